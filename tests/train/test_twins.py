"""`detour twins`: both arms see the identical token stream; exports load in stock transformers."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

from detour.cli import main as detour
from detour.train.twins import run_twins
from tests.train.conftest import RECIPES, TINY


def test_twins_same_stream_and_loadable_exports(tiny_recipe, tmp_path):
    report = run_twins(tiny_recipe(), tmp_path, progress=False)
    saved = json.loads((tmp_path / "twins.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert report["checks"] == {"tokens_equal": True, "stream_hashes_equal": True}
    detour_arm, baseline = report["arms"]["detour"], report["arms"]["baseline"]
    assert detour_arm["phases"]["clm"]["objective"] == "clm"
    assert baseline["phases"]["clm"]["objective"] == "mlm" and baseline["phases"]["clm"]["mask_rate"] == 0.30
    assert detour_arm["phases"]["clm"]["stream_hash"] == baseline["phases"]["clm"]["stream_hash"] != ""
    assert detour_arm["phases"]["decay"]["stream_hash"] != detour_arm["phases"]["clm"]["stream_hash"]
    for arm in ("detour", "baseline"):
        folder = tmp_path / arm / "model"
        config = json.loads((folder / "config.json").read_text())
        assert not config.get("is_decoder", False)
        model = AutoModelForMaskedLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        fill = pipeline("fill-mask", model=model, tokenizer=tok)
        assert len(fill(f"the patient was given {tok.mask_token} daily.")) == 5
        assert (folder / "README.md").read_text().count("clm") >= 1
        with torch.no_grad():
            assert torch.isfinite(model(**tok("a test", return_tensors="pt")).logits).all()
    assert report["end_of_decay_mlm_loss"]["detour"] > 0 and report["end_of_decay_mlm_loss"]["baseline"] > 0
    assert report["synthetic_data"] is True
    assert "SYNTHETIC" in (tmp_path / "detour" / "model" / "README.md").read_text()


def test_dry_run_prints_plan(synthetic_data, capsys):
    args = ["twins", str(RECIPES / "tiny-modernbert.yaml"), "--out", "unused", "--dry-run"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY]:
        args += ["--set", s]
    assert detour(args) == 0
    out = capsys.readouterr().out
    assert "MLM baseline arm" in out and "1,300" in out and "last_step_tokens" in out
