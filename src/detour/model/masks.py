"""Attention masks for packed documents: causal or bidirectional, exact in every layer type.

    detour doctor tiny-modernbert      # checks these masks on a real model, both objectives

`attention_inputs` gives the attention keywords of the model's forward for its backend. For sdpa
and eager that is `attention_mask=` what `build_attention_mask` returns, and transformers uses it
as-is (a 4D mask, or ModernBERT's per-layer-type dict). For varlen (`detour.model.varlen`) it is
the document boundaries alone: no mask of any size is built. A query attends to a
key only when both belong to the same document (document isolation), and, under `causal`, when
the key is not after the query. ModernBERT's sliding layers also keep |q - k| <= local_attention // 2.
Padding (doc id -1) is never attended; a padding query sees only itself, so no softmax row is
empty (an empty row gives NaN under sdpa).

The backend decides the mask's type: sdpa takes booleans (True = attend); eager ADDS the mask to
the scores, so it gets 0 / dtype-min floats (a boolean there would be silently ignored).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from detour.errors import DetourError
from detour.model import varlen
from detour.model.load import family, user_attention

SUPPORTED_ATTN = ("sdpa", "eager")


@lru_cache(maxsize=8)
def _band(length: int, causal: bool, half_window: int | None, device: torch.device) -> torch.Tensor | None:
    """[L, L] booleans for key k allowed at query q by position alone (None: all are); cached,
    since it is the same for every batch. The diagonal is always allowed."""
    if not causal and half_window is None:
        return None
    band = torch.ones(length, length, dtype=torch.bool, device=device)
    if causal:
        band = band.tril()
    if half_window is not None:  # |q - k| <= half_window
        band = band.tril(half_window).triu(-half_window)
    return band


def _for_backend(allowed: torch.Tensor, attn: str, dtype) -> torch.Tensor:
    allowed = allowed.unsqueeze(1)  # [B, 1, L, L], broadcast over heads
    if attn == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def attention_inputs(model, doc_ids: torch.Tensor, causal: bool) -> dict:
    """The attention keyword arguments of `model`'s forward on a packed batch with these document ids."""
    if model.config._attn_implementation == varlen.NAME:
        return {varlen.KWARG: varlen.packed_documents(doc_ids, causal)}
    return {"attention_mask": build_attention_mask(model, doc_ids, causal)}


def build_attention_mask(model, doc_ids: torch.Tensor, causal: bool):
    """The `attention_mask=` for `model`'s forward on a packed batch with these document ids."""
    attn = user_attention(model.config._attn_implementation)
    if attn not in SUPPORTED_ATTN:
        raise DetourError(
            f"attention implementation {attn!r} cannot take detour's packed masks; "
            f"use one of {', '.join(SUPPORTED_ATTN)}"
            + (" (varlen takes document boundaries: masks.attention_inputs)" if attn == varlen.NAME else "")
        )
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be [batch, length], got shape {tuple(doc_ids.shape)}")
    # Built directly with broadcasting: transformers.masking_utils gives the same masks but
    # materialises int64 [L, L] index grids, several times slower at L = 8192.
    length, device, dtype = doc_ids.shape[1], doc_ids.device, model.dtype
    positions = torch.arange(length, device=device)
    # each padding position becomes its own one-token "document": it matches only itself
    docs = torch.where(doc_ids >= 0, doc_ids, -1 - positions)
    same_doc = docs[:, :, None] == docs[:, None, :]  # [B, L, L]
    band = _band(length, causal, None, device)
    full = _for_backend(same_doc if band is None else same_doc & band, attn, dtype)
    if family(model) != "modernbert":
        return full
    masks = {"full_attention": full}
    if "sliding_attention" in model.config.layer_types:
        band = _band(length, causal, model.config.local_attention // 2, device)
        masks["sliding_attention"] = _for_backend(same_doc & band, attn, dtype)
    return masks
