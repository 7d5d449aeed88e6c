"""Checks of task specs and their data, made before any model is loaded.

    python -c "from detour.eval.tasks import load_spec; from detour.eval.validate import validate_tasks; \
print({k: len(v['train']) for k, v in validate_tasks([load_spec('ncbi-disease')]).items()})"

`detour eval` runs `validate_tasks` on every task before the first model loads, so a bad spec or a
bad file fails in seconds, not after hours of training on the tasks before it. `prepare_task`
runs `validate_task` too, for code that fine-tunes without the CLI.

Errors (`DetourError`, naming the spec file and field, or the data file and line):
- spec: unknown keys (pydantic, in `load_spec`), reader options that neither the format nor the
  task type reads (a misspelt option would otherwise be ignored), a headline that is not a
  metric the task type reports (the valid names are listed);
- data: a split that does not read (the readers name file:line), examples of the wrong kind for
  the type (text rows for `ner`), an empty split, NER `labels` without `O`, and a per-type
  headline `f1/<type>` whose type is absent from the validation or test examples scored.

Warnings (`WARNING: ...` on stderr): labels seen in validation or test but never in train (the
model cannot predict them); the readers add theirs (orphan I- tags repaired, BRAT entities that a
format cannot hold). Each distinct warning is printed once per process: a task read again, or
prepared for several models, does not repeat it.
"""

from __future__ import annotations

from detour.errors import DetourError
from detour.notices import warn
from detour.eval.tasks import (TaskSpec, _headline_error, _metric_names, _where, check_spec,
                                get_task_type)

def check_splits(spec: TaskSpec, splits: dict[str, list[dict]], budget=None) -> list[str]:
    """What needs the examples; returns the label set. `budget` (max_eval) is the cap applied to
    validation and test, needed to know which examples a per-type headline is scored on."""
    from detour.eval.splits import subsample

    task_type = get_task_type(spec.type)
    for name in ("train", "validation", "test"):
        if not splits.get(name):
            raise DetourError(f"{_where(spec)}: data: the {name} split is empty (see `data` and `split`)")
    needs = getattr(task_type, "example_keys", None)
    if needs:
        for name, examples in splits.items():
            bad = next((ex for ex in examples if any(k not in ex for k in needs)), None)
            if bad is not None:
                raise DetourError(
                    f"{_where(spec)}: type {spec.type!r} needs examples with {', '.join(needs)}, but format "
                    f"{spec.format!r} read {name} examples with {', '.join(sorted(bad))}; pick a format "
                    "(or reader options) that reads this kind of task (see docs/eval.md, Readers)"
                )
    labels = task_type.label_set(spec, splits["train"])
    names = _metric_names(task_type, labels)
    if names is not None and spec.headline not in names:
        raise DetourError(_headline_error(spec, names))
    gold = getattr(task_type, "gold_labels", None)
    if gold is None:
        return labels
    if spec.headline.startswith("f1/"):
        kind = spec.headline[3:]
        cap = getattr(budget, "max_eval", None)
        for name in ("validation", "test"):
            scored = subsample(splits[name], cap)
            if kind not in gold(scored):
                raise DetourError(
                    f"{_where(spec)}: headline: {spec.headline!r} needs {kind} in the {name} split, but none of its "
                    f"{len(scored)} scored example(s) has it (its F1 would be missing); pick a type present there "
                    "or micro_f1 / macro_f1"
                )
    seen = gold(splits["train"])
    for name in ("validation", "test"):
        unseen = sorted(gold(splits[name]) - seen)
        if unseen:
            source = f" ({spec.source})" if spec.source else ""
            warn(f"task {spec.name}{source}: {', '.join(unseen)} appear(s) in the {name} split but never in train: "
                 "the model cannot learn them, so they count as misses")
    return labels


def validate_task(spec: TaskSpec, splits: dict[str, list[dict]], budget=None) -> list[str]:
    """check_spec and check_splits of one task whose splits are read; returns the label set."""
    check_spec(spec)
    return check_splits(spec, splits, budget)


def validate_tasks(specs: list[TaskSpec], budget=None) -> dict[str, dict[str, list[dict]]]:
    """Read and check every task before any training; every task's problems are reported together.

    Returns task name -> {"train", "validation", "test"} -> examples.
    """
    from detour.eval.formats import collecting_line_errors
    from detour.eval.splits import load_splits

    problems, out = [], {}
    for spec in specs:
        try:
            check_spec(spec)
            with collecting_line_errors() as bad_lines:
                try:
                    splits = load_splits(spec)
                except DetourError as exc:  # e.g. no example left: say it after the lines that caused it
                    raise DetourError("\n".join(_first(bad_lines) + [str(exc)])) from None
            found = _first(bad_lines)
            try:
                check_splits(spec, splits, budget)  # its warnings too, on the lines that did read
            except DetourError as exc:
                found.append(str(exc))
            if found:
                raise DetourError("\n".join(found))
            out[spec.name] = splits
        except DetourError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise DetourError(problems[0])
    if problems:
        raise DetourError(f"{len(problems)} tasks have problems:\n" + "\n".join(problems))
    return out


def _first(messages: list[str], limit: int = 20) -> list[str]:
    """At most `limit` messages, and how many more there were."""
    return messages[:limit] + ([f"... and {len(messages) - limit} more malformed line(s)"] if len(messages) > limit else [])

