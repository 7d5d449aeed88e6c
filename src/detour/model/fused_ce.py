"""Fused linear + cross-entropy: the summed loss of `rows @ W.T + b`, gradients made in forward.

    python -m pytest -q tests/model/test_fused_ce.py

The vocabulary projection is where the head's FLOPs and memory are. Done by autograd, it needs the
(rows x vocab) logits kept for backward, or (checkpointed) computed twice. Here each chunk of rows
gets its logits, its loss and at once its gradients: with G = softmax - onehot, the chunk's
input-row gradient G @ W is written and G.T @ rows is added to the weight's; then the chunk's
logits are dropped. Backward only scales the stored gradients, so the projection costs 3 matmuls
(one forward, two gradient) instead of 4 with recompute, and one chunk of logits is alive at a time.

Hand-written rather than a library: liger-kernel and cut-cross-entropy are Triton kernels (no CPU),
and torch's own F.linear_cross_entropy chunked path exists only from torch 2.13 while detour
supports torch >= 2.4. In fp32 it matches F.cross_entropy(reduction="sum") on the full logits to
1e-5: the loss relative, every gradient entry absolute (tests/model/test_fused_ce.py).
"""

from __future__ import annotations

import torch

from detour.errors import DetourError

IGNORE = -100


def _compute_dtype(rows: torch.Tensor) -> torch.dtype:
    """The matmul dtype autograd would use here: autocast's when it is on for this device."""
    device = rows.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return rows.dtype


def _chunked(rows, weight, bias, targets, chunk_size, need_rows, need_weight, need_bias):
    """(summed loss, [grad rows, grad weight, grad bias], each None when not needed), chunk by chunk.

    With E = exp(logits - max) and s = 1 / sum(E) per row, the gradient of the logits is
    s * E - onehot. It is never formed: s scales the (rows x hidden) factors of the two gradient
    matmuls instead of the (rows x vocab) block, and the onehot part is a gather / scatter of rows.
    """
    compute = _compute_dtype(rows)
    # softmax, loss and accumulated gradients at least in fp32 (autocast runs matmuls in bf16)
    acc = torch.promote_types(compute, torch.float32)
    device, n = rows.device, rows.shape[0]
    grad_rows = torch.empty(rows.shape, dtype=acc, device=device) if need_rows else None
    grad_weight = torch.zeros(weight.shape, dtype=acc, device=device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=acc, device=device) if need_bias else None
    any_grad = need_rows or need_weight or need_bias
    total = torch.zeros((), dtype=acc, device=device)
    with torch.autocast(device.type, enabled=False):  # dtypes are chosen explicitly below
        w = weight.to(compute)
        b = bias.to(compute) if bias is not None else None
        w_acc = w.to(acc)
        # one (chunk x vocab) buffer for every chunk: a fresh one each time costs its page faults
        buffer = torch.empty((min(chunk_size, n), weight.shape[0]), dtype=compute, device=device)
        for start in range(0, n, chunk_size):
            x, y = rows[start : start + chunk_size].to(compute), targets[start : start + chunk_size]
            logits = buffer[: len(y)]
            if b is None:
                torch.mm(x, w.t(), out=logits)
            else:
                torch.addmm(b, x, w.t(), out=logits)
            z = logits.to(acc)  # the buffer itself unless autocast made it bf16
            labelled = y != IGNORE
            safe = torch.where(labelled, y, 0)
            z.sub_(z.amax(dim=1, keepdim=True))
            picked = z.gather(1, safe[:, None]).squeeze(1)
            denom = z.exp_().sum(dim=1)  # z now holds E
            total += torch.where(labelled, denom.log() - picked, 0.0).sum()
            if not any_grad:
                continue
            scale = torch.where(labelled, denom.reciprocal(), 0.0)  # ignored rows: no gradient
            e = z.to(compute)
            if need_rows:  # s * (E @ W) - W[y]
                part = (e @ w).to(acc).mul_(scale[:, None])
                grad_rows[start : start + chunk_size] = part.sub_(w_acc[safe] * labelled[:, None])
            if need_weight:  # E.T @ (s * x), then - x at each row's target
                xs = x.to(acc) * scale[:, None]
                if compute == acc:
                    torch.addmm(grad_weight, e.t(), xs, out=grad_weight)  # = addmm_, seen by FlopCounterMode
                else:
                    grad_weight += e.t() @ xs.to(compute)
                grad_weight.index_add_(0, safe, x.to(acc) * labelled[:, None], alpha=-1)
            if need_bias:  # E.T @ s, then - 1 at each target
                grad_bias += (e.t() @ scale.to(compute)).to(acc)
                grad_bias.index_add_(0, safe, labelled.to(acc), alpha=-1)
    return total, [grad_rows, grad_weight, grad_bias]


class FusedLinearCrossEntropy(torch.autograd.Function):
    """sum_i cross_entropy(rows[i] @ weight.T + bias, targets[i]); targets == -100 count zero."""

    @staticmethod
    def forward(ctx, rows, weight, bias, targets, chunk_size):
        needs = ctx.needs_input_grad
        total, ctx.grads = _chunked(rows, weight, bias, targets, chunk_size, needs[0], needs[1],
                                    bias is not None and needs[2])
        ctx.dtypes = (rows.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        # scaled out of place, so a retained graph (gradcheck, retain_graph=True) can run backward again
        out = [None if g is None else (g * grad_output).to(dtype) for g, dtype in zip(ctx.grads, ctx.dtypes)]
        return out[0], out[1], out[2], None, None


def linear_cross_entropy_sum(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             targets: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Summed cross-entropy of `rows` [N, H] projected by `weight` [V, H] (+ `bias` [V]) against `targets` [N]."""
    if rows.dim() != 2 or targets.shape != rows.shape[:1]:
        raise DetourError(f"fused cross-entropy: rows must be [N, H] and targets [N]; got {tuple(rows.shape)} "
                          f"and {tuple(targets.shape)}")
    if weight.dim() != 2 or weight.shape[1] != rows.shape[1]:
        raise DetourError(f"fused cross-entropy: weight {tuple(weight.shape)} does not project rows of width "
                          f"{rows.shape[1]}")
    if int(chunk_size) < 1:
        raise DetourError(f"fused cross-entropy: chunk_size must be >= 1, got {chunk_size}")
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (rows, weight, bias)):
        # the Function would be told every input needs a gradient under no_grad: ask for none
        return _chunked(rows, weight, bias, targets, int(chunk_size), False, False, False)[0]
    return FusedLinearCrossEntropy.apply(rows, weight, bias, targets, int(chunk_size))
