"""detour.study.torchrun: torch's launcher, exiting 75 when its ranks stopped and 1 when one failed.

    python -m pytest -q tests/study/test_torchrun.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("ranks_exit, launcher_exit", [(0, 0), (75, 75), (3, 1)])
def test_the_launcher_exits_75_only_when_every_rank_stopped(tmp_path, ranks_exit, launcher_exit):
    # the ranks here are plain shell commands (torchrun --no-python): what is tested is the launcher's exit
    result = subprocess.run([sys.executable, "-m", "detour.study.torchrun", "--standalone", "--nproc-per-node", "2",
                             "--no-python", "sh", "-c", f"exit {ranks_exit}"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == launcher_exit, result.stderr
    if launcher_exit == 1:  # torchrun's own table of the failed ranks is kept
        assert "exitcode" in result.stderr and ": 3" in result.stderr, result.stderr


def test_one_rank_stopped_and_one_failed_is_a_failure(tmp_path):
    result = subprocess.run([sys.executable, "-m", "detour.study.torchrun", "--standalone", "--nproc-per-node", "2",
                             "--no-python", "sh", "-c", 'exit $((LOCAL_RANK == 0 ? 75 : 3))'],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
