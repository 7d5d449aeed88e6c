"""Attention masks for packed documents: causal or bidirectional, exact in every layer type.

    detour doctor tiny-modernbert      # checks these masks on a real model, both objectives

What `build_attention_mask` returns is passed as `attention_mask=` to the model's forward, and
transformers uses it as-is (a 4D mask, or ModernBERT's per-layer-type dict). A query attends to a
key only when both belong to the same document (document isolation), and, under `causal`, when
the key is not after the query. ModernBERT's sliding layers also keep |q - k| <= local_attention // 2.
Padding (doc id -1) is never attended; a padding query sees only itself, so no softmax row is
empty (an empty row gives NaN under sdpa).

The backend decides the mask's type: sdpa takes booleans (True = attend); eager ADDS the mask to
the scores, so it gets 0 / dtype-min floats (a boolean there would be silently ignored).
"""

from __future__ import annotations

import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    eager_mask,
    or_masks,
    packed_sequence_mask_function,
    sdpa_mask,
    sliding_window_bidirectional_overlay,
)

from detour.errors import DetourError
from detour.model.load import family

SUPPORTED_ATTN = ("sdpa", "eager")


def _mask_function(doc_ids: torch.Tensor, causal: bool, half_window: int | None):
    real = doc_ids >= 0

    def real_query(batch_idx, head_idx, q_idx, kv_idx):
        return real[batch_idx, q_idx]

    def padding_self(batch_idx, head_idx, q_idx, kv_idx):
        return (q_idx == kv_idx) & ~real[batch_idx, q_idx]

    parts = [packed_sequence_mask_function(doc_ids), real_query]
    if causal:
        parts.append(causal_mask_function)
    if half_window is not None:
        parts.append(sliding_window_bidirectional_overlay(half_window))
    return or_masks(and_masks(*parts), padding_self)


def _build(doc_ids: torch.Tensor, causal: bool, half_window: int | None, attn: str, dtype) -> torch.Tensor:
    batch_size, length = doc_ids.shape
    kwargs = dict(
        batch_size=batch_size,
        q_length=length,
        kv_length=length,
        mask_function=_mask_function(doc_ids, causal, half_window),
        device=doc_ids.device,
    )
    if attn == "sdpa":
        return sdpa_mask(allow_is_causal_skip=False, **kwargs)
    return eager_mask(dtype=dtype, **kwargs)


def build_attention_mask(model, doc_ids: torch.Tensor, causal: bool):
    """The `attention_mask=` for `model`'s forward on a packed batch with these document ids."""
    attn = model.config._attn_implementation
    if attn not in SUPPORTED_ATTN:
        raise DetourError(
            f"attention implementation {attn!r} cannot take detour's packed masks; "
            f"use one of {', '.join(SUPPORTED_ATTN)}"
        )
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be [batch, length], got shape {tuple(doc_ids.shape)}")
    dtype = model.dtype
    full = _build(doc_ids, causal, None, attn, dtype)
    if family(model) != "modernbert":
        return full
    layer_types = set(model.config.layer_types)
    masks = {"full_attention": full}
    if "sliding_attention" in layer_types:
        half_window = model.config.local_attention // 2
        masks["sliding_attention"] = _build(doc_ids, causal, half_window, attn, dtype)
    return masks
