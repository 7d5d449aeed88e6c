"""`detour study --jobs N`: independent steps at once on slices of this machine, the same answers.

    python -m pytest -q -p no:cacheprovider tests/study/test_executors.py -x

The studies are real (a tiny ModernBERT, a generated NER task), run by real `detour study`
processes; the slices are read from the running steps' own processes (/proc, via psutil).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from detour.study.executors import slices

REPO = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))
# a tiny model and few tokens: each training step a few seconds, so two overlap plainly
SETS = ["model.config.hidden_size=32", "model.config.intermediate_size=48", "model.config.num_hidden_layers=2",
        "model.config.num_attention_heads=2", "model.config.local_attention=16", "data.seq_len=64",
        "batch.global_sequences=4", "batch.micro_batch=4", "phases.0.tokens=1k", "phases.0.lr.warmup_tokens=0",
        "phases.1.tokens=512", "checkpoint.every_tokens=100000"]


def small_study(tmp_path: Path, **changes) -> Path:
    """Two arms, a generated NER task, no analyses: the least that has independent steps and answers."""
    spec = {"name": "executors", "description": "two tiny arms evaluated on a small SYNTHETIC NER task",
            "prepare": {"corpus": {"sources": ["synthetic:clinical?docs=60&seed=0"], "tokenizer": "minilm-l6",
                                   "workers": 1}},
            "train": {"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"), "data": ["corpus"], "set": SETS},
            "eval": {"synthetic_ner": {"train": 24, "validation": 12, "test": 12}, "seeds": 1, "epochs": 1,
                     "max_length": 32},
            "report": False}
    spec.update(changes)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _env(threads: int) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}


def _study(study: Path, out: Path, *flags: str, threads: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out), *flags],
                          capture_output=True, text=True, env=_env(threads), timeout=900)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / ".study" / "log.jsonl").read_text().splitlines()]


def _scores(out: Path) -> list:
    """What an evaluation answered, without the paths of the study folder it ran in."""
    runs = json.loads((out / "eval" / "synthetic-ner" / "results.json").read_text())["runs"]
    return sorted((Path(r["model"]).parent.name, r["seed"], r["metrics"], r.get("selected_epoch")) for r in runs)


def _steps_seen(proc: subprocess.Popen) -> dict[int, dict]:
    """Every step process the study starts: pid -> its command, environment and cores, read while it runs."""
    seen: dict[int, dict] = {}
    driver = psutil.Process(proc.pid)
    own = driver.cmdline()
    while proc.poll() is None:
        try:
            children = driver.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            if child.pid in seen:
                continue
            try:
                cmd = child.cmdline()
                if "detour.cli" not in cmd or cmd == own:  # not yet exec'd: still the study's own command
                    continue
                seen[child.pid] = {"argv": cmd[cmd.index("detour.cli") + 1:], "cores": child.cpu_affinity(),
                                   "omp": child.environ().get("OMP_NUM_THREADS"),
                                   "mkl": child.environ().get("MKL_NUM_THREADS"),
                                   "gpus": child.environ().get("CUDA_VISIBLE_DEVICES")}
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                continue
        time.sleep(0.05)
    return seen


@pytest.fixture(scope="session")  # kept across the other files a worker runs in between
def two_ways(tmp_path_factory):
    """The same study with --jobs 1 (under the thread count a slice gets) and with --jobs 2."""
    if len(CORES) < 2:
        pytest.skip("--jobs 2 gets a slice of the cores each: this machine lets the tests use one core")
    root = tmp_path_factory.mktemp("executors")
    study = small_study(root)
    per_slice = len(CORES) // 2
    one = _study(study, root / "jobs1", threads=per_slice)
    assert one.returncode == 0, one.stdout + one.stderr
    # two GPUs by name, as a scheduler sets them: each slot is handed one (the names match no device, so
    # every step still runs on the CPU, as the --jobs 1 run did)
    proc = subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(root / "jobs2"),
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**_env(len(CORES)), "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    seen = _steps_seen(proc)
    output = proc.stdout.read()
    assert proc.wait() == 0, output
    return {"jobs1": root / "jobs1", "jobs2": root / "jobs2", "seen": seen, "output": output,
            "per_slice": per_slice, "out1": one.stdout}


def test_two_jobs_run_independent_steps_at_once(two_ways):
    events = _events(two_ways["jobs2"])
    order = [(e["step"], e["event"]) for e in events]
    # both arms started before either finished: they ran side by side
    first_done = min(order.index((s, "done")) for s in ("train:detour", "train:baseline"))
    assert order.index(("train:detour", "start")) < first_done
    assert order.index(("train:baseline", "start")) < first_done
    times = {(e["step"], e["event"]): e["time"] for e in events}
    assert times[("train:baseline", "start")] <= times[("train:detour", "done")]
    assert times[("train:detour", "start")] <= times[("train:baseline", "done")]
    # the order is kept: nothing starts before what it reads is done
    for step, needs in (("eval:synthetic-ner", ["train:detour", "train:baseline", "task:synthetic-ner"]),
                        ("streams", ["train:detour", "train:baseline"]),
                        ("train:detour", ["prepare:corpus"])):
        assert all(order.index((n, "done")) < order.index((step, "start")) for n in needs), order
    # the console says which step started and finished; the steps' own lines are in their logs only
    assert re.search(r"^\[2/\d+\] train:detour: run$", two_ways["output"], re.M), two_ways["output"]
    assert "  train:detour: done (" in two_ways["output"]
    assert "--resume: no checkpoint" not in two_ways["output"]
    assert "detour train" in (two_ways["jobs2"] / ".study" / "logs" / "train-detour.log").read_text()


def test_two_jobs_give_the_answers_of_one(two_ways):
    assert _scores(two_ways["jobs2"]) == _scores(two_ways["jobs1"])
    twins = [json.loads((two_ways[k] / "twins.json").read_text()) for k in ("jobs1", "jobs2")]
    assert twins[0]["checks"] == twins[1]["checks"]
    state = [json.loads((two_ways[k] / ".study" / "state.json").read_text())["steps"] for k in ("jobs1", "jobs2")]
    # the same output hashes: the weights of each arm, the bytes of the prepared corpus (the generated
    # task's spec names its files by their paths in its own study folder, so its hash differs by folder)
    for step in ("prepare:corpus", "train:detour", "train:baseline"):
        assert state[0][step]["output_hash"] == state[1][step]["output_hash"], step
    # and a --jobs 1 rerun of the --jobs 2 folder keeps every step: the keys do not depend on the executor
    again = _study(Path(two_ways["jobs2"].parent / "study.yaml"), two_ways["jobs2"], threads=two_ways["per_slice"])
    steps = len(json.loads((two_ways["jobs2"] / "study.json").read_text())["steps"])
    assert again.returncode == 0 and again.stdout.count("done earlier, kept") == steps, again.stdout + again.stderr


def test_each_step_gets_its_slice_of_the_cores_and_threads(two_ways):
    per_slice = str(two_ways["per_slice"])
    trains = [s for s in two_ways["seen"].values() if s["argv"][0] == "train"]
    assert len(trains) == 2, two_ways["seen"]
    for s in two_ways["seen"].values():
        assert len(s["cores"]) == two_ways["per_slice"] and s["omp"] == per_slice and s["mkl"] == per_slice, s
    # the two arms ran at once, so on different slices, each with its slice's GPU
    assert set(trains[0]["cores"]).isdisjoint(trains[1]["cores"])
    first_half = set(slices(CORES, 2)[0])
    for s in two_ways["seen"].values():
        assert s["gpus"] == ("GPU-a" if set(s["cores"]) == first_half else "GPU-b"), s
    assert {t["gpus"] for t in trains} == {"GPU-a", "GPU-b"}
    evals = [s for s in two_ways["seen"].values() if s["argv"][0] == "eval"]
    assert evals and evals[0]["argv"][-2:] == ["--threads", per_slice]


@pytest.mark.parametrize("flags, message", [
    (["--jobs", "0"], "detour study: error: --jobs 0: give how many steps may run at once, 1 or more"),
    (["--jobs", "-2"], "detour study: error: --jobs -2: give how many steps may run at once, 1 or more"),
    (["--cancel-on-exit"], "detour study: error: --cancel-on-exit: only with --executor slurm"),
])
def test_bad_executor_options_are_refused_before_anything_runs(tmp_path, flags, message):
    out = tmp_path / "out"
    result = _study(small_study(tmp_path), out, *flags)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith(message), result.stderr
    assert not out.exists()


def test_unknown_resource_keys_are_refused_naming_the_field(tmp_path):
    out = tmp_path / "out"
    result = _study(small_study(tmp_path, resources={"train": {"gpus": 2}}), out)
    assert result.returncode == 2 and not out.exists()
    assert "resources.train.gpus: Extra inputs are not permitted" in result.stderr
    result = _study(small_study(tmp_path, resources={"eval": {"time": "4 hours"}}), out)
    assert result.returncode == 2 and "resources.eval.time: Value error, expected minutes (240) or " \
        "[D-]HH:MM[:SS] (04:00:00), got '4 hours'" in result.stderr, result.stderr


def test_dry_run_shows_each_steps_resources(tmp_path):
    study = small_study(tmp_path, resources={"default": {"cpus_per_task": 2}, "train": {"tasks": 2, "time": "01:30:00"}})
    result = _study(study, tmp_path / "out", "--dry-run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    train = lines[next(i for i, line in enumerate(lines) if "train:detour" in line) + 1]
    assert train.strip() == "2 tasks, 2 CPU/task, time 01:30:00"
    streams = lines[next(i for i, line in enumerate(lines) if " streams " in line) + 1]
    assert streams.strip() == "in the study's process"


def test_resources_merge_a_kinds_entry_over_the_default():
    from detour.study.resources import Resources

    r = Resources.model_validate({"default": {"partition": "cpu", "time": 60}, "train": {"tasks": 4, "time": "1-02:00"}})
    assert (r.of("train").partition, r.of("train").tasks, r.of("train").minutes()) == ("cpu", 4, 26 * 60)
    assert (r.of("base").tasks, r.of("eval").tasks, r.of("eval").minutes()) == (4, None, 60)
    assert r.of("eval").model_copy(update={"time": "00:30:01"}).minutes() == 31
    extra = Resources.model_validate({"eval": {"extra": ["--mem=8G", "--exclusive"]}}).of("eval").sbatch_extra()
    assert extra == {"mem": "8G", "exclusive": True}


def broken_study(tmp_path: Path) -> Path:
    """Two independent prepare steps, one of a file that is not what its name says; the arms train on that one."""
    bad = tmp_path / "broken.parquet"
    bad.write_text("not a parquet file")
    return small_study(tmp_path, prepare={
        "corpus": {"sources": ["synthetic:clinical?docs=60&seed=0"], "tokenizer": "minilm-l6", "workers": 1},
        "broken": {"sources": [str(bad)], "tokenizer": "minilm-l6", "workers": 1}},
        train={"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"), "data": ["broken"], "set": SETS}, eval=None)


def check_broken(result: subprocess.CompletedProcess, out: Path, job: str = "") -> None:
    """The failed step named with its log (and job), what depends on it not run, the independent step done."""
    assert result.returncode == 2, result.stdout + result.stderr
    log = out / ".study" / "logs" / "prepare-broken.log"
    assert result.stderr.strip().splitlines()[-1] == (
        f"detour study: error: step prepare:broken failed (exit 2); {job}its output is in {log}; "
        "not run, as they depend on it: train:detour, train:baseline, streams")
    assert "not a readable Parquet file" in log.read_text()
    state = json.loads((out / ".study" / "state.json").read_text())
    assert set(state["steps"]) == {"prepare:corpus"}  # the independent branch finished
    assert [e["event"] for e in _events(out) if e["step"] == "prepare:broken"][-1] == "failed"


def test_a_failed_step_stops_what_depends_on_it_and_the_rest_finishes(tmp_path):
    out = tmp_path / "out"
    result = _study(broken_study(tmp_path), out, "--jobs", "2")
    check_broken(result, out)
    assert "[3/5] train:detour: not run, prepare:broken did not finish" in result.stdout


def test_sigterm_stops_every_running_step_which_saves_and_the_study_exits_75(tmp_path):
    long = [s for s in SETS if not s.startswith("phases.0.tokens")] + ["phases.0.tokens=96k"]
    study = small_study(tmp_path, eval=None, train={"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"),
                                                     "data": ["corpus"], "set": long})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out), "--jobs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(1))

    def training(arm: str) -> bool:
        metrics = out / "arms" / arm / "metrics.jsonl"
        return metrics.is_file() and '"loss"' in metrics.read_text()

    end = time.time() + 300
    while not (training("detour") and training("baseline")):
        assert proc.poll() is None and time.time() < end, "both arms should be training by now"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    assert err.strip().splitlines()[-1] == ("detour study: stopped during train:baseline, train:detour; run the same "
                                            "command again to continue (finished steps are kept)")
    stopped = {e["step"] for e in _events(out) if e["event"] == "stopped"}
    assert stopped == {"train:detour", "train:baseline"}
    for arm in ("detour", "baseline"):  # each was passed the signal and saved a checkpoint to resume from
        assert "checkpoint saved at" in (out / ".study" / "logs" / f"train-{arm}.log").read_text()
        assert list((out / "arms" / arm / "checkpoints").glob("step-*"))


def test_a_sigterm_while_a_second_step_is_being_started_reaches_that_step_too(tmp_path, monkeypatch,
                                                                            sigterm_while_starting):
    from detour.study.executors import Options
    from detour.study.graph import build_steps
    from detour.study.run import RESUMABLE_EXIT, execute
    from detour.study.spec import load_study

    long = [s for s in SETS if not s.startswith("phases.0.tokens")] + ["phases.0.tokens=96k"]
    spec = load_study(small_study(tmp_path, eval=None, train={"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"),
                                                             "data": ["corpus"], "set": long}))
    out = (tmp_path / "out").resolve()
    # while the detour runs and the baseline's process is being started
    sigterm_while_starting(lambda argv: "train" in argv and "baseline.json" in " ".join(argv))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    t0 = time.time()
    assert execute(spec, out, build_steps(spec, out), Options(jobs=2)) == RESUMABLE_EXIT
    assert time.time() - t0 < 120
    assert {e["step"] for e in _events(out) if e["event"] == "stopped"} == {"train:detour", "train:baseline"}
    # the baseline was stopped, not left to train its 96k tokens to the end
    assert not (out / "arms" / "baseline" / "model").exists()
    assert "96,000/96,000" not in (out / ".study" / "logs" / "train-baseline.log").read_text()


def test_a_training_step_of_two_tasks_runs_under_torchrun_locally_and_resumes_after_a_stop_from_outside(tmp_path):
    train = [s for s in SETS if not s.startswith(("batch.micro_batch", "phases.0.tokens"))] + [
        "batch.micro_batch=2", "phases.0.tokens=24k"]
    study = small_study(tmp_path, eval=None, resources={"train": {"tasks": 2}},
                        train={"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"), "data": ["corpus"], "set": train})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(1))
    metrics = out / "arms" / "detour" / "metrics.jsonl"
    end = time.time() + 300
    while not (metrics.is_file() and '"loss"' in metrics.read_text()):
        assert proc.poll() is None and time.time() < end, "the detour arm should be training by now"
        time.sleep(0.1)
    # a stop from outside the study (a user's kill, a node's shutdown): the launcher gets SIGTERM, and
    # the study is not signalled itself
    launcher = [p for p in psutil.Process(proc.pid).children(recursive=True) if "detour.study.torchrun" in p.cmdline()]
    assert len(launcher) == 1, [p.cmdline() for p in psutil.Process(proc.pid).children(recursive=True)]
    launcher[0].send_signal(signal.SIGTERM)
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, stdout + err
    assert "stopped during train:detour; run the same command again" in err
    assert [e["event"] for e in _events(out) if e["step"] == "train:detour"][-1] == "stopped"
    log = out / ".study" / "logs" / "train-detour.log"
    assert "checkpoint saved at" in log.read_text()
    stopped_at = max(int(p.name.split("-")[1]) for p in (out / "arms" / "detour" / "checkpoints").glob("step-*"))

    result = _study(study, out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"  $ torchrun --nproc-per-node 2 detour train {out.resolve() / '.study' / 'recipes' / 'detour.json'}" \
        in result.stdout
    resumed = log.read_text().rsplit("$ detour train", 1)[1]  # the rerun's output
    first = next(line for line in resumed.splitlines() if " phase clm tokens " in line)
    assert f" step {stopped_at} phase clm tokens {stopped_at * 256:,}/24,000 " in first, resumed  # not from step 0
    for arm in ("detour", "baseline"):  # every checkpoint of the run was written by a world of 2 processes
        states = [json.loads(p.read_text()) for p in (out / "arms" / arm / "checkpoints").glob("*/state.json")]
        assert states and {s["world_size"] for s in states} == {2}, states
