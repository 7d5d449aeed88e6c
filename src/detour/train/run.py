"""`detour train`: run one recipe into a folder.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny --dry-run
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --set phases.0.tokens=100k
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --resume   # after a crash or SIGTERM

Exit status: 0 done; 2 bad input; 75 stopped by SIGTERM/SIGINT after saving a checkpoint (resumable).
"""

from __future__ import annotations

import argparse
import sys

import yaml
from rich.console import Console
from rich.table import Table

from detour.config import Recipe, load_recipe, recipe_to_dict


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/)")
    parser.add_argument("--out", required=True, help="run folder (checkpoints, metrics.jsonl, exports)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set phases.0.tokens=50k (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved recipe and the plan, then exit")
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs still written)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def print_plan(recipe: Recipe, title: str = "") -> None:
    console = Console()
    if title:
        console.rule(title)
    console.print(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False).rstrip())
    table = Table(title=f"plan: {recipe.tokens_per_step():,} tokens/step "
                        f"({recipe.sequences_per_step()} x {recipe.data.seq_len}), "
                        f"grad accumulation {recipe.grad_accumulation()}")
    for col in ("phase", "objective", "mask_rate", "tokens", "steps", "last_step_tokens", "lr_shape"):
        table.add_column(col)
    for row in recipe.plan():
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in
                        (row[c] for c in ("phase", "objective", "mask_rate", "tokens", "steps",
                                          "last_step_tokens", "lr_shape"))))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    from detour.train.loop import RESUMABLE_EXIT, TrainingStopped, train

    recipe = load_recipe(args.recipe, args.overrides)
    recipe.grad_accumulation()  # validates the batch arithmetic before any work
    if args.dry_run:
        print_plan(recipe)
        return 0
    try:
        result = train(recipe, args.out, resume=args.resume, progress=not args.no_progress)
    except TrainingStopped as stop:
        print(f"detour train: {stop}", file=sys.stderr)
        return RESUMABLE_EXIT
    if not result.summary:  # not the main process under torchrun: rank 0 reports
        return 0
    for name, phase in result.summary["phases"].items():
        print(f"{name}: {phase['objective']} {phase['tokens']:,} tokens, final loss {phase['final_loss']:.4f}")
    print(f"model: {result.summary['model']}")
    return 0
