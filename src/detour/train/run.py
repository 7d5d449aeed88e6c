"""`detour train`: run one recipe into a folder.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny --dry-run
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --set phases.0.tokens=100k
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --resume   # after a crash or SIGTERM
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --report-to tensorboard   # RUN/tensorboard/
    detour train recipes/tiny-modernbert.yaml --out runs/tiny-decay4k --from runs/tiny --after-phase clm \
        --set phases.1.tokens=4k                                          # a shorter decay, same Phase 1

Exit status: 0 done; 2 bad input; 75 stopped by SIGTERM/SIGINT after saving a checkpoint (resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml
from rich.console import Console
from rich.table import Table

from detour.config import Recipe, load_recipe, recipe_to_dict
from detour.errors import DetourError
from detour.lock import folder_lock


TRACKERS = ("tensorboard", "wandb")


class _ReportTo(argparse.Action):
    """`--report-to tensorboard[,wandb]` is `--set logging.report_to=[...]`: the recipe carries it to every arm."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [n.strip() for n in values.split(",") if n.strip()]
        unknown = [n for n in names if n not in TRACKERS + ("none",)]
        if unknown or not names:
            parser.error(f"{option_string} {values!r}: expected {', '.join(TRACKERS)} (comma-separated) or none")
        names = [n for n in names if n != "none"]
        overrides = list(getattr(namespace, "overrides", None) or [])  # a copy: never the shared default list
        overrides.append(f"logging.report_to={json.dumps(names)}")
        namespace.overrides = overrides


class _Device(argparse.Action):
    """`--device cuda` is `--set device=cuda`: one flag for the device in every verb, a field in the recipe."""

    def __call__(self, parser, namespace, values, option_string=None):
        overrides = list(getattr(namespace, "overrides", None) or [])  # a copy: never the shared default list
        overrides.append(f"device={values}")
        namespace.overrides = overrides


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/)")
    parser.add_argument("--out", required=True, help="run folder (checkpoints, metrics.jsonl, exports)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set phases.0.tokens=50k (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved recipe and the plan, then exit")
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    parser.add_argument("--trust-unverified-checkpoint", action="store_true",
                        help="with --resume: accept a checkpoint that has no manifest.json (written by an older "
                             "detour) with a warning; by default such a checkpoint is skipped as unverified")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar or log lines on stdout (metrics.jsonl still written)")
    parser.add_argument("--report-to", action=_ReportTo, metavar="TRACKER",
                        help="also send every step's loss, lr, grad_norm and tokens/s to tensorboard "
                             "(RUN/tensorboard/) and/or wandb (RUN/wandb/), comma-separated; sets logging.report_to")
    parser.add_argument("--device", action=_Device, choices=("auto", "cpu", "cuda"),
                        help="where to train: auto (cuda when available), cpu or cuda; sets the recipe's device, "
                             "as --device does for eval and needle")
    parser.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                        help="start from RUN_DIR's checkpoint at the end of --after-phase (weights, AdamW moments, "
                             "sampler and RNG states carried); the recipe must match the parent's up to that phase")
    parser.add_argument("--after-phase", metavar="PHASE", help="the parent's phase to branch after (with --from)")


def branch_overrides(args: argparse.Namespace, run_dir: str | None = None) -> list[str]:
    """`--from` / `--after-phase` as the recipe's `branch` field (JSON strings are YAML scalars)."""
    if (args.from_run is None) != (args.after_phase is None):
        raise DetourError("--from and --after-phase go together: --from RUN_DIR --after-phase PHASE")
    if args.from_run is None:
        return []
    return [f"branch.run={json.dumps(run_dir or args.from_run)}", f"branch.after_phase={json.dumps(args.after_phase)}"]


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
    if args.dry_run:
        return _run(args)
    # Taken before torch is even imported, so a second writer is refused in a moment; train()
    # takes it again (the same process may).
    with folder_lock(args.out, enabled=int(os.environ.get("RANK", "0")) == 0):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from detour.stop import RESUMABLE_EXIT
    from detour.train.loop import TrainingStopped, train

    recipe = load_recipe(args.recipe, args.overrides + branch_overrides(args))
    recipe.grad_accumulation()  # validates the batch arithmetic before any work
    if args.dry_run:
        from detour.train.setup import preflight

        preflight(recipe, args.out)
        print_plan(recipe)
        return 0
    try:
        result = train(recipe, args.out, resume=args.resume, progress=not args.no_progress,
                       trust_unverified=args.trust_unverified_checkpoint)
    except TrainingStopped as stop:
        print(f"detour train: {stop}", file=sys.stderr)
        return RESUMABLE_EXIT
    if not result.summary:  # not the main process under torchrun: rank 0 reports
        return 0
    for name, phase in result.summary["phases"].items():
        print(f"{name}: {phase['objective']} {phase['tokens']:,} tokens, final loss {phase['final_loss']:.4f}")
    print(f"model: {result.summary['model']}")
    if "branch" in result.summary:
        print(describe_branch(result.summary["branch"]))
    return 0


def describe_branch(branch: dict) -> str:
    checks = ", ".join(f"{name} {'carried' if c['carried'] else 'continued'}: "
                       f"{'equal' if c['equal'] else 'n/a' if c['equal'] is None else 'DIFFERENT'}"
                       for name, c in branch["stream_continues_parent"].items())
    return f"branched from {branch['parent']} after {branch['after_phase']} (step {branch['global_step']}); " \
           f"stream vs parent: {checks}"
