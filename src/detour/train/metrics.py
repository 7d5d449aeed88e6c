"""The per-step metrics log (`metrics.jsonl`) and the progress bar.

    tail -n 3 runs/tiny/detour/metrics.jsonl

One JSON record per optimizer step: phase, objective, step (within the phase), global_step, tokens
(cumulative within the phase), loss, lr, grad_norm, tokens_per_s, padding_tokens, stream_hash (the
phase's chained hash of every token id consumed so far, as summary.json reports it at the phase end).
A branch (`--from`) starts with a copy of its parent's records up to the branch point.
"""

from __future__ import annotations

import json
from pathlib import Path

from detour.io import write_text
from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class MetricsLog:
    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled  # only the main process writes

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def write_many(self, records: list[dict]) -> None:
        if self.enabled and records:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in records)

    def truncate_after(self, global_step: int) -> None:
        """On resume, drop records of steps the checkpoint does not contain (they will be redone)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill -9
                continue
            if record.get("global_step", 0) <= global_step:
                kept.append(line)
        write_text(self.path, "".join(line + "\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


class Progress:
    """A progress bar per phase with tokens/s and ETA (rich); silent when disabled."""

    def __init__(self, recipe, enabled: bool = True):
        self.recipe = recipe
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} tok"),
                TextColumn("{task.fields[rate]:,.0f} tok/s"), TextColumn("loss {task.fields[loss]:.3f}"),
                TimeElapsedColumn(), TimeRemainingColumn(),
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def start_phase(self, phase, done: int) -> None:
        if self._bar is not None:
            self._task = self._bar.add_task(f"{self.recipe.name}:{phase.name} ({phase.objective})",
                                            total=phase.tokens, completed=done, rate=0.0, loss=float("nan"))

    def advance(self, n_tokens: int, loss: float) -> None:
        if self._bar is not None:
            task = self._bar.tasks[self._task]
            self._bar.update(self._task, advance=n_tokens, loss=loss, rate=task.speed or 0.0)
