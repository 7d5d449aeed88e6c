"""Fixtures for the data tests: small corpora prepared with the real MiniLM tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from detour.data.prepare import prepare
from detour.data.sources import parse_source


def prepare_sources(specs: list[str], tokenizer: Path, out: Path, workers: int = 1, **kwargs) -> dict:
    """Run the `detour prepare` pipeline in-process on source arguments."""
    return prepare([(parse_source(s, **kwargs), None) for s in specs], str(tokenizer), out, workers=workers)


@pytest.fixture(scope="session")
def small_corpus(minilm, tmp_path_factory) -> Path:
    """Two unweighted sources: 150 synthetic English cases and 60 synthetic French ones."""
    out = tmp_path_factory.mktemp("prepared") / "small"
    prepare_sources(["synthetic:clinical?docs=150&seed=1", "synthetic:clinical?docs=60&seed=2&lang=fr"], minilm, out)
    return out


@pytest.fixture(scope="session")
def weighted_corpus(minilm, tmp_path_factory) -> Path:
    """A mixture: a large English source at weight 0.3 and a small French one at 0.7 (upsampled)."""
    out = tmp_path_factory.mktemp("prepared") / "mix"
    prepare_sources(["synthetic:clinical?docs=200&seed=3:0.3", "synthetic:clinical?docs=20&seed=4&lang=fr:0.7"],
                    minilm, out)
    return out
