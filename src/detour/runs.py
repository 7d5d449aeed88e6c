"""One run folder: what `detour train` writes, and what twins, the study, the analyses and the report read.

    python -c "from detour.runs import RunFolder; print(RunFolder('runs/tiny').describe())"

    RUN/
      recipe.json              the resolved recipe, written when the run starts
      metrics.jsonl            one JSON record per logged step (train loss, lr, tokens, phase), and records
                               of another kind ("kind": "validation": a held-out loss) between them
      checkpoints/step-N/      resumable state (model, optimizer, stream position, manifest of checksums)
      export/PHASE/            a Hugging Face folder at the end of each phase
      export/PHASE/TOKENS/     mid-phase exports (a trajectory's points)
      model/                   the final Hugging Face export, with its model card
      curves.png               the loss curves
      summary.json             written last: its presence means the run finished (with every start and
                               resume of the run under "sessions": where, on what threads and versions)
      .detour-lock             while a process writes here: its flock, pid and command (gone when it ends)

`detour twins --out T` writes one run folder per arm (T/detour, T/baseline, ...) and T/twins.json,
the check that the arms saw the same token stream and the same decay masks; `detour study`
keeps its arms under STUDY/arms/. Names live here alone, so a reader never guesses a path.

Every folder detour writes into while it works (a run, a twins folder, an eval --out, a study, a
report's --out) carries LOCK_FILE; `detour.lock.folder_lock` holds it, and the kernel releases it
when the holder dies, so a kill -9 leaves no stale lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TWINS_FILE = "twins.json"
LOCK_FILE = ".detour-lock"


@dataclass(frozen=True)
class RunFolder:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))  # a str is welcome

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    def export(self, phase: str, tokens: int | None = None) -> Path:
        """The export at the end of `phase`, or after `tokens` tokens of it."""
        folder = self.export_dir / phase
        return folder if tokens is None else folder / str(tokens)

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def curves(self) -> Path:
        return self.root / "curves.png"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    def is_run(self) -> bool:
        """A run started here (its recipe is written)."""
        return self.recipe.is_file()

    def is_finished(self) -> bool:
        return self.summary.is_file()

    def describe(self) -> str:
        names = ("recipe", "metrics", "checkpoints", "export_dir", "model", "curves", "summary")
        return "\n".join(f"{name:12s} {getattr(self, name)}" for name in names)


def read_records(path: str | Path) -> list[dict]:
    """Every record of a metrics.jsonl, in order, of any kind (json.JSONDecodeError on a damaged line)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def read_metrics(path: str | Path) -> list[dict]:
    """The training steps' records of a metrics.jsonl, in order: a record with a "kind" (validation) is
    not a step and is left out."""
    return [r for r in read_records(path) if "kind" not in r]
