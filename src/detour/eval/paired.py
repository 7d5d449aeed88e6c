"""The paired statistics of `detour compare`: the sign-flip test, Holm's correction, the paired bootstrap.

    python -c "from detour.eval.paired import sign_flip_test; print(sign_flip_test([[0.02, 0.01, 0.03]]).p_value)"

`sign_flip_test` gives the p of record: exact up to 2^20 sign patterns, sampled (and still valid)
beyond; `holm` adjusts per-task p-values; `paired_bootstrap` gives the percentile interval of
delta. What each assumes and how each behaves on simulated nulls: detour.eval.significance and
docs/statistics.md (bench/bench_significance.py measures them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detour.errors import DetourError

ALPHA = 0.05  # the level the floor and Holm notes speak of
EXACT_MAX_PATTERNS = 2**20  # count every sign pattern up to this many; sample beyond
PATTERNS = 100_000  # sampled sign patterns when there are more than EXACT_MAX_PATTERNS


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
