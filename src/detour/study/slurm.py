"""SLURM itself: the command a step's job runs on the node, and what the study asks of the cluster.

    python -c "from detour.study.slurm import slurm_partitions; print(slurm_partitions())"

`slurm_task` is what submitit runs in each task of a step's job (detour.study.executors submits
it); `check_partitions` refuses a partition the cluster does not have before anything is
submitted; `job_states` reads squeue (and sacct where accounting is on) for the study's job ids.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from detour.errors import DetourError
from detour.stop import die_with_parent
from detour.study.resources import Resources


def slurm_task(argv: list[str], log: str, folder: str) -> int:
    """One task of a step's SLURM job (run by submitit on the node): the step's detour command, as a
    torch.distributed rank when the job has several tasks. Rank 0 appends to the step's log and
    writes the exit status where the study reads it (JSON, not submitit's pickled result)."""
    import submitit

    job = submitit.JobEnvironment()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if job.num_tasks > 1:
        # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them (detour.train.world);
        # every GPU of the node stays visible: world.py picks the local rank's
        dist = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        env.update(RANK=str(dist.rank), WORLD_SIZE=str(dist.world_size), LOCAL_RANK=str(dist.local_rank),
                   LOCAL_WORLD_SIZE=str(dist.local_world_size), MASTER_ADDR=dist.master_addr,
                   MASTER_PORT=str(dist.master_port))
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        env.update(OMP_NUM_THREADS=cpus, MKL_NUM_THREADS=cpus)
    rank = job.global_rank
    out_path = Path(log) if rank == 0 else Path(folder) / f"{job.job_id}_rank{rank}.log"
    with open(out_path, "a") as fh:
        if rank == 0:
            fh.write(f"$ detour {shlex.join(argv)}  (SLURM job {job.job_id}, {job.num_tasks} task(s))\n")
            fh.flush()
        # not a new session: SLURM's SIGTERM (time limit, preemption, scancel) reaches the command itself,
        # which saves a checkpoint and exits 75; submitit's own process lets SIGTERM pass
        proc = subprocess.Popen([sys.executable, "-m", "detour.cli", *argv], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, preexec_fn=functools.partial(die_with_parent, os.getpid()))
        rc = proc.wait()
    if rank == 0:
        from detour.io import write_json

        write_json(Path(folder) / f"{job.job_id}.rc.json", {"rc": rc, "job_id": job.job_id,
                                   "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return rc


def slurm_partitions() -> list[str]:
    """The partitions SLURM has (sinfo marks the default one with *)."""
    result = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise DetourError(f"--executor slurm: sinfo failed: {result.stderr.strip() or result.returncode}")
    return sorted({p.strip().rstrip("*") for p in result.stdout.split() if p.strip()})


def check_partitions(resources: Resources) -> None:
    named = resources.partitions()
    if not named or shutil.which("sinfo") is None:
        return
    have = slurm_partitions()
    for where, partition in named.items():
        if partition not in have:
            raise DetourError(f"{where}: SLURM has no partition {partition!r} (it has: {', '.join(have) or 'none'})")


def job_states(job_ids: list[str]) -> dict[str, str]:
    """Each job's SLURM state: from squeue while it is known there, then sacct when accounting is on;
    GONE when neither knows it (ended, and no accounting)."""
    if not job_ids:
        return {}
    states = {}
    try:
        result = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True,
                                text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {j: "UNKNOWN" for j in job_ids}
    # squeue exits 1 for ids it has forgotten (ended long ago); any other failure says nothing of the jobs
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        return {j: "UNKNOWN" for j in job_ids}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    left = [j for j in job_ids if j not in states]
    if left and shutil.which("sacct"):
        result = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(left)],
                                capture_output=True, text=True, timeout=60)
        if result.returncode == 0:
            for line in result.stdout.splitlines():
                job_id, _, state = line.partition("|")
                if job_id in left and state:
                    states[job_id] = state.split()[0]  # "CANCELLED by 1000" -> CANCELLED
    return {j: states.get(j, "GONE") for j in job_ids}
