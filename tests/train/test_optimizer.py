"""The optimizer as the paper's: Composer's decoupled weight decay, never on biases and norms, the recipe's betas and eps."""

from __future__ import annotations

import pytest
import torch

from detour.config import OptimizerSpec
from detour.model.freeze import no_decay_parameter_names
from detour.train.loop import set_phase_weight_decay
from detour.train.setup import build_model, build_optimizer, select_device

torch.set_num_threads(1)


def _one_step_with_zero_gradients(model, optimizer, lr: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return {n: (before[n], p.detach()) for n, p in model.named_parameters()}


def test_zero_gradients_at_the_peak_lr_decay_weights_by_exactly_weight_decay(tiny_recipe):
    recipe = tiny_recipe("optimizer.lr=2.0e-4", "optimizer.weight_decay=1.0e-2")
    model, _ = build_model(recipe, select_device("cpu"))
    optimizer = build_optimizer(model, recipe.optimizer)
    no_decay = no_decay_parameter_names(model)
    assert any("bias" in n for n in no_decay) and any("norm" in n for n in no_decay)
    moved = _one_step_with_zero_gradients(model, optimizer, lr=2.0e-4)
    for name, (before, after) in moved.items():
        if name in no_decay:
            assert torch.equal(before, after), f"{name} was decayed"
        else:  # Composer: w <- w (1 - wd * lr_t / lr_peak); at lr_t = peak that is w (1 - wd)
            torch.testing.assert_close(after, before * (1 - 1.0e-2), rtol=1e-6, atol=0, msg=name)


def test_a_phase_with_its_own_peak_decays_relative_to_that_peak(tiny_recipe):
    recipe = tiny_recipe("optimizer.lr=2.0e-4", "optimizer.weight_decay=1.0e-2", "phases.1.lr.peak=1.0e-4")
    model, _ = build_model(recipe, select_device("cpu"))
    optimizer = build_optimizer(model, recipe.optimizer)
    set_phase_weight_decay(optimizer, recipe, recipe.phases[1])
    moved = _one_step_with_zero_gradients(model, optimizer, lr=1.0e-4)  # the decay phase at its own peak
    name = "model.layers.0.attn.Wqkv.weight"
    torch.testing.assert_close(moved[name][1], moved[name][0] * (1 - 1.0e-2), rtol=1e-6, atol=0)


@pytest.mark.parametrize("betas,eps", [((0.8, 0.95), 1e-7), ((0.9, 0.98), 1e-6)])
def test_the_recipe_betas_and_eps_reach_every_group(tiny_recipe, betas, eps):
    recipe = tiny_recipe()
    model, _ = build_model(recipe, select_device("cpu"))
    optimizer = build_optimizer(model, OptimizerSpec(lr=3e-4, betas=betas, eps=eps, weight_decay=1e-5))
    assert [tuple(g["betas"]) for g in optimizer.param_groups] == [betas, betas]
    assert [g["eps"] for g in optimizer.param_groups] == [eps, eps]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [pytest.approx(1e-5 / 3e-4), 0.0]


def test_the_optimizer_is_the_fused_adamw_and_updates_as_the_per_tensor_loop(tiny_recipe):
    """The fused kernel (as the HF Trainer's default) on CPU, with the same update as torch's loop."""
    recipe = tiny_recipe()
    model, _ = build_model(recipe, select_device("cpu"))
    fused = build_optimizer(model, recipe.optimizer)
    assert fused.defaults["fused"] is True
    twin = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    loop = torch.optim.AdamW([{**{k: v for k, v in g.items() if k not in ("params", "fused", "foreach")},
                               "params": [twin[n] for n, p in model.named_parameters() if any(p is q for q in g["params"])]}
                              for g in fused.param_groups], foreach=False, fused=False)
    assert not loop.defaults["fused"] and not any(g.get("fused") for g in loop.param_groups)
    torch.manual_seed(0)
    for _ in range(3):
        for n, p in model.named_parameters():
            p.grad = torch.randn_like(p)
            twin[n].grad = p.grad.clone()
        fused.step()
        loop.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), twin[n].detach(), rtol=1e-5, atol=1e-6)
