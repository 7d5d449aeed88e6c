"""Real multi-process training: torchrun with 2 CPU processes (gloo) matches one process."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from detour.train.loop import train
from tests.train.conftest import RECIPES, TINY


def test_torchrun_two_processes_match_one(tiny_recipe, synthetic_data, tmp_path):
    # Masks come from the stream and the tiny model has no dropout, so 2 ranks x 1 micro-batch must give
    # the same updates as 1 rank x 2, for CLM and for the MLM decay alike (up to float summation order).
    overrides = ["phases.0.tokens=1280", "phases.1.tokens=256", "checkpoint.every_tokens=null"]
    single = tmp_path / "single"
    train(tiny_recipe(*overrides), single, progress=False)
    ddp = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "detour.cli", "train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(ddp), "--no-progress"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY, *overrides]:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
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
    ckpt = sorted((ddp / "checkpoints").iterdir())[-1]
    assert {"rng-0.pt", "rng-1.pt", "model.safetensors", "optimizer.pt", "state.json"} <= {p.name for p in ckpt.iterdir()}
    assert len((ddp / "metrics.jsonl").read_text().splitlines()) == len((single / "metrics.jsonl").read_text().splitlines())
