"""`detour eval`: fine-tune and score encoders on downstream tasks over seeds.

    detour eval $(python -c "from detour.paths import minilm_path; print(minilm_path())") \
        --tasks ncbi-disease,gad --seeds 2 --epochs 1 --max-train 64 --max-eval 64 --out runs/eval-smoke

MODEL is any Hugging Face encoder folder or hub name (loaded with AutoModel, no remote code).
Tasks are shipped names (`detour eval --list-tasks`) or spec files (--task-spec). Several models
share the same splits and seeds. Results go to OUT/results.json and OUT/results.md after every
finished (model, task, seed); rerunning with the same OUT resumes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from detour.errors import DetourError
from detour.eval.finetune import Budget, finetune, prepare_task
from detour.eval.results import Results, display_name
from detour.eval.splits import load_splits
from detour.eval.tasks import load_spec, shipped_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL", help="encoder folders or hub names")
    parser.add_argument("--tasks", default="", help="comma-separated shipped task names or spec files")
    parser.add_argument("--task-spec", action="append", default=[], metavar="FILE", help="a task spec YAML (repeatable)")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeds: runs seeds 0..N-1 (default 5)")
    parser.add_argument("--out", default="runs/eval", help="output folder for results.json / results.md")
    parser.add_argument("--data-root", default=None, help="where task paths resolve (default $DETOUR_DATA_ROOT or ../shared/data)")
    parser.add_argument("--epochs", type=int, default=None, help="override the spec's epochs")
    parser.add_argument("--max-train", type=int, default=None, help="cap train examples (seeded sample)")
    parser.add_argument("--max-eval", type=int, default=None, help="cap validation and test examples (seeded sample)")
    parser.add_argument("--max-length", type=int, default=None, help="override the spec's max length (tokens)")
    parser.add_argument("--lr", type=float, default=None, help="override the spec's learning rate")
    parser.add_argument("--batch-size", type=int, default=None, help="override the spec's batch size")
    parser.add_argument("--linear-probe", action="store_true", help="freeze the encoder; train the head only")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--list-tasks", action="store_true", help="list the shipped tasks and exit")


def _specs(args):
    names = [t.strip() for t in args.tasks.split(",") if t.strip()] + list(args.task_spec)
    if not names:
        raise DetourError("no task: give --tasks a,b,c and/or --task-spec FILE (see --list-tasks)")
    specs = [load_spec(n, args.data_root) for n in names]
    seen = set()
    for s in specs:
        if s.name in seen:
            raise DetourError(f"task {s.name!r} given twice")
        seen.add(s.name)
    return specs


def run(args) -> int:
    if args.list_tasks:
        for name in shipped_tasks():
            spec = load_spec(name, args.data_root)
            print(f"{name:16s} {spec.type:15s} {spec.format:15s} {spec.description}")
        return 0
    if not args.models:
        raise DetourError("give at least one MODEL (an encoder folder or hub name)")
    from detour.paths import resolve_model_ref

    args.models = [resolve_model_ref(m) for m in args.models]  # aliases such as minilm-l6
    if args.seeds < 1:
        raise DetourError("--seeds must be >= 1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    specs = _specs(args)
    budget = Budget(args.epochs, args.max_train, args.max_eval, args.max_length, args.lr, args.batch_size)
    config = {
        "models": list(args.models), "tasks": [s.name for s in specs], "seeds": list(range(args.seeds)),
        "epochs": args.epochs, "max_train": args.max_train, "max_eval": args.max_eval,
        "max_length": args.max_length, "lr": args.lr, "batch_size": args.batch_size,
        "linear_probe": bool(args.linear_probe),
    }
    results = Results.open(args.out, config)
    done = results.done()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn()]
    with Progress(*columns) as progress:
        for spec in specs:
            todo = [(m, s) for m in args.models for s in config["seeds"] if (m, spec.name, s) not in done]
            if not todo:
                continue
            splits = load_splits(spec)
            for model in args.models:
                seeds = [s for m, s in todo if m == model]
                if not seeds:
                    continue
                prep = prepare_task(spec, model, budget, splits)
                steps = prep.epochs * -(-len(prep.features["train"]) // prep.batch_size)
                for seed in seeds:
                    bar = progress.add_task(f"{display_name(model)} {spec.name} seed {seed}", total=steps, loss=float("nan"))
                    started = time.time()
                    out = finetune(model, prep, seed, args.linear_probe, args.device,
                                   on_step=lambda loss, bar=bar: progress.update(bar, advance=1, loss=loss))
                    results.add({
                        "model": model, "task": spec.name, "seed": seed, "headline": spec.headline,
                        "metrics": out["metrics"], "selected_epoch": out["selected_epoch"],
                        "budget": {
                            "epochs": prep.epochs, "train_examples": len(prep.examples["train"]),
                            "validation_examples": len(prep.examples["validation"]),
                            "eval_examples": len(prep.examples["test"]), "max_length": prep.max_length,
                            "lr": prep.lr, "batch_size": prep.batch_size, "labels": len(prep.labels),
                        },
                        "timings": {**out["timings"], "wall_s": round(time.time() - started, 3)},
                        "validation": out["validation"],
                    })
                    head = out["metrics"][spec.headline]
                    progress.console.print(f"{display_name(model)} {spec.name} seed {seed}: {spec.headline} = {head:.4f} (epoch {out['selected_epoch']})")
    print(f"results: {Path(args.out) / 'results.json'} and results.md")
    return 0
