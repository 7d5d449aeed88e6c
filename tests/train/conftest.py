"""Fixtures for engine tests: a small prepared synthetic corpus and a tiny-ModernBERT recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from detour.cli import main as detour
from detour.config import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory, minilm) -> Path:
    out = tmp_path_factory.mktemp("data") / "synthetic"
    rc = detour(["prepare", "synthetic:clinical?docs=80&seed=0", "--tokenizer", str(minilm), "--out", str(out),
                 "--workers", "1"])
    assert rc == 0
    return out


TINY = [
    "model.config.hidden_size=32", "model.config.intermediate_size=48", "model.config.num_hidden_layers=3",
    "model.config.num_attention_heads=2", "model.config.local_attention=16",
    "data.seq_len=64", "batch.global_sequences=4", "batch.micro_batch=2",
    "phases.0.tokens=1300", "phases.0.lr.warmup_tokens=512", "phases.1.tokens=700",
    "checkpoint.every_tokens=512", "checkpoint.keep_last=10",
]


@pytest.fixture
def tiny_recipe(synthetic_data):
    """The shipped tiny recipe, shrunk to seconds; budgets deliberately not multiples of a step."""

    def make(*overrides: str):
        return load_recipe(RECIPES / "tiny-modernbert.yaml",
                           [f"data.sources=[{synthetic_data}]", *TINY, *overrides])

    return make
