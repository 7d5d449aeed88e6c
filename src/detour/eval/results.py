"""results.json (every run, and mean/std per model and task) and results.md, written atomically.

    python -c "from detour.eval.results import Results; r = Results.open('runs/eval', {}); print(r.done())"

Schema `detour.eval/1`: {"schema", "config", "runs": [...], "summary": {model: {task: {metric:
{"mean", "std", "n"}}}}}. A rerun with the same output folder resumes (finished (model, task,
seed) runs are skipped) and refuses a different config, so one file never mixes two evaluations.
std is the sample standard deviation (ddof=1; 0 for a single seed). results.md is rewritten with
results.json every time (`detour eval` also rewrites both when a rerun finds every run cached), so
it never shows a table older than the runs beside it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from detour.errors import DetourError
from detour.io import write_text

SCHEMA = "detour.eval/1"


class Results:
    def __init__(self, out: Path, config: dict, runs: list[dict]):
        self.out, self.config, self.runs = out, config, runs

    @classmethod
    def open(cls, out: str | Path, config: dict) -> "Results":
        out = Path(out)
        path = out / "results.json"
        if not path.exists():
            return cls(out, config, [])
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DetourError(f"{path}: not valid JSON ({exc}); move it away to start afresh") from None
        if data.get("schema") != SCHEMA:
            raise DetourError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
        if data.get("config") != config:
            old, new = data.get("config", {}), config
            diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            raise DetourError(
                f"{path} holds an evaluation with a different config (differs in: {', '.join(diff)}); "
                "use another --out or the same arguments to resume"
            )
        return cls(out, config, data.get("runs", []))

    def done(self) -> set[tuple[str, str, int]]:
        return {(r["model"], r["task"], r["seed"]) for r in self.runs}

    def add(self, run: dict) -> None:
        self.runs.append(run)
        self.write()

    def summary(self) -> dict:
        out: dict = {}
        for model in self.config.get("models", []):
            for task in self.config.get("tasks", []):
                runs = [r for r in self.runs if r["model"] == model and r["task"] == task]
                if not runs:
                    continue
                keys = sorted({k for r in runs for k in r["metrics"]})
                out.setdefault(model, {})[task] = {
                    k: _stats([r["metrics"][k] for r in runs if k in r["metrics"]]) for k in keys
                }
        return out

    def write(self) -> None:
        """Rewrite results.json and results.md together, so the table never describes other runs.

        Both texts are rendered before either file is touched: a failure while rendering leaves
        both files as they were. Each file is replaced atomically.
        """
        summary = self.summary()
        data = {"schema": SCHEMA, "config": self.config, "runs": self.runs, "summary": summary}
        text_json = json.dumps(data, indent=1) + "\n"
        text_md = markdown_table(summary, self.config, self.runs)
        write_text(self.out / "results.json", text_json)
        write_text(self.out / "results.md", text_md)


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": len(arr)}


def display_name(model: str) -> str:
    """A short row label: the folder name (with its parent when the name says nothing)."""
    p = Path(model)
    return f"{p.parent.name}/{p.name}" if p.name in ("model", "hf", "export", "final") and p.parent.name else p.name or model


def headline_of(runs: list[dict], task: str) -> str:
    return next((r["headline"] for r in runs if r["task"] == task), "macro_f1")


def markdown_table(summary: dict, config: dict, runs: list[dict]) -> str:
    """Models as rows, tasks as columns (headline metric x 100, mean ± std), average last;
    per column the best is bold and the second underlined."""
    models = [m for m in config.get("models", []) if m in summary]
    tasks = [t for t in config.get("tasks", []) if any(t in summary[m] for m in models)]
    cells: dict[tuple[str, str], tuple[float, float] | None] = {}
    for m in models:
        means = []
        for t in tasks:
            s = summary[m].get(t, {}).get(headline_of(runs, t))
            cells[m, t] = (100 * s["mean"], 100 * s["std"]) if s else None
            means.append(s["mean"] * 100 if s else math.nan)
        complete = all(not math.isnan(x) for x in means)
        cells[m, "Average"] = (float(np.mean(means)), float("nan")) if complete and means else None
    columns = tasks + ["Average"]
    header = "| Model | " + " | ".join(f"{t} ({headline_of(runs, t)})" if t != "Average" else t for t in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for m in models:
        row = [display_name(m)]
        for c in columns:
            ranked = sorted({cells[x, c][0] for x in models if cells[x, c]}, reverse=True)
            cell = cells[m, c]
            if cell is None:
                row.append("–")
                continue
            text = f"{cell[0]:.1f}" if math.isnan(cell[1]) else f"{cell[0]:.1f} ± {cell[1]:.1f}"
            if len(models) > 1 and cell[0] == ranked[0]:
                text = f"**{text}**"
            elif len(models) > 1 and len(ranked) > 1 and cell[0] == ranked[1]:
                text = f"<u>{text}</u>"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    seeds = config.get("seeds", [])
    note = (
        f"\nHeadline metric x 100, mean ± std over {len(seeds)} seed(s) {seeds}; "
        f"epochs={config.get('epochs')}, max_train={config.get('max_train')}, max_eval={config.get('max_eval')}, "
        f"linear_probe={config.get('linear_probe')}.\n"
    )
    return "\n".join(lines) + "\n" + note
