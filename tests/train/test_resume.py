"""Fault injection: kill -9 or SIGTERM mid-run, resume, and end bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from detour.stop import RESUMABLE_EXIT
from tests.train.conftest import RECIPES, TINY


def _cmd(synthetic_data, out: Path, *extra: str) -> list[str]:
    sets = [f"data.sources=[{synthetic_data}]", *TINY, "phases.0.tokens=2600"]
    args = [sys.executable, "-m", "detour.cli", "train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out),
            "--no-progress"]
    for s in sets:
        args += ["--set", s]
    return args + list(extra)


def _run_until(cmd, predicate, sig) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while proc.poll() is None and not predicate() and time.time() < deadline:
        time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out.decode()


def _bytes(out: Path) -> bytes:
    return (out / "model" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference(synthetic_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    subprocess.run(_cmd(synthetic_data, out), check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                   capture_output=True)
    return out


def test_kill9_then_resume_is_bit_identical(synthetic_data, reference, tmp_path):
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    rc, log = _run_until(_cmd(synthetic_data, out),
                         lambda: ckpts.is_dir() and any(p.name.startswith("step-") for p in ckpts.iterdir()),
                         signal.SIGKILL)
    assert rc == -signal.SIGKILL, log
    assert not (out / "model").exists()
    done = subprocess.run(_cmd(synthetic_data, out, "--resume"), capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _bytes(out) == _bytes(reference)
    ref_metrics = (reference / "metrics.jsonl").read_text().splitlines()
    got = (out / "metrics.jsonl").read_text().splitlines()
    assert len(got) == len(ref_metrics)


def test_sigterm_saves_checkpoint_and_exits_resumable(synthetic_data, reference, tmp_path):
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    rc, log = _run_until(_cmd(synthetic_data, out),
                         lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 2,
                         signal.SIGTERM)
    assert rc == RESUMABLE_EXIT, log
    assert "--resume" in log
    done = subprocess.run(_cmd(synthetic_data, out, "--resume"), capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _bytes(out) == _bytes(reference)


def test_rerun_without_resume_refuses(synthetic_data, reference):
    done = subprocess.run(_cmd(synthetic_data, reference), capture_output=True, text=True)
    assert done.returncode == 2 and "--resume" in done.stderr
