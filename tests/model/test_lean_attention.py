"""The lean CPU attention computes sdpa's numbers, bit for bit, and keeps far less for backward."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from detour.model import lean_attention
from detour.model.doctor import packed_batch
from detour.model.lean_attention import LeanAttention, attention_forward
from detour.model.load import config_special_ids, load_mlm_model, user_attention
from detour.model.objectives import encode


def _inputs(batch=2, heads=3, length=24, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=generator, requires_grad=True) for _ in range(3)]


def _masks(batch=2, length=24):
    generator = torch.Generator().manual_seed(1)
    allowed = (torch.rand(batch, 1, length, length, generator=generator) > 0.4) | torch.eye(length, dtype=torch.bool)
    empty_row = allowed.clone()
    empty_row[0, 0, 3] = False  # a query that may see no key: sdpa's safe softmax gives it zeros
    return {"none": None, "document mask": allowed, "a query with no key": empty_row}


@pytest.mark.parametrize("mask_name", ["none", "document mask", "a query with no key"])
@pytest.mark.parametrize("shape", [(2, 3, 24, 8), (1, 12, 64, 32)])
def test_output_and_gradients_are_sdpas_bit_for_bit(mask_name, shape):
    query, key, value = _inputs(*shape)
    mask = _masks(shape[0], shape[2])[mask_name]
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    results = {}
    for name, run in {
        "sdpa": lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.1, scale=0.3),
        "lean": lambda: LeanAttention.apply(query, key, value, mask, 0.1, 0.3),
    }.items():
        torch.manual_seed(7)  # the same generator state: the same entries dropped
        out = run()
        results[name] = (out, *torch.autograd.grad(out, (query, key, value), grad))
    for ours, theirs, what in zip(results["lean"], results["sdpa"], ("output", "dq", "dk", "dv")):
        assert torch.isfinite(ours).all(), what
        assert torch.equal(ours, theirs), f"{what}: max diff {(ours - theirs).abs().max().item()}"
    # dropout is on: with another generator state other entries are dropped
    torch.manual_seed(8)
    assert not torch.equal(LeanAttention.apply(query, key, value, mask, 0.1, 0.3), results["sdpa"][0])


def _saved_bytes(run, at_least: int) -> int:
    """Bytes of the distinct storages of at least `at_least` bytes that autograd keeps for backward
    while `run` records its graph."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.nbytes() >= at_least:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


def test_keeps_a_third_of_what_sdpa_keeps_for_backward():
    query, key, value = _inputs(2, 12, 128, 16)  # q, k, v are smaller than a boolean [B, H, L, L]
    mask = _masks(2, 128)["document mask"]
    scores = 2 * 12 * 128 * 128 * 4  # bytes of one fp32 [B, H, L, L]
    sdpa = _saved_bytes(lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.1),
                        scores // 4)
    lean = _saved_bytes(lambda: LeanAttention.apply(query, key, value, mask, 0.1, 16**-0.5), scores // 4)
    assert lean == scores + scores // 4  # the softmax in fp32, which entries dropout kept in booleans
    assert sdpa >= 3 * scores  # the softmax, the dropout noise and the dropped probabilities, all fp32


class _Calls:
    def __init__(self, monkeypatch):
        self.count = 0
        apply = LeanAttention.apply

        def counted(*args):
            self.count += 1
            return apply(*args)

        monkeypatch.setattr(LeanAttention, "apply", counted)


def test_a_loaded_model_trains_exactly_as_under_stock_sdpa(minilm, monkeypatch):
    model, _ = load_mlm_model(minilm, attn_implementation="sdpa", seed=0)
    assert model.config._attn_implementation == lean_attention.NAME
    assert user_attention(model.config._attn_implementation) == "sdpa"
    model.train()
    batch = packed_batch([[30, 20, 10], [64]], 64, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id, seed=3)
    calls = _Calls(monkeypatch)
    runs = {}
    for name in (lean_attention.NAME, "sdpa"):
        model.config._attn_implementation = name
        model.zero_grad(set_to_none=True)
        torch.manual_seed(11)
        hidden = encode(model, batch, causal=False).last_hidden_state
        hidden.square().mean().backward()
        runs[name] = (hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert calls.count == model.config.num_hidden_layers  # the lean path ran, once a layer
    (ours, our_grads), (theirs, their_grads) = runs[lean_attention.NAME], runs["sdpa"]
    assert torch.equal(ours, theirs)
    assert our_grads.keys() == their_grads.keys() and our_grads
    for name, grad in our_grads.items():
        assert torch.equal(grad, their_grads[name]), name


def test_sdpa_runs_unchanged_wherever_it_has_no_math_path_for_dropout(minilm, monkeypatch):
    calls = _Calls(monkeypatch)
    query, key, value = _inputs(2, 3, 24, 8)
    mask = _masks()["document mask"]
    module = torch.nn.Module()
    cases = {
        "no dropout (eval mode)": dict(attention_mask=mask, dropout=0.0),
        "an additive float mask": dict(attention_mask=torch.zeros(2, 1, 24, 24), dropout=0.1),
        "causal flag": dict(attention_mask=None, dropout=0.1, is_causal=True),
    }
    for name, kwargs in cases.items():
        torch.manual_seed(0)
        out, _ = attention_forward(module, query, key, value, **kwargs)
        torch.manual_seed(0)
        sdpa = F.scaled_dot_product_attention(query, key, value, attn_mask=kwargs["attention_mask"],
                                              dropout_p=kwargs["dropout"], is_causal=kwargs.get("is_causal", False))
        assert torch.equal(out, sdpa.transpose(1, 2)), name
    with torch.no_grad():
        attention_forward(module, query, key, value, mask, dropout=0.1)
    assert calls.count == 0
    attention_forward(module, query, key, value, mask, dropout=0.1)
    assert calls.count == 1


def test_an_export_names_no_detour_attention(minilm, tmp_path):
    model, _ = load_mlm_model(minilm, attn_implementation="sdpa", seed=0)
    model.save_pretrained(tmp_path)
    assert "detour" not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
