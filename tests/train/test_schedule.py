"""LR shapes follow their formulas at every point, and at phase boundaries."""

import math

import pytest

from detour.config import LRSpec
from detour.train.schedule import lr_at

PEAK = 2e-4


def test_warmup_then_constant():
    spec = LRSpec(shape="constant", warmup_tokens=100)
    assert lr_at(spec, PEAK, 10, 1000) == pytest.approx(PEAK * 0.1)
    assert lr_at(spec, PEAK, 100, 1000) == pytest.approx(PEAK)
    assert lr_at(spec, PEAK, 1000, 1000) == pytest.approx(PEAK)


def test_warmup_fraction():
    spec = LRSpec(shape="constant", warmup_fraction=0.5)
    assert lr_at(spec, PEAK, 250, 1000) == pytest.approx(PEAK / 2)


@pytest.mark.parametrize("t", [0, 1, 250, 500, 999, 1000])
def test_one_minus_sqrt(t):
    spec = LRSpec(shape="1-sqrt", final_lr_fraction=0.1)
    assert lr_at(spec, PEAK, t, 1000) == pytest.approx(PEAK * (0.1 + 0.9 * (1 - math.sqrt(t / 1000))))


def test_decays_end_at_final_fraction():
    for shape in ("1-sqrt", "linear", "cosine"):
        spec = LRSpec(shape=shape, final_lr_fraction=0.1)
        assert lr_at(spec, PEAK, 0, 1000) == pytest.approx(PEAK)
        assert lr_at(spec, PEAK, 1000, 1000) == pytest.approx(0.1 * PEAK)
    assert lr_at(LRSpec(shape="cosine"), PEAK, 500, 1000) == pytest.approx(PEAK * 0.55)
    assert lr_at(LRSpec(shape="linear"), PEAK, 500, 1000) == pytest.approx(PEAK * 0.55)
