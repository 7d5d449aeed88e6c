"""Fault injection: kill -9 or SIGTERM mid-run, resume, and end bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

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
    # the summary says where each stretch of the run computed: from the start, then from the checkpoint
    (whole,) = json.loads((reference / "summary.json").read_text())["sessions"]
    summary = json.loads((out / "summary.json").read_text())
    first, resumed = summary["sessions"]
    saved = [int(p.name.split("-")[1]) for p in ckpts.iterdir() if p.name.startswith("step-")]
    assert (whole["from_step"], first["from_step"]) == (0, 0) and resumed["from_step"] in saved and resumed["from_step"] > 0
    for s in (whole, first, resumed):
        assert (s["world_size"], s["threads"], s["device"], s["torch"]) == (1, 1, "cpu", torch.__version__), s
    assert summary["same_compute"] is True


def test_a_resume_on_another_thread_count_is_said_in_the_summary():
    from detour.compute import same_compute
    from detour.train.world import World, compute_session

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        three = compute_session(World(), torch.device("cpu"), 40)
        torch.set_num_threads(1)
        one = compute_session(World(), torch.device("cpu"), 0)
    finally:
        torch.set_num_threads(before)
    assert (three["threads"], three["from_step"], one["threads"]) == (3, 40, 1)
    assert same_compute([one, dict(one, time="later", host="another")]) is True  # where and when do not matter
    assert same_compute([one, three]) is False
    assert same_compute([one, dict(one, world_size=2)]) is False and same_compute([one, dict(one, torch="x")]) is False


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


@pytest.mark.slow
def test_a_second_train_into_the_same_folder_is_refused_at_once_and_the_first_ends_bit_identical(
        synthetic_data, reference, tmp_path):
    """Two real `detour train --out SAME`: the second (with --resume, which cleans leftovers) stops
    before touching anything, naming the first's pid; the first is stopped (SIGSTOP) meanwhile so
    that it is surely alive and mid-run while the second tries."""
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(_cmd(synthetic_data, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while first.poll() is None and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert time.time() < deadline, "the first run never logged a step"
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)
        while psutil.Process(first.pid).status() != psutil.STATUS_STOPPED:  # the signal lands a moment later
            time.sleep(0.01)
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        try:
            t0 = time.time()
            second = subprocess.run(_cmd(synthetic_data, out, "--resume"), env=env, capture_output=True, text=True,
                                    timeout=120)
            took = time.time() - t0
            # listed while the first is still stopped: once it runs on, its own writes change the folder
            after = sorted(p.relative_to(out) for p in out.rglob("*"))
        finally:
            first.send_signal(signal.SIGCONT)
        print(f"second writer (after {took:.1f} s, rc {second.returncode}): {second.stderr.strip()}")
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"{out} is in use: pid {first.pid} (detour train" in second.stderr
        assert after == before  # nothing removed or added
        log, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, log.decode()[-2000:]
    assert _bytes(out) == _bytes(reference)
    assert not (out / ".detour-lock").exists()  # the finished run leaves no lock file
