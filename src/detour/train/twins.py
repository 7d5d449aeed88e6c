"""`detour twins`: the detour and its matched MLM baseline on the identical token stream, plus study arms.

    detour twins recipes/tiny-modernbert.yaml --out runs/twins
    detour twins recipes/tiny-modernbert.yaml --out runs/twins --freeze low@clm --freeze mid@clm --freeze low@decay
    detour twins recipes/tiny-modernbert.yaml --out runs/twins --arm decay-4k phases.1.tokens=4k \
        --baseline-arm baseline-seed2 seed=18
    detour twins recipes/tiny-modernbert.yaml --out runs/twins-decay4k --from runs/twins --after-phase clm \
        --set phases.1.tokens=4k

Runs the recipe as written into OUT/detour/ and its twin (every CLM phase replaced by MLM at
`baseline_mask_rate`, everything else identical: data, order, optimizer, schedule, budgets, seed)
into OUT/baseline/. Extra arms are overrides of the detour's recipe (`--arm NAME KEY=VALUE...`,
`--freeze GROUP@PHASE` for "freeze these layers during that phase", GROUP one of low, mid, late
or a range such as 0-7) or of the baseline's (`--baseline-arm`, e.g. a second seed for the noise
floor), each into OUT/NAME/. An arm that shares its first phases with the detour or the baseline
is branched from that arm's checkpoint at the end of the shared phases instead of repeating them
(a freeze-during-decay arm, a decay-length variant). OUT/twins.json holds each arm's tokens,
stream hash and final loss per phase, whether every arm saw the same token stream wherever the
budgets agree (they must) and drew the same MLM masks where its phases match the detour's (null,
"not compared", when no phase had masks to compare), the layer groups, and the MLM loss at the end
of the decay. With `validation:` in the recipe, it also checks that every arm scored the identical
held-out sequences and masks at every phase end (`validation_equal`, from each phase's
`validation_hash`; "not compared" when an arm has no validation), and gives each arm's held-out MLM
loss at the end of the decay. A check that is not "yes" ends the command with an error naming the arms and phases.

With `--from TWINS_DIR --after-phase PHASE`, each of the detour and the baseline branches from the
same arm of an earlier twins run: a decay-length sweep without repeating Phase 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from detour.config import Recipe, apply_overrides, baseline_of, load_recipe, recipe_from_dict, recipe_to_dict
from detour.errors import DetourError
from detour.io import write_json
from detour.train.run import add_common_arguments, branch_overrides, describe_branch, print_plan
from detour.lock import folder_lock
from detour.runs import TWINS_FILE, RunFolder

MAIN_ARMS = ("detour", "baseline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--arm", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
                        help="an extra arm: the detour's recipe with these overrides, into OUT/NAME (repeatable)")
    parser.add_argument("--baseline-arm", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
                        help="an extra arm from the baseline's recipe, e.g. baseline-seed2 seed=18 (repeatable)")
    parser.add_argument("--freeze", action="append", default=[], metavar="LAYERS@PHASE",
                        help="an extra arm freezing LAYERS (low, mid, late, or e.g. 0-7) during PHASE, "
                             "named freeze-LAYERS-PHASE (repeatable)")


def _override_arm(base: Recipe, name: str, overrides: list[str]) -> Recipe:
    tree = apply_overrides(recipe_to_dict(base), overrides)
    tree["name"] = f"{base.name}-{name}"
    return recipe_from_dict(tree, f"(arm {name})")


def build_arms(recipe: Recipe, arms: list[list[str]] = (), baseline_arms: list[list[str]] = (),
               freezes: list[str] = (), baseline_parent: str | None = None) -> dict[str, Recipe]:
    """Arm name -> recipe: the detour, its MLM twin, then the extra arms in the order given.

    When the detour branches from an earlier twins run, `baseline_parent` is that run's baseline,
    which the baseline (and the arms made from it) branch from.
    """
    twin = baseline_of(recipe)
    if baseline_parent is not None:
        tree = recipe_to_dict(twin)
        tree["branch"]["run"] = baseline_parent
        twin = recipe_from_dict(tree, "(baseline twin)")
    out = {"detour": recipe, "baseline": twin}

    def add(name: str, recipe_: Recipe) -> None:
        if name in out or not name or "/" in name or name.startswith("."):
            raise DetourError(f"arm name {name!r}: must be new, non-empty, and usable as a folder name")
        out[name] = recipe_

    for spec in freezes:
        layers, at, phase = spec.partition("@")
        if not at or not layers or not phase:
            raise DetourError(f"--freeze {spec!r}: expected LAYERS@PHASE, e.g. low@clm or 0-7@decay")
        names = [p.name for p in recipe.phases]
        if phase not in names:
            raise DetourError(f"--freeze {spec!r}: no phase {phase!r} in the recipe (its phases: {names})")
        add(f"freeze-{layers}-{phase}",
            _override_arm(recipe, f"freeze-{layers}-{phase}", [f"phases.{names.index(phase)}.freeze.layers={layers}"]))
    for base, specs in (("detour", arms), ("baseline", baseline_arms)):
        for name, *overrides in specs:
            if not overrides:
                raise DetourError(f"arm {name}: give at least one KEY=VALUE override (or it is the {base} itself)")
            add(name, _override_arm(out[base], name, overrides))
    return out


def _branch_point(name: str, arm: Recipe, done: dict[str, Recipe], out: Path) -> Recipe:
    """The arm, branched from the earlier arm it shares the most leading phases with (if any)."""
    from detour.train.branch import shared_prefix

    if arm.branch is not None or name in MAIN_ARMS:
        return arm
    best, k = None, 0
    for other_name, other in done.items():
        shared = shared_prefix(arm, other)
        if shared > k and other.checkpoint.keep_phase_ends:
            best, k = other_name, shared
    if best is None or k >= len(arm.phases):
        return arm
    tree = recipe_to_dict(arm)
    tree["branch"] = {"run": str(out / best), "after_phase": arm.phases[k - 1].name}
    return recipe_from_dict(tree, f"(arm {name})")


SCHEMA = "detour.twins/2"  # 2: checks.mlm_masks_equal is null when no phase's masks could be compared

_CHECK_WORDS = {"tokens_equal": "same token counts", "stream_hashes_equal": "same token stream",
                "mlm_masks_equal": "same MLM masks where the arms' phases match",
                "validation_equal": "same validation set and masks",
                "start_weights_equal": "same starting weights"}
# A check that may be null without failing: an arm run without `validation:` has nothing to compare.
_OPTIONAL_CHECKS = ("validation_equal", "start_weights_equal")


def _verdict(value: bool | None) -> str:
    return "not compared" if value is None else "yes" if value else "NO"


def describe_checks(checks: dict[str, bool | None]) -> str:
    """twins.json's checks in words: 'same token counts: yes, same token stream: yes, ...'."""
    return ", ".join(f"{_CHECK_WORDS.get(k, k)}: {_verdict(v)}" for k, v in checks.items())


def read_checks(report: dict) -> dict[str, bool | None]:
    """The checks of a twins.json of any schema, null where nothing was compared.

    Schema 1 (no `schema` field) wrote `mlm_masks_equal: true` even when no phase had masks to
    compare; its per-phase rows say whether any did.
    """
    checks = dict(report.get("checks") or {})
    if report.get("schema") is None and checks.get("mlm_masks_equal") is True:
        rows = [r for phases in (report.get("stream_vs_detour") or {}).values() for r in phases.values()]
        if not any("masks" in r for r in rows):
            checks["mlm_masks_equal"] = None
    return checks


def check_failures(report: dict, path: Path | str) -> str | None:
    """None when every check passed; else the failed checks and the arms and phases behind them, in words."""
    checks = read_checks(report)
    if all(v is True or v is None and k in _OPTIONAL_CHECKS for k, v in checks.items()):
        return None
    rows = [f"{arm} {phase}: {row}" for arm, phases in report.get("stream_vs_detour", {}).items()
            for phase, row in phases.items() if "DIFFERENT" in row or "not compared" in row]
    rows += [f"{arm}: {row}" for arm, row in (report.get("validation_vs_detour") or {}).items() if row.startswith("NO")]
    if checks.get("start_weights_equal") is False:
        rows += [f"{arm} started from weights {str(h)[:12]}" for arm, h in (report.get("start_weights") or {}).items()]
    if checks.get("mlm_masks_equal") is None and not rows:
        rows = ["no MLM phase of an arm matches one of the detour's in objective, mask rate and seed"]
    return (f"the arms' stream checks did not pass: {describe_checks(checks)} ({'; '.join(rows)}); "
            f"see {path}")


def compare_arms(summaries: dict[str, dict], groups: str | None = None) -> dict:
    """Each arm against the detour: same tokens and the same stream wherever the phase budgets agree.

    MLM masks are compared where both phases are MLM at the same rate under the same seed (the twins'
    decay); `mlm_masks_equal` is null, never true, when no such phase had a mask hash on both sides.
    """
    ref = summaries["detour"]
    phases = list(ref["phases"])
    per_arm, tokens_equal, stream_equal = {}, True, True
    masks_equal, masks_compared, masks_missing = True, False, False
    for name, summary in summaries.items():
        rows = {}
        # by position: the twin's replaced phase has its own name (mlm30 for clm)
        own = list(summary["phases"].values())
        for i, p in enumerate(phases):
            mine, theirs = own[i] if i < len(own) else None, ref["phases"][p]
            if mine is None or mine["budget"] != theirs["budget"]:
                rows[p] = "budget differs"
                continue
            same_tokens = mine["tokens"] == theirs["tokens"]
            same_stream = mine["stream_hash"] == theirs["stream_hash"]
            tokens_equal &= same_tokens
            stream_equal &= same_stream
            rows[p] = "equal" if same_tokens and same_stream else "DIFFERENT"
            if mine["objective"] == theirs["objective"] == "mlm" and mine["mask_rate"] == theirs["mask_rate"] \
                    and summary.get("seed") == ref.get("seed"):
                if mine.get("mask_hash") and theirs.get("mask_hash"):
                    same_masks = mine["mask_hash"] == theirs["mask_hash"]
                    masks_equal &= same_masks
                    masks_compared |= name != "detour"  # the detour against itself proves nothing
                    rows[p] += ", same masks" if same_masks else ", DIFFERENT masks"
                else:  # e.g. a summary.json written before masks were hashed
                    masks_missing = True
                    rows[p] += ", masks not compared (no mask hash)"
        if "branch" in summary:
            for p, c in summary["branch"]["stream_continues_parent"].items():
                if c["equal"] is False:
                    stream_equal = False
                    rows[p] = "DIFFERENT from its parent's stream"
        per_arm[name] = rows
    last = phases[-1]
    report = {
        "schema": SCHEMA,
        "synthetic_data": bool(ref.get("synthetic_data")),
        "layer_groups": groups,
        "arms": summaries,
        "checks": {"tokens_equal": tokens_equal, "stream_hashes_equal": stream_equal,
                   "mlm_masks_equal": False if not masks_equal else
                   True if masks_compared and not masks_missing else None},
        "stream_vs_detour": per_arm,
        "end_of_decay_mlm_loss": {"phase": last, **{name: list(s["phases"].values())[-1]["final_loss"]
                                                     for name, s in summaries.items()
                                                     if len(s["phases"]) == len(phases)}},
    }
    starts = {name: (s.get("start") or {}).get("weights_hash") for name, s in summaries.items()}
    if any(starts.values()):  # arms from a pretrained model; null for arms built from a config (seeded init)
        report["checks"]["start_weights_equal"] = len(set(starts.values())) == 1
        report["start_weights"] = starts
    if any(h for s in summaries.values() for h in _validation_hashes(s)):  # absent: twins.json as before `validation:`
        report["checks"]["validation_equal"], report["validation_vs_detour"] = compare_validation(summaries)
        report["end_of_decay_validation_mlm_loss"] = {
            "phase": last, **{name: list(s["phases"].values())[-1]["validation"]["mlm_loss"]
                              for name, s in summaries.items() if len(s["phases"]) == len(phases)
                              and "validation" in list(s["phases"].values())[-1]}}
    return report


def _validation_hashes(summary: dict) -> list[str | None]:
    """Each phase's validation_hash at its end, by position (None for a phase without one)."""
    return [(p.get("validation") or {}).get("validation_hash") for p in summary["phases"].values()]


def compare_validation(summaries: dict[str, dict]) -> tuple[bool | None, dict[str, str]]:
    """Whether every arm scored the detour's held-out sequences and masks: the check and a row per arm.

    Every phase end of every arm must carry the same validation_hash (the token ids and masked
    positions scored). None ("not compared") when an arm, or the detour, has no validation.
    """
    ref = [h for h in _validation_hashes(summaries["detour"]) if h]
    rows, compared, differs = {}, True, False
    for name, summary in summaries.items():
        mine = {h for h in _validation_hashes(summary) if h}
        if not ref or not mine:
            rows[name], compared = "not compared (no validation in this arm or the detour)", False
        elif mine == {ref[0]} and len(set(ref)) == 1:
            rows[name] = "same validation set and masks"
        else:
            rows[name], differs = (f"NO: validation hashes {sorted(h[:12] for h in mine)} against the detour's "
                                   f"{sorted({h[:12] for h in ref})}"), True
    return (False if differs else True if compared else None), rows


def run_twins(recipe: Recipe, out: Path, resume: bool = False, progress: bool = True,
              arms: dict[str, Recipe] | None = None, trust_unverified: bool = False) -> dict:
    from detour.train.setup import preflight

    arms = arms or build_arms(recipe)
    for name, arm in arms.items():  # every arm's inputs, before any arm trains
        preflight(arm, out / name)
    # The twins folder's lock (rank 0's) covers twins.json; each arm's training takes its own.
    with folder_lock(out, enabled=int(os.environ.get("RANK", "0")) == 0):
        return _run_arms(arms, out, resume, progress, trust_unverified)


def _run_arms(arms: dict[str, Recipe], out: Path, resume: bool, progress: bool, trust_unverified: bool) -> dict:
    from detour.train.loop import train
    from detour.train.outdir import check_out_dir

    resolved, done = {}, {}
    for name, arm in arms.items():
        resolved[name] = done[name] = _branch_point(name, arm, done, out)
        check_out_dir(out / name, resolved[name], resume)  # a changed recipe is refused now, not after an arm
    summaries, groups = {}, None
    for name, arm in resolved.items():
        folder = out / name
        finished = RunFolder(folder).summary
        if resume and finished.is_file():
            summaries[name] = json.loads(finished.read_text())
        else:
            result = train(arm, folder, resume=resume, progress=progress, trust_unverified=trust_unverified)
            summaries[name] = result.summary
        groups = groups or _groups_of(arm, folder)
    if not summaries["detour"]:  # not the main process under torchrun: rank 0 writes the report
        return {}
    report = compare_arms(summaries, groups)
    write_json(out / TWINS_FILE, report)
    return report


def _groups_of(recipe: Recipe, folder: Path) -> str | None:
    from detour.model.freeze import GROUPS, describe_groups

    named = any(p.freeze and any(x.strip() in GROUPS for x in (p.freeze.layers or "").split(","))
                for p in recipe.phases)
    config = RunFolder(folder).model / "config.json"
    if not named or not config.is_file():
        return None
    return describe_groups(json.loads(config.read_text())["num_hidden_layers"])


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _run(args)
    with folder_lock(args.out, enabled=int(os.environ.get("RANK", "0")) == 0):  # before torch loads: refused at once
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from detour.stop import RESUMABLE_EXIT
    from detour.train.loop import TrainingStopped

    parent, baseline_parent = None, None
    if args.from_run is not None:
        parent = Path(args.from_run)
        missing = [a for a in MAIN_ARMS if not RunFolder(parent / a).is_run()]
        if missing:
            raise DetourError(f"--from {parent}: not a twins folder (no {' or '.join(missing)} run inside); "
                              "`detour train --from` branches a single run")
        baseline_parent = str(parent / "baseline")
    recipe = load_recipe(args.recipe, args.overrides + branch_overrides(args, parent and str(parent / "detour")))
    recipe.grad_accumulation()
    arms = build_arms(recipe, args.arm, args.baseline_arm, args.freeze, baseline_parent)
    if args.dry_run:
        from detour.train.setup import preflight

        for name, arm in arms.items():
            preflight(arm, Path(args.out) / name)
        for name, arm in arms.items():
            print_plan(arm, {"detour": "detour arm", "baseline": "MLM baseline arm"}.get(name, f"arm {name}"))
        return 0
    try:
        report = run_twins(recipe, Path(args.out), resume=args.resume, progress=not args.no_progress, arms=arms,
                           trust_unverified=args.trust_unverified_checkpoint)
    except TrainingStopped as stop:
        print(f"detour twins: {stop}", file=sys.stderr)
        return RESUMABLE_EXIT
    if not report:
        return 0
    for arm, summary in report["arms"].items():
        losses = ", ".join(f"{p} {v['objective']} {v['final_loss']:.4f}" for p, v in summary["phases"].items())
        print(f"{arm:9s} {losses}")
        if "branch" in summary:
            print(f"{'':9s} {describe_branch(summary['branch'])}")
    if report["layer_groups"]:
        print(f"layer groups: {report['layer_groups']}")
    print(f"checks: {describe_checks(report['checks'])}")
    if report["synthetic_data"]:
        print("note: trained on SYNTHETIC text (embedded generator): an engine test, not a result")
    losses = {k: v for k, v in report["end_of_decay_mlm_loss"].items() if k != "phase"}
    print("MLM loss at the end of the decay: " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))
    held_out = {k: v for k, v in report.get("end_of_decay_validation_mlm_loss", {}).items() if k != "phase"}
    if held_out:
        print("held-out MLM loss at the end of the decay: " + ", ".join(f"{k} {v:.4f}" for k, v in held_out.items()))
    failed = check_failures(report, Path(args.out) / TWINS_FILE)
    if failed:
        raise DetourError(failed)
    return 0
