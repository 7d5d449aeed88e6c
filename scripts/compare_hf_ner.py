"""Parity check: `detour eval` vs the stock Hugging Face token-classification recipe.

    .venv/bin/python scripts/compare_hf_ner.py --epochs 3 --seed 0 --out runs/compare-hf-ner
    # or the two arms in parallel, one CPU thread each, then the summary:
    .venv/bin/python scripts/compare_hf_ner.py --only hf --threads 1 &
    .venv/bin/python scripts/compare_hf_ner.py --only detour --threads 1 &
    wait; .venv/bin/python scripts/compare_hf_ner.py --only summary

Stock recipe: `AutoModelForTokenClassification` + `Trainer` (linear decay, no warmup, AdamW,
weight decay 0.01, grad clip 1.0: the Trainer's defaults), labels on first sub-tokens, best epoch
by validation macro F1 (`load_best_model_at_end`), test scored once. Both arms use the same
seed, epochs, learning rate, batch size and max length, the same NCBI Disease files, and the same
strict span scorer (`detour.eval.metrics.span_scores`). Run outside CI: minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def read_iob(path: Path) -> list[tuple[list[str], list[str]]]:
    """The stock way: token<TAB>tag lines, blank line between sentences."""
    sents, toks, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if toks:
                sents.append((toks, tags))
            toks, tags = [], []
            continue
        tok, tag = line.split("\t")[0], line.split("\t")[-1]
        toks.append(tok)
        tags.append(tag)
    if toks:
        sents.append((toks, tags))
    return sents


def run_hf(args) -> dict:
    import numpy as np
    from datasets import Dataset
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainingArguments)

    from detour.eval.metrics import span_scores

    root = Path(args.data_root) / "tasks/en/ncbi-disease"
    data = {k: read_iob(root / f) for k, f in (("train", "train.tsv"), ("validation", "devel.tsv"), ("test", "test.tsv"))}
    labels = ["O", "B-Disease", "I-Disease"]
    index = {t: i for i, t in enumerate(labels)}
    tok = AutoTokenizer.from_pretrained(args.model)

    def encode(sents):
        enc = tok([s for s, _ in sents], is_split_into_words=True, truncation=True, max_length=args.max_length)
        all_labels = []
        for i, (_, tags) in enumerate(sents):
            prev, row = None, []
            for w in enc.word_ids(i):
                row.append(-100 if w is None or w == prev else index[tags[w]])
                prev = w
            all_labels.append(row)
        return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": all_labels})

    ds = {k: encode(v) for k, v in data.items()}

    def to_tags(pred_ids, label_ids):
        out = []
        for p, g in zip(pred_ids, label_ids):
            out.append([labels[int(x)] for x, y in zip(p, g) if y != -100])
        return out

    def compute_metrics(ev):
        pred = np.argmax(ev.predictions, axis=-1)
        gold = [[labels[int(y)] for y in g if y != -100] for g in ev.label_ids]
        return span_scores(gold, to_tags(pred, ev.label_ids))

    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=index
    )
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=32, num_train_epochs=args.epochs, weight_decay=0.01, seed=args.seed,
            eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
            metric_for_best_model="macro_f1", greater_is_better=True, save_total_limit=1,
            report_to=[], logging_strategy="no", dataloader_num_workers=0, use_cpu=args.device == "cpu",
        )
        trainer = Trainer(model=model, args=targs, train_dataset=ds["train"], eval_dataset=ds["validation"],
                          data_collator=DataCollatorForTokenClassification(tok), compute_metrics=compute_metrics)
        t0 = time.time()
        trainer.train()
        train_s = time.time() - t0
        test = trainer.predict(ds["test"])
    # Gold for the test score comes from the files (every word), not from the truncated labels.
    pred_tags = to_tags(np.argmax(test.predictions, axis=-1), test.label_ids)
    gold = [tags for _, tags in data["test"]]
    pred_tags = [p + ["O"] * (len(g) - len(p)) for p, g in zip(pred_tags, gold)]
    metrics = span_scores(gold, pred_tags)
    history = [{"epoch": h["epoch"], "macro_f1": h["eval_macro_f1"]} for h in trainer.state.log_history if "eval_macro_f1" in h]
    return {"recipe": "hf-trainer", "metrics": metrics, "validation": history, "train_s": round(train_s, 1)}


def run_detour(args) -> dict:
    from detour.cli import main

    out = Path(args.out) / "detour"
    argv = ["eval", args.model, "--tasks", "ncbi-disease", "--seeds", "1", "--epochs", str(args.epochs),
            "--lr", str(args.lr), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length),
            "--data-root", args.data_root, "--out", str(out)]
    if args.device:
        argv += ["--device", args.device]
    if args.seed != 0:
        sys.exit("detour eval runs seeds 0..N-1: use --seed 0 for a like-for-like comparison")
    rc = main(argv)
    if rc:
        sys.exit(rc)
    run = json.loads((out / "results.json").read_text())["runs"][0]
    return {"recipe": "detour eval", "metrics": run["metrics"], "validation": run["validation"],
            "selected_epoch": run["selected_epoch"], "train_s": run["timings"]["train_s"]}


def summary(out: Path) -> str:
    hf = json.loads((out / "hf.json").read_text())
    de = json.loads((out / "detour.json").read_text())
    lines = ["| recipe | test strict span F1 (macro) | micro | precision | recall | train s |", "|---|---|---|---|---|---|"]
    for r in (hf, de):
        m = r["metrics"]
        lines.append(f"| {r['recipe']} | {100 * m['macro_f1']:.2f} | {100 * m['micro_f1']:.2f} | "
                     f"{100 * m['precision']:.2f} | {100 * m['recall']:.2f} | {r['train_s']} |")
    gap = 100 * (de["metrics"]["macro_f1"] - hf["metrics"]["macro_f1"])
    lines.append(f"\ndetour - HF = {gap:+.2f} F1 points (the target: within 2 points).")
    return "\n".join(lines) + "\n"


def main() -> int:
    from detour.paths import minilm_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(minilm_path()))
    p.add_argument("--data-root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", choices=["hf", "detour", "summary"], default=None)
    p.add_argument("--out", default="runs/compare-hf-ner")
    args = p.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "hf"):
        (out / "hf.json").write_text(json.dumps(run_hf(args), indent=1))
    if args.only in (None, "detour"):
        (out / "detour.json").write_text(json.dumps(run_detour(args), indent=1))
    if (out / "hf.json").exists() and (out / "detour.json").exists():
        text = summary(out)
        (out / "summary.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
