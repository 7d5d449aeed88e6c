"""GPU training-step throughput: dense-mask sdpa against mask-free varlen attention, ModernBERT-base shape.

    bash bench/gpu.sh                               # the varlen tests (CUDA kernel included), then this
    .venv/bin/python bench/bench_gpu.py             # writes bench/results/gpu-<date>-<device>.json
    .venv/bin/python bench/bench_gpu.py --quick     # 1 warm-up step, 2 rounds of 1 step, nothing written

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
Without CUDA this exits 2.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench_train import FLOPS_FORMULA, MODERNBERT_BASE, _spread, shape_of, step_flops

REPO = Path(__file__).resolve().parents[1]
ATTNS = ("sdpa-dense", "varlen")
OBJECTIVES = ("clm", "mlm30")
MASK_RATE = 0.30


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
            "mfu": statistics.median(f / t for f, (t, _, _) in zip(flops, steps)) / rate,
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
    return {"bf16_matmul_tflops": _spread(probes), "arms": arms}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 warm-up step, 2 rounds of 1 step, nothing written")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="where to write the JSON (default bench/results/gpu-<date>-<device>.json)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; this benchmark compares GPU attention kernels and needs one "
              "(the CPU benchmark is bench/bench_train.py)", file=sys.stderr)
        return 2
    warmup, rounds, per_round = (1, 2, 1) if args.quick else (args.warmup, args.rounds, args.steps_per_round)
    start = machine_info()
    model = build_model()
    shape = shape_of(model)
    batches = make_batches(model, args.seq_len, args.micro_batch, 4, args.seed)
    docs = [int(b["doc_ids"][r].max()) + 1 for b in batches for r in range(args.micro_batch)]
    print(f"{start['gpu']}: ModernBERT-base shape, seq {args.seq_len} x {args.micro_batch}, "
          f"{min(docs)}-{max(docs)} documents per row, bf16 autocast", flush=True)
    raw, probes = measure(model, batches, warmup, rounds, per_round)
    summary = summarize(raw, probes, shape, args.seq_len)
    print_table(summary)
    if args.quick:
        return 0
    result = {"benchmark": "gpu-attention", "model": "ModernBERT-base shape, random init from config",
              "shape": shape, "seq_len": args.seq_len, "micro_batch": args.micro_batch, "documents_per_row": docs,
              "precision": "bf16 autocast, fp32 weights", "mlm_mask_rate": MASK_RATE,
              "warmup_steps": warmup, "rounds": rounds, "steps_per_round": per_round,
              "order": "rounds alternate the arms: " + " ".join(summary["arms"]) + " ...",
              "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": start,
              "flops_formula": FLOPS_FORMULA, **summary}
    from detour.io import write_json

    device = re.sub(r"[^a-z0-9]+", "-", start["gpu"].lower()).strip("-")
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"gpu-{datetime.now(timezone.utc):%Y%m%d}-{device}.json"
    write_json(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
