"""Branching: start a run from another run's checkpoint at the end of one of its phases.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny-decay4k --from runs/tiny --after-phase clm \
        --set phases.1.tokens=4k

A decay-length sweep is N branches of one Phase-1 run, not N Phase-1 runs. The branch carries
everything the parent would have carried into its next phase: weights, AdamW moments, the sampler's
position in the token stream, the MLM mask generator and the torch RNG. So the branch consumes
exactly the tokens the parent consumed (or would have consumed) next, and a branch whose later
phases equal the parent's reproduces the parent bit for bit.

The branch's recipe must equal the parent's in everything that shaped the parent up to that phase
(model, data, optimizer, batch, seed, the CLM head's chunking, and the phases up to and including it);
the first difference is an error naming the field. What comes after (the later phases, checkpoint and
export settings, the name) is the branch's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from detour.config import Recipe, recipe_to_dict
from detour.errors import DetourError
from detour.train.checkpoint import Checkpoint, is_phase_end, list_checkpoints, read_state, verify_checkpoint
from detour.runs import RunFolder

# Recipe fields that determine the parent's state at the end of a phase.
_SHARED_FIELDS = ("model", "data", "optimizer", "batch", "seed", "clm_chunk_size")


def first_difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}.{i}")
            if found:
                return found
        return None
    return None if a == b else (where, a, b)


def parent_recipe(run: Path) -> dict:
    saved = RunFolder(run).recipe
    if not saved.is_file():
        raise DetourError(f"--from {run}: not a detour run folder (no recipe.json)")
    return json.loads(saved.read_text())


def check_matches_parent(recipe: Recipe, parent: dict, run: Path) -> int:
    """Index of the branch phase; DetourError naming the first field that differs from the parent."""
    mine = recipe_to_dict(recipe)
    after = recipe.branch.after_phase
    parent_names = [p["name"] for p in parent.get("phases", [])]
    if after not in parent_names:
        raise DetourError(f"--after-phase {after}: the parent run {run} has no such phase (its phases: {parent_names})")
    k = parent_names.index(after)
    if recipe.phase_index(after) != k:
        raise DetourError(f"--after-phase {after}: it is phase {recipe.phase_index(after)} here but phase {k} in "
                          f"the parent run {run}; the phases before a branch must be the same")
    for field in _SHARED_FIELDS:
        diff = first_difference(mine.get(field), parent.get(field), field)
        if diff:
            raise DetourError(f"{diff[0]}: {diff[1]!r} here but {diff[2]!r} in the parent run {run} (recipe.json); "
                              f"a branch must match its parent in everything up to the end of phase {after!r}")
    for i in range(k + 1):
        diff = first_difference(mine["phases"][i], parent["phases"][i], f"phases.{i}")
        if diff:
            raise DetourError(f"{diff[0]}: {diff[1]!r} here but {diff[2]!r} in the parent run {run} (recipe.json); "
                              f"the phases up to {after!r} must be the parent's")
    return k


def phase_end_checkpoint(run: Path, phase_index: int, phase_name: str) -> Checkpoint:
    for path in reversed(list_checkpoints(RunFolder(run).checkpoints)):
        state = read_state(path)
        if is_phase_end(state) and state["phase_index"] == phase_index + 1:
            problem = verify_checkpoint(path)
            if problem:
                raise DetourError(f"--from {run}: the checkpoint at the end of phase {phase_name!r} cannot be used: {problem}")
            return Checkpoint(path, state)
    raise DetourError(f"--from {run}: no checkpoint at the end of phase {phase_name!r} in {RunFolder(run).checkpoints} "
                      "(the parent has not finished that phase, or its phase-end checkpoint was pruned: "
                      "checkpoint.keep_phase_ends keeps them)")


def branch_start(recipe: Recipe) -> tuple[Checkpoint, dict]:
    """The parent's phase-end checkpoint, and the branch record for summary.json; validated first."""
    run = Path(recipe.branch.run)
    parent = parent_recipe(run)
    k = check_matches_parent(recipe, parent, run)
    ckpt = phase_end_checkpoint(run, k, recipe.branch.after_phase)
    record = {"parent": str(run), "after_phase": recipe.branch.after_phase, "checkpoint": str(ckpt.path),
              "global_step": ckpt.state["global_step"], "global_tokens": ckpt.state["global_tokens"],
              "parent_stream_hashes": {name: r["stream_hash"] for name, r in ckpt.state["phases"].items()}}
    return ckpt, record


def parent_metrics(run: Path, up_to_step: int | None = None) -> list[dict]:
    path = RunFolder(run).metrics
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill -9 of the parent
            continue
    return [r for r in rows if up_to_step is None or r["global_step"] <= up_to_step]


def stream_continuity(branch: dict, summary_phases: dict) -> dict[str, Any]:
    """Per later phase: does the branch's stream equal the parent's over the same steps?

    Each metrics.jsonl line carries the phase's chained stream hash after that step, so the branch's
    final hash must appear at the same step of the parent's phase when the parent got that far.
    """
    rows = [r for r in parent_metrics(Path(branch["parent"])) if "kind" not in r]  # training steps only
    checks = {}
    for name, phase in summary_phases.items():
        if name in branch["parent_stream_hashes"]:
            checks[name] = {"carried": True, "equal": phase["stream_hash"] == branch["parent_stream_hashes"][name]}
            continue
        at = [r for r in rows if r.get("phase") == name and r.get("tokens") == phase["tokens"]]
        if not at or "stream_hash" not in at[-1]:
            checks[name] = {"carried": False, "equal": None,
                            "note": "the parent has no step of this phase at this token count to compare with"}
        else:
            checks[name] = {"carried": False, "equal": at[-1]["stream_hash"] == phase["stream_hash"],
                            "parent_step": at[-1]["step"]}
    return checks


def shared_prefix(recipe: Recipe, other: Recipe) -> int:
    """How many leading phases `recipe` shares with `other` (0 when anything outside the phases differs).

    A run that shares k phases with another can start from that run's checkpoint after phase k-1.
    """
    mine, theirs = recipe_to_dict(recipe), recipe_to_dict(other)
    if any(mine.get(f) != theirs.get(f) for f in _SHARED_FIELDS) or mine.get("branch") != theirs.get("branch"):
        return 0
    k = 0
    for a, b in zip(mine["phases"], theirs["phases"]):
        if a != b:
            break
        k += 1
    return k
