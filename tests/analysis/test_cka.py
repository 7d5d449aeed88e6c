"""Linear CKA, per-layer mean-pooled features, held-out texts, and `detour analyze cka` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from detour.analysis.cka import hidden_states, layer_features, linear_cka, linear_cka_kernel, mean_pool
from detour.analysis.texts import sample_texts
from detour.cli import main
from detour.errors import DetourError

torch.set_num_threads(1)


def _features(n=60, p=12, seed=0):
    return np.random.default_rng(seed).normal(size=(n, p))


# ---- linear CKA ----

def test_cka_of_features_with_themselves_is_one():
    x = _features()
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka_kernel(x, x) == pytest.approx(1.0, abs=1e-12)


def test_invariant_to_orthogonal_transforms_and_isotropic_scaling_only():
    x = _features(p=10)
    y = np.tanh(x @ _features(n=10, p=7, seed=1)) + 0.3 * _features(p=7, seed=2)  # related, not linearly
    q, _ = np.linalg.qr(_features(n=10, p=10, seed=3))
    base = linear_cka(x, y)
    assert 0.2 < base < 0.95
    assert linear_cka(x @ q, y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(25.0 * x, 1e-3 * y) == pytest.approx(base, rel=1e-10)
    assert linear_cka(x + 7.0, y - 3.0) == pytest.approx(base, rel=1e-10)  # column means are removed
    # not invariant to an arbitrary invertible map: stretching one direction changes the value
    stretch = np.diag([30.0] + [1.0] * 9)
    assert abs(linear_cka(x @ stretch, y) - base) > 1e-3


@pytest.mark.parametrize("n,p,q", [(50, 8, 5), (20, 64, 40)])
def test_kernel_form_equals_feature_form(n, p, q):
    x = _features(n, p, seed=4)
    y = x[:, :min(p, q)] @ _features(min(p, q), q, seed=5) + _features(n, q, seed=6)
    assert linear_cka_kernel(x, y) == pytest.approx(linear_cka(x, y), rel=1e-12)


def test_known_values_computed_by_hand():
    # One feature each: CKA is the squared Pearson correlation. Centred x = (-1, 0, 1),
    # y = (-4/3, -1/3, 5/3): (y.x)^2 / (|x|^2 |y|^2) = 3^2 / (2 * 14/3) = 27/28.
    x, y = np.array([[1.0], [2.0], [3.0]]), np.array([[1.0], [2.0], [4.0]])
    assert linear_cka(x, y) == pytest.approx(27 / 28, rel=1e-14)
    assert linear_cka_kernel(x, y) == pytest.approx(27 / 28, rel=1e-14)
    # Three orthogonal centred columns of equal norm (X^T X = 4 I) against the first alone:
    # ||Y^T X||^2 = 16, ||X^T X|| = 4 sqrt(3), ||Y^T Y|| = 4, so CKA = 1 / sqrt(3).
    h = np.array([[1, 1, 1], [-1, 1, -1], [1, -1, -1], [-1, -1, 1]], dtype=float)
    assert linear_cka(h, h[:, :1]) == pytest.approx(1 / math.sqrt(3), rel=1e-14)


def test_float64_keeps_a_small_divergence_that_float32_loses():
    x = _features(200, 32, seed=7)
    y = x + 1e-5 * _features(200, 32, seed=8)  # near-identical layers: d of order 1e-10
    d64, d64_kernel = 1 - linear_cka(x, y), 1 - linear_cka_kernel(x, y)
    assert 1e-12 < d64 < 1e-8
    assert d64_kernel == pytest.approx(d64, rel=1e-3)  # two different computations agree in float64
    d32 = 1 - linear_cka(x, y, dtype=np.float32)
    assert not math.isclose(d32, d64, rel_tol=0.5)


def test_unrelated_random_features_have_low_cka():
    x, y = _features(500, 32, seed=9), _features(500, 32, seed=10)
    related = x @ _features(32, 32, seed=11) + 0.5 * y
    assert linear_cka(x, y) < 0.1  # about 0.06: the small-sample bias of CKA at n = 500, p = q = 32
    assert linear_cka(x, related) > 0.5  # a random linear map distorts, yet stays far above 0.06


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="same number of examples"):
        linear_cka(_features(10), _features(11))
    with pytest.raises(ValueError, match="identical for every example"):
        linear_cka(np.ones((10, 3)), _features(10))


# ---- mean pooling and hidden states ----

def test_mean_pool_ignores_whatever_is_in_padded_positions():
    hidden = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    poisoned = hidden.clone()
    poisoned[0, 3:] = float("nan")
    pooled = mean_pool(poisoned, mask)
    assert pooled.dtype == torch.float64
    torch.testing.assert_close(pooled[0], hidden[0, :3].double().mean(0))
    torch.testing.assert_close(pooled[1], hidden[1].double().mean(0))


@pytest.fixture(scope="module")
def tiny(minilm, tmp_path_factory):
    """Three tiny ModernBERT MLM checkpoints (seeds 0, 1, 2), a copy of seed 0, and a 4-layer one."""
    from transformers import AutoTokenizer, ModernBertForMaskedLM

    from tests.conftest import tiny_modernbert_config

    tok = AutoTokenizer.from_pretrained(minilm)
    root = tmp_path_factory.mktemp("cka-models")
    folders = {}
    for name, seed, layers in [("s0", 0, 3), ("s0-copy", 0, 3), ("s1", 1, 3), ("s2", 2, 3), ("deep", 3, 4)]:
        torch.manual_seed(seed)
        model = ModernBertForMaskedLM(tiny_modernbert_config(num_hidden_layers=layers))
        folders[name] = root / name
        model.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])
    return folders


def test_hidden_states_are_embeddings_then_each_layer_before_final_norm(tiny):
    from transformers import AutoModel, AutoTokenizer

    model, tok = AutoModel.from_pretrained(tiny["s1"]).eval(), AutoTokenizer.from_pretrained(tiny["s1"])
    batch = tok(["The patient was discharged on day four."], return_tensors="pt")
    with torch.no_grad():
        states = hidden_states(model, batch)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        emb = model.embeddings(input_ids=batch["input_ids"])
    assert len(states) == model.config.num_hidden_layers + 1
    torch.testing.assert_close(states[0], emb)
    torch.testing.assert_close(model.final_norm(states[-1]), out.last_hidden_state)
    assert not torch.allclose(states[-1], out.last_hidden_state)


def test_layer_features_do_not_depend_on_padding(tiny):
    from transformers import AutoModel, AutoTokenizer

    model, tok = AutoModel.from_pretrained(tiny["s1"]), AutoTokenizer.from_pretrained(tiny["s1"])
    texts = sample_texts("synthetic", 6, seed=0)
    texts[2] = "Short note."  # very different lengths: lots of padding when batched together
    alone = layer_features(model, tok, texts, max_length=48, batch_size=1)      # no padding at all
    batched = layer_features(model, tok, texts, max_length=48, batch_size=6)    # padded to the longest
    assert len(alone) == 4 and alone[0].shape == (6, 64) and alone[0].dtype == np.float64
    assert not model.training
    for a, b in zip(alone, batched):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert not np.allclose(alone[1][0], alone[1][2])  # different texts, different features


# ---- held-out texts ----

def test_text_samples_are_seeded_and_differ_between_seeds(tmp_path):
    assert sample_texts("synthetic", 4, seed=1) == sample_texts("synthetic", 4, seed=1)
    assert not set(sample_texts("synthetic", 4, seed=1)) & set(sample_texts("synthetic", 4, seed=2))
    corpus = tmp_path / "notes.txt"
    corpus.write_text("".join(f"document number {i}\n" + ("\n" if i % 5 == 0 else "") for i in range(40)),
                      encoding="utf-8")
    a, b = sample_texts(str(corpus), 10, seed=0), sample_texts(str(corpus), 10, seed=1)
    assert a == sample_texts(str(corpus), 10, seed=0)
    assert len(set(a)) == 10 and set(a) != set(b) and all(t.startswith("document number") for t in a)
    with pytest.raises(DetourError, match="40 non-empty documents, fewer than --n 41"):
        sample_texts(str(corpus), 41, seed=0)


# ---- the verb ----

def _analyze(*argv) -> int:
    return main(["analyze", "cka", *map(str, argv)])


def test_verb_end_to_end_with_noise_floor(tiny, tmp_path, capsys):
    out = tmp_path / "cka"
    assert _analyze(tiny["s0"], tiny["s1"], "--noise-floor", tiny["s2"], "--n", 12, "--seeds", 2,
                    "--max-length", 40, "--out", out) == 0
    result = json.loads((out / "cka.json").read_text())
    assert (out / "cka.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["num_layers"] == 3 and result["schema"] == "detour.cka/2"
    # one numbering with trajectory, transplant, drift and freeze: transformer layers from 0, beside the hidden state
    assert [row["layer"] for row in result["layers"]] == ["emb", 0, 1, 2]
    assert [row["hidden_state"] for row in result["layers"]] == [0, 1, 2, 3]
    assert [row["name"] for row in result["layers"]] == ["embeddings", "layer 0", "layer 1", "layer 2"]
    for row in result["layers"]:
        assert len(row["cka_per_seed"]) == 2 and 0 <= row["cka_mean"] <= 1
        assert row["cka_mean"] == pytest.approx(sum(row["cka_per_seed"]) / 2)
        assert row["divergence"] == pytest.approx(1 - row["cka_mean"])
        assert row["divergence"] > 0.01  # different random initialisations
        assert row["seed_noise_ratio"] == pytest.approx(row["divergence"] / row["noise_divergence"])
    assert not list(out.glob(".*"))  # no temporaries left
    printed = capsys.readouterr().out
    assert "embeddings" in printed and "d(C,B)" in printed and "SYNTHETIC" in printed


def test_identical_models_give_zero_divergence_at_every_layer(tiny, tmp_path):
    out = tmp_path / "same"
    assert _analyze(tiny["s0"], tiny["s0-copy"], "--n", 8, "--seeds", 1, "--max-length", 32, "--out", out) == 0
    layers = json.loads((out / "cka.json").read_text())["layers"]
    assert len(layers) == 4
    assert all(abs(row["divergence"]) < 1e-12 for row in layers)


def test_mismatched_layer_counts_fail_clearly(tiny, tmp_path, capsys):
    out = tmp_path / "bad"
    assert _analyze(tiny["s0"], tiny["deep"], "--n", 4, "--out", out) == 2
    err = capsys.readouterr().err
    assert "layer counts differ" in err and "has 3" in err and "has 4" in err
    assert not out.exists()


def test_different_tokenizers_fail_clearly(tiny, tmp_path, capsys):
    from transformers import AutoTokenizer

    other = tmp_path / "s1-extra-token"
    for f in tiny["s1"].iterdir():
        (other / f.name).parent.mkdir(exist_ok=True)
        (other / f.name).write_bytes(f.read_bytes())
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["pericholecystic"])
    tok.save_pretrained(other)
    assert _analyze(tiny["s0"], other, "--n", 4, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "tokenizers differ" in err and "pericholecystic" in err


def test_alias_and_bert_models_are_accepted(minilm, tmp_path):
    out = tmp_path / "minilm"
    assert _analyze("minilm-l6", minilm, "--n", 6, "--seeds", 1, "--max-length", 24, "--out", out) == 0
    result = json.loads((out / "cka.json").read_text())
    assert result["num_layers"] == 6 and len(result["layers"]) == 7
    assert all(abs(row["divergence"]) < 1e-12 for row in result["layers"])


def test_a_first_schema_cka_file_is_read_in_todays_numbering():
    from detour.analysis.layers import read_cka_layers

    old = {"schema": "detour.cka/1", "layers": [{"layer": 0, "name": "embeddings", "divergence": 0.1},
                                                 {"layer": 1, "name": "layer 1", "divergence": 0.2},
                                                 {"layer": 2, "name": "layer 2", "divergence": 0.3}]}
    rows = read_cka_layers(old)
    assert [(r["layer"], r["hidden_state"], r["name"]) for r in rows] == [
        ("emb", 0, "embeddings"), (0, 1, "layer 0"), (1, 2, "layer 1")]
    assert [r["divergence"] for r in rows] == [0.1, 0.2, 0.3]
    new = {"schema": "detour.cka/2", "layers": rows}
    assert read_cka_layers(new) == rows  # today's files are read as they are

