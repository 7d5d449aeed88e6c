"""results.json (every run, and mean/std per model and task) and results.md, written atomically.

    python -c "from detour.eval.results import Results; r = Results.open('runs/eval'); print(r.done())"

Schema `detour.eval/1`: {"schema", "config", "runs": [...], "summary": {model: {task: {metric:
{"mean", "std", "n"}}}}}. `config` names what the file holds: its models and tasks (in the order
they first appear) and the seeds present. Each run carries what determines it (weights hash, task
spec, data hash, options, seed: see detour.eval.run); a run added for a (model, task, seed) already
in the file replaces it in place. std is the sample standard deviation (ddof=1; 0 in results.json
for a single seed, "n/a" in results.md). results.md is rewritten with results.json every time
(`detour eval` also rewrites both when a rerun finds every run cached), so it never shows a table
older than the runs beside it.

results.md: the headline table (models x tasks, x 100, two decimals, best bold, second
underlined, average last), then the headline with precision and recall per model and task, then
per-type F1 where the task type reports it, then per task the seeds done and the settings.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from detour.errors import DetourError
from detour.io import write_text

SCHEMA = "detour.eval/1"


class Results:
    def __init__(self, out: Path, runs: list[dict]):
        self.out, self.runs = out, runs

    @classmethod
    def open(cls, out: str | Path) -> "Results":
        out = Path(out)
        path = out / "results.json"
        if not path.exists():
            return cls(out, [])
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DetourError(f"{path}: not valid JSON ({exc}); move it away to start afresh") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise DetourError(f"{path}: schema {got!r}, expected {SCHEMA!r}; move it away or use another --out")
        runs = data.get("runs", [])
        if not isinstance(runs, list) or not all(isinstance(r, dict) and {"model", "task", "seed"} <= set(r) for r in runs):
            raise DetourError(f"{path}: field 'runs' must be a list of runs with model, task and seed; "
                              "move it away or use another --out")
        return cls(out, runs)

    def done(self) -> set[tuple[str, str, int]]:
        return {(r["model"], r["task"], r["seed"]) for r in self.runs}

    def find(self, model: str, task: str, seed: int) -> dict | None:
        return next((r for r in self.runs if (r["model"], r["task"], r["seed"]) == (model, task, seed)), None)

    def add(self, run: dict) -> None:
        """Record a run (replacing the one of the same model, task and seed), then rewrite both files."""
        where = (run["model"], run["task"], run["seed"])
        for i, old in enumerate(self.runs):
            if (old["model"], old["task"], old["seed"]) == where:
                self.runs[i] = run
                break
        else:
            self.runs.append(run)
        self.write()

    def config(self) -> dict:
        return {
            "models": list(dict.fromkeys(r["model"] for r in self.runs)),
            "tasks": list(dict.fromkeys(r["task"] for r in self.runs)),
            "seeds": sorted({r["seed"] for r in self.runs}),
        }

    def summary(self) -> dict:
        out: dict = {}
        config = self.config()
        for model in config["models"]:
            for task in config["tasks"]:
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
        config, summary = self.config(), self.summary()
        data = {"schema": SCHEMA, "config": config, "runs": self.runs, "summary": summary}
        text_json = json.dumps(data, indent=1) + "\n"
        text_md = markdown_table(summary, config, self.runs)
        write_text(self.out / "results.json", text_json)
        write_text(self.out / "results.md", text_md)


def _canonical(value):
    """The value as results.json gives it back (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(value))


def setting_of(run: dict) -> dict:
    """The task's part of a run's cache key: spec contents (not its wording), examples, options.
    Every run of one task in one results.json shares it (detour eval refuses to mix two)."""
    spec = {k: v for k, v in run["spec"].items() if k != "description"}
    return {"spec": _canonical(spec), "data_sha256": run["data_sha256"], "options": _canonical(run["options"])}


def run_key(run: dict) -> dict | None:
    """Everything that determines a finished run's result, from its record: the model's weights,
    the task setting and the seed. None for a run recorded without them (an older detour eval)."""
    if not all(k in run for k in ("weights_sha256", "spec", "data_sha256", "options", "seed")):
        return None
    return {"weights": run["weights_sha256"], "seed": run["seed"], **setting_of(run)}


def collapsed_lines(runs: list[dict], name) -> list[str]:
    """A section naming the fine-tunes that answered alike for every test example, if any."""
    from detour.eval.metrics import collapsed_seeds

    found = collapsed_seeds(runs, lambda r: (r["model"], r["task"]))
    if not found:
        return []
    total = Counter((r["model"], r["task"]) for r in runs)
    lines = ["## Fine-tunes that answered alike for every example", "",
             "| Model | Task | Seeds | Of |", "|---|---|---|---|"]
    lines += [f"| {name(m)} | {t} | {', '.join(map(str, seeds))} | {total[m, t]} |" for (m, t), seeds in found.items()]
    return lines + ["", "These gave one label (or one label set) to every test example, or tagged no entity: their "
                    "score is the floor of that one answer, not a reading of the encoder (a budget too small for "
                    "this model, or a fine-tune that diverged).", ""]


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": len(arr)}


def display_name(model: str) -> str:
    """A short row label: the folder name (with its parent when the name says nothing)."""
    p = Path(model)
    return f"{p.parent.name}/{p.name}" if p.name in ("model", "hf", "export", "final") and p.parent.name else p.name or model


def seed_ranges(seeds: list[int]) -> str:
    """`0`, `0-2`, `0, 2-4`: consecutive seeds as ranges."""
    seeds = sorted(set(seeds))
    parts, start = [], None
    for i, s in enumerate(seeds):
        if start is None:
            start = s
        if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
            parts.append(str(s) if s == start else f"{start}-{s}")
            start = None
    return ", ".join(parts)


def seed_list(seeds: list[int]) -> str:
    """`seed 0`, `seeds 0-2`, `seeds 0, 2-4`."""
    return ("seed " if len(set(seeds)) == 1 else "seeds ") + seed_ranges(seeds)


def _done(seeds: list[int]) -> str:
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} done ({seed_ranges(seeds)})"


def headline_of(runs: list[dict], task: str) -> str:
    return next((r["headline"] for r in runs if r["task"] == task), "macro_f1")


def _cell(stat: dict | None) -> str:
    """A metric x 100 with two decimals, ± its sample std; one seed has no spread (n/a)."""
    if stat is None:
        return "–"
    spread = f"{100 * stat['std']:.2f}" if stat["n"] > 1 else "n/a"
    return f"{100 * stat['mean']:.2f} ± {spread}"


def _headline_table(summary: dict, models: list[str], tasks: list[str], runs: list[dict]) -> list[str]:
    """Models as rows, tasks as columns, average last; per column the best bold, the second underlined."""
    cells: dict[tuple[str, str], tuple[float, str] | None] = {}
    for m in models:
        means = []
        for t in tasks:
            s = summary[m].get(t, {}).get(headline_of(runs, t))
            cells[m, t] = (s["mean"], _cell(s)) if s else None
            means.append(s["mean"] if s else math.nan)
        complete = bool(means) and all(not math.isnan(x) for x in means)
        cells[m, "Average"] = (float(np.mean(means)), f"{100 * float(np.mean(means)):.2f}") if complete else None
    columns = tasks + ["Average"]
    header = "| Model | " + " | ".join(f"{t} ({headline_of(runs, t)})" if t != "Average" else t for t in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for m in models:
        row = [display_name(m)]
        for c in columns:
            scored = [cells[x, c][0] for x in models if cells[x, c]]
            ranked = sorted(set(scored), reverse=True)
            cell = cells[m, c]
            if cell is None:
                row.append("–")
                continue
            text = cell[1]
            if len(scored) > 1 and cell[0] == ranked[0]:  # a model alone in a column is not "best"
                text = f"**{text}**"
            elif len(scored) > 1 and len(ranked) > 1 and cell[0] == ranked[1]:
                text = f"<u>{text}</u>"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _seeds_done(runs: list[dict], model: str, task: str) -> list[int]:
    return sorted(r["seed"] for r in runs if r["model"] == model and r["task"] == task)


def markdown_table(summary: dict, config: dict, runs: list[dict]) -> str:
    """results.md: the headline table, precision and recall, per-type F1, and per task the seeds
    actually done and the settings they were made with."""
    models = [m for m in config.get("models", []) if m in summary]
    tasks = [t for t in config.get("tasks", []) if any(t in summary[m] for m in models)]
    lines = ["# Results", "", *_headline_table(summary, models, tasks, runs), "",
             "Headline metric x 100, mean ± sample std over the seeds done (n/a: one seed, no spread); "
             "the average is over tasks, for models with every task.", ""]

    lines += ["## Headline, precision and recall", "",
              "| Model | Task | Headline | Score | P | R | Seeds |", "|---|---|---|---|---|---|---|"]
    for m in models:
        for t in tasks:
            s = summary[m].get(t)
            if s is None:
                continue
            head = headline_of(runs, t)
            lines.append(f"| {display_name(m)} | {t} | {head} | {_cell(s.get(head))} | {_cell(s.get('precision'))} "
                         f"| {_cell(s.get('recall'))} | {len(_seeds_done(runs, m, t))} |")
    lines += ["", "P and R: micro precision and recall (strict entity spans for NER); – where the task type "
              "reports none.", ""]

    per_type = [(m, t, k[len("f1/"):], s[k]) for m in models for t in tasks
                for s in [summary[m].get(t) or {}] for k in s if k.startswith("f1/")]
    if per_type:
        lines += ["## F1 per type", "", "| Model | Task | Type | F1 |", "|---|---|---|---|"]
        lines += [f"| {display_name(m)} | {t} | {kind} | {_cell(stat)} |" for m, t, kind, stat in per_type]
        lines.append("")

    lines += collapsed_lines(runs, display_name)

    lines += ["## Seeds and settings", ""]
    for t in tasks:
        done = {m: _seeds_done(runs, m, t) for m in models if t in summary[m]}
        if len({tuple(v) for v in done.values()}) == 1:
            seeds = next(iter(done.values()))
            who = "every model" if len(done) > 1 else display_name(next(iter(done)))
            text = f"{_done(seeds)}, for {who}"
        else:
            text = "; ".join(f"{display_name(m)}: {_done(v)}" for m, v in done.items())
        parts = [f"- {t}: {text}.", _settings(next(r for r in runs if r["task"] == t)),
                 _mixed([r for r in runs if r["task"] == t], "settings", _setting_print)]
        lines.append(" ".join(p for p in parts if p))
    for m in models:
        warning = _mixed([r for r in runs if r["model"] == m], "weights", lambda r: r.get("weights_sha256"))
        if warning:
            lines.append(f"- {display_name(m)}: {warning}")
    return "\n".join(lines) + "\n"


def _setting_print(run: dict) -> str | None:
    return json.dumps(setting_of(run), sort_keys=True) if run_key(run) else None


def _mixed(runs: list[dict], what: str, fingerprint) -> str:
    """A warning when runs that share a table cell, column or row were made with different
    settings or weights (a rerun stopped before it replaced them all); empty otherwise."""
    kinds = {fingerprint(r) for r in runs}
    if len(kinds) < 2:
        return ""
    return (f"**Mixed: these runs were made with {len(kinds)} different {what}** (a rerun stopped before it "
            "replaced them all); rerun the same command to finish it.")


def _settings(run: dict) -> str:
    """A run's budget in words (every run of a task in one results.json shares it)."""
    b = run.get("budget") or {}
    if not b:
        return ""
    probe = run.get("linear_probe")
    mode = "linear probe" if probe else ("fine-tuned" if probe is not None else "")
    parts = [f"{b.get('epochs')} epoch(s)", f"lr {b.get('lr')}", f"batch {b.get('batch_size')}",
             f"max length {b.get('max_length')}",
             f"{b.get('train_examples')} train / {b.get('validation_examples')} validation / {b.get('eval_examples')} test examples"]
    return ", ".join(parts + ([mode] if mode else [])) + "."
