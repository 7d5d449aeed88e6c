"""`detour twins`: the detour and its matched MLM baseline, on the identical token stream.

    detour twins recipes/tiny-modernbert.yaml --out runs/twins

Runs the recipe as written into OUT/detour/ and its twin (every CLM phase replaced by MLM at
`baseline_mask_rate`, everything else identical: data, order, optimizer, schedule, budgets, seed)
into OUT/baseline/, then writes OUT/twins.json: each arm's tokens, stream hash and final loss per
phase, whether tokens and hashes match (they must), and both arms' MLM loss at the end of the decay.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detour.config import baseline_of, load_recipe
from detour.errors import DetourError
from detour.io import write_json
from detour.train.run import add_common_arguments, print_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def compare_arms(detour: dict, baseline: dict) -> dict:
    phases = list(detour["phases"])
    same_tokens = all(detour["phases"][p]["tokens"] == baseline["phases"][p]["tokens"] for p in phases)
    same_stream = all(detour["phases"][p]["stream_hash"] == baseline["phases"][p]["stream_hash"] for p in phases)
    last = phases[-1]
    return {
        "synthetic_data": bool(detour.get("synthetic_data")),
        "arms": {"detour": detour, "baseline": baseline},
        "checks": {"tokens_equal": same_tokens, "stream_hashes_equal": same_stream},
        "end_of_decay_mlm_loss": {"phase": last, "detour": detour["phases"][last]["final_loss"],
                                  "baseline": baseline["phases"][last]["final_loss"]},
    }


def run_twins(recipe, out: Path, resume: bool = False, progress: bool = True) -> dict:
    from detour.train.loop import train

    arms = {"detour": recipe, "baseline": baseline_of(recipe)}
    summaries = {}
    for name, arm in arms.items():
        folder = out / name
        done = folder / "summary.json"
        if resume and done.is_file():
            summaries[name] = json.loads(done.read_text())
            continue
        summaries[name] = train(arm, folder, resume=resume, progress=progress).summary
    if not summaries["detour"]:  # not the main process under torchrun: rank 0 writes the report
        return {}
    report = compare_arms(summaries["detour"], summaries["baseline"])
    write_json(out / "twins.json", report)
    return report


def run(args: argparse.Namespace) -> int:
    from detour.train.loop import RESUMABLE_EXIT, TrainingStopped

    recipe = load_recipe(args.recipe, args.overrides)
    recipe.grad_accumulation()
    if args.dry_run:
        print_plan(recipe, "detour arm")
        print_plan(baseline_of(recipe), "MLM baseline arm")
        return 0
    try:
        report = run_twins(recipe, Path(args.out), resume=args.resume, progress=not args.no_progress)
    except TrainingStopped as stop:
        print(f"detour twins: {stop}", file=sys.stderr)
        return RESUMABLE_EXIT
    if not report:
        return 0
    for arm, summary in report["arms"].items():
        losses = ", ".join(f"{p} {v['objective']} {v['final_loss']:.4f}" for p, v in summary["phases"].items())
        print(f"{arm:9s} {losses}")
    print(f"checks: {report['checks']}")
    if report["synthetic_data"]:
        print("note: trained on SYNTHETIC text (embedded generator): an engine test, not a result")
    print(f"MLM loss at the end of the decay: detour {report['end_of_decay_mlm_loss']['detour']:.4f}, "
          f"baseline {report['end_of_decay_mlm_loss']['baseline']:.4f}")
    if not all(report["checks"].values()):
        raise DetourError(f"the twins did not see the same token stream: {report['checks']} ({args.out}/twins.json)")
    return 0
