"""A study evaluates each arm in its own step, after that arm's training only, and gathers the arms'
runs of a task into the one results.json a multi-arm `detour eval` call writes.

    .venv/bin/python -m pytest -q tests/study/test_eval_steps.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from detour.cli import main
from detour.study.graph import build_steps, step_key
from detour.study.spec import load_study
from tests.conftest import tiny_modernbert_config
from tests.study.test_study import _study


def _all_arms(tmp_path: Path) -> Path:
    """The suite's tiny study, evaluating every arm (detour, baseline, baseline-seed2)."""
    study = _study(tmp_path)
    spec = yaml.safe_load(study.read_text())
    del spec["eval"]["arms"]
    study.write_text(yaml.safe_dump(spec))
    return study


def test_each_arm_is_evaluated_after_its_own_training_and_the_gather_after_every_arm(tmp_path):
    out = (tmp_path / "out").resolve()
    steps = {s.name: s for s in build_steps(load_study(_all_arms(tmp_path)), out)}
    arms = ["detour", "baseline", "baseline-seed2"]
    for arm in arms:
        step = steps[f"eval:synthetic-ner:{arm}"]
        assert step.kind == "eval" and step.deps == [f"train:{arm}", "task:synthetic-ner"]
        assert step.argv[:2] == ["eval", str(out / "arms" / arm / "model")]  # that arm's model alone
        assert step.argv[step.argv.index("--out") + 1] == str(out / "eval" / "synthetic-ner" / "arms" / arm)
    gather = steps["eval:synthetic-ner"]
    assert gather.kind == "gather" and gather.argv is None  # in the study's own process
    assert gather.deps == [f"eval:synthetic-ner:{arm}" for arm in arms]
    assert gather.hash_of == out / "eval" / "synthetic-ner" / "results.json"
    # the report reads the gathered file: it waits for the gather
    assert "eval:synthetic-ner" in steps["report"].deps
    names = list(steps)
    assert names.index("eval:synthetic-ner") > max(names.index(f"eval:synthetic-ner:{a}") for a in arms)


def test_a_changed_arm_reruns_its_own_evaluation_and_the_gather_only(tmp_path):
    from detour.study.state import State, plan

    study = _all_arms(tmp_path)
    out = (tmp_path / "out").resolve()
    steps = build_steps(load_study(study), out)
    state = State(out)
    hashes = {}
    for step in steps:  # every step finished with this study's keys
        state.steps[step.name] = {"key": step_key(step, out, hashes), "output_hash": f"hash-of-{step.name}"}
        hashes[step.name] = f"hash-of-{step.name}"
        for p in step.outputs:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    assert set(plan(steps, out, state).values()) == {"done"}
    changed = yaml.safe_load(study.read_text())
    changed["arms"]["baseline-seed2"]["set"] = ["seed=19"]
    study.write_text(yaml.safe_dump(changed))
    states = plan(build_steps(load_study(study), out), out, state)
    evals = {name: s for name, s in states.items() if name.startswith("eval:")}
    assert evals == {"eval:synthetic-ner:detour": "done", "eval:synthetic-ner:baseline": "done",
                     "eval:synthetic-ner:baseline-seed2": "stale", "eval:synthetic-ner": "stale"}


# ---- the gathered file against one multi-arm call, on real models ----

SEEDS = ["--seeds", "2", "--max-length", "32"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, tokenizer_dir):
    """Two tiny ModernBERTs (other initial weights) fine-tuned on a generated task: once in one
    `detour eval` call of both, once in a call each, which are then gathered."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from detour.eval.synthetic_ner import write_task
    from detour.study.gather import gather

    root = tmp_path_factory.mktemp("eval-steps")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    models = []
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        AutoModelForMaskedLM.from_config(tiny_modernbert_config()).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        models.append(str(root / name))
    task = write_task(root / "task", (48, 16, 16), seed=3)
    spec = ["--task-spec", str(task), *SEEDS]
    assert main(["eval", *models, *spec, "--out", str(root / "multi")]) == 0
    for model in models:
        assert main(["eval", model, *spec, "--out", str(root / "arms" / Path(model).name)]) == 0
    gather([root / "arms" / Path(m).name / "results.json" for m in models], root / "gathered")
    return {"root": root, "models": models, "spec": spec}


def _without_timings(path: Path) -> dict:
    data = json.loads(path.read_text())
    for run in data["runs"]:
        run.pop("timings")  # wall-clock seconds: the one thing two calls do not share
    return data


def test_the_gathered_results_are_those_of_one_call_of_every_arm(evaluated):
    root = evaluated["root"]
    multi, gathered = _without_timings(root / "multi" / "results.json"), _without_timings(root / "gathered" / "results.json")
    assert gathered == multi  # the same runs in the same order, config and summary: every seed's scores
    scores = {(r["model"], r["seed"]): r["metrics"] for r in multi["runs"]}
    assert len(scores) == 4 and len({json.dumps(m, sort_keys=True) for m in scores.values()}) > 1  # not a trivial match
    md = (root / "gathered" / "results.md").read_text()
    assert md.split("## Seeds and settings")[0] == (root / "multi" / "results.md").read_text().split("## Seeds and settings")[0]


def test_an_arm_reuses_its_runs_from_a_multi_arm_results_file(evaluated, capsys):
    """How a study folder from before the per-arm steps continues: nothing is fine-tuned again, and
    the gathered file is the multi-arm one byte for byte."""
    from detour.study.gather import gather

    root, models, spec = evaluated["root"], evaluated["models"], evaluated["spec"]
    multi = root / "multi" / "results.json"
    for model in models:
        capsys.readouterr()
        assert main(["eval", model, *spec, "--reuse-from", str(multi), "--out", str(root / "reused" / Path(model).name)]) == 0
        printed = capsys.readouterr().out
        assert "reuse from" in printed and "2 run(s) with an unchanged key" in printed and "0 of 2 run(s) to do" in printed
    gather([root / "reused" / Path(m).name / "results.json" for m in models], root / "regathered")
    assert (root / "regathered" / "results.json").read_bytes() == multi.read_bytes()
    # another setting is another key: nothing is taken
    assert main(["eval", models[0], *spec, "--lr", "1e-3", "--reuse-from", str(multi), "--dry-run",
                 "--out", str(root / "other-lr")]) == 0
    printed = capsys.readouterr().out
    assert "0 run(s) with an unchanged key" in printed and "2 run(s) would train" in printed


def test_reuse_from_must_name_a_results_file(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "model"), "--tasks", "gad", "--reuse-from", str(tmp_path / "notes.txt"),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--reuse-from" in err[0] and "results.json" in err[0]
    assert not (tmp_path / "o").exists()


def test_gather_refuses_a_missing_arm_file(tmp_path):
    from detour.errors import DetourError
    from detour.study.gather import gather

    with pytest.raises(DetourError, match="not found; its evaluation step did not write it"):
        gather([tmp_path / "arms" / "detour" / "results.json"], tmp_path / "into")
