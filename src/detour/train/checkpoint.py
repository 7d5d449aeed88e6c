"""Atomic training checkpoints: weights (safetensors), optimizer, RNG and trainer state.

    ls runs/tiny/detour/checkpoints/    # step-00000040/ ... ; `detour train ... --resume` picks the latest

The newest `checkpoint.keep_last` are kept, plus every phase-end checkpoint (a branch with
`--from RUN --after-phase NAME` starts from one) unless `checkpoint.keep_phase_ends` is false.

A checkpoint is written into a hidden temporary folder and renamed into place, so a folder named
`step-*` is always complete: a crash or kill -9 mid-write leaves only a `.tmp-*` folder, which the
next save or resume removes. Nothing is unpickled: tensors are read with `weights_only=True`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from detour.errors import DetourError
from detour.train.distributed import World

PREFIX = "step-"


@dataclass
class Checkpoint:
    path: Path
    state: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_phase_end(state: dict[str, Any]) -> bool:
    """A checkpoint taken at the end of a phase: the next phase has not consumed a token yet."""
    return state.get("phase_index", 0) > 0 and state.get("phase_tokens", 0) == 0


def save_checkpoint(root: Path, step: int, model, optimizer, generator: torch.Generator,
                    state: dict[str, Any], keep_last: int, world: World | None = None,
                    keep_phase_ends: bool = True) -> Path:
    """Save on every rank: the main rank writes weights, optimizer and state; each rank its RNG."""
    world = world or World()
    final = root / f"{PREFIX}{step:08d}"
    # The temporary name is the same on every rank (no pid) so all ranks write into one folder.
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    if world.main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))  # handles tied weights
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
    world.barrier()
    rng = {"torch": torch.get_rng_state(), "mask_generator": generator.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, tmp / f"rng-{world.rank}.pt")
    world.barrier()
    if world.main:
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # a re-save of the same step (e.g. signal at a phase end)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        _prune(root, keep_last, keep_phase_ends)
    world.barrier()
    return final


def _prune(root: Path, keep_last: int, keep_phase_ends: bool = True) -> None:
    """Keep the newest `keep_last` checkpoints, and every phase-end one (branches start from them)."""
    for stale in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    complete = list_checkpoints(root)
    for old in complete[:-keep_last]:
        if keep_phase_ends and is_phase_end(json.loads((old / "state.json").read_text())):
            continue
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
                  and (p / "state.json").is_file())


def latest_checkpoint(root: Path) -> Checkpoint | None:
    found = list_checkpoints(root)
    if not found:
        return None
    path = found[-1]
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DetourError(f"checkpoint {path} is unreadable: {exc}") from None
    return Checkpoint(path, state)


def restore_checkpoint(ckpt: Checkpoint, model, optimizer, generator: torch.Generator, world: World | None = None) -> None:
    world = world or World()
    saved_world = ckpt.state.get("world_size", 1)
    if saved_world != world.size:
        raise DetourError(f"checkpoint {ckpt.path} was written by {saved_world} process(es); resume it with the same "
                          f"number (got {world.size})")
    missing, unexpected = load_model(model, str(ckpt.path / "model.safetensors"), strict=False)
    if unexpected or missing:
        # Tied decoder weights may be stored once; anything else is a different model.
        real_missing = [k for k in missing if "decoder" not in k]
        if unexpected or real_missing:
            raise DetourError(f"checkpoint {ckpt.path} does not match the model: missing {real_missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True))
    rng = torch.load(ckpt.path / f"rng-{world.rank}.pt", map_location="cpu", weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["mask_generator"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
