"""Recovery of the gap between two probed models, and the rule that says when the gap is noise.

    python -c "from detour.analysis.recovery import recovery; print(recovery([0.6, 0.62], [0.5, 0.5], [0.55, 0.56]))"

Recovery = (F1_transplant - F1_B) / (F1_A - F1_B), per probe seed with seeds paired; the gap is within
noise when |mean F1_A - mean F1_B| < max(min_gap, 2 x the pooled seed std of A and B).
"""

from __future__ import annotations

import math
import statistics

# Half an F1 point: below this a gap between two probed models is not worth a ratio.
DEFAULT_MIN_GAP = 0.005


def stats(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample std (0 for one value; None for none)."""
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def recovery(f1_src: list[float], f1_dst: list[float], f1_block: list[float]) -> dict:
    """Recovery of the A-B gap per seed (seeds paired by position), its mean and std.

    A seed where F1_A equals F1_B has no gap to recover: its recovery is None and the mean and std
    are over the other seeds (None when no seed has a gap).
    """
    if not len(f1_src) == len(f1_dst) == len(f1_block):
        raise ValueError("recovery pairs seeds: the three lists need one value per seed")
    # + 0.0 turns the -0.0 of a zero recovery over a negative gap into 0.0
    per_seed = [None if a == b else (t - b) / (a - b) + 0.0 for a, b, t in zip(f1_src, f1_dst, f1_block)]
    mean, std = stats([r for r in per_seed if r is not None])
    gap = statistics.fmean(f1_src) - statistics.fmean(f1_dst)
    of_means = None if gap == 0 else (statistics.fmean(f1_block) - statistics.fmean(f1_dst)) / gap + 0.0
    return {"recovery_mean": mean, "recovery_std": std, "recovery_per_seed": per_seed,
            "recovery_of_means": of_means}


def gap_noise(f1_src: list[float], f1_dst: list[float], min_gap: float = DEFAULT_MIN_GAP) -> dict:
    """The A-B gap and whether it is within noise: |gap| < max(min_gap, 2 x pooled seed std of A and B)."""
    mean_a, std_a = stats(f1_src)
    mean_b, std_b = stats(f1_dst)
    pooled = math.sqrt((std_a ** 2 + std_b ** 2) / 2)
    threshold = max(min_gap, 2 * pooled)
    gap = mean_a - mean_b
    return {"gap": gap, "pooled_std": pooled, "threshold": threshold, "gap_within_noise": abs(gap) < threshold}


def average_over_tasks(tasks: list[dict], block: str) -> dict:
    """Per seed, the mean recovery over tasks (None where a task has none at that seed); then mean and std."""
    rows = [t["blocks"][block]["recovery_per_seed"] for t in tasks]
    per_seed = [None if any(r is None for r in seed) else statistics.fmean(seed) for seed in zip(*rows)]
    mean, std = stats([r for r in per_seed if r is not None])
    return {"recovery_mean": mean, "recovery_std": std, "recovery_per_seed": per_seed}
