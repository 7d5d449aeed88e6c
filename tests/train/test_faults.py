"""Fault injection: corrupt, truncated and missing checkpoint files, a full disk, random kill -9 points.

Every case must end bit-identical to an uninterrupted run, or stop with an error that names the
problem; nothing is ever silently restarted.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from detour.errors import DetourError
from detour.train import checkpoint as checkpoint_module
from detour.train.checkpoint import CheckpointWriteError, list_checkpoints, verify_checkpoint
from detour.train.loop import train
from tests.train.conftest import RECIPES, TINY

torch.set_num_threads(1)

SETS = ["phases.0.tokens=2600", "checkpoint.every_tokens=256", "checkpoint.keep_last=3", "model.config.attention_dropout=0.1",
        "phases.0.objective=mlm", "phases.0.mask_rate=0.3"]  # an MLM phase with dropout: every RNG matters


def _final(out: Path) -> bytes:
    return (out / "model" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference(tiny_recipe_module, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    train(tiny_recipe_module(*SETS), out, progress=False)
    return out


@pytest.fixture(scope="module")
def tiny_recipe_module(synthetic_data):
    from detour.config import load_recipe

    def make(*overrides):
        return load_recipe(RECIPES / "tiny-modernbert.yaml", [f"data.sources=[{synthetic_data}]", *TINY, *overrides])

    return make


def _crashed_copy(reference: Path, dest: Path, keep_steps: int) -> Path:
    """The run folder as a kill after the checkpoint of `keep_steps` would leave it."""
    shutil.copytree(reference, dest)
    for name in ("model", "summary.json"):
        target = dest / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    for ckpt in list_checkpoints(dest / "checkpoints"):
        if int(ckpt.name.split("-")[1]) > keep_steps:
            shutil.rmtree(ckpt)
    return dest


def _newest(out: Path) -> Path:
    return list_checkpoints(out / "checkpoints")[-1]


@pytest.mark.parametrize("damage", ["flip-weights", "flip-optimizer", "truncate-rng"])
def test_a_corrupt_checkpoint_is_named_and_the_previous_one_used(tiny_recipe_module, reference, tmp_path,
                                                                 damage, capsys):
    out = _crashed_copy(reference, tmp_path / "run", keep_steps=13)
    bad = _newest(out)
    name = {"flip-weights": "model.safetensors", "flip-optimizer": "optimizer.pt", "truncate-rng": "rng-0.pt"}[damage]
    target = bad / name
    data = bytearray(target.read_bytes())
    if damage == "truncate-rng":
        data = data[: len(data) // 2]
    else:
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])  # 64 flipped bytes
    target.write_bytes(bytes(data))
    assert verify_checkpoint(bad) is not None
    train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    err = capsys.readouterr().err
    assert f"skipping corrupt checkpoint {bad}" in err and str(target) in err
    assert ("checksum" in err) if damage != "truncate-rng" else ("truncated" in err)
    assert "resuming from the previous good checkpoint" in err
    assert _final(out) == _final(reference)


def test_no_usable_checkpoint_is_an_error_not_a_fresh_start(tiny_recipe_module, reference, tmp_path):
    out = _crashed_copy(reference, tmp_path / "run", keep_steps=13)
    metrics = (out / "metrics.jsonl").read_bytes()
    for ckpt in out.glob("checkpoints/step-*"):
        (ckpt / "state.json").unlink()
        (ckpt / "manifest.json").unlink()
    with pytest.raises(DetourError, match="no usable checkpoint in .*Nothing was deleted"):
        train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert not (out / "model").exists()


def test_resume_without_any_checkpoint_says_it_starts_fresh(tiny_recipe_module, tmp_path, capsys):
    train(tiny_recipe_module(*SETS, "phases.0.tokens=256", "phases.1.tokens=256"), tmp_path / "run", resume=True,
          progress=False)
    assert "no checkpoint in" in capsys.readouterr().err


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tiny_recipe_module, reference, tmp_path,
                                                                 monkeypatch):
    real_save = torch.save
    calls = {"n": 0}

    def full_disk(obj, path, *args, **kwargs):
        # The 4th checkpoint's optimizer file: half of it reaches the disk, then the disk is full.
        if str(path).endswith("optimizer.pt"):
            calls["n"] += 1
            if calls["n"] == 4:
                real_save(obj, path, *args, **kwargs)
                with open(path, "r+b") as fh:
                    fh.truncate(os.path.getsize(path) // 2)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(checkpoint_module.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"No space left on device; it needs about .* MiB; .* MiB are free"):
        train(tiny_recipe_module(*SETS), out, progress=False)
    assert not list((out / "checkpoints").glob(".tmp-*")), "the temporary folder was left behind"
    kept = list_checkpoints(out / "checkpoints")
    assert [c.name for c in kept] == ["step-00000001", "step-00000002", "step-00000003"]
    assert all(verify_checkpoint(c) is None for c in kept)
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)  # space is back
    train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    assert _final(out) == _final(reference)


def _cmd(synthetic_data, out: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "detour.cli", "train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out),
            "--no-progress"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY, *SETS]:
        args += ["--set", s]
    return args + list(extra)


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def test_random_kill9_points_then_resume_is_bit_identical(synthetic_data, reference, tmp_path):
    """Seeded random kill -9 points in one run (mid-step, mid-checkpoint, mid-export), then resume."""
    # A new seed every run (printed), so CI tries new kill points each time; DETOUR_FAULT_SEED replays one.
    # Three points keep the suite short (new ones every run); DETOUR_FAULT_POINTS=25 is the full audit.
    seed = int(os.environ.get("DETOUR_FAULT_SEED", str(time.time_ns() % 10**6)))
    n_points = int(os.environ.get("DETOUR_FAULT_POINTS", "3"))
    rng = random.Random(seed)
    total = _lines(reference / "metrics.jsonl")
    points = sorted(rng.sample(range(1, total), min(n_points, total - 1)))
    jitter = [rng.uniform(0.0, 0.15) for _ in points]
    print(f"kill -9 points (seed {seed}): after step {points}, plus {[round(j, 3) for j in jitter]} s")
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    survived = 0
    for k, wait in zip(points, jitter):
        proc = subprocess.Popen(_cmd(synthetic_data, out, "--resume"), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while proc.poll() is None and _lines(out / "metrics.jsonl") < k and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(wait)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            survived += 1
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (-signal.SIGKILL, 0), err.decode()[-2000:]
        assert not (out / "summary.json").exists() or proc.returncode == 0
    done = subprocess.run(_cmd(synthetic_data, out, "--resume"), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert survived >= 0.8 * len(points), f"only {survived} of {len(points)} kill points hit a running process"
    assert _final(out) == _final(reference)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == list(range(1, total + 1))  # no step lost or repeated


@pytest.fixture
def small_filesystem(small_filesystem_of):
    """A real 30 MiB tmpfs (tests/conftest.py: needs mount permission)."""
    return small_filesystem_of("30m")


def test_a_real_full_disk_then_space_back_resumes_bit_identical(tiny_recipe_module, reference, small_filesystem):
    out = small_filesystem / "run"
    with pytest.raises(DetourError) as failure:
        train(tiny_recipe_module(*SETS), out, progress=False)
    print(f"full disk: {failure.value}")
    assert "No space left on device" in str(failure.value) and "MiB are free there" in str(failure.value)
    assert not list(out.rglob(".tmp-*")) and not list(out.rglob("*.tmp-*")), "temporary files left behind"
    kept = list_checkpoints(out / "checkpoints")
    assert kept and all(verify_checkpoint(c) is None for c in kept)
    small_filesystem.grow("300m")
    train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    assert _final(out) == _final(reference)


def test_sigterm_during_the_final_export_lets_it_finish(tiny_recipe_module, reference, tmp_path, monkeypatch,
                                                       capsys):
    from detour.model import export as export_module

    real_export = export_module.export_hf

    def export_with_a_sigterm(model, tokenizer, folder, card):
        if folder.name == "model":  # the final export: the wall-time kill arrives now
            os.kill(os.getpid(), signal.SIGTERM)
        return real_export(model, tokenizer, folder, card)

    out = _crashed_copy(reference, tmp_path / "run", keep_steps=13)
    (out / "checkpoints" / ".tmp-step-00000014").mkdir()  # a checkpoint a kill cut short
    monkeypatch.setattr(export_module, "export_hf", export_with_a_sigterm)
    result = train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    assert result.summary and (out / "summary.json").is_file()
    assert not list(out.glob("model.tmp-*")) and _final(out) == _final(reference)
    assert "removed" in capsys.readouterr().err and not (out / "checkpoints" / ".tmp-step-00000014").exists()


def test_a_checkpoint_without_manifest_is_skipped_as_unverified(tiny_recipe_module, reference, tmp_path, capsys):
    out = _crashed_copy(reference, tmp_path / "run", keep_steps=13)
    *_, previous, bad = list_checkpoints(out / "checkpoints")
    (bad / "manifest.json").unlink()
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])  # damage no checksum can name now
    weights.write_bytes(bytes(data))
    train(tiny_recipe_module(*SETS), out, resume=True, progress=False)
    err = capsys.readouterr().err
    print(err)
    assert f"skipping unverified checkpoint {bad}: it has no manifest.json" in err
    assert f"resuming from the previous good checkpoint {previous}" in err
    assert _final(out) == _final(reference)


def test_trust_unverified_checkpoint_takes_it_with_a_warning(reference, tmp_path):
    from detour.train.checkpoint import latest_checkpoint
    from detour.train.run import add_arguments

    out = _crashed_copy(reference, tmp_path / "run", keep_steps=13)
    newest = _newest(out)
    (newest / "manifest.json").unlink()
    said = []
    assert latest_checkpoint(out / "checkpoints", warn=said.append, trust_unverified=True).path == newest
    assert said and said[0].startswith(f"detour: WARNING: resuming from unverified checkpoint {newest}")
    for ckpt in list_checkpoints(out / "checkpoints"):
        (ckpt / "manifest.json").unlink(missing_ok=True)
    with pytest.raises(DetourError, match="--trust-unverified-checkpoint resumes from one without a manifest"):
        latest_checkpoint(out / "checkpoints", warn=said.append)
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["r.yaml", "--out", "o", "--resume", "--trust-unverified-checkpoint"]).trust_unverified_checkpoint


def test_the_mask_generator_in_checkpoints_is_never_drawn_from(reference, tiny_recipe_module):
    """MLM masks come from the stream (seed, phase, sequence index): the generator each checkpoint keeps
    for its format stays at its seed through a whole MLM run, so restoring it or not changes nothing."""
    from detour.data.packing import PackedStream, collate
    from detour.model.objectives import mlm_inputs
    from detour.train.loop import mask_key
    from detour.train.setup import build_model

    recipe = tiny_recipe_module(*SETS)
    seeded = torch.Generator().manual_seed(recipe.seed).get_state()
    for ckpt in list_checkpoints(reference / "checkpoints"):
        rng = torch.load(ckpt / "rng-0.pt", weights_only=True)
        assert torch.equal(rng["mask_generator"], seeded), f"{ckpt}: the mask generator was drawn from"
    model, tokenizer = build_model(recipe, torch.device("cpu"))
    stream = PackedStream.from_paths([(s.path, s.weight) for s in recipe.data.sources], seq_len=recipe.data.seq_len,
                                     seed=recipe.data.shuffle_seed)
    batch = collate([stream.next_sequence() for _ in range(4)], tokenizer.pad_token_id)
    key = mask_key(recipe, recipe.phases[0])
    a = mlm_inputs(model, batch, 0.3, torch.Generator().manual_seed(1), mask_key=key)
    b = mlm_inputs(model, batch, 0.3, torch.Generator().manual_seed(2), mask_key=key)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
