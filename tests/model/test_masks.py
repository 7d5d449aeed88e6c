"""Packed-document masks: exact pattern per backend, and exact causality / isolation in real models."""

from __future__ import annotations

import pytest
import torch

from detour.errors import DetourError
from detour.model.doctor import check_model
from detour.model.masks import build_attention_mask

DOCS = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1]])


def expected(causal: bool, half_window: int | None) -> torch.Tensor:
    n = DOCS.shape[1]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        for k in range(n):
            if DOCS[0, q] < 0:
                allowed[q, k] = q == k
                continue
            ok = bool(DOCS[0, q] == DOCS[0, k])
            ok &= (k <= q) if causal else True
            ok &= abs(q - k) <= half_window if half_window is not None else True
            allowed[q, k] = ok
    return allowed


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_modernbert_mask_pattern_per_layer_type(models, causal, attn):
    model, _ = models("modernbert", attn)  # local_attention 8: half window 4
    masks = build_attention_mask(model, DOCS, causal)
    assert set(masks) == {"full_attention", "sliding_attention"}
    for layer_type, half in (("full_attention", None), ("sliding_attention", 4)):
        mask = masks[layer_type]
        assert mask.shape == (1, 1, 11, 11)
        if attn == "sdpa":
            assert mask.dtype == torch.bool
            allowed = mask[0, 0]
        else:  # eager ADDS the mask: 0 where allowed, a huge negative elsewhere
            assert mask.dtype == torch.float32
            assert set(mask.unique().tolist()) <= {0.0, torch.finfo(torch.float32).min}
            allowed = mask[0, 0] == 0
        assert torch.equal(allowed, expected(causal, half)), layer_type


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_bert_family_mask_is_one_4d_tensor(models, kind, attn):
    model, _ = models(kind, attn)
    mask = build_attention_mask(model, DOCS, causal=True)
    allowed = mask[0, 0] if attn == "sdpa" else mask[0, 0] == 0
    assert mask.shape == (1, 1, 11, 11)
    assert torch.equal(allowed, expected(True, None))


@pytest.mark.parametrize(
    "kind,attn",
    [("modernbert", "sdpa"), ("modernbert", "eager"), ("bert", "sdpa"), ("bert", "eager"),
     ("roberta", "sdpa"), ("roberta", "eager"), ("camembert", "sdpa"), ("xlm-roberta", "eager")],
)
def test_causal_exact_and_documents_isolated_in_every_layer(models, kind, attn):
    model, _ = models(kind, attn)
    verdict = check_model(model, seq_len=40)  # > local_attention: sliding layers really slide
    failed = [c for c in verdict["checks"] if not c["ok"]]
    assert verdict["ok"], failed
    names = {(c["objective"], c["check"].split(" at ")[0]) for c in verdict["checks"]}
    assert {("clm", "causal"), ("mlm", "bidirectional"), ("clm", "doc1->doc0 isolation"),
            ("mlm", "doc0->doc1 isolation"), ("mlm", "one document equals the stock forward")} <= names
    causal = [c for c in verdict["checks"] if c["check"].startswith("causal")]
    assert all(c["value"] == 0.0 and c["future_change"] > 1e-3 for c in causal)


def test_unsupported_attention_backend_is_a_clear_error(models):
    model, _ = models("modernbert")
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(DetourError, match="flash_attention_2"):
            build_attention_mask(model, DOCS, causal=True)
    finally:
        model.config._attn_implementation = "sdpa"
