"""Mask-free attention for packed documents: document boundaries as cu_seqlens, flash varlen on CUDA.

    python -m pytest -q tests/model/test_varlen.py

Every document of every row of a packed [B, L] batch is one sequence of the flattened B*L tokens
(`packed_boundaries`); each padding position (doc id -1) is a sequence of its own, so it attends
only to itself, exactly as under the dense masks of `detour.model.masks`. No L x L tensor exists:
on CUDA with bf16/fp16 inputs (training autocasts) `torch.nn.attention.varlen.varlen_attn` runs
the flash kernel; anywhere else a reference computes the same thing document by document with
`scaled_dot_product_attention` (exact in fp32, slower). Windows: ModernBERT's sliding layers keep
|q - k| <= local_attention // 2 (the left half only under causal); global layers and the BERT
family have none.

Importing this module registers the backend under `NAME` with transformers' AttentionInterface
(the attention) and AttentionMaskInterface (masks: a 2D padding mask passes through as [B, L],
never expanded). `detour.model.load` sets `config._attn_implementation = NAME` for
`model.attn_implementation: varlen`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from detour.errors import DetourError

log = logging.getLogger(__name__)

NAME = "detour_varlen"
# The boundaries reach the attention function as one keyword argument of the model's forward, not
# as `attention_mask`: BERT's forward sends `attention_mask` through create_bidirectional_mask,
# which keeps only tensors (a 4D one as-is, a 2D one as padding), so an object there would be
# dropped or mistaken for a mask; every supported family forwards unknown keywords untouched to
# the attention function. Not transformers' own `cu_seq_lens_q`: those mean flash semantics to
# other backends, and ours also carry causality, which no attention module knows here (detour
# runs one bidirectional model causally by passing the masks).
KWARG = "packed_documents"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class PackedDocuments:
    """What the attention function needs for one packed batch (built once per forward)."""

    cu_seqlens: torch.Tensor  # int32 [n_sequences + 1]: starts of the sequences in the flattened tokens, then B*L
    max_len: int  # the longest sequence (the kernel sizes its tiles by it)
    causal: bool
    shape: tuple[int, int]  # (B, L) of the batch, checked against the attention inputs


def packed_boundaries(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32, max_len) of a [B, L] doc-id batch, over its B*L flattened tokens.

    A sequence starts at every row start, wherever the doc id changes, and at every padding
    position (id < 0), so padding positions are sequences of one token. Documents are contiguous
    runs, as packing makes them.
    """
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be [batch, length], got shape {tuple(doc_ids.shape)}")
    flat = doc_ids.reshape(-1)
    total = flat.numel()
    if total == 0:
        return torch.zeros(1, dtype=torch.int32, device=doc_ids.device), 0
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = (flat[1:] != flat[:-1]) | (flat[1:] < 0)
    start[:: doc_ids.shape[1]] = True  # a row never continues the previous one
    starts = start.nonzero().squeeze(1)
    cu_seqlens = torch.cat([starts, starts.new_tensor([total])]).to(torch.int32)
    return cu_seqlens, int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def packed_documents(doc_ids: torch.Tensor, causal: bool) -> PackedDocuments:
    cu_seqlens, max_len = packed_boundaries(doc_ids)
    return PackedDocuments(cu_seqlens, max_len, bool(causal), tuple(doc_ids.shape))


def half_window(sliding_window: int | None) -> int | None:
    """|q - k| limit of a layer from the `sliding_window` its attention module passes (None: global).

    ModernBERT passes local_attention // 2 + 1, flash's inclusive convention (transformers' flash
    path also subtracts the 1); the BERT family passes none.
    """
    return None if sliding_window is None else int(sliding_window) - 1


def kernel_window(causal: bool, half: int | None) -> tuple[int, int]:
    """varlen_attn's (left, right): (-1, -1) all, (-1, 0) causal, (w, w) sliding, (w, 0) causal sliding."""
    left = -1 if half is None else half
    return (left, 0) if causal else (left, -1 if half is None else half)


def reference_attention(q, k, v, cu_seqlens: torch.Tensor, causal: bool, half: int | None, scale: float):
    """[T, H, D] attention within each sequence of `cu_seqlens`, one sdpa call per document.

    A one-token sequence's output is its own value (its only key gets weight 1), taken directly,
    so long runs of padding cost no loop.
    """
    bounds = cu_seqlens.tolist()
    pieces, run_start = [], None
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e - s == 1:
            run_start = s if run_start is None else run_start
            continue
        if run_start is not None:
            pieces.append(v[run_start:s])
            run_start = None
        qd, kd, vd = (x[s:e].transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        mask = None
        if half is not None:  # small: n x n for this document only
            rel = torch.arange(e - s, device=q.device)
            rel = rel[:, None] - rel[None, :]  # q - k
            mask = (rel.abs() <= half) & (rel >= 0 if causal else True)
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, is_causal=causal and mask is None,
                                             scale=scale)
        pieces.append(out.transpose(0, 1))
    if run_start is not None:
        pieces.append(v[run_start:bounds[-1]])
    return torch.cat(pieces) if pieces else v[:0]


_warned_fp32_cuda = False


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             sliding_window=None, packed_documents: PackedDocuments | None = None, **kwargs):
    """transformers' attention-function signature: [B, H, L, D] inputs, returns ([B, L, H, D], None)."""
    global _warned_fp32_cuda
    batch, heads, length, dim = query.shape
    if dropout and dropout > 0:
        raise DetourError(f"model.attn_implementation varlen: attention dropout {dropout} is not supported "
                          "(the varlen kernel has none); use sdpa, or a model with attention dropout 0")
    if packed_documents is None:  # a plain forward: rows (or their unpadded part) are single documents
        packed_documents = _from_padding_mask(attention_mask, batch, length, query.device,
                                              bool(getattr(module, "is_causal", False)))
    elif attention_mask is not None:
        raise DetourError("varlen attention takes packed document boundaries or a padding mask, not both")
    if packed_documents.shape != (batch, length):
        raise DetourError(f"varlen attention: boundaries for a {packed_documents.shape} batch, "
                          f"attention inputs of {(batch, length)}")
    causal, half = packed_documents.causal, half_window(sliding_window)
    scale = dim**-0.5 if scaling is None else scaling
    q, k, v = (x.transpose(1, 2).reshape(batch * length, heads, dim) for x in (query, key, value))
    cu_seqlens = packed_documents.cu_seqlens.to(query.device)
    if query.is_cuda and query.dtype in KERNEL_DTYPES:
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, packed_documents.max_len, packed_documents.max_len,
                          scale=scale, window_size=kernel_window(causal, half))
    else:
        if query.is_cuda and not _warned_fp32_cuda:
            _warned_fp32_cuda = True
            log.warning("varlen attention: %s inputs on CUDA run the per-document reference (the flash kernel "
                        "takes bf16/fp16: train under autocast)", query.dtype)
        out = reference_attention(q, k, v, cu_seqlens, causal, half, scale)
    return out.view(batch, length, heads, dim), None


def _from_padding_mask(attention_mask, batch: int, length: int, device, causal: bool) -> PackedDocuments:
    if attention_mask is None:
        doc_ids = torch.zeros(batch, length, dtype=torch.long, device=device)
    elif attention_mask.dim() == 2:
        doc_ids = torch.where(attention_mask.to(device).bool(), 0, -1)
    else:
        raise DetourError(f"varlen attention takes document boundaries, not a {attention_mask.dim()}D mask: "
                          "call the model through detour.model.objectives.encode, or load it with sdpa")
    return packed_documents(doc_ids, causal)


def padding_mask_passthrough(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                             attention_mask=None, **kwargs):
    """transformers' mask-function signature: the [B, L] padding mask (or None) as it came, not expanded."""
    return attention_mask


AttentionInterface.register(NAME, varlen_attention_forward)
AttentionMaskInterface.register(NAME, padding_mask_passthrough)
