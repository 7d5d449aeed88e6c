"""`detour demo`: its built-in study, its SYNTHETIC labels and its switch to real data.

    python -m pytest -q tests/study/test_demo.py
"""

from __future__ import annotations

import pytest

from detour.cli import main
from detour.errors import DetourError
from detour.study.demo import demo_study
from detour.study.graph import build_steps


def test_the_demo_is_the_three_arm_minilm_study_on_synthetic_data(tmp_path):
    spec = demo_study()
    steps = {s.name: s for s in build_steps(spec, tmp_path)}
    assert {"train:detour", "train:baseline", "train:baseline-seed2", "task:synthetic-ner", "eval:synthetic-ner:detour",
            "eval:synthetic-ner", "cka", "trajectory", "report"} <= set(steps)
    detour = steps["train:detour"].recipe
    assert detour.model.source == "minilm-l6"  # the pretrained encoder, not a random one
    assert [p.objective for p in detour.phases] == ["clm", "mlm"]
    assert [p.objective for p in steps["train:baseline"].recipe.phases] == ["mlm", "mlm"]
    assert steps["train:baseline-seed2"].recipe.seed != detour.seed
    assert spec.prepare["corpus"].sources[0].startswith("synthetic:clinical")
    assert "--noise-floor" in steps["cka"].argv and steps["eval:synthetic-ner:detour"].argv.count("--seeds") == 1
    assert spec.eval.seeds >= 3
    # a held-out split of the corpus, scored in every arm along the run
    assert "--validation" in steps["prepare:corpus"].argv
    for arm in ("detour", "baseline", "baseline-seed2"):
        validation = steps[f"train:{arm}"].recipe.validation
        assert validation is not None and validation.every_tokens is not None, arm


def test_dry_run_says_the_data_are_synthetic(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "SYNTHETIC" in printed and "not a result" in printed
    assert "to run   train:detour" in printed and "fine-tunes" in printed
    assert not (tmp_path / "demo").exists()


def test_corpus_and_tasks_run_it_on_real_files(tmp_path, capsys):
    corpus = tmp_path / "notes.txt"
    corpus.write_text("A patient was admitted with chest pain.\nA second note.\n")
    spec = demo_study([str(corpus)], "ncbi-disease,gad")
    assert spec.prepare["corpus"].sources == [str(corpus.resolve())]
    assert spec.eval.synthetic_ner is None and spec.eval.tasks == ["ncbi-disease", "gad"]
    steps = build_steps(spec, tmp_path / "out")
    names = [s.name for s in steps]
    assert spec.prepare["corpus"].validation == demo_study().prepare["corpus"].validation  # real text is split too
    assert str(corpus.resolve()) in steps[0].argv and "--validation" in steps[0].argv
    assert "task:synthetic-ner" not in names and "eval:ncbi-disease" in names and "eval:gad" in names
    assert main(["demo", "--corpus", str(corpus), "--tasks", "gad", "--out", str(tmp_path / "d"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "the pretraining corpus" not in printed  # real corpus: only the remaining synthetic part is named


def test_bad_demo_inputs_are_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(DetourError, match="--corpus .*nope.txt: not found"):
        demo_study([str(tmp_path / "nope.txt")])
    assert main(["demo", "--tasks", "no-such-task", "--out", str(tmp_path / "d"), "--dry-run"]) == 2
    assert "no-such-task" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
