"""A fine-tuning run's cache key, and which runs `detour eval` reuses, reruns, runs anew or keeps.

    python -c "from detour.eval.runkeys import key_changes; print(key_changes(None, {}))"

A run in OUT/results.json is reused only when its key is unchanged: the model's weights, the task
spec as run, a sha256 of the examples used, the command's options and the seed. Every other run is
(re)run, and `key_changes` says why. Runs not asked for are kept, unless one table would then mix
two setups (`check_runs_not_redone`), which is refused before any training.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from detour.errors import DetourError
from detour.eval.finetune import Budget
from detour.eval.results import Results, display_name, run_key, seed_list
from detour.eval.splits import subsample


# The options that change a run's result, with the flag that sets each (None: the spec's value).
OPTIONS = {"epochs": "--epochs", "max_train": "--max-train", "max_eval": "--max-eval",
           "max_length": "--max-length", "lr": "--lr", "batch_size": "--batch-size",
           "linear_probe": "--linear-probe"}


def spec_record(spec) -> dict:
    """The task spec as run, without where it was read from (paths differ between machines)."""
    return spec.model_dump(mode="json", exclude={"source", "root"})


def examples_sha256(examples: dict[str, list[dict]]) -> str:
    """A fingerprint of the train/validation/test examples actually used (after the caps)."""
    text = json.dumps({k: examples[k] for k in sorted(examples)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def capped_examples(splits: dict, budget: Budget) -> dict[str, list[dict]]:
    """The examples a run trains and scores on: the same seeded caps as prepare_task takes (a run
    checks that both agree before it trains)."""
    return {"train": subsample(splits["train"], budget.max_train),
            "validation": subsample(splits["validation"], budget.max_eval),
            "test": subsample(splits["test"], budget.max_eval)}


def _flat(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value
    return out


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def key_changes(old: dict | None, new: dict) -> str:
    """Why a recorded run does not count for `new`: every part of the key that differs, with both values."""
    if old is None:
        return "no cache key recorded: written by an older detour eval"
    parts = []
    if old["weights"] != new["weights"]:
        parts.append(f"model weights changed: {old['weights'][:19]} -> {new['weights'][:19]}")
    a, b = _flat("", old["spec"], {}), _flat("", new["spec"], {})
    absent = object()  # a field only one side has differs even when the other's value is null
    spec = [f"{k} {_show(a.get(k, '(absent)'))} -> {_show(b.get(k, '(absent)'))}"
            for k in sorted(set(a) | set(b)) if a.get(k, absent) != b.get(k, absent)]
    if spec:
        parts.append("task spec changed: " + ", ".join(spec))
    if old["data_sha256"] != new["data_sha256"]:
        parts.append(f"data changed: sha256 {old['data_sha256'][:12]} -> {new['data_sha256'][:12]}")

    def flag(name, value):
        if name == "linear_probe":
            return "on" if value else "off"
        return "(spec's)" if value is None else _show(value)

    options = [f"{OPTIONS.get(k, k)} {flag(k, old['options'].get(k))} -> {flag(k, new['options'].get(k))}"
               for k in OPTIONS if old["options"].get(k) != new["options"].get(k)]
    if options:
        parts.append("options changed: " + ", ".join(options))
    if old["seed"] != new["seed"]:
        parts.append(f"seed {old['seed']} -> {new['seed']}")
    return "; ".join(parts) or "unchanged"


@dataclass
class TaskPlan:
    """One task of this command: its spec, splits (while still needed) and its part of the key."""

    spec: object
    splits: dict | None
    setting: dict


def groups(rows: list[tuple[str, str, int, str]]) -> list[str]:
    """(model, task, seed, why) rows as one line per model, task and reason: `model task seeds 0-2 (why)`."""
    grouped: dict[tuple[str, str, str], list[int]] = {}
    for model, task, seed, why in rows:
        grouped.setdefault((model, task, why), []).append(seed)
    return [f"{display_name(m)} {t} {seed_list(seeds)}" + (f" ({why})" if why else "")
            for (m, t, why), seeds in grouped.items()]


def reuse_or_run(tasks: list[TaskPlan], models: list[str], seeds: list[int], weights: dict, results: Results):
    """(reused, todo, report): a run whose key is unchanged is reused; any other runs, new or again."""
    reused, todo, report = [], [], {"reused": [], "rerun": [], "new": [], "resume": []}
    for tp in tasks:
        for model in models:
            for seed in seeds:
                key = {"weights": weights[model], "seed": seed, **tp.setting}
                old = results.find(model, tp.spec.name, seed)
                if old is not None and run_key(old) == key:
                    reused.append((model, tp.spec.name, seed))
                    report["reused"].append((model, tp.spec.name, seed, "unchanged"))
                    continue
                todo.append((tp, model, seed, key))
                if old is not None:
                    report["rerun"].append((model, tp.spec.name, seed, key_changes(run_key(old), key)))
                else:
                    report["new"].append((model, tp.spec.name, seed, ""))
    return reused, todo, report


def import_runs(results: Results, other: Results, tasks: list[TaskPlan], models: list[str], seeds: list[int],
                weights: dict) -> int:
    """Copy into `results` the runs of `other` that this command would reuse (the same task and seed,
    and an unchanged key: weights, task setting), unless `results` already holds them so. The
    records are copied whole (timings included): reusing one is reusing what it measured. The model
    is matched by its weights, not its name: a study folder that moved names its models by their
    new paths (the run is then recorded under this command's name)."""
    taken = 0
    for tp in tasks:
        for model in models:
            for seed in seeds:
                key = {"weights": weights[model], "seed": seed, **tp.setting}
                mine = results.find(model, tp.spec.name, seed)
                if mine is not None and run_key(mine) == key:
                    continue
                same = [r for r in other.runs if r["task"] == tp.spec.name and r["seed"] == seed and run_key(r) == key]
                if not same:
                    continue
                theirs = next((r for r in same if r["model"] == model), {**same[0], "model": model})
                if mine is not None:
                    results.runs[results.runs.index(mine)] = theirs
                else:
                    results.runs.append(theirs)
                taken += 1
    return taken


def check_runs_not_redone(results: Results, planned: set, settings: dict, weights: dict) -> list[tuple]:
    """The earlier runs this command does not redo, kept; DetourError if one would share a table with
    this command's runs under other settings: a task's column (one task setting), a model's row (one
    set of weights)."""
    conflicts, kept = [], []
    for run in results.runs:
        where = (run["model"], run["task"], run["seed"])
        if where in planned:
            continue
        key, now = run_key(run), None  # `now`: the key this command would give the run
        if run["task"] in settings or run["model"] in weights:
            now = dict(key or {})
            now.update(settings.get(run["task"], {}))
            if run["model"] in weights:
                now["weights"] = weights[run["model"]]
        if now is not None and key != now:
            conflicts.append((*where, key_changes(key, now)))
        else:
            kept.append((*where, "not asked for this time"))
    if conflicts:
        hints = set()
        for model, task, seed, _ in conflicts:
            if model not in weights:
                hints.add(f"add the model {model}")
            if task not in settings:
                hints.add(f"add {task} to --tasks")
            if model in weights and task in settings:
                hints.add(f"--seeds {max(s for _, _, s, _ in conflicts) + 1}")
        raise DetourError(
            f"{results.out / 'results.json'} holds runs made with other settings that this command would not redo, "
            "and one table would then mix two setups: " + "; ".join(groups(conflicts))
            + f". Redo them too ({', '.join(sorted(hints))}), or use another --out.")
    return kept
