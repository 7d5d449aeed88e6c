"""Calibration and power of `detour compare`'s p-values: the sign-flip test of record next to the
paired bootstrap p that earlier versions reported.

    .venv/bin/python bench/bench_significance.py            # 2000 nulls a design, writes bench/results/significance-*.json
    .venv/bin/python bench/bench_significance.py --quick    # 300 nulls a design, nothing written

Simulated paired differences A - B for designs of 3, 5, 9 seeds x 1, 4, 8 tasks, each drawn with
mean 0 and standard deviation 1 per task (before the task's scale) from:
  - normal;
  - skewed: a centred lognormal, (exp(Z) - e^0.5) / sqrt((e - 1) e): mean 0, skewness 6.2; the
    sign-flip test assumes nulls symmetric about 0, and this one is not;
  - mildly skewed: the same with exp(Z / 2): skewness 1.75 (nulls only, no power rows);
  - heavy: Student t with 3 degrees of freedom, over sqrt(3);
  - unequal: normal, with the tasks' variances spread evenly on a log scale from 1 to 10 (the
    standard deviations from 1 to 3.16); with one task it is the normal design and is left out.
For each design and distribution: the rejection rate at alpha 0.05 and 0.01 (reject when p <= alpha)
over --nulls nulls, for
  - sign-flip: detour.eval.paired.sign_flip_test, the mean over tasks of the mean difference
    (the p of record); exact up to 2^20 sign patterns, else --patterns sampled ones;
  - sign-flip standardised: the same test of the mean over tasks of sum(d) / sqrt(sum(d^2));
  - bootstrap: the shift-method p of detour.eval.paired.paired_bootstrap (small-sample
    correction on), with --resamples resamples;
and, of the same runs, the coverage of the bootstrap's 95% percentile interval (the interval
`compare` prints; it moves with the data, so its coverage is the same with or without a true
difference) and the family-wise error rate of the per-task sign-flip p after Holm's correction.
Then the power (rejection rate at 0.05) with a true difference of 0.5 and 1 standard deviation of
each task's differences added to every difference.

The library functions run on all the nulls of a block at once (a leading batch axis): each row
gets exactly the p a single call with that block's seed gives (checked on a few rows each run);
the blocks (--block nulls) have their own seeds. The Monte-Carlo standard error of a rate r over n
nulls is sqrt(alpha (1 - alpha) / n). The target, for the sign-flip test on every symmetric null
(normal, heavy, unequal) and both alphas (48 cells): each cell's rate at most what a test exactly at
its level exceeds with probability 0.05 / 48 (the binomial's quantile), so that a calibrated test
passes all 48 at once with probability at least 0.95; the count of cells beyond alpha + 2 s.e. is
printed beside it. The skewed null is reported as measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

SEEDS = (3, 5, 9)
FAMILY = 0.05  # the chance that a calibrated test fails the target somewhere among all its cells
TASKS = (1, 4, 8)
DISTRIBUTIONS = {
    "normal": "normal, sd 1",
    "skewed": "centred lognormal (exp(Z) - e^0.5) / sqrt((e-1) e): mean 0, sd 1, skewness 6.2",
    "skewed-mild": "centred lognormal of Z/2, scaled to sd 1: skewness 1.75 (nulls only)",
    "heavy": "Student t, 3 degrees of freedom, over sqrt(3): sd 1",
    "unequal": "normal, task variances log-spaced from 1 to 10 (more than one task)",
}
ALPHAS = (0.05, 0.01)
EFFECTS = (0.5, 1.0)  # true difference, in standard deviations of each task's differences
TESTS = ("sign_flip", "sign_flip_standardised", "bootstrap")
LABELS = {"sign_flip": "sign-flip", "sign_flip_standardised": "sign-flip std", "bootstrap": "bootstrap"}
RECORD = "sign_flip"  # the p of record of `detour compare`
SYMMETRIC = ("normal", "heavy", "unequal")
SKEWED = ("skewed", "skewed-mild")
NULL_ONLY = ("skewed-mild",)


def task_scales(distribution: str, tasks: int) -> np.ndarray:
    if distribution == "unequal":
        return np.sqrt(np.logspace(0, 1, tasks))
    return np.ones(tasks)


def draw(distribution: str, rng: np.random.Generator, nulls: int, seeds: int, tasks: int) -> np.ndarray:
    """Differences of mean 0 and sd 1 before the tasks' scales, shape (tasks, nulls, seeds)."""
    shape = (tasks, nulls, seeds)
    if distribution in ("normal", "unequal"):
        x = rng.standard_normal(shape)
    elif distribution in SKEWED:
        sigma = 1.0 if distribution == "skewed" else 0.5
        x = (np.exp(sigma * rng.standard_normal(shape)) - math.exp(sigma**2 / 2)) \
            / math.sqrt((math.exp(sigma**2) - 1) * math.exp(sigma**2))
    elif distribution == "heavy":
        x = rng.standard_t(3, shape) / math.sqrt(3)
    else:
        raise ValueError(distribution)
    return x * task_scales(distribution, tasks)[:, None, None]


def run_block(diffs: np.ndarray, seed: int, resamples: int, patterns: int, per_task: bool) -> dict:
    """Every test's p for one block of nulls, diffs of shape (tasks, nulls, seeds)."""
    from detour.eval.paired import holm, paired_bootstrap, sign_flip_test

    per_task_diffs = list(diffs)
    flip = sign_flip_test(per_task_diffs, patterns=patterns, seed=seed)
    flip_std = sign_flip_test(per_task_diffs, standardise=True, patterns=patterns, seed=seed)
    _, low, high, boot_p = paired_bootstrap(per_task_diffs, resamples, seed, correction=True)
    out = {"sign_flip": flip.p_value, "sign_flip_standardised": flip_std.p_value, "bootstrap": boot_p,
           "ci_low": low, "ci_high": high, "exact": flip.exact, "patterns": flip.patterns}
    if per_task:
        tasks = np.stack([sign_flip_test([d], patterns=patterns, seed=seed).p_value for d in per_task_diffs], axis=-1)
        out["holm_min"] = holm(tasks).min(axis=-1)
    return out


def check_rows(diffs: np.ndarray, block: dict, seed: int, resamples: int, patterns: int, rows=(0, 1)) -> None:
    """The batched p of a few rows equal single calls' (the path `detour compare` takes)."""
    from detour.eval.paired import paired_bootstrap, sign_flip_test

    for r in rows:
        one = [d[r] for d in diffs]
        assert sign_flip_test(one, patterns=patterns, seed=seed).p_value == block["sign_flip"][r]
        assert sign_flip_test(one, True, patterns, seed).p_value == block["sign_flip_standardised"][r]
        _, low, high, p = paired_bootstrap(one, resamples, seed, correction=True)
        assert (p, low, high) == (block["bootstrap"][r], block["ci_low"][r], block["ci_high"][r])


def scenario(index: int, seeds: int, tasks: int, distribution: str, effect: float, args) -> dict:
    """Rates of one design x distribution x true difference over args.nulls nulls."""
    rng = np.random.default_rng([20261202, index])
    scales = task_scales(distribution, tasks)
    truth = float(np.mean(effect * scales))
    parts: dict[str, list] = {}
    for start in range(0, args.nulls, args.block):
        size = min(args.block, args.nulls - start)
        diffs = draw(distribution, rng, size, seeds, tasks) + effect * scales[:, None, None]
        seed = index * 1000 + start // args.block
        block = run_block(diffs, seed, args.resamples, args.patterns, per_task=effect == 0)
        if start == 0:
            check_rows(diffs, block, seed, args.resamples, args.patterns)
        for key, value in block.items():
            parts.setdefault(key, []).append(np.atleast_1d(value))
    p = {k: np.concatenate(v) for k, v in parts.items()}
    row = {"seeds": seeds, "tasks": tasks, "distribution": distribution, "effect_sd": effect, "nulls": args.nulls,
           "exact": bool(p["exact"][0]), "sign_patterns": int(p["patterns"][0]),
           "rates": {t: {str(a): float(np.mean(p[t] <= a)) for a in ALPHAS} for t in TESTS},
           "ci_coverage": float(np.mean((p["ci_low"] <= truth) & (truth <= p["ci_high"])))}
    if effect == 0:
        row["holm_fwer"] = {str(a): float(np.mean(p["holm_min"] <= a)) for a in ALPHAS}
    return row


def se(alpha: float, n: int) -> float:
    return math.sqrt(alpha * (1 - alpha) / n)


def level_bound(alpha: float, nulls: int, cells: int, family: float = FAMILY) -> float:
    """The highest rate a test exactly at level alpha exceeds, over `nulls` nulls, with probability
    at most family / cells: checked on every cell, all cells together pass with probability at
    least 1 - family (Bonferroni). One cell's alpha + 2 s.e. would fail a calibrated test somewhere
    among many cells more often than not (48 cells: about two runs in three)."""
    from scipy.stats import binom

    return float(binom.ppf(1 - family / cells, nulls, alpha)) / nulls


def summarise(rows: list[dict], nulls: int) -> dict:
    """Worst null rate per test and alpha (symmetric nulls, and skewed), and the target."""
    null_rows = [r for r in rows if r["effect_sd"] == 0]
    worst = {}
    for group, dists in (("symmetric", SYMMETRIC), *((d, (d,)) for d in SKEWED)):
        for t in TESTS:
            for a in ALPHAS:
                rates = [(r["rates"][t][str(a)], f"{r['seeds']}x{r['tasks']} {r['distribution']}")
                         for r in null_rows if r["distribution"] in dists]
                rate, where = max(rates)
                worst.setdefault(group, {}).setdefault(t, {})[str(a)] = {"rate": rate, "design": where}
    cells = [(r, a) for r in null_rows if r["distribution"] in SYMMETRIC for a in ALPHAS]
    bound = {a: level_bound(a, nulls, len(cells)) for a in ALPHAS}
    checks = {f"{r['seeds']}x{r['tasks']} {r['distribution']} alpha {a}": r["rates"][RECORD][str(a)] <= bound[a]
              for r, a in cells}
    failed = [k for k, ok in checks.items() if not ok]
    beyond_2se = sum(r["rates"][RECORD][str(a)] > a + 2 * se(a, nulls) for r, a in cells)
    return {"worst": worst,
            "target": {"description": f"{LABELS[RECORD]} rate <= what a test exactly at its level exceeds with "
                                      f"probability {FAMILY} / {len(cells)} over {nulls} nulls (Bonferroni over the "
                                      f"{len(cells)} cells: " + ", ".join(f"alpha {a}: {bound[a]:.4f}" for a in ALPHAS)
                                      + ") on every design of the symmetric nulls (normal, heavy, unequal)",
                       "bounds": {str(a): bound[a] for a in ALPHAS}, "met": not failed, "failed": failed,
                       "cells": len(cells), "cells_beyond_alpha_plus_2_se": beyond_2se}}


def table(rows: list[dict], nulls: int) -> str:
    """The null rates with their ratio to alpha, the interval's coverage, Holm's FWER; then the power."""
    lines = []
    head = ["design", "null"] + [f"{LABELS[t]} {a}" for t in TESTS for a in ALPHAS] + \
           ["flip/alpha", "boot/alpha", "CI cover", "Holm FWER .05"]
    body = []
    for r in rows:
        if r["effect_sd"] != 0:
            continue
        rates = r["rates"]
        body.append([f"{r['seeds']}x{r['tasks']}" + ("" if r["exact"] else "*"), r["distribution"],
                     *(f"{rates[t][str(a)]:.4f}" for t in TESTS for a in ALPHAS),
                     f"{rates[RECORD]['0.05'] / 0.05:.2f}x", f"{rates['bootstrap']['0.05'] / 0.05:.2f}x",
                     f"{r['ci_coverage']:.3f}", f"{r['holm_fwer']['0.05']:.4f}"])
    lines.append(_grid(head, body))
    lines.append(f"(rates at alpha 0.05 / 0.01 over {nulls} nulls; Monte-Carlo s.e. {se(0.05, nulls):.4f} / "
                 f"{se(0.01, nulls):.4f}; ratios at 0.05; * sign-flip p from sampled sign patterns)")
    head = ["design", "null"] + [f"{LABELS[t]} {e}sd" for t in TESTS for e in EFFECTS]
    body = []
    for design in sorted({(r["seeds"], r["tasks"]) for r in rows}, key=lambda d: (d[1], d[0])):
        for dist in DISTRIBUTIONS:
            got = {r["effect_sd"]: r for r in rows if (r["seeds"], r["tasks"]) == design and r["distribution"] == dist}
            if EFFECTS[0] in got:
                body.append([f"{design[0]}x{design[1]}", dist,
                             *(f"{got[e]['rates'][t]['0.05']:.3f}" for t in TESTS for e in EFFECTS)])
    lines.append("\npower at alpha 0.05 (true difference in sd of each task's differences):")
    lines.append(_grid(head, body))
    return "\n".join(lines)


def _grid(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [head, *body])


def machine_info() -> dict:
    from bench_data import machine_info as common  # the same machine description as the other benchmarks

    return {**common(), "numpy": np.__version__, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def detour_source() -> dict:
    """The commit checked out, and whether src/detour/eval/paired.py (what is measured) is that
    commit's file."""
    import detour.eval.paired as measured

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    committed = subprocess.run(["git", "show", "HEAD:src/detour/eval/paired.py"], cwd=REPO, capture_output=True)
    same = committed.returncode == 0 and Path(measured.__file__).read_bytes() == committed.stdout
    return {"commit": commit, "paired_matches_commit": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nulls", type=int, default=2000, help="simulated designs per row (default 2000)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--patterns", type=int, default=4999,
                        help="sampled sign patterns beyond 2^20 (default 4999; `detour compare` uses 100000)")
    parser.add_argument("--block", type=int, default=250, help="nulls computed at once, with one seed (default 250)")
    parser.add_argument("--quick", action="store_true", help="300 nulls a row, nothing written")
    parser.add_argument("--out", help="where to write the JSON (default bench/results/significance-<date>-<cores>cpu.json)")
    args = parser.parse_args()
    if args.quick:
        args.nulls = 300
    sys.path.insert(0, str(REPO / "src"))
    info = machine_info()
    started = time.perf_counter()
    rows, index = [], 0
    for tasks in TASKS:
        for seeds in SEEDS:
            for dist in DISTRIBUTIONS:
                if dist == "unequal" and tasks == 1:
                    continue
                for effect in (0.0,) if dist in NULL_ONLY else (0.0, *EFFECTS):
                    index += 1
                    rows.append(scenario(index, seeds, tasks, dist, effect, args))
            print(f"{seeds} seeds x {tasks} tasks done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    wall = time.perf_counter() - started
    info["load_average_at_end"] = os.getloadavg()
    summary = summarise(rows, args.nulls)
    print(table(rows, args.nulls))
    print()
    for group in ("symmetric", *SKEWED):
        for t in TESTS:
            worst = summary["worst"][group][t]
            print(f"worst {group} null rate, {LABELS[t]}: " + "; ".join(
                f"alpha {a}: {w['rate']:.4f} ({w['rate'] / float(a):.2f}x, {w['design']})" for a, w in worst.items()))
    target = summary["target"]
    print(f"\ntarget {target['description']}: {'met' if target['met'] else 'NOT met'}"
          + (f" (failed: {', '.join(target['failed'])})" if target["failed"] else ""))
    print(f"{target['cells_beyond_alpha_plus_2_se']} of {target['cells']} cells beyond alpha + 2 Monte-Carlo s.e. "
          "(a test exactly at its level lands there in 2-3% of cells)")
    print(f"{len(rows)} rows in {wall:.0f} s")
    if args.quick:
        return 0
    from bench_data import results_path

    out = Path(args.out) if args.out else results_path("significance")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "significance-calibration", "nulls_per_row": args.nulls, "resamples": args.resamples,
        "sampled_sign_patterns": args.patterns, "exact_up_to_patterns": 2**20, "block": args.block,
        "alphas": list(ALPHAS), "effects_sd": list(EFFECTS), "designs": [f"{s}x{t}" for t in TASKS for s in SEEDS],
        "distributions": DISTRIBUTIONS,
        "tests": {"sign_flip": "detour.eval.paired.sign_flip_test, mean over tasks of the mean difference "
                               "(the p of record of `detour compare`)",
                  "sign_flip_standardised": "sign_flip_test(standardise=True): mean over tasks of sum(d)/sqrt(sum(d^2))",
                  "bootstrap": "paired_bootstrap's shift-method p, small-sample correction on (the p of earlier versions)"},
        "method": "reject when p <= alpha; ci_coverage: share of rows whose 95% percentile bootstrap interval "
                  "(correction on) holds the true mean difference; holm_fwer: share of null rows where any task's "
                  "sign-flip p after Holm's correction is <= alpha; the batched p of the first rows of every "
                  "scenario were checked equal to single calls",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "wall_s": round(wall, 1),
        "machine": info, "detour": detour_source(), **summary, "rows": rows,
    }
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
