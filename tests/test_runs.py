"""detour.runs: the one description of a run folder, and reading its metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detour.runs import TWINS_FILE, RunFolder, read_metrics


def test_the_run_folder_names_what_train_writes(tmp_path):
    run = RunFolder(str(tmp_path))  # a str is taken as a path
    assert run.root == tmp_path
    assert (run.recipe, run.metrics, run.summary, run.curves) == (
        tmp_path / "recipe.json", tmp_path / "metrics.jsonl", tmp_path / "summary.json", tmp_path / "curves.png")
    assert (run.checkpoints, run.model, run.export_dir) == (tmp_path / "checkpoints", tmp_path / "model",
                                                            tmp_path / "export")
    assert run.export("decay") == tmp_path / "export" / "decay"
    assert run.export("clm", 4096) == tmp_path / "export" / "clm" / "4096"
    assert TWINS_FILE == "twins.json"
    assert not run.is_run() and not run.is_finished()
    run.recipe.write_text("{}")
    assert run.is_run() and not run.is_finished()
    run.summary.write_text("{}")
    assert run.is_finished()
    assert RunFolder(tmp_path) == run


def test_read_metrics_keeps_order_skips_blank_lines_and_names_a_damaged_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"global_step": 1}\n\n{"global_step": 2}\n')
    assert [r["global_step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"global_step": 1}\n{"global_st')
    with pytest.raises(json.JSONDecodeError):
        read_metrics(Path(path))
