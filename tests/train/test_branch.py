"""Branching from a phase-end checkpoint: the branch continues the parent's run bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from detour.cli import main as detour
from detour.errors import DetourError
from detour.train.checkpoint import is_phase_end, list_checkpoints
from detour.train.loop import train
from tests.train.conftest import RECIPES, TINY

torch.set_num_threads(1)

# A checkpoint after every step (256 tokens a step), none pruned: any step's weights can be compared.
EVERY_STEP = ["checkpoint.every_tokens=256", "checkpoint.keep_last=100"]
CLM_STEPS = 6  # ceil(1300 / 256)


def _weights_at(run, global_step: int) -> dict:
    path = run / "checkpoints" / f"step-{global_step:08d}" / "model.safetensors"
    return load_file(str(path))


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def _branch(tiny_recipe, parent, out, *overrides):
    recipe = tiny_recipe(*EVERY_STEP, *overrides, f"branch.run={json.dumps(str(parent))}", "branch.after_phase=clm")
    return train(recipe, out, progress=False)


def _parent(tmp_path_factory, synthetic_data, *overrides):
    from detour.config import load_recipe

    out = tmp_path_factory.mktemp("parent") / "run"
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", [f"data.sources=[{synthetic_data}]", *TINY, *EVERY_STEP,
                                                            "phases.1.lr.shape=constant", *overrides])
    train(recipe, out, progress=False)
    return out


@pytest.fixture(scope="module")
def parent(tmp_path_factory, synthetic_data):
    return _parent(tmp_path_factory, synthetic_data)


# The MLM twin's Phase 1 draws masks (and the dropout RNG moves), so its branch also needs the
# generators' states carried, which a CLM parent would not show.
MLM_PHASE_1 = ["phases.0.objective=mlm", "phases.0.mask_rate=0.3", "model.config.attention_dropout=0.1"]


@pytest.fixture(scope="module")
def mlm_parent(tmp_path_factory, synthetic_data):
    return _parent(tmp_path_factory, synthetic_data, *MLM_PHASE_1)


@pytest.mark.parametrize("kind", ["clm", "mlm"])
def test_branches_of_two_lengths_take_the_parents_first_decay_step(tiny_recipe, parent, mlm_parent, tmp_path, kind):
    parent, extra = (parent, []) if kind == "clm" else (mlm_parent, MLM_PHASE_1)
    parent_first_decay = _weights_at(parent, CLM_STEPS + 1)
    for tokens in ("700", "512"):  # 3 steps (the last one partial) and 2
        out = tmp_path / f"decay-{tokens}"
        result = _branch(tiny_recipe, parent, out, *extra, "phases.1.lr.shape=constant", f"phases.1.tokens={tokens}")
        _assert_identical(_weights_at(out, CLM_STEPS + 1), parent_first_decay)
        branch = result.summary["branch"]
        assert branch["after_phase"] == "clm" and branch["global_step"] == CLM_STEPS
        # the Phase-1 record is the parent's, and the decay stream equals the parent's over the same steps
        assert branch["stream_continues_parent"]["clm"] == {"carried": True, "equal": True}
        assert branch["stream_continues_parent"]["decay"]["equal"] is True
        parent_rows = [json.loads(line) for line in (parent / "metrics.jsonl").read_text().splitlines()]
        same_step = [r for r in parent_rows if r["phase"] == "decay" and r["tokens"] == int(tokens)]
        assert same_step[0]["stream_hash"] == result.summary["phases"]["decay"]["stream_hash"]
        # the branch's metrics start with the parent's Phase-1 records
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert rows[:CLM_STEPS] == parent_rows[:CLM_STEPS]
    # the full-length branch is the parent's run, bit for bit
    _assert_identical(load_file(str(tmp_path / "decay-700" / "model" / "model.safetensors")),
                      load_file(str(parent / "model" / "model.safetensors")))


def test_a_branch_equals_its_recipe_run_from_scratch(tiny_recipe, parent, tmp_path):
    # A 1-sqrt decay of another length: the branch ends where an uninterrupted run of its recipe ends.
    sets = ["phases.1.lr.shape=1-sqrt", "phases.1.tokens=300"]
    # The parent's decay has a constant LR: only the phases up to `clm` must match, so a change there
    # is refused while the decay's own shape is free.
    with pytest.raises(DetourError, match=r"^phases\.0\.lr\.shape: "):
        _branch(tiny_recipe, parent, tmp_path / "bad", "phases.0.lr.shape=1-sqrt")
    branched = _branch(tiny_recipe, parent, tmp_path / "branch", *sets).out
    scratch = train(tiny_recipe(*EVERY_STEP, *sets), tmp_path / "scratch", progress=False).out
    _assert_identical(load_file(str(branched / "model" / "model.safetensors")),
                      load_file(str(scratch / "model" / "model.safetensors")))


@pytest.mark.parametrize("override,field", [("data.shuffle_seed=43", "data.shuffle_seed"),
                                            ("data.seq_len=32", "data.seq_len"),
                                            ("optimizer.lr=1.0e-3", "optimizer.lr"),
                                            ("phases.0.tokens=1000", "phases.0.tokens")])
def test_a_branch_that_differs_before_the_branch_point_is_refused(tiny_recipe, parent, tmp_path, override, field):
    with pytest.raises(DetourError, match=rf"^{field.replace('.', r'[.]')}: .* in the parent run"):
        _branch(tiny_recipe, parent, tmp_path / "bad", override)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_cli_branch_flags_and_errors(tiny_recipe, parent, tmp_path, synthetic_data, capsys):
    sets = [f"data.sources=[{synthetic_data}]", *TINY, "phases.1.tokens=256"]
    args = ["train", str(RECIPES / "tiny-modernbert.yaml"), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    assert detour(args + ["--out", str(tmp_path / "a"), "--from", str(parent)]) == 2
    assert "--from and --after-phase go together" in capsys.readouterr().err
    assert detour(args + ["--out", str(tmp_path / "b"), "--from", str(parent), "--after-phase", "decay"]) == 2
    assert "last phase" in capsys.readouterr().err
    assert detour(args + ["--out", str(tmp_path / "c"), "--from", str(tmp_path), "--after-phase", "clm"]) == 2
    assert "no recipe.json" in capsys.readouterr().err
    assert detour(args + ["--out", str(tmp_path / "d"), "--from", str(parent), "--after-phase", "clm",
                          "--set", "data.shuffle_seed=7"]) == 2
    assert "data.shuffle_seed: 7 here but 42 in the parent run" in capsys.readouterr().err
    assert detour(args + ["--out", str(tmp_path / "e"), "--from", str(parent), "--after-phase", "clm"]) == 0
    out = capsys.readouterr().out
    assert f"branched from {parent} after clm (step {CLM_STEPS})" in out
    assert "decay continued: equal" in out


def test_phase_end_checkpoints_survive_pruning(tiny_recipe, tmp_path):
    out = train(tiny_recipe("checkpoint.every_tokens=256", "checkpoint.keep_last=1"), tmp_path / "run",
                progress=False).out
    kept = list_checkpoints(out / "checkpoints")
    states = [json.loads((p / "state.json").read_text()) for p in kept]
    # the last (end of decay) and the end of clm; every periodic one pruned
    assert [s["global_step"] for s in states] == [CLM_STEPS, CLM_STEPS + 3]
    assert all(is_phase_end(s) for s in states)
    out2 = train(tiny_recipe("checkpoint.every_tokens=256", "checkpoint.keep_last=1",
                             "checkpoint.keep_phase_ends=false"), tmp_path / "run2", progress=False).out
    assert [p.name for p in list_checkpoints(out2 / "checkpoints")] == [f"step-{CLM_STEPS + 3:08d}"]
