"""Atomic training checkpoints: weights (safetensors), optimizer, RNG and trainer state.

    ls runs/tiny/detour/checkpoints/    # step-00000040/ ... ; `detour train ... --resume` picks the latest

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


def save_checkpoint(root: Path, step: int, model, optimizer, generator: torch.Generator,
                    state: dict[str, Any], keep_last: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))  # handles tied weights
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state(), "mask_generator": generator.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # a re-save of the same step (e.g. signal at a phase end)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    for stale in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    complete = list_checkpoints(root)
    for old in complete[:-keep_last]:
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


def restore_checkpoint(ckpt: Checkpoint, model, optimizer, generator: torch.Generator) -> None:
    missing, unexpected = load_model(model, str(ckpt.path / "model.safetensors"), strict=False)
    if unexpected or missing:
        # Tied decoder weights may be stored once; anything else is a different model.
        real_missing = [k for k in missing if "decoder" not in k]
        if unexpected or real_missing:
            raise DetourError(f"checkpoint {ckpt.path} does not match the model: missing {real_missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(ckpt.path / "optimizer.pt", weights_only=True))
    rng = torch.load(ckpt.path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["mask_generator"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
