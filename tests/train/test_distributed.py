"""Real multi-process training: torchrun with 2 CPU processes (gloo) matches one process."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from detour.train.loop import train
from tests.train.conftest import RECIPES, TINY


def _crashed_copy(run, dest, keep_steps: int):
    """The run folder as a kill after the checkpoint of `keep_steps` would leave it."""
    import shutil

    shutil.copytree(run, dest)
    shutil.rmtree(dest / "model")
    (dest / "summary.json").unlink()
    for ckpt in (dest / "checkpoints").iterdir():
        if int(ckpt.name.split("-")[1]) > keep_steps:
            shutil.rmtree(ckpt)


def _torchrun(synthetic_data, out, overrides, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "detour.cli", "train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out), "--no-progress"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY, *overrides]:
        cmd += ["--set", s]
    done = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_torchrun_two_processes_match_one(tiny_recipe, synthetic_data, tmp_path):
    # Masks come from the stream and the tiny model has no dropout, so 2 ranks x 1 micro-batch must give
    # the same updates as 1 rank x 2, for CLM and for the MLM decay alike (up to float summation order).
    overrides = ["phases.0.tokens=1280", "phases.1.tokens=512", "checkpoint.every_tokens=256",
                 "checkpoint.keep_last=20"]
    single = tmp_path / "single"
    train(tiny_recipe(*overrides), single, progress=False)
    ddp = tmp_path / "ddp"
    _torchrun(synthetic_data, ddp, overrides)
    a = load_file(str(single / "export" / "clm" / "model.safetensors"))
    b = load_file(str(ddp / "export" / "clm" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=2e-5, msg=k)
    final_single = load_file(str(single / "model" / "model.safetensors"))
    final_ddp = load_file(str(ddp / "model" / "model.safetensors"))
    assert not all(torch.equal(a[k], final_ddp[k]) for k in a)
    for k in final_single:
        torch.testing.assert_close(final_single[k], final_ddp[k], rtol=0, atol=2e-5, msg=k)
    import json

    hashes = [json.loads((run / "summary.json").read_text())["phases"]["decay"]["mask_hash"] for run in (single, ddp)]
    assert hashes[0] == hashes[1] is not None  # the same positions masked on 1 and on 2 processes
    # a checkpoint of 2 processes resumes on 1, and one of 1 process on 2 (in the MLM decay)
    _crashed_copy(ddp, tmp_path / "2to1", keep_steps=6)
    train(tiny_recipe(*overrides), tmp_path / "2to1", resume=True, progress=False)
    _crashed_copy(single, tmp_path / "1to2", keep_steps=6)
    done = _torchrun(synthetic_data, tmp_path / "1to2", overrides, "--resume")
    assert "resuming a checkpoint of 1 process(es) on 2" in done.stderr
    for run in ("2to1", "1to2"):
        resumed = load_file(str(tmp_path / run / "model" / "model.safetensors"))
        for k in final_single:
            torch.testing.assert_close(resumed[k], final_single[k], rtol=0, atol=2e-5, msg=f"{run}: {k}")
    ckpt = sorted((ddp / "checkpoints").iterdir())[-1]
    assert {"rng-0.pt", "rng-1.pt", "model.safetensors", "optimizer.pt", "state.json"} <= {p.name for p in ckpt.iterdir()}
    assert len((ddp / "metrics.jsonl").read_text().splitlines()) == len((single / "metrics.jsonl").read_text().splitlines())
