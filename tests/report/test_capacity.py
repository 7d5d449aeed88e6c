"""How flat a base had become, as the capacity comparison reports it.

    python -m pytest -q tests/report/test_capacity.py
"""

from __future__ import annotations

import pytest

from detour.report.capacity import base_slope


def _points(curve, phase="mlm"):
    return [{"kind": "validation", "phase": phase, "run_tokens": t, "mlm_loss": loss} for t, loss in curve]


def test_the_slope_is_per_million_tokens_over_the_last_third_of_the_first_phase():
    # steep early, then falling 0.05 per 1M over 12-18M; the anneal's fall must not count
    constant = _points([(0, 10.0), (2e6, 6.0), (6e6, 4.6), (12e6, 4.20), (15e6, 4.05), (18e6, 3.90)])
    anneal = _points([(19e6, 3.70), (20e6, 3.60)], phase="anneal")
    assert base_slope(constant + anneal) == pytest.approx(-0.05)


def test_a_flat_base_shows_zero_and_too_few_points_show_nothing():
    assert base_slope(_points([(0, 10.0), (3e6, 5.0), (4e6, 4.0), (5e6, 4.0), (6e6, 4.0)])) == pytest.approx(0.0)
    assert base_slope(_points([(0, 10.0), (3e6, 5.0)])) is None  # one point in the last third
    assert base_slope([]) is None
