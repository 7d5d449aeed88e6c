"""A whole study's wall time with `--jobs 1` against `--jobs 2`: `detour demo`, the same answers.

    .venv/bin/python bench/bench_study_jobs.py            # detour demo, ABAB (2 rounds each), writes bench/results/study-jobs-*.json
    .venv/bin/python bench/bench_study_jobs.py --quick    # a two-arm tiny study, AB once, nothing written (a few minutes)
    .venv/bin/python bench/bench_study_jobs.py --rounds 3 --jobs 4

Arm A runs `detour demo --out FRESH --jobs 1`, arm B `detour demo --out FRESH --jobs 2`, alternated
(A B A B) so that a change of the machine's load falls on both; each run starts from an empty
folder (nothing cached). On a machine without GPUs, `--jobs N` gives each step 1/N of the cores
and as many threads; a step's numbers depend on its thread count, so arm A runs each step with the
same count (OMP_NUM_THREADS = cores / N) and the report's numbers must come out the same in both
arms: the script checks it (results.json scores, twins.json checks, every number of report.md but
its timings) and says where they differ. `--a-threads default` runs arm A with torch's own thread
count instead (the demo as a user runs it), and then only reports differences.

The gains come from steps that may run side by side: the trained arms (the detour, its twin and the
second-seed twin after the data are prepared), the evaluations of each (task, arm), the analyses.
The table prints each run's minutes and the ratio of the arms' medians (A / B: above 1, --jobs N is
faster). The JSON holds the machine (CPU model, cores, load average before each run), every run and
the check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DETOUR = [sys.executable, "-m", "detour.cli"]
TIMING = re.compile(r"\b(\d+(\.\d+)? ?(s|min|h|seconds|minutes)\b|tokens/s|took|elapsed|wall)", re.I)


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {"cpu_model": cpu, "cpu_cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "load_average_before": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform()}


def results_path(machine: str | None = None) -> Path:
    """bench/results/study-jobs-DATE-NCPUcpu.json, or -2, -3, ... after it (a second run keeps the first)."""
    stem = f"study-jobs-{datetime.now(timezone.utc):%Y%m%d}-{machine or f'{os.cpu_count()}cpu'}"
    out = REPO / "bench" / "results" / f"{stem}.json"
    n = 2
    while out.exists():
        out, n = out.with_name(f"{stem}-{n}.json"), n + 1
    return out


def quick_study(folder: Path) -> Path:
    """Two tiny arms on a small synthetic corpus, evaluated on a small SYNTHETIC task, with the report."""
    import yaml

    sets = ["model.config.hidden_size=32", "model.config.intermediate_size=48", "model.config.num_hidden_layers=2",
            "model.config.num_attention_heads=2", "model.config.local_attention=16", "data.seq_len=64",
            "batch.global_sequences=4", "batch.micro_batch=4", "phases.0.tokens=2k", "phases.0.lr.warmup_tokens=0",
            "phases.1.tokens=512", "checkpoint.every_tokens=100000"]
    spec = {"name": "jobs-quick", "description": "two tiny arms on SYNTHETIC text, for the --jobs benchmark",
            "prepare": {"corpus": {"sources": ["synthetic:clinical?docs=80&seed=0"], "tokenizer": "minilm-l6",
                                   "workers": 1}},
            "train": {"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"), "data": ["corpus"], "set": sets},
            "eval": {"synthetic_ner": {"train": 32, "validation": 16, "test": 16}, "seeds": 1, "epochs": 1,
                     "max_length": 32}}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def answers(out: Path) -> dict:
    """What a run answered, free of its folder's name and of timings: scores, stream checks, the report's numbers."""
    found: dict = {"scores": {}, "twins": None, "report_numbers": []}
    for results in sorted(out.glob("eval/*/results.json")):
        runs = json.loads(results.read_text())["runs"]
        found["scores"][results.parent.name] = sorted(
            [Path(r["model"]).parent.name, r["task"], r["seed"], r["metrics"]] for r in runs)
    if (out / "twins.json").is_file():
        found["twins"] = json.loads((out / "twins.json").read_text()).get("checks")
    if (out / "report.md").is_file():
        text = (out / "report.md").read_text().replace(str(out), "$OUT")
        for line in text.splitlines():
            if not TIMING.search(line):
                found["report_numbers"].append(re.findall(r"-?\d+(?:[.,]\d+)*(?:e-?\d+)?", line))
    return found


def first_difference(a: dict, b: dict) -> str | None:
    for key in ("scores", "twins", "report_numbers"):
        if a[key] != b[key]:
            if key == "report_numbers":
                i = next((i for i, (x, y) in enumerate(zip(a[key], b[key])) if x != y), min(len(a[key]), len(b[key])))
                return f"report.md's numbers, line {i + 1} without timings: {a[key][i:i + 1]} against {b[key][i:i + 1]}"
            return f"{key} differ"
    return None


def run_once(command: list[str], jobs: int, threads: str | None, out: Path, log: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
    else:
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    load = os.getloadavg()
    start = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.run([*command, "--out", str(out), "--jobs", str(jobs)], stdout=fh, stderr=subprocess.STDOUT,
                            env=env).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"bench_study_jobs: {' '.join(command)} --jobs {jobs} exited {rc}; its output is in {log}")
    return {"jobs": jobs, "threads": threads or "default", "seconds": round(wall, 1), "load_average_before": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a two-arm tiny study, one round, nothing written")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of A then B (default 2; --quick: 1)")
    parser.add_argument("--jobs", type=int, default=2, help="arm B's --jobs (default 2)")
    parser.add_argument("--a-threads", default="same",
                        help="arm A's threads a step: 'same' as a slice of arm B (default; answers checked equal) or "
                             "'default' (torch's own)")
    parser.add_argument("--keep", action="store_true", help="keep the study folders (default: removed after each check)")
    parser.add_argument("--out-json", type=Path, help="write the results here (default: bench/results/study-jobs-*.json)")
    args = parser.parse_args(argv)
    if args.jobs < 2:
        parser.error("--jobs: arm B runs 2 or more steps at once")
    rounds = args.rounds or (1 if args.quick else 2)
    cores = len(os.sched_getaffinity(0))
    slice_threads = str(max(1, cores // args.jobs))
    a_threads = slice_threads if args.a_threads == "same" else None
    info = machine_info()
    work = Path(tempfile.mkdtemp(prefix="bench-study-jobs-"))
    command = [*DETOUR, "study", str(quick_study(work))] if args.quick else [*DETOUR, "demo"]
    shown = "detour " + " ".join(command[3:])
    print(f"bench_study_jobs: {shown}, --jobs 1 (threads {a_threads or 'default'}) against "
          f"--jobs {args.jobs} ({slice_threads} a step), {rounds} round(s) ABAB, on {cores} cores "
          f"({info['cpu_model']}), load {info['load_average_before'][0]:.2f}", flush=True)
    runs, reference, differences = [], None, []
    for r in range(1, rounds + 1):
        for arm, jobs, threads in (("A", 1, a_threads), ("B", args.jobs, slice_threads)):
            out = work / f"{arm}{r}"
            row = {"arm": arm, "round": r, **run_once(command, jobs, threads, out, work / f"{arm}{r}.log")}
            got = answers(out)
            if reference is None:
                reference = got
            else:
                diff = first_difference(reference, got)
                row["same_answers"] = diff is None
                if diff:
                    differences.append(f"{arm}{r}: {diff}")
            runs.append(row)
            print(f"  {arm}{r}  --jobs {jobs}  {row['seconds'] / 60:6.2f} min  (load before {row['load_average_before'][0]:.2f})"
                  f"{'' if row.get('same_answers', True) else '  ANSWERS DIFFER'}", flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
    a = statistics.median(x["seconds"] for x in runs if x["arm"] == "A")
    b = statistics.median(x["seconds"] for x in runs if x["arm"] == "B")
    print(f"\n| arm | --jobs | threads a step | median min | runs (min) |\n|---|---|---|---|---|")
    for arm, jobs, threads in (("A", 1, a_threads or "default"), ("B", args.jobs, slice_threads)):
        mins = [f"{x['seconds'] / 60:.2f}" for x in runs if x["arm"] == arm]
        print(f"| {arm} | {jobs} | {threads} | {(a if arm == 'A' else b) / 60:.2f} | {', '.join(mins)} |")
    print(f"\nratio A / B: {a / b:.2f}x  (above 1: --jobs {args.jobs} is faster)")
    same = not differences
    print("answers: the same in every run (scores, stream checks, report numbers)" if same else
          "answers differ: " + "; ".join(differences))
    info["load_average_at_end"] = os.getloadavg()
    result = {"schema": "detour.bench.study-jobs/1", "command": shown, "quick": args.quick,
              "machine": info, "jobs_b": args.jobs, "threads_a": a_threads or "default", "threads_b": slice_threads,
              "runs": runs, "median_seconds": {"A": a, "B": b}, "ratio_a_over_b": round(a / b, 3),
              "same_answers": same, "differences": differences,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if args.out_json or not args.quick:
        path = args.out_json or results_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if same or a_threads is None else 1


if __name__ == "__main__":
    sys.exit(main())
