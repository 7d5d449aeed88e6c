"""Atomic training checkpoints: weights (safetensors), optimizer, RNG and trainer state.

    ls runs/tiny/detour/checkpoints/    # step-00000040/ ... ; `detour train ... --resume` picks the latest

The newest `checkpoint.keep_last` are kept, plus every phase-end checkpoint (a branch with
`--from RUN --after-phase NAME` starts from one) unless `checkpoint.keep_phase_ends` is false.

A checkpoint is written into a hidden temporary folder and renamed into place, so a folder named
`step-*` is always complete: a crash or kill -9 mid-write leaves only a `.tmp-*` folder, which the
next save or resume removes. Its `manifest.json`, written last, holds the size and sha256 of every
file; `--resume` verifies it, names a corrupt or truncated file and falls back to the newest good
checkpoint. A checkpoint without a manifest is skipped the same way (named as unverified), unless
`--trust-unverified-checkpoint` accepts it with a warning. A write failure (disk full, read-only, quota) removes the temporary folder and leaves
the earlier checkpoints intact. Nothing is unpickled: tensors are read with `weights_only=True`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from detour.errors import DetourError
from detour.io import file_sha256, is_disk_full, no_space
from detour.train.world import World

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


def read_state(path: Path) -> dict[str, Any] | None:
    """A checkpoint's state.json, or None when it is missing or unreadable."""
    try:
        return json.loads((path / "state.json").read_text())
    except (OSError, ValueError):
        return None


def is_phase_end(state: dict[str, Any] | None) -> bool:
    """A checkpoint taken at the end of a phase: the next phase has not consumed a token yet."""
    return state is not None and state.get("phase_index", 0) > 0 and state.get("phase_tokens", 0) == 0


MANIFEST = "manifest.json"
# A checkpoint with its state but no manifest: written by a detour before checkpoints carried one,
# or a manifest lost since. Nothing says its files are whole, so it is used only when asked for.
UNVERIFIED = f"it has no {MANIFEST}, so its files cannot be verified"
TRUST_FLAG = "--trust-unverified-checkpoint"


class CheckpointWriteError(DetourError):
    """A checkpoint could not be written (disk full, read-only, quota); the previous one is intact."""


def _write_manifest(folder: Path) -> None:
    """Size and sha256 of every file, written last: a checkpoint without it is not complete."""
    files = {f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in sorted(folder.iterdir()) if f.is_file()}
    with open(folder / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump({"format": "detour.checkpoint/1", "files": files}, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def verify_checkpoint(path: Path) -> str | None:
    """None if every file matches the manifest; else what is wrong, naming the file."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        if (path / "state.json").is_file():
            return UNVERIFIED
        return f"{manifest} is missing (the checkpoint is incomplete)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"{manifest} is unreadable ({exc})"
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{f} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{f} is truncated or corrupt: {size:,} bytes, the manifest says {want['bytes']:,}"
        if file_sha256(f) != want["sha256"]:
            return f"{f} is corrupt: its sha256 checksum does not match the manifest"
    return None


def _space(folder: Path, model, optimizer) -> tuple[int, int | None]:
    """(bytes a checkpoint needs, about; bytes free where it is written, or None if unknown)."""
    needed = sum(p.numel() * p.element_size() for p in model.parameters())
    needed += sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
                  if torch.is_tensor(t))
    try:
        return needed, shutil.disk_usage(folder).free
    except OSError:
        return needed, None


def _write_failure(final: Path, error: OSError | None, model, optimizer) -> str:
    needed, free = _space(final.parent, model, optimizer)
    after = "The temporary folder was removed and earlier checkpoints are intact: free space, then rerun with --resume"
    # torch reports a full disk as an internal assertion ("unexpected pos", "iostream error")
    if (error is not None and is_disk_full(error)) or (free is not None and free < needed):
        return no_space(f"checkpoint {final}", final.parent, error, needed, after)
    what = error.strerror if error is not None and error.strerror else str(error or "failed on another rank")
    space = f"it needs about {needed / 2**20:,.0f} MiB" + (
        f"; {free / 2**20:,.0f} MiB are free there" if free is not None else "")
    return f"writing checkpoint {final} failed: {what}; {space}. {after}"


def save_checkpoint(root: Path, step: int, model, optimizer, generator: torch.Generator,
                    state: dict[str, Any], keep_last: int, world: World | None = None,
                    keep_phase_ends: bool = True) -> Path:
    """Save on every rank: the main rank writes weights, optimizer and state; each rank its RNG.

    A write failure on any rank (ENOSPC, EROFS, EDQUOT, ...) removes the temporary folder on the
    main rank and raises CheckpointWriteError everywhere; the previous checkpoints are untouched.
    """
    world = world or World()
    final = root / f"{PREFIX}{step:08d}"
    # The temporary name is the same on every rank (no pid) so all ranks write into one folder.
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    error: OSError | None = None
    if world.main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            save_model(model, str(tmp / "model.safetensors"))  # handles tied weights
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "state.json").write_text(json.dumps(state, indent=2))
        except (OSError, RuntimeError) as exc:  # torch reports a full disk as "basic_ios::clear: iostream error"
            error = exc if isinstance(exc, OSError) else OSError(str(exc))
    world.barrier()
    if not world.any(error is not None):
        rng = {"torch": torch.get_rng_state(), "mask_generator": generator.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        try:
            torch.save(rng, tmp / f"rng-{world.rank}.pt")
        except (OSError, RuntimeError) as exc:  # torch reports a full disk as a RuntimeError
            error = exc if isinstance(exc, OSError) else OSError(str(exc))
    world.barrier()
    failed = world.any(error is not None)  # every rank takes part in each collective, in the same order
    if world.main and not failed:
        try:
            for f in tmp.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            _write_manifest(tmp)
        except OSError as exc:
            error = exc
    if world.any(error is not None):
        if world.main:
            shutil.rmtree(tmp, ignore_errors=True)
        world.barrier()
        raise CheckpointWriteError(_write_failure(final, error, model, optimizer))
    if world.main:
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
        if keep_phase_ends and is_phase_end(read_state(old)):
            continue
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_folders(root: Path) -> list[Path]:
    """Every `step-*` folder, usable or not: a run folder holding any is not a fresh one."""
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)) if root.is_dir() else []


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (unverified: see `latest_checkpoint`)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
                  and ((p / MANIFEST).is_file() or (p / "state.json").is_file()))


def latest_checkpoint(root: Path, warn=None, trust_unverified: bool = False) -> Checkpoint | None:
    """The newest checkpoint whose files match their checksums; corrupt ones are named and skipped.

    A checkpoint without a manifest is skipped as unverified too, unless `trust_unverified` (then
    it is used with a WARNING: an old run's checkpoints). None when there is no checkpoint folder
    at all. Checkpoint folders that are all unusable are an error, never a silent fresh start.
    """
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    candidates = checkpoint_folders(root)
    problems = []
    for path in reversed(candidates):
        problem = verify_checkpoint(path)
        if problem == UNVERIFIED:
            if trust_unverified:
                warn(f"detour: WARNING: resuming from unverified checkpoint {path}: {UNVERIFIED} "
                     f"({TRUST_FLAG}); a damaged file in it would go unnoticed")
                problem = None
            else:
                warn(f"detour: skipping unverified checkpoint {path}: {UNVERIFIED}; {TRUST_FLAG} uses it "
                     "anyway (a checkpoint of an older detour)")
                problems.append(f"{path}: {UNVERIFIED}")
                continue
        if problem is None:
            try:
                state = json.loads((path / "state.json").read_text())
            except (OSError, json.JSONDecodeError) as exc:
                problem = f"{path / 'state.json'} is unreadable ({exc})"
            else:
                if problems:
                    warn(f"detour: resuming from the previous good checkpoint {path}")
                return Checkpoint(path, state)
        warn(f"detour: skipping corrupt checkpoint {path}: {problem}")
        problems.append(problem)
    if problems:
        hint = f" ({TRUST_FLAG} resumes from one without a manifest)" if any(UNVERIFIED in p for p in problems) else ""
        raise DetourError(f"no usable checkpoint in {root}: " + "; ".join(problems)
                          + f". Nothing was deleted; move the folder away to start the run again{hint}")
    return None


def restore_checkpoint(ckpt: Checkpoint, model, optimizer, generator: torch.Generator, world: World | None = None) -> None:
    world = world or World()
    saved_world = ckpt.state.get("world_size", 1)
    if saved_world != world.size and world.main:
        # Weights, optimizer and the sampler are global; masks come from the stream. Only the
        # per-rank dropout RNG has no counterpart: a rank without its own file takes rank 0's.
        print(f"detour: resuming a checkpoint of {saved_world} process(es) on {world.size}: the same token stream "
              "and masks; dropout draws differ from an uninterrupted run", file=sys.stderr)
    missing, unexpected = load_model(model, str(ckpt.path / "model.safetensors"), strict=False)
    if unexpected or missing:
        # Tied decoder weights may be stored once; anything else is a different model.
        real_missing = [k for k in missing if "decoder" not in k]
        if unexpected or real_missing:
            raise DetourError(f"checkpoint {ckpt.path} does not match the model: missing {real_missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True))
    rng_file = ckpt.path / f"rng-{world.rank}.pt"
    if not rng_file.is_file():  # resumed on more processes than wrote the checkpoint
        rng_file = ckpt.path / "rng-0.pt"
    rng = torch.load(rng_file, map_location="cpu", weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["mask_generator"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
