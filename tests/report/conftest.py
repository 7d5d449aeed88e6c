"""A real, tiny study folder for the report tests, built once per session through `detour.cli.main`.

Every file in it is written by the verb that writes it in a real study (prepare, twins, eval,
analyze, needle), only `study.json` is written here, as `detour study` would. The corpus is the
embedded SYNTHETIC generator and the model a 3-layer ModernBERT of hidden 32 with the MiniLM
tokenizer: under a minute on 2 loaded cores. The evaluation and the transplant need a shipped task
(GAD) from ../shared/data; without it the study has neither, and the tests that need them skip.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from detour.cli import main as detour
from tests.conftest import SHARED_DATA

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny-modernbert.yaml"
TINY = [
    "model.config.hidden_size=32", "model.config.intermediate_size=48", "model.config.num_hidden_layers=3",
    "model.config.num_attention_heads=2", "model.config.local_attention=16", "data.seq_len=64",
    "batch.global_sequences=4", "batch.micro_batch=4", "phases.0.tokens=1024", "phases.0.lr.warmup_tokens=256",
    "phases.1.tokens=512", "checkpoint.every_tokens=100000", "checkpoint.export_every_tokens=256",
    "checkpoint.export_phases=[decay]", "validation.sequences=8", "validation.every_tokens=512",
]
FEW_TEXTS = ["--n", "8", "--seeds", "2", "--max-length", "32"]
PROBE = ["--epochs", "1", "--max-train", "32", "--max-eval", "32", "--max-length", "64"]


def _run(*argv: str) -> None:
    assert detour(list(argv)) == 0, f"detour {' '.join(argv)} failed"


@pytest.fixture(scope="session")
def study(tmp_path_factory, minilm) -> Path:
    """study/: study.json, twins.json, arms/{detour,baseline,freeze-low-clm,baseline-seed2}/, eval/gad/,
    analysis/{cka,cka-freeze-low-clm,trajectory,transplant,drift-detour}/, needle/{detour,baseline}/."""
    root = tmp_path_factory.mktemp("report")
    data, out = root / "data", root / "study"
    arms = out / "arms"
    _run("prepare", "synthetic:clinical?docs=120&seed=0", "--tokenizer", str(minilm), "--out", str(data),
         "--workers", "1", "--validation", "0.1")
    sets = [x for o in [*TINY, f"data.sources=[{data}]"] for x in ("--set", o)]
    _run("twins", str(RECIPE), "--out", str(arms), *sets, "--freeze", "low@clm",
         "--baseline-arm", "baseline-seed2", "seed=18", "--no-progress")
    shutil.copy(arms / "twins.json", out / "twins.json")  # where a study keeps it
    model = {a: str(arms / a / "model") for a in ("detour", "baseline", "freeze-low-clm", "baseline-seed2")}
    _run("analyze", "cka", model["detour"], model["baseline"], "--noise-floor", model["baseline-seed2"], *FEW_TEXTS,
         "--out", str(out / "analysis" / "cka"))
    _run("analyze", "cka", model["freeze-low-clm"], model["baseline"], "--noise-floor", model["baseline-seed2"],
         *FEW_TEXTS, "--out", str(out / "analysis" / "cka-freeze-low-clm"))
    _run("analyze", "trajectory", str(arms / "detour"), str(arms / "baseline"), "--noise-floor",
         str(arms / "baseline-seed2"), *FEW_TEXTS, "--out", str(out / "analysis" / "trajectory"))
    _run("analyze", "drift", model["detour"], model["baseline"], "--out", str(out / "analysis" / "drift-detour"))
    for arm in ("detour", "baseline"):
        _run("needle", model[arm], "--preset", "small", "--pairs", "60", "--lengths", "64,128", "--epochs", "2",
             "--out", str(out / "needle" / arm))
    tasks = []
    if SHARED_DATA.is_dir():
        tasks = ["gad"]
        _run("eval", *model.values(), "--tasks", "gad", "--seeds", "2", *PROBE, "--out", str(out / "eval" / "gad"))
        _run("analyze", "transplant", "--src", model["detour"], "--dst", model["baseline"], "--tasks", "gad",
             "--blocks", "low", "none", "--seeds", "2", *PROBE, "--lr", "1e-3", "--out", str(out / "analysis" / "transplant"))
    study_json = {
        "schema": "detour.study/1", "name": "tiny-study", "description": "a tiny ModernBERT on synthetic text",
        "synthetic_data": True,
        "arms": {"detour": {"role": "detour", "description": "CLM, then an MLM decay"},
                 "baseline": {"role": "baseline", "description": "MLM at 30%, then the same decay"},
                 "freeze-low-clm": {"role": "arm", "description": "the detour with the low layers frozen during CLM"},
                 "baseline-seed2": {"role": "arm", "description": "the baseline with seed 18"}},
        "eval": {"tasks": tasks, "seeds": 2, "options": {"max_train": 32, "max_eval": 32, "epochs": 1}},
    }
    (out / "study.json").write_text(json.dumps(study_json, indent=2), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def report(study, tmp_path_factory) -> dict:
    """The paths write_report returned for the study, and the markdown and HTML texts."""
    from detour.report.render import write_report

    paths = write_report(study, tmp_path_factory.mktemp("report-out"))
    return {**paths, "md": paths["markdown"].read_text(encoding="utf-8"),
            "html_text": paths["html"].read_text(encoding="utf-8")}
