"""A training run's folder before the first step: refuse to overwrite or to resume another recipe,
and clear what a killed run left, detour's own names only.

    python -c "from detour.train.outdir import clean_export_leftovers; print(clean_export_leftovers(__import__('pathlib').Path('runs/demo')))"
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from detour.config import Recipe, recipe_to_dict
from detour.errors import DetourError
from detour.io import write_json
from detour.runs import RunFolder
from detour.train.checkpoint import checkpoint_folders


def check_out_dir(out: Path, recipe: Recipe, resume: bool) -> None:
    """Refuse to overwrite a run that has checkpoints, or to resume one with another recipe."""
    saved = RunFolder(out).recipe
    if not (saved.is_file() and checkpoint_folders(RunFolder(out).checkpoints)):
        return
    if not resume:
        raise DetourError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    from detour.train.branch import first_difference

    # `logging`, `card` and `distributed` never shape the run: a resume may change them (a checkpoint
    # resumes on any number of processes and either strategy), and runs saved before they existed lack them.
    mine, theirs = recipe_to_dict(recipe), json.loads(saved.read_text())
    for key in ("logging", "card", "distributed"):
        mine.pop(key, None)
        theirs.pop(key, None)
    diff = first_difference(mine, theirs, "")
    if diff:
        raise DetourError(f"{out} holds a run of a different recipe ({diff[0]}: {diff[1]!r} now, {diff[2]!r} in "
                          f"{saved}); resume with the same recipe and --set overrides, or choose another --out")


_EXPORT_LEFTOVER = re.compile(r"^(?P<target>.+)\.(?P<kind>tmp|old)-\d+$")


def clean_export_leftovers(out: Path) -> list[str]:
    """Folders a killed export left (`model.tmp-PID`, `export/clm.old-PID`, ...): detour's names only.

    A `.tmp-` folder is an unfinished export: removed. An `.old-` folder is the previous export,
    moved aside just before its replacement was renamed in: put back if the kill came in between,
    else removed.
    """
    done = []
    for parent in [out, RunFolder(out).export_dir, *(p for p in RunFolder(out).export_dir.glob("*") if p.is_dir())]:
        if not parent.is_dir():
            continue
        for folder in sorted(parent.iterdir()):
            m = _EXPORT_LEFTOVER.match(folder.name)
            if not (m and folder.is_dir()):
                continue
            target = folder.with_name(m["target"])
            if m["kind"] == "old" and not target.exists():
                os.replace(folder, target)
                done.append(f"restored {target}")
            else:
                # Exports taken during the phase may have been moved in already: they go back first.
                for sub in sorted(folder.iterdir()):
                    if sub.is_dir() and sub.name.isdigit() and target.is_dir() and not (target / sub.name).exists():
                        os.replace(sub, target / sub.name)
                        done.append(f"restored {target / sub.name}")
                shutil.rmtree(folder)
                done.append(f"removed {folder}")
    return done


def start_out_dir(out: Path, recipe: Recipe, resume: bool) -> None:
    """Called once set-up succeeded, so a failed start leaves nothing behind that looks like a run."""
    out.mkdir(parents=True, exist_ok=True)
    for line in clean_export_leftovers(out):
        print(f"detour: {line} (left by an interrupted export)", file=sys.stderr)
    for stale in sorted(RunFolder(out).checkpoints.glob(".tmp-step-*")):  # a checkpoint a kill cut short
        shutil.rmtree(stale)
        print(f"detour: removed {stale} (an unfinished checkpoint)", file=sys.stderr)
    if not resume or not checkpoint_folders(RunFolder(out).checkpoints):
        RunFolder(out).metrics.unlink(missing_ok=True)  # a fresh start: no stale records
    write_json(RunFolder(out).recipe, recipe_to_dict(recipe))
