"""Accuracy cells of the needle probe: counts, 95% Wilson score intervals, and the chance check.

    python -c "from detour.analysis.needle_stats import accuracy_cell; print(accuracy_cell([True] * 8 + [False] * 2))"

Every accuracy in needle.json is a cell `{"accuracy", "n", "ci": [low, high]}` (`accuracy` and
`ci` are null when n = 0). The Wilson interval, unlike the normal approximation, stays inside
[0, 1] and is sensible at the few tens of pairs a length x position cell holds. The probe "beats
chance" only when the interval's lower bound is above the chance level (1 / number of answer
classes): a validation accuracy of 0.6 on 22 pairs is not evidence that the probe learned anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from scipy.stats import binomtest

CONFIDENCE = 0.95


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n trials; None when n = 0 (nothing measured)."""
    if n == 0:
        return None
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def accuracy_cell(correct: Sequence[bool]) -> dict:
    """`{"accuracy", "n", "ci"}` of a list of right/wrong answers."""
    n, k = len(correct), int(sum(bool(c) for c in correct))
    ci = wilson(k, n)
    return {"accuracy": k / n if n else None, "n": n, "ci": None if ci is None else [round(ci[0], 4), round(ci[1], 4)]}


def chance_level(n_classes: int) -> float:
    """Accuracy of guessing among balanced answer classes."""
    return 1.0 / n_classes


def beats_chance(cell: dict, chance: float) -> bool:
    """True only when the cell's interval lies wholly above chance (an empty cell never does)."""
    return cell.get("ci") is not None and cell["ci"][0] > chance


def fmt(cell: dict) -> str:
    """`0.550 [0.420, 0.670]`, or `-` for an empty cell."""
    if cell.get("accuracy") is None:
        return "-"
    return f"{cell['accuracy']:.3f} [{cell['ci'][0]:.3f}, {cell['ci'][1]:.3f}]"
