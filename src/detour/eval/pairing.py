"""Which runs of two models `detour compare` pairs, by task and seed, and whether their settings agree.

    python -c "from detour.eval.pairing import load_runs; print(len(load_runs(['docs/reproduction/eval/ncbi-disease/results.json'])))"

`load_runs` reads results.json files of `detour eval`; `select_arms` splits them into model A and
model B (by --a/--b, or one model a file); `pair_tasks` pairs the two models' scores on the seeds
both ran; `check_settings` names every evaluation setting that differs between paired runs, and
each one an older results file did not record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detour.errors import DetourError

SCHEMA = "detour.eval/1"


@dataclass
class TaskDiff:
    task: str
    metric: str
    seeds: list[int]
    a: list[float]
    b: list[float]
    seeds_a: list[int] = field(default_factory=list)  # every seed model A ran on this task
    seeds_b: list[int] = field(default_factory=list)
    p_value: float | None = None  # the sign-flip test over this task's seeds
    p_holm: float | None = None  # p_value after Holm's correction across the compared tasks
    p_floor: float | None = None  # the smallest p_value this task's seed count allows

    @property
    def diffs(self) -> np.ndarray:
        return np.asarray(self.a, dtype=np.float64) - np.asarray(self.b, dtype=np.float64)


# Per-run evaluation settings that must agree for a comparison to compare models, not setups.
# `spec` is the task spec (flattened to spec.<field>), `data_sha256` the examples actually used.
BUDGET_SETTINGS = ("epochs", "train_examples", "validation_examples", "eval_examples", "max_length",
                   "lr", "batch_size", "labels")
IGNORED_SPEC_FIELDS = ("description", "source", "root")  # wording and where the files lie
RECORDED = ("spec", "data_sha256", "linear_probe", *BUDGET_SETTINGS)  # what `detour eval` records


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value


def run_settings(run: dict) -> dict[str, object]:
    """The evaluation settings a run recorded, by name; a setting it did not record is absent."""
    out: dict[str, object] = {}
    if isinstance(run.get("spec"), dict):
        _flatten("spec", {k: v for k, v in run["spec"].items() if k not in IGNORED_SPEC_FIELDS}, out)
    if "data_sha256" in run:
        out["data_sha256"] = run["data_sha256"]
    probe = run.get("linear_probe", (run.get("_config") or {}).get("linear_probe"))
    if probe is not None:  # older runs carry it only in their file's config
        out["linear_probe"] = probe
    budget = run.get("budget") or {}
    out.update({key: budget[key] for key in BUDGET_SETTINGS if key in budget})
    return out


def _show(values: list) -> str:
    if not values:
        return "not recorded"
    shown = [v[:12] if isinstance(v, str) and len(v) == 64 else v for v in values]  # sha256: a prefix
    return str(shown[0]) if len(shown) == 1 else str(shown)


def check_settings(arm_a: list[dict], arm_b: list[dict], pairs: list[TaskDiff]) -> tuple[list[str], list[str]]:
    """(settings that differ between A's and B's paired runs, settings that cannot be checked)."""
    runs = ({(r["task"], int(r["seed"])): r for r in arm_a}, {(r["task"], int(r["seed"])): r for r in arm_b})
    differences: list[str] = []
    missing: dict[tuple[str, str], list[str]] = {}  # (who lacks them, task) -> settings
    for t in pairs:
        values: dict[str, tuple[dict, dict]] = {}  # setting -> (A's values, B's values), seed order
        lacking: dict[str, set[str]] = {}  # setting (top level) -> "A" and/or "B"
        for seed in t.seeds:
            for side, arm_runs in zip("AB", runs):
                settings = run_settings(arm_runs[t.task, seed])
                for top in RECORDED:
                    if not any(k == top or k.startswith(top + ".") for k in settings):
                        lacking.setdefault(top, set()).add(side)
                for key, value in settings.items():
                    seen = values.setdefault(key, ({}, {}))["AB".index(side)]
                    seen.setdefault(json.dumps(value, sort_keys=True), value)
        for key, (va, vb) in values.items():
            if key.split(".")[0] not in lacking and set(va) != set(vb):
                differences.append(f"task {t.task}: {key} differs (A: {_show(list(va.values()))}, "
                                   f"B: {_show(list(vb.values()))})")
        for top, who in lacking.items():
            missing.setdefault((" and ".join(sorted(who)), t.task), []).append(top)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (who, settings) -> tasks
    for (who, task), settings in missing.items():
        grouped.setdefault((who, tuple(settings)), []).append(task)
    unchecked = [f"cannot check {', '.join(settings)} for task(s) {', '.join(tasks)}: not recorded in the "
                 f"results of {who} (written by an older `detour eval`)"
                 for (who, settings), tasks in grouped.items()]
    return differences, unchecked


def load_runs(paths: list[Path]) -> list[dict]:
    """Every run of every results file, each tagged with the file it came from (`_file`, `_index`)."""
    runs: list[dict] = []
    for index, path in enumerate(paths):
        path = Path(path)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise DetourError(f"{path}: no such results file (written by `detour eval --out DIR`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DetourError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise DetourError(f"{path}: field 'schema' must be {SCHEMA!r}, got {data.get('schema') if isinstance(data, dict) else type(data).__name__!r}")
        if not isinstance(data.get("runs"), list):
            raise DetourError(f"{path}: field 'runs' must be a list")
        for i, run in enumerate(data["runs"]):
            for key in ("model", "task", "seed", "metrics"):
                if key not in run:
                    raise DetourError(f"{path}: runs[{i}] has no field {key!r}")
            runs.append({**run, "_file": str(path), "_index": index, "_config": data.get("config") or {}})
    return runs


def _resolve_model(wanted: str, models: list[str], flag: str) -> str:
    """The model as recorded, as results.md labels it, or as a path (relative or absolute, any trailing slash)."""
    from detour.eval.results import display_name

    if wanted in models:
        return wanted
    clean = wanted.rstrip("/")

    def same_path(m: str) -> bool:
        try:
            return Path(m).resolve() == Path(clean).resolve()
        except OSError:
            return False

    for rule in (lambda m: m.rstrip("/") == clean, same_path, lambda m: display_name(m.rstrip("/")) == clean,
                 lambda m: Path(m.rstrip("/")).name == clean):
        matches = [m for m in models if rule(m)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            break
    raise DetourError(f"{flag} {wanted!r}: not found among the models in the results ({', '.join(models)})"
                      if not matches else f"{flag} {wanted!r} is ambiguous: {', '.join(matches)}")


def select_arms(runs: list[dict], n_files: int, a: str | None, b: str | None) -> tuple[list[dict], list[dict], str, str]:
    """Split runs into arm A and arm B, by --a/--b, or by file when two files hold one model each."""
    if a is None and b is None:
        per_file = [sorted({r["model"] for r in runs if r["_index"] == i}) for i in range(n_files)]
        if n_files == 2 and all(len(m) == 1 for m in per_file):
            arm_a = [r for r in runs if r["_index"] == 0]
            arm_b = [r for r in runs if r["_index"] == 1]
            return arm_a, arm_b, per_file[0][0], per_file[1][0]
        models = sorted({r["model"] for r in runs})
        if len(models) == 2 and n_files == 1:
            raise DetourError(f"say which model is A and which is B: --a {models[0]} --b {models[1]} (or the reverse)")
        raise DetourError(f"name the two models with --a and --b; the results hold: {', '.join(models)}")
    if a is None or b is None:
        raise DetourError("give both --a and --b (or neither, with two files of one model each)")
    models = sorted({r["model"] for r in runs})
    name_a, name_b = _resolve_model(a, models, "--a"), _resolve_model(b, models, "--b")
    if name_a == name_b:
        raise DetourError(f"--a and --b both name {name_a!r}: compare two different models")
    return ([r for r in runs if r["model"] == name_a], [r for r in runs if r["model"] == name_b], name_a, name_b)


def _scores(arm: list[dict], model: str, metric: str | None) -> dict[str, dict[int, tuple[float, str]]]:
    """task -> seed -> (score, metric name), refusing duplicates and missing metrics."""
    out: dict[str, dict[int, tuple[float, str]]] = {}
    for run in arm:
        name = metric or run.get("headline")
        if not name:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) has no 'headline'; pass --metric")
        if name not in run["metrics"]:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) has no metric {name!r} "
                              f"(it has: {', '.join(sorted(run['metrics']))})")
        value = run["metrics"][name]
        if value is None or not np.isfinite(float(value)):
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) metric {name!r} is not finite: {value}")
        seeds = out.setdefault(run["task"], {})
        if run["seed"] in seeds:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) appears twice in the results")
        seeds[int(run["seed"])] = (float(value), name)
    return out


def pair_tasks(arm_a: list[dict], arm_b: list[dict], name_a: str, name_b: str,
               tasks: list[str] | None, metric: str | None) -> list[TaskDiff]:
    """Per task, the two models' scores on the seeds both ran, paired by seed."""
    sa, sb = _scores(arm_a, name_a, metric), _scores(arm_b, name_b, metric)
    if tasks is None:
        only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
        if only_a or only_b:
            detail = "; ".join(x for x in (f"only {name_a}: {', '.join(only_a)}" if only_a else "",
                                           f"only {name_b}: {', '.join(only_b)}" if only_b else "") if x)
            raise DetourError(f"the two models were not run on the same tasks ({detail}); restrict with --tasks")
        tasks = sorted(sa)
    if not tasks:
        raise DetourError(f"no tasks to compare for {name_a} and {name_b}")
    out = []
    for task in tasks:
        for name, scores in ((name_a, sa), (name_b, sb)):
            if task not in scores:
                raise DetourError(f"task {task!r}: no runs of model {name!r} in the results")
        seeds = sorted(set(sa[task]) & set(sb[task]))
        if not seeds:
            raise DetourError(f"task {task!r}: models {name_a!r} and {name_b!r} share no seed "
                              f"({sorted(sa[task])} vs {sorted(sb[task])})")
        metrics = {sa[task][s][1] for s in seeds} | {sb[task][s][1] for s in seeds}
        if len(metrics) > 1:
            raise DetourError(f"task {task!r}: the runs headline different metrics ({', '.join(sorted(metrics))}); pass --metric")
        out.append(TaskDiff(task, metrics.pop(), seeds, [sa[task][s][0] for s in seeds], [sb[task][s][0] for s in seeds],
                            sorted(sa[task]), sorted(sb[task])))
    return out
