"""The SLURM cluster that `detour study --executor slurm` submits to runs a real job and gives back its output.

    sudo bash scripts/slurm.sh start && .venv/bin/python -m pytest -q tests/test_slurm_cluster.py
"""

from __future__ import annotations

import subprocess

from tests.conftest import REPO


def test_a_job_submitted_with_sbatch_runs_and_writes_its_output(slurm, tmp_path):
    out = tmp_path / "job.out"
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", "-p", slurm, "-c", "1", "-t", "2", "-J", "detour-cluster-check",
         "-o", str(out), "--wrap", "echo ran on $(hostname -s) as job $SLURM_JOB_ID"],
        # it waits for a free CPU: on a shared cluster the other tests' jobs may hold them all
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    assert out.read_text().split() == ["ran", "on", subprocess.check_output(["hostname", "-s"], text=True).strip(),
                                       "as", "job", job]


def test_the_cluster_script_refuses_an_unknown_subcommand_with_one_line():
    done = subprocess.run(["bash", str(REPO / "scripts" / "slurm.sh"), "restart"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["usage: bash scripts/slurm.sh start|stop|status"]
