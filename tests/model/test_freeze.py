"""Freeze groups (layers x components), layer groups and the no-decay set, on MiniLM and ModernBERT."""

from __future__ import annotations

import pytest

from detour.errors import DetourError
from detour.model.freeze import frozen_parameter_names, layer_groups, no_decay_parameter_names


def test_whole_layers_0_1_on_minilm(models):
    model, _ = models("bert")
    names = frozen_parameter_names(model, "0-1", None)
    assert names == {n for n, _ in model.named_parameters()
                     if n.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.1."))}
    assert len(names) == 2 * 16


def test_layers_and_components_intersect(models):
    model, _ = models("bert")
    names = frozen_parameter_names(model, "0-1", ["attention"])
    assert names == {f"bert.encoder.layer.{i}.attention.{p}.{w}" for i in (0, 1)
                     for p in ("self.query", "self.key", "self.value", "output.dense") for w in ("weight", "bias")}
    mlp = frozen_parameter_names(model, "0-1", ["mlp", "norm"])
    assert "bert.encoder.layer.1.intermediate.dense.weight" in mlp
    assert "bert.encoder.layer.1.attention.output.LayerNorm.weight" in mlp
    assert not mlp & names


def test_components_alone_span_all_layers_and_the_model(models):
    model, _ = models("modernbert")
    mlp = frozen_parameter_names(model, None, ["mlp"])
    assert mlp == {f"model.layers.{i}.mlp.{w}.weight" for i in range(3) for w in ("Wi", "Wo")}
    emb = frozen_parameter_names(model, None, ["embeddings"])
    assert emb == {"model.embeddings.tok_embeddings.weight", "model.embeddings.norm.weight"}
    head = frozen_parameter_names(model, None, ["head"])
    assert head == {"head.dense.weight", "head.norm.weight", "decoder.bias"}
    assert frozen_parameter_names(model, "0,2", ["attention"]) == {
        "model.layers.0.attn.Wqkv.weight", "model.layers.0.attn.Wo.weight",
        "model.layers.2.attn.Wqkv.weight", "model.layers.2.attn.Wo.weight"}
    assert frozen_parameter_names(model, None, None) == set()


@pytest.mark.parametrize("layers,components,message", [
    ("0-6", None, "out of range"), ("a-b", None, "not like"), ("2-1", None, "out of range"),
    (None, ["ffn"], "ffn"), ("0-1", ["embeddings"], "select no parameter"),
])
def test_bad_freeze_specs_are_user_errors(models, layers, components, message):
    model, _ = models("bert")  # 6 layers: 0-5
    with pytest.raises(DetourError, match=message):
        frozen_parameter_names(model, layers, components)


def test_layer_groups_partition_the_layers(models):
    model, _ = models("bert")
    groups = layer_groups(model)
    assert len(groups) == 6 and all(len(g) == 16 for g in groups)
    assert all(n.startswith(f"bert.encoder.layer.{i}.") for i, g in enumerate(groups) for n in g)


@pytest.mark.parametrize("kind", ["bert", "modernbert", "roberta"])
def test_no_decay_is_biases_and_norm_weights(models, kind):
    model, _ = models(kind)
    names = no_decay_parameter_names(model)
    params = dict(model.named_parameters())
    assert names
    for name in names:
        assert name.endswith("bias") or "norm" in name.lower(), name
    for name, param in params.items():
        if name not in names:
            assert param.dim() == 2, name  # every remaining parameter is a matrix (weights, embeddings)
    assert any("LayerNorm.weight" in n or "norm.weight" in n for n in names)


@pytest.mark.parametrize("layers, groups", [
    (22, "low 0-7, mid 8-14, late 15-21"),  # ModernBERT-base: the paper's own split
    (28, "low 0-9, mid 10-18, late 19-27"),  # ModernBERT-large
    (12, "low 0-3, mid 4-7, late 8-11"),  # BERT-base, RoBERTa-base, CamemBERT-base
    (6, "low 0-1, mid 2-3, late 4-5"),
    (4, "low 0, mid 1-2, late 3"),
    (3, "low 0, mid 1, late 2"),  # the fewest: a layer each
])
def test_layer_groups_scale_the_papers_split_to_each_depth(layers, groups):
    from detour.model.freeze import describe_groups, layer_group_ranges

    assert describe_groups(layers) == f"{groups} (of {layers} layers)"
    ranges = layer_group_ranges(layers)
    assert [i for r in ranges.values() for i in r] == list(range(layers))  # every layer in one group


def test_fewer_than_three_layers_have_no_groups():
    from detour.model.freeze import layer_group_ranges

    with pytest.raises(DetourError, match="at least 3 layers; this model has 2"):
        layer_group_ranges(2)
