"""`detour study --executor slurm` on a real SLURM cluster: one job a step, reattached after the
driver dies, a cancelled training resubmitted and resumed, training steps as torch.distributed ranks.

    sudo bash scripts/slurm.sh start && python -m pytest -q -p no:cacheprovider tests/study/test_slurm.py -x

Everything is real: sbatch through submitit, squeue, scancel, gloo ranks started by srun. The
`slurm` fixture (tests/conftest.py) skips without a cluster, and fails where CI requires one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.study.test_executors import SETS, _env, _events, small_study

# a training long enough to be caught half-way (about a hundred steps of a tiny model), two ranks
TRAIN = [s for s in SETS if not s.startswith(("phases.0.tokens", "batch.micro_batch"))] + [
    "phases.0.tokens=24k", "batch.micro_batch=2"]


def _driver(study: Path, out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out),
                             "--executor", "slurm", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(1), start_new_session=True)


def _jobs(out: Path) -> dict:
    path = out / ".study" / "state.json"
    try:
        return json.loads(path.read_text()).get("jobs", {})
    except (OSError, ValueError):
        return {}


def _wait_for(what, timeout: float = 300, every: float = 0.1):
    end = time.time() + timeout
    while time.time() < end:
        value = what()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"waited {timeout} s in vain")


def _alive(job_id: str) -> bool:
    from detour.study.executors import ALIVE
    from detour.study.slurm import job_states

    return job_states([job_id])[job_id] in ALIVE


def _training_lines(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and '"loss"' in line]


def _submitted(out: Path) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    for e in _events(out):
        if e["event"] == "submitted":
            ids.setdefault(e["step"], []).append(e["job_id"])
    return ids


@pytest.fixture(scope="session")  # kept across the other files a worker runs in between
def interrupted(slurm, tmp_path_factory):
    """A study of two 2-rank trainings under SLURM whose driver is killed (kill -9) while they run,
    whose detour training is scancelled half-way, then run again to the end; beside it, the detour's
    recipe trained uninterrupted by `torchrun --nproc-per-node 2`."""
    root = tmp_path_factory.mktemp("slurm")
    study = small_study(root, resources={"train": {"tasks": 2}}, eval=None,
                        train={"recipe": str(Path(__file__).resolve().parents[2] / "recipes" / "tiny-modernbert.yaml"),
                               "data": ["corpus"], "set": TRAIN})
    out = root / "out"
    first = _driver(study, out)
    detour_job = _wait_for(lambda: _jobs(out).get("train:detour", {}).get("job_id"))
    _wait_for(lambda: len(_training_lines(out / "arms" / "detour")) >= 3)  # half-way through its steps
    first.kill()  # the driver dies; its jobs are the cluster's
    first.wait()
    subprocess.run(["scancel", detour_job], check=True)  # and the training is cancelled mid-run
    _wait_for(lambda: not _alive(detour_job), timeout=120, every=0.5)
    cancelled_at = len(_training_lines(out / "arms" / "detour"))
    rerun = subprocess.run([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out),
                            "--executor", "slurm"], capture_output=True, text=True, env=_env(1), timeout=900)
    reference = root / "torchrun"
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "detour.cli", "train", str(out / ".study" / "recipes" / "detour.json"), "--out",
                          str(reference), "--no-progress"], capture_output=True, text=True, env=_env(1), timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return {"out": out, "rerun": rerun, "reference": reference, "detour_job": detour_job,
            "cancelled_at": cancelled_at}


def test_the_rerun_completes_with_each_step_its_own_job_none_submitted_twice(interrupted):
    out, rerun = interrupted["out"], interrupted["rerun"]
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    jobs = _jobs(out)
    assert set(jobs) == {"prepare:corpus", "train:detour", "train:baseline"}  # streams runs in the driver
    ids = [j["job_id"] for j in jobs.values()]
    assert len(set(ids)) == len(ids)
    submitted = _submitted(out)
    # every step submitted once, but the cancelled training, submitted again once, under a new id
    assert len(submitted["prepare:corpus"]) == 1 and len(submitted["train:baseline"]) == 1, submitted
    assert submitted["train:detour"] == [interrupted["detour_job"], jobs["train:detour"]["job_id"]], submitted
    assert jobs["train:detour"]["attempts"] == 2
    assert "[1/4] prepare:corpus: done earlier, kept" in rerun.stdout  # finished before the kill: kept
    assert f"SLURM job {submitted['train:baseline'][0]} of train:baseline " in rerun.stdout  # taken over, not resubmitted
    assert f"SLURM job {interrupted['detour_job']} ended" in rerun.stdout
    assert set(json.loads((out / ".study" / "state.json").read_text())["steps"]) == {
        "prepare:corpus", "train:detour", "train:baseline", "streams"}


def test_the_cancelled_training_resumed_from_its_checkpoint_to_the_uninterrupted_weights(interrupted):
    out = interrupted["out"]
    log = (out / ".study" / "logs" / "train-detour.log").read_text()
    first, _, second = log.partition(f"(SLURM job {_jobs(out)['train:detour']['job_id']}, 2 task(s))")
    assert "checkpoint saved at" in first, log
    assert second and "--resume: no checkpoint" not in second  # the second job continued the first's run
    assert 3 <= interrupted["cancelled_at"]
    got = load_file(str(out / "arms" / "detour" / "model" / "model.safetensors"))
    want = load_file(str(interrupted["reference"] / "model" / "model.safetensors"))
    assert got.keys() == want.keys()
    # docs/distributed.md: resumes end within 5e-6 of the uninterrupted run's weights
    worst = max((got[k].float() - want[k].float()).abs().max().item() for k in got)
    assert worst <= 5e-6, worst


def test_a_training_step_of_two_tasks_is_a_two_rank_job_with_torchruns_losses(interrupted):
    out = interrupted["out"]
    for arm in ("detour", "baseline"):
        header = (out / ".study" / "logs" / f"train-{arm}.log").read_text().splitlines()[0]
        assert header.endswith(", 2 task(s))"), header
        rank1 = list((out / ".study" / "jobs" / f"train-{arm}").glob("*_rank1.log"))
        assert rank1, f"no rank-1 output for {arm}"
    got = {r["global_step"]: r["loss"] for r in _training_lines(out / "arms" / "detour")}
    want = {r["global_step"]: r["loss"] for r in _training_lines(interrupted["reference"])}
    assert got.keys() == want.keys() and len(got) > interrupted["cancelled_at"]
    # docs/distributed.md: the same per-step losses to 1e-6 relative
    assert all(abs(got[s] - want[s]) <= 1e-6 * abs(want[s]) for s in want), [(s, got[s], want[s]) for s in want
                                                                              if got[s] != want[s]][:5]


def test_dry_run_shows_each_steps_job_and_resources(interrupted):
    out = interrupted["out"]
    dry = subprocess.run([sys.executable, "-m", "detour.cli", "study", str(out.parent / "study.yaml"), "--out",
                          str(out), "--executor", "slurm", "--dry-run"], capture_output=True, text=True, env=_env(1))
    assert dry.returncode == 0, dry.stderr
    job = _jobs(out)["train:detour"]["job_id"]
    assert f"SLURM job {job} (" in dry.stdout and ", attempt 2); 2 tasks" in dry.stdout, dry.stdout


@pytest.mark.parametrize("cancel", [False, True])
def test_a_stopped_driver_leaves_its_jobs_to_the_cluster_or_cancels_them(slurm, tmp_path, cancel):
    out = tmp_path / "out"
    driver = _driver(small_study(tmp_path), out, *(["--cancel-on-exit"] if cancel else []))
    job = _wait_for(lambda: _jobs(out).get("prepare:corpus", {}).get("job_id"))
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 75, err
    line = err.strip().splitlines()[-1]
    try:
        if cancel:
            assert line == f"detour study: stopped; cancelled the SLURM jobs of prepare:corpus (job {job}) " \
                           "(--cancel-on-exit)"
            _wait_for(lambda: not _alive(job), timeout=60, every=0.5)
        else:
            assert line.startswith(f"detour study: stopped; left the SLURM jobs of prepare:corpus (job {job}) to "
                                   "the cluster; run the same command again to reattach"), line
            assert _alive(job) or (out / ".study" / "jobs" / "prepare-corpus" / f"{job}.rc.json").is_file()
    finally:
        subprocess.run(["scancel", job], check=False)


def test_a_partition_slurm_does_not_have_is_refused_before_anything_is_submitted(slurm, tmp_path):
    out = tmp_path / "out"
    driver = _driver(small_study(tmp_path, resources={"train": {"partition": "no-such-partition"}}), out)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 2
    assert err.strip() == (f"detour study: error: resources.train.partition: SLURM has no partition "
                           f"'no-such-partition' (it has: {slurm})")
    assert not out.exists()


def test_slurm_without_sbatch_on_path_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    env = {**_env(1), "PATH": str(tmp_path)}  # no SLURM commands here
    result = subprocess.run([sys.executable, "-m", "detour.cli", "study", str(small_study(tmp_path)), "--out",
                             str(out), "--executor", "slurm"], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == ("detour study: error: --executor slurm: no sbatch on PATH; run the study where "
                                     "SLURM's commands are (a login node), or use --executor local")
    assert not out.exists()


def test_a_failed_job_is_named_with_its_id_and_log_and_its_dependents_are_not_submitted(slurm, tmp_path):
    from tests.study.test_executors import broken_study, check_broken

    out = tmp_path / "out"
    driver = _driver(broken_study(tmp_path), out)
    stdout, stderr = driver.communicate(timeout=600)
    job = _jobs(out)["prepare:broken"]["job_id"]
    check_broken(subprocess.CompletedProcess(driver.args, driver.returncode, stdout, stderr), out, f"SLURM job {job}; ")
    assert set(_jobs(out)) == {"prepare:corpus", "prepare:broken"}  # nothing after it was submitted
