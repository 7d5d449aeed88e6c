"""Relative weight change per layer and component, and `detour analyze drift` end to end."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from detour.analysis.drift import SCHEMA, compare, drift_analysis
from detour.cli import main
from detour.errors import DetourError

torch.set_num_threads(1)


def _analyze(*argv) -> int:
    return main(["analyze", "drift", *map(str, argv)])


def _row(result: dict, name: str) -> dict:
    return next(row for row in result["layers"] if row["name"] == name)


def _perturb(param: torch.Tensor, scale: float, seed: int) -> None:
    """Add noise of norm `scale` * ||param|| in place."""
    noise = torch.randn(param.shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        param.add_(scale * param.norm() * noise / noise.norm())


def _norms(a, b) -> tuple[float, float]:
    """(||a - b||^2, ||b||^2), by numpy in float64."""
    a, b = (np.asarray(t.detach(), dtype=np.float64) for t in (a, b))
    return float(np.sum((a - b) ** 2)), float(np.sum(b ** 2))


# ---- the aggregation, on hand-made weights ----

def test_group_values_are_computed_by_hand():
    t = torch.tensor
    classes = {"l0.att": (0, "attention"), "l0.mlp": (0, "mlp"), "l1.att": (1, "attention"),
               "l4.att": (4, "attention"), "emb": (None, "embeddings"), "fnorm": (None, "norm"),
               "y": (None, "other"), "z": (2, "mlp")}
    b = {"l0.att": t([3.0, 4.0]), "l0.mlp": torch.zeros(3), "l1.att": t([0.0, 0.0, 12.0]),
         "l4.att": t([[1.0, 2.0], [2.0, 4.0]]), "emb": t([1.0, 1.0]), "fnorm": t([2.0]),
         "y": t([1.0]), "z": torch.ones(2, 2)}
    a = {"l0.att": t([3.0, 6.0]), "l0.mlp": torch.ones(3), "l1.att": t([0.0, 5.0, 12.0]),
         "l4.att": b["l4.att"].clone(), "emb": b["emb"].clone(), "fnorm": t([1.0]),
         "x": t([5.0]), "z": torch.ones(2, 3)}
    result = compare(a, b, classes, num_layers=6)

    rel = {m["name"]: m["rel"] for m in result["matrices"]}
    assert rel == {"l0.att": 2 / 5, "l0.mlp": None, "l1.att": 5 / 12, "l4.att": 0.0, "emb": 0.0, "fnorm": 0.5}
    layer0 = _row(result, "layer 0")
    assert layer0["rel"] == {"attention": 2 / 5, "mlp": None}  # B's mlp weights are zero: null, no division
    assert layer0["total"] == pytest.approx(math.sqrt(4 + 3) / 5, rel=1e-15)
    assert _row(result, "layer 1")["total"] == pytest.approx(5 / 12, rel=1e-15)
    assert _row(result, "layer 2") == {"name": "layer 2", "layer": 2, "rel": {}, "total": None,
                                       "diff": 0.0, "norm_b": 0.0}
    assert _row(result, "final norm")["rel"] == {"norm": 0.5} and _row(result, "final norm")["layer"] is None
    assert [row["name"] for row in result["layers"]] == (["embeddings"] + [f"layer {i}" for i in range(6)]
                                                          + ["final norm"])
    # groups of 6 layers: low 0-1, mid 2-3, late 4-5; a group weighs its matrices by their size,
    # so low is not the mean of its layers' totals (0.529, 0.417)
    groups = {g["name"]: g for g in result["groups"]}
    assert [groups[g]["layers"] for g in ("low", "mid", "late")] == [[0, 1], [2, 3], [4, 5]]
    assert groups["low"]["total"] == pytest.approx(math.sqrt(4 + 3 + 25) / math.sqrt(25 + 144), rel=1e-15)
    assert groups["mid"]["total"] is None and groups["late"]["total"] == 0.0
    assert result["total"] == pytest.approx(math.sqrt(4 + 3 + 25 + 1) / math.sqrt(25 + 144 + 25 + 2 + 4),
                                            rel=1e-15)
    assert result["only_in_a"] == ["x"] and result["only_in_b"] == ["y"]
    assert result["shape_mismatch"] == [{"name": "z", "shape_a": [2, 3], "shape_b": [2, 2]}]
    json.dumps(result, allow_nan=False)


def test_squared_norms_are_float64_over_chunks(monkeypatch):
    import detour.analysis.drift as drift

    b = torch.randn(7, 11, generator=torch.Generator().manual_seed(0))
    a = b + 1e-4 * torch.randn(7, 11, generator=torch.Generator().manual_seed(1))
    expected = _norms(a, b)
    monkeypatch.setattr(drift, "_CHUNK", 10)  # 77 elements: eight chunks, the last one short
    assert drift.squared_norms(a, b) == pytest.approx(expected, rel=1e-13)


def test_no_parameter_in_common_is_refused():
    with pytest.raises(DetourError, match="no parameter in common.*1 only in A, 1 only in B, 1 with different"):
        compare({"x": torch.ones(2), "z": torch.ones(3)}, {"y": torch.ones(2), "z": torch.ones(2)},
                {"y": (None, "other"), "z": (0, "mlp")}, num_layers=3)


# ---- tiny ModernBERT checkpoints ----

@pytest.fixture(scope="module")
def tiny(minilm, tmp_path_factory):
    """A 6-layer tiny ModernBERT MLM checkpoint `base`, its copy, a perturbed copy, and misfits."""
    from transformers import AutoTokenizer, ModernBertForMaskedLM

    from tests.conftest import tiny_modernbert_config

    tok = AutoTokenizer.from_pretrained(minilm)
    root = tmp_path_factory.mktemp("drift-models")
    folders = {name: root / name for name in ("base", "copy", "perturbed", "shallow", "narrow", "vocab")}

    def save(model, name):
        model.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])

    torch.manual_seed(0)
    base = ModernBertForMaskedLM(tiny_modernbert_config(num_hidden_layers=6))
    save(base, "base")
    shutil.copytree(folders["base"], folders["copy"])
    perturbed = ModernBertForMaskedLM(base.config)
    perturbed.load_state_dict(base.state_dict())
    params = dict(perturbed.named_parameters())
    _perturb(params["model.layers.2.attn.Wqkv.weight"], 0.1, seed=1)
    _perturb(params["model.layers.3.mlp.Wi.weight"], 0.03, seed=2)
    save(perturbed, "perturbed")
    misfits = {"shallow": {"num_hidden_layers": 4}, "narrow": {"num_hidden_layers": 6, "hidden_size": 32},
               "vocab": {"num_hidden_layers": 6, "vocab_size": 30528}}
    for name, overrides in misfits.items():
        torch.manual_seed(0)
        save(ModernBertForMaskedLM(tiny_modernbert_config(**overrides)), name)
    return {"folders": folders, "base": dict(base.named_parameters()), "perturbed": params}


def test_verb_end_to_end_and_a_model_against_itself_is_exactly_zero(tiny, tmp_path, capsys):
    f = tiny["folders"]
    out = tmp_path / "self"
    assert _analyze(f["copy"], f["base"], "--out", out) == 0
    assert (out / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "drift.json").read_text())
    assert result["schema"] == SCHEMA == "detour.drift/1"
    cfg = result["config"]
    assert cfg["model_a"] == str(f["copy"]) and cfg["model_b"] == str(f["base"])
    assert cfg["weights_hash_a"] == cfg["weights_hash_b"] and cfg["weights_hash_a"].startswith("sha256:")
    assert cfg["model_type"] == "modernbert" and cfg["num_layers"] == 6
    assert cfg["groups"] == "low 0-1, mid 2-3, late 4-5 (of 6 layers)"
    # every body parameter compared (the MLM head is not), each exactly unchanged
    body = [n.removeprefix("model.") for n in tiny["base"] if n.startswith("model.")]
    assert [m["name"] for m in result["matrices"]] == body
    assert all(m["diff"] == 0.0 and m["rel"] == 0.0 and m["norm_b"] > 0 for m in result["matrices"])
    rows = ["embeddings"] + [f"layer {i}" for i in range(6)] + ["final norm"]
    assert [row["name"] for row in result["layers"]] == rows
    assert result["columns"] == ["attention", "mlp", "norm", "embeddings"]
    for row in result["layers"]:
        assert row["total"] == 0.0 and row["rel"] and all(v == 0.0 for v in row["rel"].values())
    assert _row(result, "layer 1")["rel"] == {"attention": 0.0, "mlp": 0.0, "norm": 0.0}
    assert _row(result, "embeddings")["rel"] == {"embeddings": 0.0}
    assert [g["total"] for g in result["groups"]] == [0.0, 0.0, 0.0] and result["total"] == 0.0
    assert result["only_in_a"] == result["only_in_b"] == result["shape_mismatch"] == []
    assert not list(out.glob(".*"))  # no temporaries left
    printed = capsys.readouterr().out
    assert "embeddings" in printed and "layer 5" in printed and "final norm" in printed and "drift.json" in printed


def test_perturbed_matrices_show_their_exact_change_and_nothing_else_moves(tiny):
    f, base, pert = tiny["folders"], tiny["base"], tiny["perturbed"]
    result = drift_analysis(str(f["perturbed"]), str(f["base"]))
    changed = {"layers.2.attn.Wqkv.weight", "layers.3.mlp.Wi.weight"}
    for m in result["matrices"]:
        if m["name"] not in changed:
            assert m["diff"] == 0.0 and m["rel"] == 0.0, m["name"]
    rel = {m["name"]: m["rel"] for m in result["matrices"]}
    assert rel["layers.2.attn.Wqkv.weight"] == pytest.approx(0.1, rel=1e-5)
    assert rel["layers.3.mlp.Wi.weight"] == pytest.approx(0.03, rel=1e-5)

    def sq(name):
        return _norms(pert["model." + name], base["model." + name])

    d_qkv, n_qkv = sq("layers.2.attn.Wqkv.weight")
    _, n_wo = sq("layers.2.attn.Wo.weight")
    layer2 = _row(result, "layer 2")
    assert layer2["rel"]["attention"] == pytest.approx(math.sqrt(d_qkv) / math.sqrt(n_qkv + n_wo), rel=1e-12)
    assert layer2["rel"]["mlp"] == 0.0 and layer2["rel"]["norm"] == 0.0
    d_wi, n_wi = sq("layers.3.mlp.Wi.weight")
    _, n_mlp_wo = sq("layers.3.mlp.Wo.weight")
    assert _row(result, "layer 3")["rel"] == {"attention": 0.0, "norm": 0.0,
                                              "mlp": pytest.approx(math.sqrt(d_wi / (n_wi + n_mlp_wo)), rel=1e-12)}
    norms = {layer: sum(sq(n.removeprefix("model."))[1] for n in base if n.startswith(f"model.layers.{layer}."))
             for layer in (2, 3)}
    assert layer2["total"] == pytest.approx(math.sqrt(d_qkv / norms[2]), rel=1e-12)
    mid = next(g for g in result["groups"] if g["name"] == "mid")
    assert mid["layers"] == [2, 3]
    assert mid["total"] == pytest.approx(math.sqrt((d_qkv + d_wi) / (norms[2] + norms[3])), rel=1e-12)
    for row in result["layers"]:
        if row["name"] not in ("layer 2", "layer 3"):
            assert row["total"] == 0.0, row["name"]
    assert [g["total"] for g in result["groups"] if g["name"] != "mid"] == [0.0, 0.0]


def test_mismatched_depth_is_refused_naming_both_models(tiny, tmp_path, capsys):
    f = tiny["folders"]
    out = tmp_path / "bad"
    assert _analyze(f["shallow"], f["base"], "--out", out) == 2
    err = capsys.readouterr().err
    assert "layer counts differ" in err and f"{f['shallow']} has 4" in err and f"{f['base']} has 6" in err
    assert not out.exists()


def test_other_architectures_are_refused_before_loading_weights(tiny, minilm):
    f = tiny["folders"]
    with pytest.raises(DetourError, match=r"hidden sizes differ \(model_a .*narrow has 32, model_b .*base has 64"):
        drift_analysis(str(f["narrow"]), str(f["base"]))
    with pytest.raises(DetourError, match="model types differ.*is bert.*is modernbert"):
        drift_analysis(str(minilm), str(f["base"]))
    with pytest.raises(DetourError, match="model .*nowhere: no such folder"):
        drift_analysis(str(f["base"].parent / "nowhere"), str(f["base"]))


def test_a_matrix_of_another_shape_is_listed_not_compared(tiny):
    f = tiny["folders"]
    result = drift_analysis(str(f["vocab"]), str(f["base"]))
    assert result["shape_mismatch"] == [{"name": "embeddings.tok_embeddings.weight",
                                         "shape_a": [30528, 64], "shape_b": [30522, 64]}]
    names = [m["name"] for m in result["matrices"]]
    assert "embeddings.tok_embeddings.weight" not in names and "embeddings.norm.weight" in names
    assert _row(result, "layer 0")["total"] > 0.1  # another random initialisation
    json.dumps(result, allow_nan=False)


# ---- MiniLM (BERT naming) ----

def test_minilm_with_one_perturbed_layer(minilm, tmp_path):
    from transformers import BertForMaskedLM

    # Saved as a masked LM, like a trained arm: the checkpoint has a head but no pooler, which
    # transformers would initialise afresh when loading the bare BertModel.
    arm = BertForMaskedLM.from_pretrained(minilm)
    params = dict(arm.named_parameters())
    _perturb(params["bert.encoder.layer.1.attention.self.query.weight"], 0.05, seed=3)
    arm.save_pretrained(tmp_path / "arm")

    from transformers import BertModel

    base = dict(BertModel.from_pretrained(minilm).named_parameters())
    result = drift_analysis(str(tmp_path / "arm"), "minilm-l6")
    assert result["config"]["model_type"] == "bert" and result["config"]["num_layers"] == 6
    assert result["only_in_b"] == ["pooler.dense.bias", "pooler.dense.weight"] and result["only_in_a"] == []
    assert result["columns"] == ["attention", "mlp", "norm", "embeddings"]
    assert [row["name"] for row in result["layers"]] == ["embeddings"] + [f"layer {i}" for i in range(6)]
    kind = {m["name"]: m["component"] for m in result["matrices"]}
    assert kind["encoder.layer.1.attention.output.dense.bias"] == "attention"
    assert kind["encoder.layer.1.attention.output.LayerNorm.weight"] == "norm"
    assert kind["encoder.layer.1.intermediate.dense.weight"] == kind["encoder.layer.1.output.dense.weight"] == "mlp"
    assert kind["embeddings.LayerNorm.bias"] == "embeddings"

    d, _ = _norms(params["bert.encoder.layer.1.attention.self.query.weight"],
                  base["encoder.layer.1.attention.self.query.weight"])
    attention = [n for n in base if n.startswith("encoder.layer.1.attention.") and "LayerNorm" not in n]
    assert len(attention) == 8  # q, k, v and output projections, weights and biases
    n_att = sum(float(np.sum(np.asarray(base[n].detach(), dtype=np.float64) ** 2)) for n in attention)
    layer1 = _row(result, "layer 1")
    assert layer1["rel"]["attention"] == pytest.approx(math.sqrt(d / n_att), rel=1e-12)
    assert layer1["rel"]["mlp"] == layer1["rel"]["norm"] == 0.0
    for row in result["layers"]:
        if row["name"] != "layer 1":
            assert row["total"] == 0.0 and all(v == 0.0 for v in row["rel"].values()), row["name"]

