"""The training loop: exact budgets, LR at phase boundaries, freezing, optimizer moments, export."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from detour.train.loop import train
from detour.runs import RunFolder, read_metrics
from detour.train.schedule import lr_at


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_budgets_exact_and_lr_follows_formula(tiny_recipe, tmp_path):
    recipe = tiny_recipe()
    result = train(recipe, tmp_path / "run", progress=False)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    per_step = recipe.tokens_per_step()
    for phase in recipe.phases:
        rows = [r for r in records if r["phase"] == phase.name]
        assert rows[-1]["tokens"] == phase.tokens == result.summary["phases"][phase.name]["tokens"]
        assert len(rows) == math.ceil(phase.tokens / per_step)
        assert rows[-1]["tokens"] - rows[-2]["tokens"] == phase.tokens - (len(rows) - 1) * per_step
        for r in rows:
            assert r["lr"] == pytest.approx(lr_at(phase.lr, recipe.optimizer.lr, r["tokens"], phase.tokens), rel=1e-12)
            assert r["padding_tokens"] == 0 or r is rows[-1]
            assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["grad_norm"] >= 0
    clm = [r for r in records if r["phase"] == "clm"]
    decay = [r for r in records if r["phase"] == "decay"]
    assert clm[0]["lr"] < clm[1]["lr"] <= recipe.optimizer.lr          # warmup
    assert clm[-1]["lr"] == pytest.approx(recipe.optimizer.lr)          # then constant
    assert decay[-1]["lr"] == pytest.approx(0.1 * recipe.optimizer.lr)  # 1-sqrt ends at 10% of peak
    assert decay[0]["lr"] < recipe.optimizer.lr and decay[0]["lr"] > decay[1]["lr"]
    assert {"phase", "step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(records[0])
    run = RunFolder(tmp_path / "run")  # the folder is laid out as detour.runs describes it, for every reader
    assert run.is_finished() and run.curves.is_file() and (run.model / "config.json").is_file()
    assert all((run.export(p.name) / "config.json").is_file() for p in recipe.phases)


def test_frozen_groups_get_no_update(tiny_recipe, tmp_path):
    # Phase 1 freezes layer 0; phase 2 freezes layer 1, whose AdamW moments were carried from phase 1
    # and whose weight decay would still move it if it stayed in the optimizer step.
    recipe = tiny_recipe("phases.0.freeze.layers=0", "phases.1.freeze.layers=1")
    train(recipe, tmp_path / "run", progress=False)
    from detour.train.setup import build_model, select_device

    torch.manual_seed(recipe.seed)
    initial = {k: v.clone() for k, v in build_model(recipe, select_device("cpu"))[0].state_dict().items()}
    after_clm = _weights(tmp_path / "run" / "export" / "clm")
    after_decay = _weights(tmp_path / "run" / "export" / "decay")
    layer0 = [k for k in after_clm if ".layers.0." in k]
    layer1 = [k for k in after_clm if ".layers.1." in k]
    assert layer0 and layer1
    for k in layer0:
        assert torch.equal(after_clm[k], initial[k]), k
    for k in layer1:
        assert not torch.equal(after_clm[k], initial[k]) or "bias" in k
        assert torch.equal(after_decay[k], after_clm[k]), k
    assert any(not torch.equal(after_decay[k], after_clm[k]) for k in layer0)


@pytest.mark.parametrize("keep", [True, False])
def test_optimizer_moments_carried_or_reset(tiny_recipe, tmp_path, keep):
    recipe = tiny_recipe(f"phases.1.keep_optimizer_state={str(keep).lower()}")
    train(recipe, tmp_path / "run", progress=False)
    from detour.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = torch.load(ckpt.path / "optimizer.pt", weights_only=True)["state"]
    steps = {int(s["step"]) for s in state.values()}
    clm_steps, decay_steps = (recipe.steps_in_phase(p) for p in recipe.phases)
    assert steps == ({clm_steps + decay_steps} if keep else {decay_steps})


def test_mismatched_tokenizer_is_refused(tiny_recipe, tmp_path, minilm):
    from transformers import AutoTokenizer

    from detour.errors import DetourError

    cased = tmp_path / "cased-tokenizer"
    tok = AutoTokenizer.from_pretrained(minilm, do_lower_case=False)
    tok.save_pretrained(cased)
    with pytest.raises(DetourError, match="different tokenizer"):
        train(tiny_recipe(f"model.tokenizer={cased}"), tmp_path / "run", progress=False)


def test_non_finite_loss_stops_with_a_clear_error_and_no_checkpoint(tiny_recipe, tmp_path):
    from detour.errors import DetourError

    recipe = tiny_recipe("optimizer.lr=1.0e+30", "phases.0.lr.warmup_tokens=null", "optimizer.grad_clip=null",
                         "checkpoint.every_tokens=null")
    with pytest.raises(DetourError, match="non-finite loss"):
        train(recipe, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
