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
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from detour import io
from detour.errors import DetourError
from detour.flags import positive_int
from detour.eval.paired import (ALPHA, PATTERNS, distinct_resamples, format_p, holm, paired_bootstrap, seeds_for_holm,
                                sign_flip_test)
from detour.eval.pairing import TaskDiff, check_settings, load_runs, pair_tasks, select_arms

COMPARE_SCHEMA = "detour.compare/2"
COMPARE_SCHEMAS = ("detour.compare/1", COMPARE_SCHEMA)  # what read_comparison reads
MIN_SEEDS = 2  # paired seeds per task below which the bootstrap says nothing


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
