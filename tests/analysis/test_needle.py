"""`detour needle`: the fact generator, the haystack pairs, the probe end to end on a tiny ModernBERT,
and its accuracy intervals and chance check."""

from __future__ import annotations

import json
import random
import re
import time
import zlib
from collections import Counter

import numpy as np
import pytest

from detour.cli import main
from detour.analysis import needle as needle_module
from detour.analysis.needle_haystack import Haystacks, make_pairs
from detour.analysis.needle_stats import accuracy_cell, beats_chance, chance_level, wilson
from detour.analysis.needle_templates import LEXICONS, TEMPLATES, make_fact, slots


def _pattern(template: str, lexicon: dict) -> re.Pattern:
    """The template's non-slot text kept literally; each slot one value of its lexicon."""
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{'|'.join(map(re.escape, lexicon[p]))})"
                              for i, p in enumerate(parts)) + r"\Z")


@pytest.mark.parametrize("lang", sorted(TEMPLATES))
def test_positives_and_negatives_differ_only_in_slot_values(lang):
    assert len(TEMPLATES[lang]) == 8
    rng = random.Random(0)
    for name, template in TEMPLATES[lang].items():
        assert 2 <= len(slots(template)) <= 4, name
        for label in (1, 0) * 20:
            fact = make_fact(name, lang, label, rng)
            pattern = _pattern(template, LEXICONS[lang])
            needle, query = pattern.match(fact.needle), pattern.match(fact.query)
            assert needle and query, (fact.needle, fact.query)  # same template, same non-slot text
            assert needle.groupdict() == fact.needle_values and query.groupdict() == fact.query_values
            for slot, value in fact.needle_values.items():
                assert value in LEXICONS[lang][slot]
                assert (fact.query_values[slot] == value) == bool(label)  # a negative changes every slot
            assert (fact.query == fact.needle) == bool(label)


@pytest.fixture(scope="module")
def tiny_needle_model(tmp_path_factory, minilm):
    """A tiny random ModernBERT (1,024 positions) saved with the MiniLM tokenizer."""
    import torch
    from transformers import AutoTokenizer, ModernBertModel

    from tests.conftest import tiny_modernbert_config

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-modernbert")
    ModernBertModel(tiny_modernbert_config(max_position_embeddings=1024)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    return folder


def _contains(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i: i + len(sub)] == sub:
            return i
    return -1


def test_pairs_keep_the_needle_at_its_position_and_fit_the_length(minilm_tokenizer, shared_data):
    docs = (shared_data / "corpora/en-biomed/pubmed-abstracts-1mb.txt").read_text(encoding="utf-8").splitlines()[:40]
    hay = Haystacks(docs, minilm_tokenizer)
    pairs = make_pairs(36, [64, 200], ["start", "middle", "end"], "en", hay, seed=1)
    sep = minilm_tokenizer.sep_token_id
    cells = Counter((p.length, p.position, p.fact.label) for p in pairs)
    assert set(cells.values()) == {3}  # balanced: 3 positives and 3 negatives in each length x position
    for p in pairs:
        ids = p.input_ids
        assert p.length - 6 <= len(ids) <= p.length
        needle = minilm_tokenizer(p.fact.needle, add_special_tokens=False)["input_ids"]
        query = minilm_tokenizer(p.fact.query, add_special_tokens=False)["input_ids"]
        assert ids[1: 1 + len(query)] == query and ids[1 + len(query)] == sep
        hay_start = 2 + len(query)
        at = _contains(ids[hay_start:], needle)
        assert at >= 0, p.fact.needle
        if p.position == "start":
            assert at == 0
        elif p.position == "end":
            assert hay_start + at + len(needle) == len(ids) - 1
        else:
            n_hay = len(ids) - 1 - hay_start - len(needle)
            assert abs(at - n_hay / 2) <= max(16, n_hay // 8) + 8


def test_needle_end_to_end_on_tiny_modernbert(tiny_needle_model, tmp_path, capsys):
    out = tmp_path / "needle"
    start = time.time()
    code = main(["needle", str(tiny_needle_model), "--preset", "small", "--lengths", "128,256,512",
                 "--pairs", "150", "--out", str(out), "--device", "cpu"])
    elapsed = time.time() - start
    assert code == 0
    assert elapsed < 120
    result = json.loads((out / "needle.json").read_text())
    assert result["counts"] == {"train": 105, "val": 22, "test": 23}
    test = result["test"]
    assert test["overall"]["n"] == 23 and 0.0 <= test["overall"]["accuracy"] <= 1.0
    assert set(test["per_length"]) == {"128", "256", "512"}
    assert set(test["per_position"]) == {"start", "middle", "end"}
    assert sum(c["n"] for row in test["per_length_position"].values() for c in row.values()) == 23
    assert (out / "needle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stdout = capsys.readouterr().out
    assert "test accuracy" in stdout
    # every accuracy carries its count and its 95% Wilson interval, the form `detour report` reads
    cells = [test["overall"], *test["per_length"].values(), *test["per_position"].values(),
             *(c for row in test["per_length_position"].values() for c in row.values()),
             result["train"]["overall"], result["validation"]]
    for cell in cells:
        assert set(cell) == {"accuracy", "n", "ci"}
        if cell["n"]:
            low, high = cell["ci"]
            assert (low, high) == pytest.approx(wilson(round(cell["accuracy"] * cell["n"]), cell["n"]), abs=1e-4)
            assert 0.0 <= low <= cell["accuracy"] <= high <= 1.0
    assert result["n_classes"] == 2 and result["chance"] == 0.5
    assert result["validation"]["n"] == 22 and result["validation"]["accuracy"] == pytest.approx(result["val_accuracy"])
    # a frozen random encoder carries no trace of the needle: its probe must not pass for one that learned
    assert result["beats_chance_on_validation"] is False
    assert "WARNING: the probe did not beat chance on validation" in stdout
    for n in ("128", "256", "512"):  # a progress line per length while encoding, and its result after the probe
        assert re.search(rf"^length {n}: {result['pairs_per_length'][n]} pairs encoded \(\d+\.\d s\)$", stdout, re.M)
        assert re.search(rf"^length {n}: \d+ pairs, test accuracy \d\.\d{{3}} \[\d\.\d{{3}}, \d\.\d{{3}}\] on \d+ ", stdout, re.M)
    assert sum(result["pairs_per_length"].values()) == 150


def test_linear_probe_on_a_corpus_file_in_french(tiny_needle_model, tmp_path, shared_data):
    out = tmp_path / "fr"
    haystack = shared_data / "corpora/fr-biomed/e3c-fr-layer3-sample.jsonl"
    assert main(["needle", str(tiny_needle_model), "--lang", "fr", "--haystack", str(haystack), "--linear",
                 "--lengths", "128,256", "--pairs", "24", "--epochs", "3", "--out", str(out)]) == 0
    result = json.loads((out / "needle.json").read_text())
    assert result["config"]["probe"] == "linear" and result["config"]["lang"] == "fr"
    assert len(result["val_history"]) == 3


def test_clear_errors(tiny_needle_model, tmp_path, capsys):
    assert main(["needle", str(tiny_needle_model), "--lengths", "2048", "--out", str(tmp_path)]) == 2
    assert "max_position_embeddings (1024)" in capsys.readouterr().err
    assert main(["needle", str(tiny_needle_model), "--haystack", str(tmp_path / "none.txt"), "--out", str(tmp_path)]) == 2
    assert main(["needle", str(tiny_needle_model), "--preset", "huge"]) == 2
    assert not (tmp_path / "needle.json").exists()


def test_an_unusable_out_fails_before_the_model_is_loaded(tmp_path, capsys):
    # the model folder does not exist: reaching the model load would report that instead
    taken = tmp_path / "needle.txt"
    taken.write_text("user notes\n")
    for out, why in [(taken, "exists and is not a folder"), (taken / "needle", "cannot write there")]:
        assert main(["needle", str(tmp_path / "no-model"), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: {why}" in err and "no-model" not in err
    assert taken.read_text() == "user notes\n"


def test_wilson_interval_matches_known_values():
    # reference values: Wilson (1927) score interval, z = 1.96, as in Newcombe (1998) and statsmodels
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(0, 0) is None
    assert accuracy_cell([True] * 8 + [False] * 2) == {"accuracy": 0.8, "n": 10, "ci": [0.4902, 0.9433]}
    assert accuracy_cell([]) == {"accuracy": None, "n": 0, "ci": None}
    assert json.loads(json.dumps(accuracy_cell([]))) == {"accuracy": None, "n": 0, "ci": None}


def test_beating_chance_needs_the_whole_interval_above_it():
    assert chance_level(2) == 0.5 and chance_level(4) == 0.25
    assert not beats_chance(accuracy_cell([True] * 6 + [False] * 4), 0.5)  # 0.6, but [0.31, 0.83]
    assert not beats_chance(accuracy_cell([True] * 14 + [False] * 8), 0.5)  # 0.64 on 22 validation pairs
    assert beats_chance(accuracy_cell([True] * 9 + [False]), 0.5)  # [0.60, 0.98]
    assert beats_chance(accuracy_cell([True] * 6 + [False] * 4), 0.25)  # the same 0.6 beats a 4-way chance
    assert not beats_chance(accuracy_cell([]), 0.5)


def _encoder_that_sees(label_of):
    """A stand-in for the frozen encoder whose CLS vector is `label_of(pair)` plus a little noise."""
    def cls_features(model, pairs, batch_size, device):
        rng = np.random.default_rng(len(pairs))
        x = rng.normal(0.0, 0.1, size=(len(pairs), 16)).astype(np.float32)
        x += np.array([[2.0 * label_of(p) - 1.0] for p in pairs], dtype=np.float32)
        return x
    return cls_features


@pytest.mark.parametrize("sees, beats", [
    ("label", True),  # the answer is in the vector: the probe learns it
    ("shuffled label", False),  # a label unrelated to the answer: nothing to learn
])
def test_the_chance_flag_separates_a_probe_that_learns_from_one_that_cannot(
        sees, beats, tiny_needle_model, tmp_path, monkeypatch, capsys):
    def pseudo_label(pair):
        return zlib.crc32(f"{pair.fact.needle}|{pair.length}|{pair.position}".encode()) % 2

    monkeypatch.setattr(needle_module, "cls_features",
                        _encoder_that_sees((lambda p: p.fact.label) if sees == "label" else pseudo_label))
    out = tmp_path / "needle"
    assert main(["needle", str(tiny_needle_model), "--lengths", "64,128", "--pairs", "120",
                 "--out", str(out), "--device", "cpu"]) == 0
    result = json.loads((out / "needle.json").read_text())
    assert result["beats_chance_on_validation"] is beats
    low = result["validation"]["ci"][0]
    assert (low > 0.8) if beats else (low <= 0.5)
    stdout = capsys.readouterr().out
    assert ("WARNING: the probe did not beat chance on validation" in stdout) is not beats
    if beats:
        assert result["test"]["overall"]["accuracy"] == 1.0
