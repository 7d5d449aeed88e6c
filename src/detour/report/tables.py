"""The numbers of the results and freeze tables: headline metric per arm and task, and each arm against the baseline.

    python -c "from detour.report.collect import collect; from detour.report.tables import *; \
s = collect('runs/study'); print(significance_rows(s, results_table(s)))"

Mean and sample standard deviation (ddof=1) over fine-tuning seeds of each task's headline metric,
as `detour eval` summarises them; the average over tasks is the mean of the task means, given only
for an arm evaluated on every task. Significance is `detour.eval.significance.compare` (what
`detour compare` prints) on the tasks both arms ran: the p of record is its paired sign-flip test
(exact up to 2^20 sign patterns), whose floor 2 / 2^N the table states when it keeps the design
from significance; per task, the sign-flip p with Holm's correction across the tasks. The 95%
interval is the paired bootstrap's, with 10,000 resamples, or the number of distinct resamples the
design allows when that is smaller (the refusal of `compare` names this as the fix). Any other
refusal of `compare` (fewer than 2 shared seeds, different evaluation settings) is shown instead of
a p-value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from detour.errors import DetourError
from detour.report.collect import Study

RESAMPLES = 10_000
ALPHA = 0.05


@dataclass
class Cell:
    mean: float
    std: float  # sample std over seeds; 0 for one seed
    n: int
    seeds: list[int]


@dataclass
class ResultsTable:
    arms: list[str]
    tasks: list[str]
    headline: dict[str, str]  # task -> metric
    cells: dict[tuple[str, str], Cell]  # (arm, task)
    average: dict[str, float]  # arm -> mean of its task means (arms with every task)
    labels: dict[str, list[str]]  # arm -> the model labels its runs carry
    budget: dict[str, dict]  # task -> the budget its runs recorded (the first run's)
    linear_probe: dict[str, bool]

    def best(self, task: str) -> float | None:
        """The best value of a column; None when fewer than two arms have one, or all tie (no one is 'best')."""
        values = [self.cells[a, task].mean for a in self.arms if (a, task) in self.cells] if task != "Average" \
            else list(self.average.values())
        return max(values) if len(values) > 1 and max(values) > min(values) else None


@dataclass
class Significance:
    arm: str
    against: str
    tasks: list[str]
    seeds: dict[str, int]  # task -> paired seeds
    delta: float | None = None  # mean over tasks of the mean paired difference, 0-1 scale
    ci: tuple[float, float] | None = None
    p_value: float | None = None  # the sign-flip test's, pooled over tasks x seeds
    resamples: int | None = None  # of the bootstrap interval
    distinct: int | None = None
    refused: str | None = None  # why no p-value
    notes: list[str] = field(default_factory=list)
    test: str | None = None  # how p was counted and its floor (`compare`'s own line)
    p_floor: float | None = None
    task_p: dict[str, tuple[float, float]] = field(default_factory=dict)  # task -> (p, Holm p)
    holm: str | None = None  # how the per-task p were counted, and what the seed count allows

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < ALPHA

    def floor(self) -> float | None:
        return self.p_floor


def results_table(s: Study) -> ResultsTable | None:
    if not s.eval_runs:
        return None
    arms = [a for a in s.arms if any(r["arm"] == a for r in s.eval_runs)]
    arms += sorted({r["arm"] for r in s.eval_runs} - set(arms))  # models evaluated beside the arms
    tasks = list(dict.fromkeys(r["task"] for r in s.eval_runs))
    headline, budget, probe = {}, {}, {}
    for r in s.eval_runs:
        headline.setdefault(r["task"], r.get("headline") or "macro_f1")
        budget.setdefault(r["task"], r.get("budget") or {})
        probe.setdefault(r["task"], bool(r.get("linear_probe")))
    cells, labels = {}, {}
    for arm in arms:
        runs = [r for r in s.eval_runs if r["arm"] == arm]
        labels[arm] = list(dict.fromkeys(r["model"] for r in runs))
        for task in tasks:
            mine = sorted((int(r["seed"]), float(r["metrics"][headline[task]])) for r in runs
                          if r["task"] == task and headline[task] in r["metrics"])
            if mine:
                values = np.array([v for _, v in mine])
                cells[arm, task] = Cell(float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                                        len(values), [k for k, _ in mine])
    average = {a: float(np.mean([cells[a, t].mean for t in tasks])) for a in arms if all((a, t) in cells for t in tasks)}
    return ResultsTable(arms, tasks, headline, cells, average, labels, budget, probe)


def compare_arms(s: Study, table: ResultsTable, arm: str, against: str) -> Significance:
    """`detour compare` of `arm` against `against` on the tasks both ran, through the library."""
    from detour.eval.paired import distinct_resamples
    from detour.eval.pairing import load_runs, pair_tasks
    from detour.eval.significance import compare, describe_holm, describe_test

    tasks = [t for t in table.tasks if (arm, t) in table.cells and (against, t) in table.cells]
    out = Significance(arm, against, tasks, {})
    if len(table.labels[arm]) != 1 or len(table.labels[against]) != 1:
        out.refused = (f"the results name {arm} or {against} under several model paths "
                       f"({', '.join(table.labels[arm] + table.labels[against])}); one path an arm is needed to pair runs")
        return out
    if not tasks:
        out.refused = f"{arm} and {against} share no evaluated task"
        return out
    a, b = table.labels[arm][0], table.labels[against][0]
    try:
        runs = load_runs(s.eval_files)
        pairs = pair_tasks([r for r in runs if r["model"] == a], [r for r in runs if r["model"] == b], a, b, tasks, None)
        out.seeds = {t.task: len(t.seeds) for t in pairs}
        resamples = min(RESAMPLES, distinct_resamples([len(t.seeds) for t in pairs]))
        result = compare(s.eval_files, a, b, tasks, resamples=resamples)
    except DetourError as exc:
        out.refused = str(exc)
        return out
    out.delta, out.ci, out.p_value = result.delta, (result.ci_low, result.ci_high), result.p_value
    out.resamples, out.distinct = result.resamples, result.distinct_resamples
    out.test, out.p_floor, out.holm = describe_test(result), result.p_floor, describe_holm(result)
    out.task_p = {t.task: (t.p_value, t.p_holm) for t in result.tasks}
    out.notes = list(result.unchecked)
    return out


def comparison_pairs(s: Study, arms: list[str]) -> list[tuple[str, str]]:
    """(arm, against) for each compared arm: an arm with `against` (study.json) is compared with that
    arm, which is then a twin and not compared itself; every other arm with the baseline."""
    baseline = s.role("baseline")
    partners = {name: a.against for name, a in s.arms.items() if a.against and name in arms and a.against in arms}
    twins = set(partners.values())
    out = []
    for arm in arms:
        if arm in partners:
            out.append((arm, partners[arm]))
        elif arm != baseline and arm not in twins and baseline in arms:
            out.append((arm, baseline))
    return out


def significance_rows(s: Study, table: ResultsTable | None) -> list[Significance]:
    if table is None:
        return []
    return [compare_arms(s, table, arm, against) for arm, against in comparison_pairs(s, table.arms)]


def _freezes(arm) -> list[tuple[str, dict]]:
    return [(p.get("name"), p["freeze"]) for p in (arm.recipe or {}).get("phases") or [] if p.get("freeze")]


def freeze_arms(s: Study) -> list[str]:
    """Arms named freeze-* or whose recipe freezes other than the detour's does: a freeze every arm
    shares (a head warm-up with the body frozen) is part of the design, not an intervention."""
    detour, baseline = s.role("detour"), s.role("baseline")
    shared = _freezes(s.arms[detour]) if detour in s.arms else []
    return [arm.name for arm in s.arms.values() if arm.name not in (detour, baseline)
            and (arm.name.startswith("freeze-") or _freezes(arm) != shared)]


def layer_groups(s: Study) -> dict[str, list[int]] | None:
    """`low`, `mid`, `late` as the study recorded them (twins.json, trajectory.json), else computed.

    Reading the recorded split keeps `detour report` free of torch: detour.model.freeze, which
    computes it, imports the model code.
    """
    text = (s.twins or {}).get("layer_groups") or ""
    found = {m[0]: list(range(int(m[1]), int(m[2] or m[1]) + 1))
             for m in re.findall(r"\b(low|mid|late) (\d+)(?:-(\d+))?", text)}
    if len(found) == 3:
        return found
    recorded = ((s.trajectory or {}).get("config") or {}).get("groups")
    if isinstance(recorded, dict) and all(g in recorded for g in ("low", "mid", "late")):
        return {g: list(recorded[g]) for g in ("low", "mid", "late")}
    depth = next((a.model_config.get("num_hidden_layers") for a in s.arms.values() if a.model_config), None)
    if not depth or depth < 3:
        return None
    from detour.model.freeze import layer_group_ranges

    return {g: list(r) for g, r in layer_group_ranges(depth).items()}


def _layers(spec: str, groups: dict[str, list[int]] | None) -> list[int] | None:
    """'low', '0-7' or '0-3,8' -> layer indices; None when a part cannot be read."""
    out = set()
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if part in (groups or {}):
            out.update(groups[part])
        elif match:
            out.update(range(int(match[1]), int(match[2] or match[1]) + 1))
        else:
            return None
    return sorted(out)


def frozen_layers(s: Study, arm: str) -> list[tuple[str, str, list[int] | None]]:
    """(phase, what the recipe says, the layer indices it means) for every frozen phase of an arm."""
    groups = None
    out = []
    for p in (s.arms[arm].recipe or {}).get("phases") or []:
        freeze = p.get("freeze") or {}
        if not freeze:
            continue
        what = freeze.get("layers") or "all layers"
        if freeze.get("components"):
            what += f" ({', '.join(freeze['components'])})"
        layers = None
        if freeze.get("layers"):
            groups = groups or layer_groups(s)
            layers = _layers(freeze["layers"], groups)
        out.append((p.get("name", "?"), what, layers))
    return out


def low_layers(s: Study) -> list[int] | None:
    """The transformer layers of the `low` group at the arms' depth."""
    groups = layer_groups(s)
    return groups["low"] if groups else None


def low_divergence(cka: dict, layers: list[int]) -> tuple[float, float | None] | None:
    """Mean divergence over the given transformer layers (counted from 0, as cka.json's rows are read
    by `read_cka_layers`), and the same mean of the noise floor when there is one."""
    rows = [r for r in cka.get("layers") or [] if isinstance(r.get("layer"), int) and r["layer"] in layers]
    if not rows:
        return None
    noise = [r.get("noise_divergence") for r in rows]
    return (float(np.mean([r["divergence"] for r in rows])),
            float(np.mean(noise)) if all(x is not None for x in noise) else None)
