"""Attention with dropout on the CPU that keeps a third of sdpa's memory, computing the same thing.

    python -m pytest -q tests/model/test_lean_attention.py

With attention dropout on (BERT's attention_probs_dropout_prob is 0.1) torch's CPU sdpa cannot use
its fused kernel and runs the math path, which keeps three [B, H, L, L] fp32 tensors a layer for
backward: the softmax, the dropout noise (fp32: CPU dropout draws a float tensor) and the dropped
probabilities. At MiniLM's 12 heads and 8 x 256 tokens that is about 80 MiB a layer with the
temporaries, most of a training step's activations. `LeanAttention` keeps the softmax and the
dropout's keep-mask as booleans (30 MiB a layer), rebuilds the dropped probabilities in backward
from the two (one multiply, no matmul), and writes the softmax over the scores in place.

What it computes is sdpa's math path, op for op: the scale split as sqrt(scale) on q and on k, the
masked scores at -inf, the softmax, the dropout noise drawn with the same `bernoulli_` call on a
tensor of the same shape (so the same generator state gives the same dropped entries), and the
same matmuls; backward takes autograd's formulas in autograd's order, so outputs and gradients are
bit for bit sdpa's.

`attention_forward` is transformers' attention-function signature; importing this module registers
it as `NAME`, which `detour.model.load` loads for `model.attn_implementation: sdpa`. It runs
`LeanAttention` only where sdpa would take the math path for dropout (CPU, training, autograd on,
a boolean or no mask, no causal flag, no GQA); every other call goes to transformers' sdpa function
unchanged.
"""

from __future__ import annotations

import math

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

NAME = "detour_sdpa"


class LeanAttention(torch.autograd.Function):
    """softmax(q k^T * scale, masked) with dropout p, times v; [B, H, L, D] inputs, [B, H, L, D] output."""

    @staticmethod
    def forward(ctx, query, key, value, allowed, dropout: float, scale: float):
        root = math.sqrt(scale)
        q, k = query * root, key * root
        probs = torch.matmul(q, k.transpose(-2, -1))
        if allowed is not None:
            probs.masked_fill_(~allowed, float("-inf"))
        # in place: the CPU kernel reads each row whole before it writes it
        torch.ops.aten._softmax.out(probs, -1, False, out=probs)
        if allowed is not None:
            empty = ~allowed.any(-1, keepdim=True)
            if empty.any():  # as sdpa's safe softmax: a query that may see no key gets zeros, not NaN
                probs.masked_fill_(empty, 0.0)
        noise = torch.empty_like(probs).bernoulli_(1 - dropout)
        keep = noise.bool()
        noise.div_(1 - dropout)
        dropped = noise.mul_(probs)  # sdpa's `probs * noise`, in the noise's buffer
        out = torch.matmul(dropped, value)
        ctx.save_for_backward(q, k, value, probs, keep)
        ctx.dropout, ctx.root = dropout, root
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, value, probs, keep = ctx.saved_tensors
        factor = 1 / (1 - ctx.dropout)
        dropped = probs * keep
        dropped.mul_(factor)
        grad_value = torch.matmul(dropped.transpose(-2, -1), grad_out)
        del dropped
        grad_probs = torch.matmul(grad_out, value.transpose(-2, -1))
        grad_probs.mul_(keep).mul_(factor)
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        del grad_probs
        grad_query = torch.matmul(grad_scores, k).mul_(ctx.root)
        grad_key = torch.matmul(q.transpose(-2, -1), grad_scores).mul_(ctx.root).transpose(-2, -1)
        return grad_query, grad_key, grad_value, None, None, None


def lean_applies(query, key, attention_mask, dropout: float, is_causal) -> bool:
    """Whether sdpa would run its math path for dropout here, which LeanAttention replaces."""
    return (
        dropout > 0
        and query.device.type == "cpu"
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad)
        and query.dtype == torch.float32
        and query.shape[1] == key.shape[1]  # no grouped heads
        and query.shape[2] == key.shape[2]
        and (attention_mask is None or attention_mask.dtype == torch.bool)
        and not is_causal
    )


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """transformers' attention-function signature: [B, H, L, D] inputs, returns ([B, L, H, D], None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    causal = causal and attention_mask is None and query.shape[2] > 1
    plain = not (kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
                 or kwargs.get("output_attentions", False))
    if not (plain and lean_applies(query, key, attention_mask, dropout, causal)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = LeanAttention.apply(query, key, value, attention_mask, float(dropout), float(scale))
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
