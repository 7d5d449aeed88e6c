"""bench/bench_gpu.py without a CUDA device: exit 2 and say why, before building anything."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_gpu_benchmark_without_cuda_exits_2_with_a_clear_message():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even on a machine that has one
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr and "bench/bench_train.py" in proc.stderr
    assert proc.stdout == ""
