"""MiniLM on every shipped task, next to a trivial baseline per task (run outside CI).

    .venv/bin/python scripts/eval_minilm_all.py --out runs/eval-minilm            # MiniLM only
    .venv/bin/python scripts/eval_minilm_all.py --second-encoder --out runs/eval-two \
        --example-doc docs/example-results.md                                    # + a 2nd encoder

Runs `detour eval` with the stated budget (defaults below: a CPU-sized reduction of the paper's
protocol), then scores, on the same test examples, the baseline of each task type: the majority
class (classification, relation), the most frequent label set (multi-label), no entity at all
(NER). Writes docs/eval-minilm.md (or --doc). With --second-encoder it also builds a tiny
ModernBERT from config (random weights, MiniLM's tokenizer; see make_tiny_modernbert) and
evaluates it on the same tasks, splits and seeds, for the example results table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def make_tiny_modernbert(folder: Path, tokenizer_from: str) -> str:
    """A small ModernBERT (4 layers, hidden 256, global attention every 2nd layer, window 64),
    randomly initialised with seed 0, saved with the MiniLM tokenizer so both see the same text."""
    import torch
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    if (folder / "config.json").exists():
        return str(folder)
    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    cfg = ModernBertConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=512, global_attn_every_n_layers=2, local_attention=64,
        pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, mask_token_id=tok.mask_token_id,
    )
    torch.manual_seed(0)
    ModernBertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def baselines(models_out: Path, data_root: str, budget) -> dict[str, dict]:
    """Baseline metrics per task on the same capped test split detour eval used."""
    from detour.eval.finetune import prepare_task
    from detour.eval.tasks import get_task_type, load_spec

    data = json.loads((models_out / "results.json").read_text())
    model = data["config"]["models"][0]
    out = {}
    for task in data["config"]["tasks"]:
        spec = load_spec(task, data_root)
        prep = prepare_task(spec, model, budget)
        tt = get_task_type(spec.type)
        try:
            preds = tt.baseline(prep.examples["train"], len(prep.examples["test"]), prep.labels)
        except NotImplementedError:  # a plugin task type without a baseline
            continue
        out[task] = tt.score(prep.examples["test"], preds, prep.labels)
    return out


def write_doc(doc: Path, out: Path, base: dict, argv: list[str]) -> str:
    data = json.loads((out / "results.json").read_text())
    model = data["config"]["models"][0]
    summ = data["summary"][model]
    lines = [
        "| task | type | headline | MiniLM (mean ± std) | baseline | baseline kind | MiniLM beats it? |",
        "|---|---|---|---|---|---|---|",
    ]
    from detour.eval.tasks import load_spec

    for task in data["config"]["tasks"]:
        if task not in summ:
            lines.append(f"| {task} | | | not run | | | |")
            continue
        spec = load_spec(task)
        h = spec.headline
        m = summ[task][h]
        if task not in base:
            lines.append(f"| {task} | {spec.type} | {h} | {100 * m['mean']:.1f} ± {100 * m['std']:.1f} | n/a | none | |")
            continue
        b = base[task][h]
        kind = "no entity" if "ner" in spec.type else {"multilabel": "most frequent label set"}.get(spec.type, "majority class")
        lines.append(f"| {task} | {spec.type} | {h} | {100 * m['mean']:.1f} ± {100 * m['std']:.1f} | {100 * b:.1f} | "
                     f"{kind} | {'yes' if m['mean'] > b else '**no**'} |")
    table = "\n".join(lines)
    runs = [r for r in data["runs"] if r["model"] == model]
    budgets = "\n".join(f"- {r['task']}: {json.dumps(r['budget'])}, selected epoch {r['selected_epoch']}, "
                        f"train {r['timings']['train_s']:.0f} s" for r in runs)
    text = (
        "# MiniLM on every shipped task, next to a trivial baseline\n\n"
        f"Command: `.venv/bin/python scripts/eval_minilm_all.py {' '.join(argv)}`\n"
        f"(config: {json.dumps(data['config'])})\n\n" + table + "\n\n## Budgets per run\n\n" + budgets + "\n"
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    if doc.exists() and "<!-- notes -->" in doc.read_text():
        text += "\n<!-- notes -->" + doc.read_text().split("<!-- notes -->", 1)[1]
    doc.write_text(text)
    return table


def main() -> int:
    from detour.cli import main as detour_main
    from detour.eval.finetune import Budget
    from detour.eval.tasks import shipped_tasks
    from detour.paths import minilm_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(shipped_tasks()))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-train", type=int, default=600)
    p.add_argument("--max-eval", type=int, default=200)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--out", default="runs/eval-minilm")
    p.add_argument("--doc", default="docs/eval-minilm.md")
    p.add_argument("--second-encoder", action="store_true", help="also evaluate a tiny random ModernBERT")
    p.add_argument("--example-doc", default=None, help="copy the two-model results.md here")
    p.add_argument("--doc-only", action="store_true", help="only rewrite the docs from --out's (partial) results")
    args = p.parse_args()
    minilm = str(minilm_path())
    models = [minilm]
    if args.second_encoder:
        models.append(make_tiny_modernbert(Path(args.out).parent / "tiny-modernbert-random", minilm))
    common = ["--tasks", args.tasks, "--seeds", str(args.seeds), "--epochs", str(args.epochs),
              "--max-train", str(args.max_train), "--max-eval", str(args.max_eval), "--max-length", str(args.max_length),
              "--data-root", args.data_root, "--out", args.out]
    if args.threads:
        common += ["--threads", str(args.threads)]
    rc = 0 if args.doc_only else detour_main(["eval", *models, *common])
    if rc:
        return rc
    budget = Budget(args.epochs, args.max_train, args.max_eval, args.max_length)
    table = write_doc(Path(args.doc), Path(args.out), baselines(Path(args.out), args.data_root, budget), sys.argv[1:])
    print(table)
    if args.example_doc:
        md = (Path(args.out) / "results.md").read_text()
        Path(args.example_doc).write_text(md)
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
