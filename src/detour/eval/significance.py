"""`detour compare`: is model A's gain over model B real? A paired sign-flip test over tasks x seeds.

    detour compare runs/eval/results.json --a detour-base --b mlm-base
    detour compare runs/eval/results.json detour-base mlm-base          # the same, positional
    detour compare detour/results.json mlm/results.json          # one model in each file: A, then B
    detour compare results.json --a A --b B --tasks ncbi-disease,gad --metric micro_f1 --out cmp.json
    detour compare one-seed.json --a A --b B --allow    # compare anyway; the output carries WARNINGs

Reads the `results.json` written by `detour eval` (schema `detour.eval/1`), from one file or several.
For each task only seeds run by both models count, and the two models' scores are paired by seed.
The metric is each run's headline metric unless `--metric` names another one. The statistic is
delta, the mean over tasks of the mean paired difference A - B.

The p-value of record is the paired sign-flip (randomisation) test. If A and B are equally good,
each paired difference is as likely to come out negative as positive: its sign is a coin toss given
its size. Flipping the signs of the N = sum over tasks of n_t differences in every possible way
gives the null distribution of the statistic, and the two-sided p is the fraction of the 2^N sign
patterns whose |statistic| is at least the observed one,

    p = #{ s : |T(s * d)| >= |T(d)| } / 2^N.

That p is exact: under the null, P(p <= alpha) <= alpha for any alpha, any number of seeds and any
distribution of the differences that is symmetric about zero. Up to 2^20 patterns (20 paired
differences, e.g. 5 seeds x 4 tasks) they are all counted; beyond that `--patterns` (default
100,000) random patterns are drawn with `--seed` and

    p = (1 + #{ sampled s : |T(s * d)| >= |T(d)| }) / (1 + patterns),

which stays valid (the observed pattern counts as one of the draws). The observed pattern and its
mirror image always count, so an exact p cannot fall below 2 / 2^N (3 seeds x 1 task: 2/8 = 0.25;
5 seeds x 1 task: 2/32 = 0.0625; 3 seeds x 6 tasks: 2/2^18 = 7.6e-06), and a sampled one not below
1 / (1 + patterns); `compare` prints that floor and says when it is at or above 0.05.

What the test assumes: under the null, every paired difference is symmetric about zero and the
differences are independent across seeds and tasks (the seeds are the unit of pairing). That holds
when the two models' scores of a seed are exchangeable; it does not require normality or equal
variances. A null that is skewed (mean zero, but long-tailed on one side) breaks the symmetry,
and the test then answers "is the distribution symmetric about zero?"; bench/bench_significance.py
measures what that does to its error rate (docs/statistics.md).

The statistic: by default the one delta reports, so the p, the interval and the printed difference
speak of the same quantity, in the metric's units, and a task counts as much as its seed noise
makes it count. `--standardise` instead divides each task's sum of differences by the root of its
sum of squares (which no sign flip changes, so the test stays exact; within one task it orders the
patterns as the one-sample t statistic does): every task then weighs the same whatever its scale,
which helps when one very noisy task would drown the others, at the price of a statistic that is no
longer in the metric's units.

Per task, the same test over that task's seeds gives a p (exact for up to 20 seeds), with Holm's
step-down correction across the tasks. With few seeds a task's p has a high floor (2 / 2^n), and
Holm multiplies the smallest by the number of tasks m; when m * 2 / 2^n >= 0.05 no task can be
significant on its own whatever the scores, and `compare` says so and how many seeds would be
needed (the pooled p can still be small).

The 95% confidence interval of delta is the percentile interval of a paired bootstrap: each
resample draws, for every task, seeds with replacement, with the SAME draw applied to both models.
With few seeds a plain bootstrap is too narrow (the resampled variance is (n-1)/n of the unbiased
one), so by default each task's differences are first spread about their mean by sqrt(n / (n-1))
(Davison & Hinkley's modified residuals; `--no-correction` turns it off). Even so its coverage is
below 95% with few seeds (measured on normal differences: 0.81 for 3 seeds x 1 task, 0.93 for
5 x 4; docs/statistics.md, from bench/bench_significance.py). Earlier versions also took the p-value
from this bootstrap (the shift method); on normal nulls of 3-9 seeds x 1-8 tasks it rejected at
alpha 0.05 in 5.5% (9 x 8) to 24% (3 x 1) of them, which is why the p of record is now the
sign-flip test.

Before any resampling, `compare` refuses (DetourError, exit 2) a comparison that cannot mean what
it prints, and `--allow` turns each refusal into a WARNING on stderr and in the JSON:

- a task with fewer than 2 seeds shared by the two models: one difference gives that task a
  zero-width bootstrap interval and a sign-flip p of 1 whatever the difference is;
- fewer distinct resamples than --resamples: per task, the n seeds drawn with replacement form one
  of C(2n-1, n) multisets (the task's mean ignores their order), and the tasks draw independently,
  so the design has prod_t C(2n_t-1, n_t) distinct resamples (2 tasks x 2 seeds: 3 x 3 = 9);
  beyond that N only repeats them, and the interval rests on that many cases. The count is
  printed and written to the JSON;
- evaluation settings that differ between the two models' runs of a task: the task spec, the
  examples used (`data_sha256`), linear probe, epochs, example counts, max length, lr, batch size,
  label count. Settings an older results file did not record are named as not checkable.

`--out FILE` writes the result with schema `detour.compare/2`: `p_value` is the sign-flip p and
`p_method` says so, beside `exact`, `patterns`, `differences`, `p_floor` and `statistic`; each
task carries its own `p_value`, `p_holm`, `p_floor`. In `detour.compare/1` (earlier versions)
`p_value` was the bootstrap's; `read_comparison` reads both.
"""

from __future__ import annotations

import argparse

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from detour import io
from detour.errors import DetourError
from detour.flags import positive_int

SCHEMA = "detour.eval/1"
COMPARE_SCHEMA = "detour.compare/2"
COMPARE_SCHEMAS = ("detour.compare/1", COMPARE_SCHEMA)  # what read_comparison reads
MIN_SEEDS = 2  # paired seeds per task below which the bootstrap says nothing
ALPHA = 0.05  # the level the floor and Holm notes speak of
EXACT_MAX_PATTERNS = 2**20  # count every sign pattern up to this many; sample beyond
PATTERNS = 100_000  # sampled sign patterns when there are more than EXACT_MAX_PATTERNS


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


@dataclass
class Comparison:
    model_a: str
    model_b: str
    metric: str  # "headline" when each task uses its own headline metric
    delta: float  # mean over tasks of the mean difference A - B
    ci_low: float
    ci_high: float
    p_value: float  # the sign-flip test's
    resamples: int
    seed: int
    correction: bool
    tasks: list[TaskDiff]
    distinct_resamples: int = 0  # resamples the design can tell apart (see distinct_resamples)
    allowed: bool = False  # --allow: the refusals below were turned into warnings
    warnings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # settings the results did not record
    statistic: str = "mean"  # the sign-flip statistic: "mean" (delta) or "standardised"
    exact: bool = True  # every sign pattern counted (else `patterns` sampled ones)
    patterns: int = 0  # sign patterns p was counted over
    differences: int = 0  # paired differences flipped: 2^differences patterns in all
    p_floor: float = 0.0  # the smallest p this design (and, when sampled, `patterns`) allows

    def to_dict(self) -> dict:
        out = asdict(self)
        out["schema"] = COMPARE_SCHEMA
        out["p_method"] = "sign-flip"
        out["ci_method"] = "paired bootstrap, percentile" + (", sqrt(n/(n-1)) spread" if self.correction else "")
        for row, task in zip(out["tasks"], self.tasks):
            row["mean_diff"] = float(task.diffs.mean())
            row["mean_a"] = float(np.mean(task.a))
            row["mean_b"] = float(np.mean(task.b))
        return out


def read_comparison(path: Path) -> dict:
    """A `--out` file of `detour compare`, in the fields of detour.compare/2.

    A detour.compare/1 file (written before the sign-flip test) keeps its numbers; its `p_value`
    is the bootstrap's, which `p_method` "bootstrap-shift" says, and the sign-flip fields are None.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in COMPARE_SCHEMAS:
        raise DetourError(f"{path}: field 'schema' must be one of {', '.join(COMPARE_SCHEMAS)}, got {schema!r}")
    if schema == "detour.compare/1":
        data = {**data, "p_method": "bootstrap-shift", "ci_method": "paired bootstrap, percentile"
                + (", sqrt(n/(n-1)) spread" if data.get("correction") else ""),
                "statistic": "mean", "exact": None, "patterns": None, "differences": None, "p_floor": None,
                "tasks": [{**t, "p_value": None, "p_holm": None, "p_floor": None} for t in data.get("tasks", [])]}
    return data


def bootstrap_statistics(per_task_diffs: list[np.ndarray], resamples: int = 10_000, seed: int = 0,
                         correction: bool = True) -> tuple[float, np.ndarray]:
    """(observed statistic, the `resamples` resampled statistics) of the mean over tasks of the
    mean paired difference: each resample draws every task's seeds with replacement.

    Each task's differences may carry leading batch axes (shape (..., n_t), the same ones for every
    task): each batch row is then bootstrapped with the same draws, which is what a single call of
    that row would draw, and the results gain those axes."""
    if resamples < 1:
        raise DetourError(f"--resamples must be at least 1, got {resamples}")
    if not per_task_diffs or any(np.shape(d)[-1] == 0 for d in per_task_diffs):
        raise DetourError("paired bootstrap needs at least one seed for every task")
    rng = np.random.default_rng(seed)
    per_task_diffs = [np.asarray(d, dtype=np.float64) for d in per_task_diffs]
    observed = np.mean([d.mean(axis=-1) for d in per_task_diffs], axis=0)
    boot = 0.0
    for diffs in per_task_diffs:
        n = diffs.shape[-1]
        if correction and n > 1:
            mean = diffs.mean(axis=-1, keepdims=True)
            diffs = mean + (diffs - mean) * np.sqrt(n / (n - 1))
        idx = rng.integers(0, n, size=(resamples, n))
        boot = boot + np.take(diffs, idx, axis=-1).mean(axis=-1)
    boot = boot / len(per_task_diffs)
    return (float(observed) if np.ndim(observed) == 0 else observed), boot


def paired_bootstrap(per_task_diffs: list[np.ndarray], resamples: int = 10_000, seed: int = 0,
                     correction: bool = True):
    """(statistic, ci_low, ci_high, shift-method p) of the mean over tasks of the mean paired difference.

    `per_task_diffs[t]` holds the differences A - B of task t, one per seed (paired by seed).
    `correction` spreads each task's differences by sqrt(n / (n-1)) about their mean first.
    The interval is the percentile interval. The p (the resampled statistics centred on their mean
    standing in for the null, add-one smoothed) is what earlier versions reported; it is too small
    with few seeds and is no longer the p of record (`sign_flip_test` is). Leading batch axes as in
    `bootstrap_statistics`: the four results then carry them.
    """
    observed, boot = bootstrap_statistics(per_task_diffs, resamples, seed, correction)
    centred = np.abs(boot - boot.mean(axis=-1, keepdims=True))
    # A tiny tolerance so float noise in the centring cannot turn "equal" into "smaller".
    extreme = np.count_nonzero(centred >= np.abs(observed)[..., None] - 1e-12, axis=-1)
    p_value = (1 + extreme) / (1 + resamples)
    ci_low, ci_high = np.percentile(boot, [2.5, 97.5], axis=-1)
    if np.ndim(observed) == 0:
        return observed, float(ci_low), float(ci_high), float(p_value)
    return observed, ci_low, ci_high, p_value


@dataclass
class SignFlip:
    """The paired sign-flip test of one design: its statistic, two-sided p and what p counted.
    `statistic` and `p_value` are arrays when the differences carried leading batch axes."""
    statistic: float | np.ndarray
    p_value: float | np.ndarray
    exact: bool  # all 2^differences patterns counted; else `patterns` sampled ones
    patterns: int
    differences: int
    standardised: bool

    @property
    def p_floor(self) -> float:
        """The smallest p the design allows: the observed pattern and its mirror image always count."""
        return 2.0 / 2**self.differences if self.exact else 1.0 / (1 + self.patterns)


def _signs(n: int) -> np.ndarray:
    """Every pattern of n signs, shape (2^n, n), as +-1.0; row 0 is all +1."""
    bits = (np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)) & 1
    return 1.0 - 2.0 * bits


def sign_flip_weights(per_task_diffs: list[np.ndarray], standardise: bool = False) -> np.ndarray:
    """The statistic as a sum over differences, T(d) = sum_j w_j d_j: the weights times the
    differences, concatenated over tasks (shape (..., N)). A sign flip of difference j flips
    the sign of its term, so T(s * d) = sum_j s_j * terms_j."""
    tasks = len(per_task_diffs)
    terms = []
    for d in per_task_diffs:
        d = np.asarray(d, dtype=np.float64)
        if standardise:
            # the root sum of squares is the same for every sign pattern, so dividing by it keeps the test exact
            norm = np.sqrt(np.sum(d * d, axis=-1, keepdims=True))
            terms.append(np.divide(d, norm * tasks, out=np.zeros_like(d), where=norm > 0))
        else:
            terms.append(d / (d.shape[-1] * tasks))
    return np.concatenate(terms, axis=-1)


def _exact_counts(terms: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """Per row of terms (B, N): how many of the 2^N sign patterns have |sum_j s_j terms_j| >= threshold.

    Meet in the middle: the sums of the first half's 2^h patterns and of the second half's
    2^(N-h), sorted, are combined by binary search, so 2^20 patterns cost two sets of 1024 sums.
    """
    rows, n = terms.shape
    half = n // 2
    first = terms[:, :half] @ _signs(half).T
    second = np.sort(terms[:, half:] @ _signs(n - half).T, axis=-1)
    size = second.shape[-1]
    counts = np.empty(rows, dtype=np.int64)
    for r in range(rows):
        a = threshold[r]
        if a <= 0:  # a zero statistic: every pattern is as extreme
            counts[r] = 2**n
            continue
        upper = size - np.searchsorted(second[r], a - first[r], side="left")  # sum >= a
        lower = np.searchsorted(second[r], -a - first[r], side="right")  # sum <= -a
        counts[r] = int(upper.sum() + lower.sum())
    return counts


def sign_flip_test(per_task_diffs: list[np.ndarray], standardise: bool = False, patterns: int = PATTERNS,
                   seed: int = 0, max_exact: int = EXACT_MAX_PATTERNS) -> SignFlip:
    """The two-sided paired sign-flip test of the mean over tasks of the mean paired difference
    (or, `standardise`, of the mean over tasks of sum(d) / sqrt(sum(d^2))).

    `per_task_diffs[t]` holds the differences A - B of task t, one per seed, optionally with
    leading batch axes (shape (..., n_t)). With at most `max_exact` sign patterns all are counted
    (p exact); otherwise `patterns` random ones from `seed`, the same for every batch row, and
    p = (1 + #as extreme) / (1 + patterns).
    """
    if not per_task_diffs or any(np.shape(d)[-1] == 0 for d in per_task_diffs):
        raise DetourError("the sign-flip test needs at least one seed for every task")
    if patterns < 1:
        raise DetourError(f"--patterns must be at least 1, got {patterns}")
    terms = sign_flip_weights(per_task_diffs, standardise)
    batch, n = terms.shape[:-1], terms.shape[-1]
    terms = terms.reshape(-1, n)
    observed = terms.sum(axis=-1)
    # The observed pattern and another with the same |sum| are summed in different orders; a
    # relative tolerance keeps float noise from ranking a tie as less extreme.
    threshold = np.abs(observed) - 1e-9 * np.abs(terms).sum(axis=-1)
    exact = 2**n <= max_exact
    if exact:
        p = _exact_counts(terms, threshold) / 2**n
        counted = 2**n
    else:
        rng = np.random.default_rng(seed)
        extreme = np.zeros(len(terms), dtype=np.int64)
        chunk = max(256, 2**22 // (len(terms) + n))
        for start in range(0, patterns, chunk):
            signs = 1.0 - 2.0 * rng.integers(0, 2, size=(min(chunk, patterns - start), n), dtype=np.int8)
            extreme += np.count_nonzero(np.abs(terms @ signs.T) >= threshold[:, None], axis=-1)
        p = (1 + extreme) / (1 + patterns)
        counted = patterns
    observed, p = observed.reshape(batch), p.reshape(batch)
    if not batch:
        observed, p = float(observed), float(p)
    return SignFlip(observed, p, exact, counted, n, standardise)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of the p-values along the last axis (family-wise error control).

    The k-th smallest of m p-values is multiplied by m - k + 1, and each adjusted value is raised
    to the largest before it, so a larger raw p never gets a smaller adjusted one; capped at 1.
    """
    p = np.asarray(p_values, dtype=np.float64)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    scaled = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted = np.minimum(1.0, np.maximum.accumulate(scaled, axis=-1))
    out = np.empty_like(p)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out


def seeds_for_holm(tasks: int, alpha: float = ALPHA) -> int:
    """The fewest seeds a task needs so that its exact p can pass Holm's first step: m * 2 / 2^n < alpha."""
    n = 1
    while tasks * 2.0 / 2**n >= alpha:
        n += 1
    return n


def format_p(p: float) -> str:
    """4 decimals, or 2 significant digits below 0.0001 (an exact p can be far below that)."""
    return f"{p:.4f}" if p >= 1e-4 or p == 0 else f"{p:.1e}"


def distinct_resamples(seed_counts: list[int]) -> int:
    """How many different resamples `bootstrap_statistics` can draw, exactly.

    A task with n seeds draws n of them with replacement; its mean depends only on how often each
    seed was drawn, one of C(2n-1, n) multisets. Tasks draw independently, so the counts multiply.
    """
    return math.prod(math.comb(2 * n - 1, n) for n in seed_counts)


def design_problems(pairs: list[TaskDiff], resamples: int) -> tuple[int, list[str]]:
    """(distinct resamples, what makes a task's test or the bootstrap interval meaningless)."""
    problems = []
    for t in pairs:
        if len(t.seeds) < MIN_SEEDS:
            problems.append(
                f"task {t.task}: {len(t.seeds)} seed shared by the two models (A ran {len(t.seeds_a)}: "
                f"{t.seeds_a}; B ran {len(t.seeds_b)}: {t.seeds_b}); one paired difference gives that task "
                f"a sign-flip p of 1 (2 sign patterns, both as extreme) and a zero-width bootstrap interval "
                f"for any difference; evaluate both with --seeds {MIN_SEEDS} or more (5 is usual)")
    distinct = distinct_resamples([len(t.seeds) for t in pairs])
    if distinct < resamples:
        design = " x ".join(f"C({2 * len(t.seeds) - 1},{len(t.seeds)})" for t in pairs)
        problems.append(
            f"only {distinct} distinct bootstrap resamples exist for {len(pairs)} task(s) with "
            f"{', '.join(str(len(t.seeds)) for t in pairs)} seed(s) ({design}), fewer than "
            f"--resamples {resamples}: the extra resamples only repeat them, so the confidence "
            f"interval rests on {distinct} cases; add seeds or tasks, or lower --resamples to {distinct}")
    return distinct, problems


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


def compare(paths: list[Path], a: str | None = None, b: str | None = None, tasks: list[str] | None = None,
            metric: str | None = None, resamples: int = 10_000, seed: int = 0,
            correction: bool = True, allow: bool = False, patterns: int = PATTERNS,
            standardise: bool = False) -> Comparison:
    """The sign-flip test of A - B (pooled, and per task with Holm) and its bootstrap interval;
    refuses (unless `allow`) a design or setup it cannot judge."""
    runs = load_runs(paths)
    arm_a, arm_b, name_a, name_b = select_arms(runs, len(paths), a, b)
    pairs = pair_tasks(arm_a, arm_b, name_a, name_b, tasks, metric)
    if resamples < 1:
        raise DetourError(f"--resamples must be at least 1, got {resamples}")
    if patterns < 1:
        raise DetourError(f"--patterns must be at least 1, got {patterns}")
    distinct, problems = design_problems(pairs, resamples)
    differences, unchecked = check_settings(arm_a, arm_b, pairs)
    if differences:
        problems.append("the two models were evaluated with different settings, so A - B mixes the model "
                        "with the setup:\n    " + "\n    ".join(differences) +
                        "\n  rerun one of them with the other's settings (same task spec, data and budget flags)")
    if problems and not allow:
        raise DetourError(f"cannot compare A = {name_a} with B = {name_b} reliably:\n  - " + "\n  - ".join(problems) +
                          "\n(pass --allow to compare anyway; the output then carries these warnings)")
    diffs = [t.diffs for t in pairs]
    delta, lo, hi, _ = paired_bootstrap(diffs, resamples, seed, correction)
    test = sign_flip_test(diffs, standardise, patterns, seed)
    per_task = [sign_flip_test([d], patterns=patterns, seed=seed) for d in diffs]
    for t, task_test, adjusted in zip(pairs, per_task, holm([x.p_value for x in per_task])):
        t.p_value, t.p_holm, t.p_floor = task_test.p_value, float(adjusted), task_test.p_floor
    return Comparison(name_a, name_b, metric or "headline", delta, lo, hi, test.p_value, resamples, seed, correction,
                      pairs, distinct_resamples=distinct, allowed=allow, warnings=problems, unchecked=unchecked,
                      statistic="standardised" if standardise else "mean", exact=test.exact,
                      patterns=test.patterns, differences=test.differences, p_floor=test.p_floor)


def _power_of_two(n: int) -> str:
    return f"2^{n} = {2**n}" if n <= 40 else f"2^{n}"


def describe_test(result: Comparison) -> str:
    """How the p of record was counted, and its floor, in one line."""
    n = result.differences
    what = ("the mean over tasks of sum(d) / sqrt(sum(d^2))" if result.statistic == "standardised"
            else "the mean over tasks of the mean difference")
    if result.exact:
        how = f"exact: all {_power_of_two(n)} sign patterns of the {n} paired differences"
        floor = f"p cannot fall below 2/2^{n} = {format_p(result.p_floor)}"
    else:
        how = (f"sampled: {result.patterns} random sign patterns of the {_power_of_two(n)} (seed {result.seed}), "
               f"p = (1 + #as extreme) / (1 + {result.patterns})")
        floor = f"p cannot fall below 1/{result.patterns + 1} = {format_p(result.p_floor)}"
    if result.p_floor >= ALPHA:
        floor += f", so this design cannot show significance at {ALPHA}: add seeds or tasks"
    return f"p: paired sign-flip test over tasks x seeds, two-sided, {how}; statistic: {what}; {floor}"


def describe_holm(result: Comparison) -> str:
    """How the per-task p were counted, and whether the design lets any task be significant alone."""
    m = len(result.tasks)
    text = (f"per task: sign-flip p over the task's seeds, and Holm's step-down correction across the {m} task(s) "
            f"(Holm p)")
    floors = [t.p_floor for t in result.tasks]
    if m * min(floors) >= ALPHA:
        fewest = min(result.tasks, key=lambda t: t.p_floor)
        n = len(fewest.seeds)
        text += (f"; with {n} seed(s) a task's p cannot fall below {format_p(fewest.p_floor)}"
                 + (f" and Holm multiplies the smallest by {m}" if m > 1 else "")
                 + f", so no task can be significant at {ALPHA} on its own: that needs {seeds_for_holm(m)} seeds "
                   f"a task with {m} task(s)")
    return text


def print_comparison(result: Comparison) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"A = {result.model_a}   vs   B = {result.model_b}")
    for col in ("task", "metric", "seeds", "A mean", "B mean", "A - B", "p", "Holm p"):
        table.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for t in result.tasks:
        table.add_row(t.task, t.metric, str(len(t.seeds)), f"{np.mean(t.a):.4f}", f"{np.mean(t.b):.4f}",
                      f"{t.diffs.mean():+.4f}", format_p(t.p_value), format_p(t.p_holm))
    Console().print(table)
    # plain print: a terminal's width must not wrap these lines (people grep them)
    print(f"mean over {len(result.tasks)} tasks of A - B: {result.delta:+.4f}   "
          f"95% CI [{result.ci_low:+.4f}, {result.ci_high:+.4f}]   p = {format_p(result.p_value)}")
    print(describe_test(result))
    print(f"95% CI: percentile interval of the paired bootstrap, {result.resamples} resamples, seed {result.seed}, "
          f"small-sample correction {'on' if result.correction else 'off'}; "
          f"{_count(result.distinct_resamples)} distinct resamples possible (product over tasks of C(2n-1, n))")
    print(describe_holm(result))
    for t in result.tasks:
        dropped = sorted((set(t.seeds_a) | set(t.seeds_b)) - set(t.seeds))
        if dropped:
            print(f"note: task {t.task}: seeds {dropped} were run by one model only and are left out of the pairs")


def _count(n: int) -> str:
    return str(n) if n < 10**12 else f"about {float(n):.3e} ({len(str(n))} digits)"


def print_warnings(result: Comparison) -> None:
    """The refusals --allow turned into warnings, and the settings that could not be checked, on stderr."""
    for text in result.warnings:
        print(f"WARNING: {text}", file=sys.stderr)
    for text in result.unchecked:
        print(f"note: {text}", file=sys.stderr)


def write_json(result: Comparison, out: Path) -> None:
    io.write_json(out, result.to_dict())


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS",
                        help="results.json files (or their folders) written by `detour eval`, "
                        "optionally followed by the two model names (instead of --a/--b)")
    parser.add_argument("--a", help="model A (the name as given to `detour eval`, or its folder name)")
    parser.add_argument("--b", help="model B; without --a/--b, two files of one model each give A then B")
    parser.add_argument("--tasks", help="comma-separated tasks (default: every task both models ran)")
    parser.add_argument("--metric", help="metric to compare (default: each task's headline metric)")
    parser.add_argument("--resamples", type=positive_int, default=10_000,
                        help="bootstrap resamples for the confidence interval (default 10000)")
    parser.add_argument("--patterns", type=positive_int, default=PATTERNS,
                        help=f"random sign patterns for the p-value when there are more than 2^20 (default {PATTERNS}); "
                        "up to 2^20 all are counted and p is exact")
    parser.add_argument("--standardise", action="store_true",
                        help="test the mean over tasks of sum(d) / sqrt(sum(d^2)) (every task weighs the same) "
                        "instead of the mean difference")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and of sampled sign patterns (default 0)")
    parser.add_argument("--no-correction", action="store_true",
                        help="plain bootstrap, without the sqrt(n/(n-1)) small-sample correction")
    parser.add_argument("--out", type=Path, dest="json_out", metavar="FILE",
                        help="also write the result as JSON to FILE (e.g. compare.json)")
    # the flag's earlier name, kept working for one release: every other verb says --out
    parser.add_argument("--json", type=Path, dest="json_deprecated", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--allow", action="store_true",
                        help="compare even with fewer than 2 seeds a task, fewer distinct resamples than "
                        "--resamples, or differing evaluation settings; each becomes a WARNING (stderr and JSON)")


def run(args) -> int:
    paths, a, b = list(args.results), args.a, args.b
    if a is None and b is None and len(paths) >= 3 and not any(p.exists() for p in paths[-2:]):
        paths, a, b = paths[:-2], str(paths[-2]), str(paths[-1])  # `detour compare RESULTS A B`
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    result = compare(paths, a, b, tasks, args.metric, args.resamples, args.seed,
                     correction=not args.no_correction, allow=args.allow, patterns=args.patterns,
                     standardise=args.standardise)
    if getattr(args, "json_deprecated", None) is not None:
        from detour.notices import warn

        warn("detour compare --json is now --out (--json still works in this release)")
        args.json_out = args.json_out or args.json_deprecated
    if args.json_out is not None:  # an unwritable --out fails before anything is printed
        if Path(args.json_out).is_dir():
            raise DetourError(f"--out {args.json_out}: is a folder; give a file name such as {Path(args.json_out) / 'compare.json'}")
        io.ensure_output_dir(Path(args.json_out).parent, "--out (its folder)")
    print_comparison(result)
    print_warnings(result)  # after the table, so they are the last thing on screen
    if args.json_out:
        write_json(result, args.json_out)
        print(f"wrote {args.json_out}")
    return 0
