"""`detour study`: the graph, its keys, kills and reruns, and the study file's errors.

    python -m pytest -q tests/study/test_study.py
"""

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
import yaml

from detour.cli import main
from detour.errors import DetourError
from detour.study.graph import build_steps
from detour.study.spec import load_study
from detour.study.state import State

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "studies"


def _study(tmp_path: Path, **changes) -> Path:
    """studies/tiny.yaml, made smaller for the suite, with an extra task spec file of its own."""
    spec = yaml.safe_load((STUDIES / "tiny.yaml").read_text())
    spec["train"]["recipe"] = str(REPO / "recipes" / "tiny-modernbert.yaml")
    spec["arms"].pop("freeze-low-clm")
    spec["analyses"] = {"cka": {"noise_floor": "baseline-seed2", "options": {"n": 12, "seeds": 1, "max_length": 32}}}
    spec["eval"]["synthetic_ner"] = {"train": 24, "validation": 12, "test": 12}
    spec["eval"]["seeds"] = 2
    spec["eval"]["max_length"] = 32
    spec["eval"]["arms"] = ["detour", "baseline"]
    spec["train"]["set"] += ["phases.0.tokens=4k", "phases.1.tokens=2k"]  # 2 CLM steps and 1 decay step
    spec.update(changes)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _events(out: Path) -> list[dict]:
    log = out / ".study" / "log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def _started(events: list[dict]) -> list[str]:
    return [e["step"] for e in events if e["event"] == "start"]


def _spawn(study: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    t0 = time.time()
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the study ended (rc {proc.returncode}) before {what}:\n{proc.stdout.read()}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _no_step_left(out: Path, timeout: float = 60) -> None:
    """The steps of a killed study end too (they get SIGTERM when the study dies)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        alive = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
        if not alive:
            return
        time.sleep(0.3)
    raise AssertionError(f"steps still running after the study was killed: {[p.pid for p in alive]}")


@pytest.mark.slow
def test_killed_study_continues_without_redoing_finished_steps(tmp_path, minilm, capsys):
    from detour.eval.synthetic_ner import write_task

    other = write_task(tmp_path / "other-task", (24, 12, 12), seed=5)
    study = _study(tmp_path)
    spec = yaml.safe_load(study.read_text())
    # one task, the detour and its twin, one seed: the analyses, the generated task and more
    # seeds add steps and runs, not cases
    spec["eval"]["tasks"] = [str(other)]
    spec["eval"].pop("synthetic_ner")
    spec["eval"]["seeds"] = 1
    spec["arms"], spec["analyses"] = {}, {}
    study.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"

    # 1. SIGTERM while the second arm trains: the running step stops cleanly, the study exits 75
    proc = _spawn(study, out)
    _wait_for(lambda: "train:baseline" in _started(_events(out)), proc, "train:baseline started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, proc.stdout.read()
    first = _events(out)
    assert ("train:detour", "done") in [(e["step"], e["event"]) for e in first]
    assert ("train:baseline", "stopped") in [(e["step"], e["event"]) for e in first]

    # 2. kill -9 of the study during the evaluation, once the detour's seed is finished
    results = out / "eval" / other.stem / "arms" / "detour" / "results.json"
    proc = _spawn(study, out)
    _wait_for(lambda: results.is_file() and json.loads(results.read_text()).get("runs"), proc, "a finished seed")
    proc.kill()
    proc.wait()
    _no_step_left(out)
    second = _events(out)[len(first):]
    assert "train:detour" not in _started(second)  # done in 1., never rerun

    # 3. the same command again finishes, redoing nothing that had finished
    proc = _spawn(study, out)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    third = _events(out)[len(first) + len(second):]
    ran = _started(third)
    assert "train:detour" not in ran and "train:baseline" not in ran and "prepare:corpus" not in ran
    # the detour's evaluation reran only if the kill came before the study recorded it done
    assert [s for s in ran if s != f"eval:{other.stem}:detour"] == [f"eval:{other.stem}:baseline", f"eval:{other.stem}",
                                                                   "report"]
    if f"eval:{other.stem}:detour" in ran:
        log = (out / ".study" / "logs" / f"eval-{other.stem}-detour.log").read_text()
        assert "0 of 1 run(s) to do" in log  # its finished seed reused
    assert (out / "report.html").is_file() and (out / "twins.json").is_file()
    assert f"report: {out / 'report.html'}" in output
    # the study's held-out split was scored in every arm, on the same sequences and masks
    assert json.loads((out / "twins.json").read_text())["checks"]["validation_equal"] is True
    for arm in ("detour", "baseline"):
        points = [r for r in map(json.loads, (out / "arms" / arm / "metrics.jsonl").read_text().splitlines())
                  if r.get("kind") == "validation"]
        assert [p["run_tokens"] for p in points] == [0, 2048, 4000, 6000], arm  # start, 2k, the phase ends

    # 4. a changed task spec reruns that task's evaluation and the report, nothing else
    task = yaml.safe_load(other.read_text())
    task["training"]["lr"] = task["training"]["lr"] * 2
    other.write_text(yaml.safe_dump(task))
    assert main(["study", str(study), "--out", str(out)]) == 0
    fourth = _events(out)[len(first) + len(second) + len(third):]
    task = other.stem
    assert _started(fourth) == [f"eval:{task}:detour", f"eval:{task}:baseline", f"eval:{task}", "report"]

    # 5. a dry run now says every step is done
    steps = build_steps(load_study(study), out)
    from detour.study.state import State, plan

    assert set(plan(steps, out.resolve(), State(out)).values()) == {"done"}

    # 6. a folder finished before evaluations were split by arm (every arm's runs in eval/TASK/results.json,
    # no eval/TASK/arms/, no per-arm steps in the state): the arms' steps reuse those runs, nothing is
    # fine-tuned again, the gathered file comes out byte for byte the same, so the report is kept
    gathered = out / "eval" / task / "results.json"
    before = gathered.read_bytes()
    (out / "eval" / task / "arms").rename(tmp_path / "per-arm-set-aside")
    state_file = out / ".study" / "state.json"
    state = json.loads(state_file.read_text())
    for arm in ("detour", "baseline"):
        del state["steps"][f"eval:{task}:{arm}"]
    state["steps"][f"eval:{task}"]["key"] = "the multi-arm step's key"
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["study", str(study), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert f"; 1 in {task}/results.json, reused if unchanged" in printed
    assert f"stale    eval:{task} " in printed
    assert main(["study", str(study), "--out", str(out)]) == 0
    fifth = _events(out)[len(first) + len(second) + len(third) + len(fourth):]
    assert _started(fifth) == [f"eval:{task}:detour", f"eval:{task}:baseline", f"eval:{task}"]
    for arm in ("detour", "baseline"):
        log = (out / ".study" / "logs" / f"eval-{task}-{arm}.log").read_text().rsplit("$ detour", 1)[1]  # this run's
        assert "1 run(s) with an unchanged key" in log and "0 of 1 run(s) to do" in log, log
    assert gathered.read_bytes() == before


def test_dry_run_prints_the_graph_with_states_and_estimates(tmp_path, capsys):
    study = _study(tmp_path)
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    for step in ("prepare:corpus", "train:detour", "train:baseline", "train:baseline-seed2", "streams",
                 "task:synthetic-ner", "eval:synthetic-ner:detour", "eval:synthetic-ner:baseline",
                 "eval:synthetic-ner", "cka", "report"):
        assert f"to run   {step} " in printed
    assert "6,000 tokens + 4 held-out points, ~" in printed  # 4k + 2k per arm, held out at 0, 2k, 4k, 6k
    assert "2 fine-tunes x 1 epoch (eval.epochs), ~" in printed  # an arm's 2 seeds, the study's epochs
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.parametrize("load, busy", [(0.3, False), (1.4, False), (1.6, True), (7.5, True)])
def test_a_dry_run_on_a_busy_machine_says_its_estimates_come_out_long(tmp_path, capsys, monkeypatch, load, busy):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert main(["study", str(_study(tmp_path)), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    note = f"note: this machine was busy as the rate was measured (load average {load:.1f} on 2 cores)"
    assert (note in capsys.readouterr().out) is busy


def test_the_estimate_counts_the_held_out_points_where_the_loop_scores_them(tmp_path):
    from detour.config import load_recipe, recipe_from_dict, recipe_to_dict
    from detour.study.estimate import validation_cost

    tree = recipe_to_dict(load_recipe(REPO / "recipes" / "tiny-modernbert.yaml"))
    tree["phases"][0]["tokens"], tree["phases"][1]["tokens"] = 8000, 3000  # clm, then the decay
    tree["data"]["seq_len"] = 128
    tree["validation"] = {"every_tokens": 3000, "sequences": 4}
    seq = 4 * 128
    # the start, 3k, 6k, the CLM end at 8k (two forwards each), 9k, the decay's end at 11k
    assert validation_cost(recipe_from_dict(tree, "tiny")) == (6, (4 * 2 + 2) * seq)
    del tree["validation"]["every_tokens"]  # the start and the phase ends
    assert validation_cost(recipe_from_dict(tree, "tiny")) == (3, (2 + 2 + 1) * seq)
    tree["validation"]["every_tokens"] = 3000
    tree["branch"] = {"run": str(tmp_path / "parent"), "after_phase": tree["phases"][0]["name"]}
    # a branch starts at its parent's scored phase end: 9k and 11k
    assert validation_cost(recipe_from_dict(tree, "branch")) == (2, 2 * seq)
    del tree["validation"]
    assert validation_cost(recipe_from_dict(tree, "none")) == (0, 0)


def test_the_estimate_runs_the_vocabulary_head_only_where_there_are_labels(tmp_path):
    from detour.config import load_recipe, recipe_from_dict, recipe_to_dict
    from detour.study.estimate import training_flops

    tree = recipe_to_dict(load_recipe(REPO / "recipes" / "tiny-modernbert.yaml"))
    tree["phases"][0]["tokens"], tree["phases"][1]["tokens"] = 8000, 3000  # clm, then an MLM decay at 15%
    tree.pop("validation", None)
    body, head = 1000, 9000  # a small model: the head (vocabulary x hidden) outweighs the body
    # CLM: the head on every position; MLM: on the masked 15% only
    assert training_flops(recipe_from_dict(tree, "t"), body + head, head) == \
        6 * 8000 * (body + head) + 6 * 3000 * (body + head * 0.15)
    tree["phases"][1]["mask_rate"] = 0.3
    assert training_flops(recipe_from_dict(tree, "t"), body + head, head) == \
        6 * 8000 * (body + head) + 6 * 3000 * (body + head * 0.3)
    # held out at the start and the CLM's end (a masked and a causal forward) and the decay's end
    tree["data"]["seq_len"] = 128
    tree["validation"] = {"sequences": 4, "mask_rate": 0.2}
    seq = 4 * 128
    assert training_flops(recipe_from_dict(tree, "t"), body + head, head) == \
        6 * 8000 * (body + head) + 6 * 3000 * (body + head * 0.3) + \
        2 * seq * (3 * (body + head * 0.2) + 2 * (body + head))
    # a branch runs (and is costed for) the phases after its branch point only
    tree["branch"] = {"run": str(tmp_path / "parent"), "after_phase": tree["phases"][0]["name"]}
    tree.pop("validation")
    assert training_flops(recipe_from_dict(tree, "b"), body + head, head) == 6 * 3000 * (body + head * 0.3)


def test_a_training_step_is_estimated_with_its_start_up(tmp_path, monkeypatch):
    """Even a step of no FLOPs at all pays the process start, imports and model load."""
    from detour.study import estimate

    monkeypatch.setattr(estimate, "matmul_rate", lambda: 1e30)
    spec = load_study(_study(tmp_path))
    rough = estimate.estimates(spec, build_steps(spec, tmp_path / "out"))
    assert rough["train:detour"] == f"6,000 tokens + 4 held-out points, ~{estimate.STARTUP_S:.0f} s"


def test_a_stale_step_and_its_downstream_are_shown_stale(tmp_path):
    from detour.study.state import State, plan

    study = _study(tmp_path)
    spec = load_study(study)
    out = (tmp_path / "out").resolve()
    steps = build_steps(spec, out)
    state = State(out)
    # pretend everything finished with the keys of this study, then change one arm's seed
    from detour.study.graph import step_key

    hashes = {}
    for step in steps:
        key = step_key(step, out, hashes)
        hashes[step.name] = f"hash-of-{step.name}"
        state.steps[step.name] = {"key": key, "output_hash": hashes[step.name]}
        for p in step.outputs:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    assert set(plan(steps, out, state).values()) == {"done"}
    changed = yaml.safe_load(study.read_text())
    changed["arms"]["baseline-seed2"]["set"] = ["seed=19"]
    study.write_text(yaml.safe_dump(changed))
    states = plan(build_steps(load_study(study), out), out, state)
    assert states["train:baseline-seed2"] == "stale"
    assert states["streams"] == states["cka"] == states["report"] == "stale"  # they read that arm
    # the evaluation covers the detour and the baseline only: unchanged, so kept
    assert states["train:detour"] == states["train:baseline"] == states["task:synthetic-ner"] == "done"
    assert states["eval:synthetic-ner:detour"] == states["eval:synthetic-ner:baseline"] == "done"
    assert states["eval:synthetic-ner"] == "done"


@pytest.mark.parametrize("change, message", [
    ({"arms": {"seed2": {"base": "baseline", "sett": ["seed=18"]}}}, "arms.seed2.sett: Extra inputs"),
    ({"eval": {"seeds": 0, "tasks": ["gad"]}}, "eval.seeds: Input should be greater than 0"),
    ({"analyses": {"cka": {"noise_floor": "seed3"}}}, "analyses.cka.noise_floor: no arm 'seed3'"),
    ({"analyses": {"cka": {"options": {"nn": 3}}}}, "analyses.cka.options: unrecognized arguments: --nn 3"),
    ({"analyses": {"needle": {"options": {"out": "x"}}}}, "analyses.needle.options.out: set by the study itself"),
    ({"train": {"recipe": "nope.yaml"}}, "train.recipe:"),
    ({"train": {"recipe": str(REPO / "recipes" / "tiny-modernbert.yaml"), "data": ["corpus2"]}},
     "train.data.0: 'corpus2' is not a `prepare` entry"),
    ({"base": {"recipe": "nope.yaml"}}, "base.recipe:"),
    ({"base": {"recipe": str(REPO / "recipes" / "modernbert-scratch-base.yaml"), "data": ["corpus2"]}},
     "base.data.0: 'corpus2' is not a `prepare` entry"),
    ({"sizes": {"s": {"set": ["model.config.hidden_size=32"]}}}, "sizes: a study at several sizes pretrains"),
    ({"arms": {"detour": {"set": ["seed=1"]}}}, "arms: Value error, 'detour' is not usable"),
    ({"arms": {"x": {"base": "baseline"}}}, "arms.x: give `set` overrides or `freeze`"),
    ({"arms": {"x": {"set": ["seed=3"], "against": "y"}}}, "arms.x.against: no arm 'y'"),
    ({"arms": {"x": {"set": ["seed=3"], "against": "x"}}}, "arms.x.against: an arm is not compared with itself"),
    ({"arms": {"x": {"set": ["seed=3"], "noise_floor": "y"}}}, "arms.x.noise_floor: no arm 'y'"),
    ({"arms": {"x": {"set": ["seed=3"], "noise_floor": "baseline"}}},
     "arms.x.noise_floor: the noise floor is a third arm, not 'baseline'"),
    ({"arms": {"x": {"set": ["seed=3"], "noise_floor": "x"}}}, "arms.x.noise_floor: the noise floor is a third arm, not 'x'"),
    ({"prepare": {"corpus": {"sources": ["synthetic:clinical?docs=300"], "tokenizer": "minilm-l6", "validation": 1.0}}},
     "prepare.corpus.validation: Value error, expected a fraction between 0 and 1 (0.02) or a whole count"),
    ({"prepare": {"corpus": {"sources": ["synthetic:clinical?docs=300"], "tokenizer": "minilm-l6", "validation": "2%"}}},
     "prepare.corpus.validation: Value error, expected a fraction"),
    ({"prepare": {"corpus": {"sources": ["synthetic:clinical?docs=300"], "tokenizer": "minilm-l6", "validation": 300}}},
     "prepare.corpus.validation: 300 documents held out of synthetic:clinical?docs=300, which has 300"),
    ({"prepare": {"corpus": {"sources": ["synthetic:clinical?docs=300"], "tokenizer": "minilm-l6",
                             "validation_seed": 3}}}, "prepare.corpus.validation_seed: Value error, a seed of no draw"),
])
def test_invalid_study_files_are_refused_naming_the_field(tmp_path, change, message):
    study = _study(tmp_path, **change)
    with pytest.raises(DetourError, match=None) as err:
        load_study(study)
    assert message in str(err.value)
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 2


def test_out_must_be_a_study_folder_or_new(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    assert main(["study", str(_study(tmp_path)), "--out", str(out)]) == 2
    assert "not a study folder" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "the user's"


def test_shipped_studies_load_and_build(tmp_path):
    for path in sorted(STUDIES.glob("*.yaml")):
        spec = load_study(path)
        steps = build_steps(spec, tmp_path / path.stem)
        assert steps[-1].name == "report", path
        assert any(s.name == "train:detour" for s in steps) and any(s.name == "train:baseline" for s in steps)


def _training_data(spec) -> list[str]:
    return spec.train.data or []


def test_shipped_studies_hold_out_documents_and_score_them_in_every_arm(tmp_path):
    """Each shipped study prepares a held-out split of the data it trains on, and every arm scores it."""
    for path in sorted(STUDIES.glob("*.yaml")):
        spec = load_study(path)
        assert _training_data(spec), path
        steps = {s.name: s for s in build_steps(spec, tmp_path / path.stem)}
        for name in _training_data(spec):
            assert spec.prepare[name].validation is not None, f"{path.name}: prepare.{name}.validation"
            assert "--validation" in steps[f"prepare:{name}"].argv, path
        for step in steps.values():
            if step.kind == "train":
                v = step.recipe.validation
                assert v is not None and v.every_tokens is not None, f"{path.name}: {step.name} has no validation"


def test_prepare_with_validation_writes_the_split_and_a_new_amount_reruns_it(tmp_path):
    from detour.study.run import execute
    from detour.study.state import State, plan

    study = _study(tmp_path)
    spec = load_study(study)
    out = (tmp_path / "out").resolve()
    steps = build_steps(spec, out)
    prepare = steps[0]
    assert prepare.name == "prepare:corpus"
    held_out = spec.prepare["corpus"].validation
    assert prepare.argv[prepare.argv.index("--validation"):][:4] == ["--validation", str(held_out),
                                                                     "--validation-seed", "0"]
    assert execute(spec, out, [prepare]) == 0  # the step as the study runs it: `detour prepare` in its process
    manifest = json.loads((out / "data" / "corpus" / "manifest.json").read_text())
    assert manifest["validation"]["documents"] == held_out and manifest["validation"]["seed"] == 0
    assert manifest["documents"] == 300 - held_out  # the held-out documents are not trained on
    split = json.loads((out / "data" / "corpus" / "validation" / "manifest.json").read_text())
    assert split["documents"] == held_out and split["tokens"] >= 8 * 256  # the study's validation.sequences
    assert plan(steps, out, State(out))["prepare:corpus"] == "done"

    for changed in ({"validation": 0.1}, {"validation_seed": 1}):
        raw = yaml.safe_load(study.read_text())
        raw["prepare"]["corpus"].update(changed)
        other = tmp_path / "changed.yaml"
        other.write_text(yaml.safe_dump(raw))
        states = plan(build_steps(load_study(other), out), out, State(out))
        assert states["prepare:corpus"] == "stale", changed


def test_validation_without_a_split_is_refused_before_anything_runs(tmp_path, capsys):
    raw = yaml.safe_load(_study(tmp_path).read_text())
    del raw["prepare"]["corpus"]["validation"]
    study = tmp_path / "no-split.yaml"
    study.write_text(yaml.safe_dump(raw))
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "prepare.corpus.validation: arm detour scores held-out documents" in capsys.readouterr().err
    raw["train"]["set"].append("validation.source=elsewhere")  # a split named in the recipe: no study split needed
    study.write_text(yaml.safe_dump(raw))
    build_steps(load_study(study), tmp_path / "out")


def test_keys_ignore_where_the_study_folder_is(tmp_path):
    from detour.study.graph import step_key

    spec = load_study(_study(tmp_path))
    a = {s.name: s for s in build_steps(spec, tmp_path / "a")}
    b = {s.name: s for s in build_steps(spec, tmp_path / "elsewhere" / "b")}
    assert step_key(a["train:detour"], (tmp_path / "a").resolve(), {"prepare:corpus": "h"}) == \
        step_key(b["train:detour"], (tmp_path / "elsewhere" / "b").resolve(), {"prepare:corpus": "h"})
    # but a different upstream output is a different key
    assert step_key(a["train:detour"], (tmp_path / "a").resolve(), {"prepare:corpus": "h"}) != \
        step_key(a["train:detour"], (tmp_path / "a").resolve(), {"prepare:corpus": "other"})


def test_a_corpus_copied_with_new_times_keeps_its_keys_but_new_content_does_not(tmp_path):
    from detour.study.graph import step_key
    from detour.study.state import State, plan

    corpus = tmp_path / "notes.txt"
    corpus.write_text("Patient seen for a cough.\nNo fever, chest clear.\n")
    study = _study(tmp_path, prepare={"corpus": {"sources": [str(corpus)], "tokenizer": "minilm-l6", "validation": 1}})
    out = (tmp_path / "out").resolve()
    steps = build_steps(load_study(study), out)
    state, hashes = State(out), {}
    for step in steps:  # as if the whole study had finished
        state.steps[step.name] = {"key": step_key(step, out, hashes, state.content), "output_hash": f"h-{step.name}"}
        hashes[step.name] = f"h-{step.name}"
        for p in step.outputs:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    state.save()
    assert str(corpus.resolve()) in json.loads((out / ".study" / "hashes.json").read_text())["files"]
    later = corpus.stat().st_mtime_ns + 3600 * 10**9
    os.utime(corpus, ns=(later, later))  # a fresh copy on a scratch disk: the same bytes, a new time
    assert set(plan(steps, out, State(out)).values()) == {"done"}
    corpus.write_text("Patient seen for a cough.\nFever, crackles at the left base.\n")
    states = plan(steps, out, State(out))
    assert states["prepare:corpus"] == states["train:detour"] == states["report"] == "stale"


def test_content_hashes_read_a_file_again_only_when_its_size_or_time_changes(tmp_path):
    from detour.study.hashes import ContentHashes

    f = tmp_path / "corpus.txt"
    f.write_text("abc\n")
    cache = ContentHashes(tmp_path / "hashes.json")
    first = cache.of(f)
    cache.save()
    st = f.stat()
    f.write_text("xyz\n")  # same size; the time put back: the cache answers without reading
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ContentHashes(tmp_path / "hashes.json").of(f) == first
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert ContentHashes(tmp_path / "hashes.json").of(f) != first
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"1")
    before = cache.of(folder)
    (folder / "b.bin").write_bytes(b"2")
    assert cache.of(folder) != before


def test_a_stop_before_the_steps_process_exists_is_recorded_on_that_step(tmp_path, monkeypatch):
    from detour.study import run as study_run
    from detour.study.graph import step_key

    study = _study(tmp_path)
    spec = load_study(study)
    out = (tmp_path / "out").resolve()
    steps = build_steps(spec, out)
    state, hashes = State(out), {}
    first_action = next(s for s in steps if s.argv is None and s.kind == "task")
    for step in steps[:steps.index(first_action)]:  # as if those had finished
        state.steps[step.name] = {"key": step_key(step, out, hashes, state.content), "output_hash": f"h-{step.name}"}
        hashes[step.name] = f"h-{step.name}"
        for p in step.outputs:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    state.save()

    def interrupted(*_args):  # SIGTERM's handler raises this when no step process is running
        raise KeyboardInterrupt

    monkeypatch.setattr(study_run, "_act", interrupted)
    monkeypatch.setattr(study_run, "write_design", lambda *_args: None)
    assert study_run.execute(spec, out, steps) == study_run.RESUMABLE_EXIT
    assert [(e["step"], e["event"]) for e in _events(out)][-2:] == [(first_action.name, "start"),
                                                                    (first_action.name, "stopped")]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sigterm_as_a_steps_process_is_being_started_stops_the_study_at_once(tmp_path, sigterm_while_starting,
                                                                               jobs):
    from detour.study import run as study_run
    from detour.study.executors import Options

    study = _study(tmp_path)
    spec = load_study(study)
    out = (tmp_path / "out").resolve()
    steps = build_steps(spec, out)

    def hung(*_args):
        raise AssertionError("the study waited on a step whose process was never started")

    sigterm_while_starting()  # after the first step's start is recorded, before its process exists
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        assert study_run.execute(spec, out, steps, Options(jobs=jobs)) == study_run.RESUMABLE_EXIT
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    events = [(e["step"], e["event"]) for e in _events(out)]
    assert events == [(steps[0].name, "start"), (steps[0].name, "stopped")]
    assert steps[0].name not in State(out).steps  # not recorded done: the rerun runs it

def test_dry_run_estimates_each_task_for_its_own_epochs(tmp_path, capsys):
    from detour.eval.synthetic_ner import write_task

    own = write_task(tmp_path / "own", (24, 12, 12), seed=5)  # its spec sets 3 epochs
    unset = tmp_path / "unset.yaml"
    spec = yaml.safe_load(own.read_text())
    spec["name"], spec["training"] = "unset", {"lr": 1.0e-4}
    unset.write_text(yaml.safe_dump(spec))
    seven = tmp_path / "seven.yaml"
    spec["name"], spec["training"] = "seven", {"epochs": 7}
    seven.write_text(yaml.safe_dump(spec))
    study = _study(tmp_path, eval={"tasks": [str(unset), str(seven), "gad"], "seeds": 2, "max_train": 32,
                                   "arms": ["detour", "baseline"], "synthetic_ner": {"train": 24, "validation": 12,
                                                                                    "test": 12}})
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    # a step per task and arm, each the arm's 2 seeds
    assert "eval:unset:detour" in printed and "2 fine-tunes x 10 epochs (the default: its spec sets none), ~" in printed
    assert "2 fine-tunes x 7 epochs (its spec's), ~" in printed
    assert "2 fine-tunes x 10 epochs (its spec's), ~" in printed  # gad's spec: 10
    assert "2 fine-tunes x 3 epochs (its spec's), ~" in printed  # the generated task's spec: 3


@pytest.mark.slow
def test_the_steps_of_a_study_killed_with_9_are_gone_a_second_later(tmp_path, minilm):
    """Each step's process asks the kernel (PR_SET_PDEATHSIG) to be killed with its study, and so do
    prepare's tokenizer workers: no step goes on writing beside the rerun."""
    study = _study(tmp_path)
    spec = yaml.safe_load(study.read_text())
    for prep in spec["prepare"].values():
        prep["workers"] = 2  # a step with children of its own
    study.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    proc = _spawn(study, out)
    try:
        me = psutil.Process(proc.pid)
        family: list[psutil.Process] = []

        def a_step_with_its_workers() -> bool:
            family[:] = me.children(recursive=True)
            return any("detour.cli" in " ".join(p.cmdline()) for p in family) and len(family) >= 3

        _wait_for(a_step_with_its_workers, proc, "a step with its workers", timeout=120)
        print("running:", [(p.pid, " ".join(p.cmdline())[:80]) for p in family])
        proc.kill()
        proc.wait()
        time.sleep(1.0)
        alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running 1 s after the study was killed: {[p.pid for p in alive]}"
    finally:
        proc.kill()


def _decay_study(tmp_path: Path, arms: dict) -> tuple[Path, Path, dict]:
    """The suite's study with these extra arms and CKA for `decay-long`: (study file, out, steps by name)."""
    study = _study(tmp_path, arms=arms)
    spec = yaml.safe_load(study.read_text())
    spec["analyses"]["cka"]["arms"] = ["decay-long"]
    study.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    return study, out, {s.name: s for s in build_steps(load_study(study), out)}


def test_an_arm_against_its_twin_is_compared_with_it_in_cka_and_the_design_says_so(tmp_path):
    """The decay-length design: each decay of the detour is compared with the twin's decay of the same length."""
    from detour.study.run import write_design

    study, out, steps = _decay_study(tmp_path, {
        "decay-long": {"set": ["phases.1.tokens=4k"], "against": "baseline-decay-long"},
        "baseline-decay-long": {"base": "baseline", "set": ["phases.1.tokens=4k"]},
        "baseline-seed2": {"base": "baseline", "set": ["seed=18"]}})
    cka = steps["cka:decay-long"]
    assert cka.argv[2:4] == [str(out / "arms" / "decay-long" / "model"), str(out / "arms" / "baseline-decay-long" / "model")]
    assert "train:baseline-decay-long" in cka.deps and "train:baseline" not in cka.deps
    assert steps["cka"].argv[3] == str(out / "arms" / "baseline" / "model")  # the detour: against the baseline
    out.mkdir()
    write_design(load_study(study), out, list(steps.values()))
    arms = json.loads((out / "study.json").read_text())["arms"]
    assert arms["decay-long"]["against"] == "baseline-decay-long" and "against" not in arms["baseline-decay-long"]


def test_an_arm_with_its_own_noise_floor_is_measured_against_it_in_cka(tmp_path):
    """A longer decay's CKA against the seed noise of twins with that same decay, not the study's floor."""
    _, out, steps = _decay_study(tmp_path, {
        "decay-long": {"set": ["phases.1.tokens=4k"], "against": "baseline-decay-long",
                       "noise_floor": "baseline-seed2-decay-long"},
        "baseline-decay-long": {"base": "baseline", "set": ["phases.1.tokens=4k"]},
        "baseline-seed2": {"base": "baseline", "set": ["seed=18"]},
        "baseline-seed2-decay-long": {"base": "baseline", "set": ["seed=18", "phases.1.tokens=4k"]}})
    cka = steps["cka:decay-long"]
    floor = cka.argv[cka.argv.index("--noise-floor") + 1]
    assert floor == str(out / "arms" / "baseline-seed2-decay-long" / "model")
    assert "train:baseline-seed2-decay-long" in cka.deps and "train:baseline-seed2" not in cka.deps
    main_cka = steps["cka"]  # the detour keeps the study's floor
    assert main_cka.argv[main_cka.argv.index("--noise-floor") + 1] == str(out / "arms" / "baseline-seed2" / "model")
    # the floor's twin branches from the seed-2 twin's Phase-1 checkpoint, as the decay arms do from theirs
    branch = steps["train:baseline-seed2-decay-long"].recipe.branch
    assert branch is not None and Path(branch.run).name == "baseline-seed2"
