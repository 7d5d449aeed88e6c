"""Fused linear + cross-entropy: exact against the dense loss, no logits kept, no recompute in the head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from detour.errors import DetourError
from detour.model.fused_ce import linear_cross_entropy_sum
from detour.model.load import mlm_head_parts
from detour.model.objectives import clm_labels, clm_loss, encode, head_loss_sum, head_rows

N, H, V = 37, 16, 50


def case(dtype=torch.float32, bias=True, ignored=(3, 4, 20), seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(N, H, generator=gen, dtype=dtype)
    weight = torch.randn(V, H, generator=gen, dtype=dtype)
    b = torch.randn(V, generator=gen, dtype=dtype) if bias else None
    targets = torch.randint(V, (N,), generator=gen)
    targets[list(ignored)] = -100
    return rows, weight, b, targets


def loss_and_grads(fn, rows, weight, bias, targets):
    leaves = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in (rows, weight, bias)]
    loss = fn(*leaves, targets)
    loss.backward()
    return loss.detach(), [None if t is None else t.grad for t in leaves]


def dense(rows, weight, bias, targets):
    return F.cross_entropy(F.linear(rows, weight, bias), targets, reduction="sum")


def fused(chunk):
    return lambda rows, weight, bias, targets: linear_cross_entropy_sum(rows, weight, bias, targets, chunk)


@pytest.mark.parametrize("chunk", [1, 5, N, 100])  # size 1, an uneven last chunk, one chunk, more than N
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_equal_the_dense_reference(chunk, bias):
    rows, weight, b, targets = case(bias=bias)
    for t in (rows, weight, b):
        if t is not None:
            t.requires_grad_(True)
    ref_loss, ref_grads = loss_and_grads(dense, rows, weight, b, targets)
    loss, grads = loss_and_grads(fused(chunk), rows, weight, b, targets)
    # the loss to 1e-5 relative: a sum of 34 fp32 terms near 380 has an ulp of 3e-5, so the order of
    # summation alone moves it by more than 1e-5 absolute; every gradient entry to 1e-5 absolute
    assert (loss - ref_loss).abs().item() <= 1e-5 * ref_loss.abs().item()
    for g, ref in zip(grads, ref_grads):
        assert (g is None) == (ref is None)
        if ref is not None:
            assert (g - ref).abs().max().item() <= 1e-5
    assert grads[0][[3, 4, 20]].abs().max().item() == 0.0  # ignored rows get no gradient


def test_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(7, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(7, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.tensor([0, -100, 6, 2, 2])
    assert torch.autograd.gradcheck(lambda r, w, b: linear_cross_entropy_sum(r, w, b, targets, 2), (rows, weight, bias))


def test_frozen_weight_gets_no_gradient_and_rows_without_grad_get_none():
    rows, weight, b, targets = case()
    ref_loss, ref_grads = loss_and_grads(dense, rows.requires_grad_(), weight, b.requires_grad_(), targets)
    loss, grads = loss_and_grads(fused(8), rows, weight, b, targets)  # weight frozen (no requires_grad)
    assert grads[1] is None and (loss - ref_loss).abs().item() <= 1e-5 * ref_loss.abs().item()
    with FlopCounterMode(display=False) as counter:  # and no weight gradient is computed at all
        linear_cross_entropy_sum(rows, weight, b, targets, 8).backward()
    assert counter.get_total_flops() == 2 * (2 * N * H * V)  # the logits and the row gradient
    assert (grads[0] - ref_grads[0]).abs().max().item() <= 1e-5
    assert (grads[2] - ref_grads[2]).abs().max().item() <= 1e-5
    # only the weight trains: the rows and bias need nothing
    _, ref_grads = loss_and_grads(dense, rows.detach(), weight.requires_grad_(), b.detach(), targets)
    _, grads = loss_and_grads(fused(8), rows.detach(), weight, b.detach(), targets)
    assert grads[0] is None and grads[2] is None
    assert (grads[1] - ref_grads[1]).abs().max().item() <= 1e-5


def test_all_ignored_rows_give_zero_loss_and_zero_gradients():
    rows, weight, b, targets = case(ignored=range(N))
    loss, grads = loss_and_grads(fused(10), rows.requires_grad_(), weight.requires_grad_(), b.requires_grad_(), targets)
    assert loss.item() == 0.0 and all(g.abs().max().item() == 0.0 for g in grads)


def test_backward_scales_by_the_upstream_gradient_and_keeps_no_logits():
    rows, weight, b, targets = case()
    leaves = [t.clone().requires_grad_() for t in (rows, weight, b)]
    loss = linear_cross_entropy_sum(*leaves, targets, 4)
    stored = [g for g in loss.grad_fn.grads if g is not None]
    # what waits for backward: one gradient per input, never a (rows x vocab) block
    assert sorted(tuple(g.shape) for g in stored) == sorted([(N, H), (V, H), (V,)])
    (loss * 0.25).backward()
    ref = [t.clone().requires_grad_() for t in (rows, weight, b)]
    (dense(*ref, targets) * 0.25).backward()
    for got, want in zip(leaves, ref):
        assert (got.grad - want.grad).abs().max().item() <= 1e-5


def test_autocast_runs_the_projection_in_its_dtype_and_the_softmax_in_float32():
    rows, weight, b, targets = case()
    leaves = [t.clone().requires_grad_() for t in (rows, weight, b)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy_sum(*leaves, targets, 8)
    loss.backward()
    assert loss.dtype == torch.float32 and all(t.grad.dtype == torch.float32 for t in leaves)
    exact = dense(rows, weight, b, targets).item()
    assert loss.item() == pytest.approx(exact, rel=2e-2)
    assert abs(loss.item() - exact) > 1e-4 * exact  # bf16 logits: not the fp32 result


def test_bad_shapes_and_chunk_size_are_clear_errors():
    rows, weight, b, targets = case()
    with pytest.raises(DetourError, match="chunk_size"):
        linear_cross_entropy_sum(rows, weight, b, targets, 0)
    with pytest.raises(DetourError, match="targets"):
        linear_cross_entropy_sum(rows, weight, b, targets[:-1], 4)
    with pytest.raises(DetourError, match="width"):
        linear_cross_entropy_sum(rows[:, :-1], weight, b, targets, 4)


def _head_flops(model, batch, chunk_size):
    hidden = encode(model, batch, causal=True).last_hidden_state.detach().requires_grad_()
    labels = clm_labels(batch)
    keep = labels != -100
    with FlopCounterMode(display=False) as counter:
        head_loss_sum(model, hidden[keep], labels[keep], chunk_size).backward()
    return counter.get_total_flops(), int(keep.sum())


def test_clm_head_projects_three_times_not_four(models):
    # the old checkpointed head recomputed each chunk's logits in backward: 8 N H V FLOPs, now 6
    model, _ = models("modernbert")
    from detour.model.doctor import packed_batch
    from detour.model.load import config_special_ids

    batch = packed_batch([[20, 10], [31]], 32, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id, 0)
    flops, labelled = _head_flops(model, batch, 7)
    n = head_rows(labelled)  # the head's rows: padded to a few sizes
    hidden_size, vocab = model.config.hidden_size, model.config.vocab_size
    projection = 2 * n * hidden_size * vocab
    transform = 3 * 2 * n * hidden_size * hidden_size  # dense layer forward + its two gradients
    assert flops == 3 * projection + transform


def test_frozen_embeddings_train_the_head_without_a_decoder_gradient(models):
    model, _ = models("bert")
    _, decoder = mlm_head_parts(model)
    assert decoder.weight is model.get_input_embeddings().weight  # tied: a freeze of embeddings covers it
    from detour.model.doctor import packed_batch
    from detour.model.load import config_special_ids

    batch = packed_batch([[20, 10]], 32, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id, 0)
    decoder.weight.requires_grad_(False)
    try:
        out = clm_loss(model, batch, chunk_size=8)
        out.loss_sum.backward()
        assert decoder.weight.grad is None and decoder.bias.grad is not None
        assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    finally:
        decoder.weight.requires_grad_(True)
        model.zero_grad(set_to_none=True)


def test_without_grad_only_the_forward_projection_runs():
    rows, weight, b, targets = case()
    rows.requires_grad_(), weight.requires_grad_()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        loss = linear_cross_entropy_sum(rows, weight, b, targets, 8)
    assert not loss.requires_grad and counter.get_total_flops() == 2 * N * H * V
    assert (loss - dense(rows, weight, b, targets)).abs().item() <= 1e-5 * loss.item()


def test_large_logits_neither_overflow_nor_lose_the_loss():
    rows, weight, b, targets = case()
    rows = (rows * 60).requires_grad_()  # logits in the thousands: exp() of them overflows fp32
    ref_loss, ref_grads = loss_and_grads(dense, rows, weight.requires_grad_(), b.requires_grad_(), targets)
    loss, grads = loss_and_grads(fused(6), rows, weight.requires_grad_(), b.requires_grad_(), targets)
    assert torch.isfinite(loss) and (loss - ref_loss).abs().item() <= 1e-5 * ref_loss.abs().item()
    for g, ref in zip(grads, ref_grads):  # the weight's gradient is rows-sized (~240) here: relative
        assert (g - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())


def test_a_hooked_decoder_runs_as_a_module_with_the_same_loss_and_gradients(models):
    # hooks (or adapters) on the decoder must see it run: the checkpointed path, same numbers
    model, _ = models("modernbert")
    _, decoder = mlm_head_parts(model)
    from detour.model.doctor import packed_batch
    from detour.model.load import config_special_ids

    batch = packed_batch([[20, 10]], 32, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    fused_out = clm_loss(model, batch, chunk_size=8)
    fused_grads = torch.autograd.grad(fused_out.loss_sum, params)
    rows = []
    hook = decoder.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    try:
        hooked = clm_loss(model, batch, chunk_size=8)
        hooked_grads = torch.autograd.grad(hooked.loss_sum, params)
    finally:
        hook.remove()
    assert sum(rows) == 2 * head_rows(hooked.n_labels)  # each chunk ran forward twice: once more in backward
    assert hooked.loss_sum.item() == pytest.approx(fused_out.loss_sum.item(), rel=1e-5)
    for g, ref in zip(fused_grads, hooked_grads):
        assert (g - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
