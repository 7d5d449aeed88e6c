"""OUT/epoch-checkpoints of `detour eval`: the per-epoch state of each (model, task, seed) whose
fine-tuning has not finished, so a stopped evaluation resumes that seed at its next epoch.

    python -c "from detour.eval.epochs import EpochCheckpoints; from pathlib import Path; \
print(EpochCheckpoints(Path('runs/eval')).path('arms/detour/model', 'gad', 0))"
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from detour.errors import DetourError
from detour.eval.results import display_name
from detour.io import write_text

CHECKPOINT_DIR = "epoch-checkpoints"
CHECKPOINT_MARKER = ".detour-eval"  # says the folder is detour's, so detour may remove what it wrote there


class EpochCheckpoints:
    """OUT/epoch-checkpoints: one file per (model, task, seed) whose training has not finished.

    The folder appears with its marker already in it and disappears whole (each a rename of a
    folder under a name of detour's own), so a kill -9 at any moment never leaves it without the
    marker, which a rerun would take for a folder of the user's.
    """

    def __init__(self, out: Path):
        self.dir = out / CHECKPOINT_DIR
        self._clear_leftovers()
        if self.dir.exists() and not (self.dir / CHECKPOINT_MARKER).is_file():
            raise DetourError(f"{self.dir} exists and was not made by detour eval (no {CHECKPOINT_MARKER} in it); "
                              "move it away or use another --out")

    def _staging(self, what: str) -> Path:
        return self.dir.with_name(f".{CHECKPOINT_DIR}.{what}-{os.getpid()}")

    def _clear_leftovers(self) -> None:
        """Staging folders a killed run left behind: removed when they hold nothing but the marker."""
        for folder in self.dir.parent.glob(f".{CHECKPOINT_DIR}.*-*") if self.dir.parent.is_dir() else ():
            if folder.is_dir() and {p.name for p in folder.iterdir()} <= {CHECKPOINT_MARKER}:
                (folder / CHECKPOINT_MARKER).unlink(missing_ok=True)
                folder.rmdir()

    def path(self, model: str, task: str, seed: int) -> Path:
        def slug(text):
            return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "x"

        # the display name for people, a hash of the full reference for uniqueness
        digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:8]
        return self.dir / f"{slug(display_name(model))}-{digest}.{slug(task)}.seed{seed}.pt"

    def ready(self) -> None:
        if (self.dir / CHECKPOINT_MARKER).is_file():
            return
        staging = self._staging("new")
        staging.mkdir(parents=True, exist_ok=True)
        try:
            write_text(staging / CHECKPOINT_MARKER, "Epoch checkpoints of unfinished detour eval runs: a rerun "
                                                    "resumes from them.\ndetour eval removes each once its run "
                                                    "is finished.\n")
            os.replace(staging, self.dir)
        except BaseException:  # a stop (SIGTERM, Ctrl-C) or a full disk halfway: no staging folder stays
            self._drop(staging)
            raise

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        # the folder goes with its last checkpoint; anything else in it keeps it
        if self.dir.is_dir() and [p.name for p in self.dir.iterdir()] == [CHECKPOINT_MARKER]:
            gone = self._staging("old")
            try:
                os.replace(self.dir, gone)
            finally:  # a stop halfway still removes the renamed folder, which held the marker alone
                self._drop(gone)

    @staticmethod
    def _drop(staging: Path) -> None:
        """A staging folder of this process's, emptied of the marker it may hold."""
        if staging.is_dir():
            (staging / CHECKPOINT_MARKER).unlink(missing_ok=True)
            staging.rmdir()
