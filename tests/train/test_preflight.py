"""Errors before compute: `--dry-run` and the start of every run check what can be known up front."""

from __future__ import annotations

import json
import time

import pytest

from detour.cli import main as detour
from detour.train.outdir import clean_export_leftovers
from detour.train.twins import run_twins
from tests.train.conftest import RECIPES, TINY


def _args(verb, synthetic_data, out, *sets):
    args = [verb, str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out), "--no-progress"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY, *sets]:
        args += ["--set", s]
    return args


@pytest.mark.parametrize("sets,message", [
    (["model.config.num_hiden_layers=2"], "model.config: unknown key(s) for ModernBertConfig: num_hiden_layers "
                                          "(did you mean num_hidden_layers?)"),
    (["model.config.num_attention_heads=5"], "model.config: The hidden size (32) is not a multiple of the number "
                                             "of attention heads (5)"),
    (["phases.1.freeze.layers=abc"], "phases.1.freeze.layers (decay): 'abc' is not like"),
    (["phases.1.freeze.layers=2-5"], "phases.1.freeze.layers (decay): '2-5' is out of range for a model with 3 layers"),
    (["data.sources=[/nonexistent/corpus]"], "data.sources.0: /nonexistent/corpus: not a prepared corpus"),
])
@pytest.mark.parametrize("verb", ["train", "twins"])
def test_dry_run_finds_bad_input(synthetic_data, tmp_path, capsys, verb, sets, message):
    assert detour(_args(verb, synthetic_data, tmp_path / "run", *sets, ) + ["--dry-run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_run_refuses_the_same_before_loading_anything(synthetic_data, tmp_path, capsys):
    t0 = time.perf_counter()
    assert detour(_args("train", synthetic_data, tmp_path / "run", "phases.1.freeze.layers=7")) == 2
    assert "phases.1.freeze.layers (decay): '7' is out of range" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert time.perf_counter() - t0 < 30


def test_out_that_is_a_file_is_refused(synthetic_data, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    assert detour(_args("train", synthetic_data, tmp_path / "file") + ["--dry-run"]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "mine"


def test_a_changed_recipe_on_twins_resume_is_refused_before_any_arm_trains(tiny_recipe, synthetic_data, tmp_path,
                                                                           capsys):
    run_twins(tiny_recipe(), tmp_path, progress=False)
    before = {arm: (tmp_path / arm / "metrics.jsonl").read_bytes() for arm in ("detour", "baseline")}
    assert detour(_args("twins", synthetic_data, tmp_path, "phases.0.lr.warmup_tokens=256") + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'detour'} holds a run of a different recipe (phases.0.lr.warmup_tokens: 256 now, 512" in err
    assert before == {arm: (tmp_path / arm / "metrics.jsonl").read_bytes() for arm in ("detour", "baseline")}


def test_export_leftovers_are_cleaned_and_only_detours_own(tmp_path):
    out = tmp_path / "run"
    (out / "model.tmp-123").mkdir(parents=True)
    (out / "model.tmp-123" / "config.json").write_text("{}")
    (out / "export" / "clm.old-55").mkdir(parents=True)  # the kill came between the two renames
    (out / "export" / "clm.old-55" / "config.json").write_text(json.dumps({"old": True}))
    (out / "export" / "decay").mkdir()
    (out / "export" / "decay.tmp-77" / "4096").mkdir(parents=True)  # a sub-export already moved in
    (out / "export" / "decay.tmp-77" / "4096" / "config.json").write_text("{}")
    (out / "export" / "decay" / "8192.tmp-9").mkdir()
    (out / "model.tmp-notes").mkdir()  # not detour's pattern: the user's
    done = clean_export_leftovers(out)
    assert not (out / "model.tmp-123").exists() and not (out / "export" / "decay" / "8192.tmp-9").exists()
    assert json.loads((out / "export" / "clm" / "config.json").read_text()) == {"old": True}
    assert (out / "export" / "decay" / "4096" / "config.json").is_file()
    assert not (out / "export" / "decay.tmp-77").exists()
    assert (out / "model.tmp-notes").is_dir()
    assert len(done) == 5


def test_real_data_without_a_license_is_refused_before_training(tmp_path, capsys):
    corpus = tmp_path / "notes.txt"
    corpus.write_text("The patient was given aspirin.\nNo fever was reported on admission.\n")
    assert detour(["prepare", str(corpus), "--tokenizer", "minilm-l6", "--out", str(tmp_path / "data")]) == 0
    args = ["train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(tmp_path / "run"), "--dry-run"]
    for s in [f"data.sources=[{tmp_path / 'data'}]", *TINY]:
        args += ["--set", s]
    capsys.readouterr()
    assert detour(args) == 2
    assert "card.license" in capsys.readouterr().err
    assert detour(args + ["--set", "card.license=cc-by-4.0"]) == 0


def test_out_that_is_the_data_folder_is_refused(synthetic_data, tmp_path, capsys):
    before = sorted(p.name for p in synthetic_data.rglob("*"))
    for out in (synthetic_data, synthetic_data / "run"):
        assert detour(_args("train", synthetic_data, out)) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: is " in err and "data folder of data.sources.0" in err
    assert sorted(p.name for p in synthetic_data.rglob("*")) == before
