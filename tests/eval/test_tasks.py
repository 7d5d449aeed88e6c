"""Task specs and registries: shipped specs load, paths resolve against the data root, errors
name the file and field, and a new format registers with one line."""

from pathlib import Path

import pytest

from detour.errors import DetourError
from detour.eval import tasks
from detour.eval.splits import load_splits
from detour.eval.tasks import FORMATS, load_spec, register_format, shipped_tasks


def test_shipped_tasks_and_their_types():
    names = shipped_tasks()
    assert {"ncbi-disease", "jnlpba", "gad", "chemprot", "hoc", "e3c-fr", "fracco-30", "fracco-100"} <= set(names)
    for name in names:
        spec = load_spec(name, "/data")
        assert spec.type in tasks.TASK_TYPES and spec.format in FORMATS


def test_paths_resolve_against_data_root(monkeypatch, tmp_path):
    spec = load_spec("gad", tmp_path)
    assert spec.path("train") == tmp_path / "tasks/en/gad/train.tsv"
    monkeypatch.setenv("DETOUR_DATA_ROOT", "/elsewhere")
    assert load_spec("gad").path("test") == Path("/elsewhere/tasks/en/gad/test.tsv")
    monkeypatch.delenv("DETOUR_DATA_ROOT")
    monkeypatch.chdir(tmp_path)
    assert load_spec("gad").path("test") == tmp_path.parent / "shared/data/tasks/en/gad/test.tsv"
    f = tmp_path / "abs.yaml"
    f.write_text(f"name: a\ntype: classification\nformat: tsv\ndata: {{all: {tmp_path}/x.tsv}}\n")
    assert load_spec(f, "/data").path("all") == tmp_path / "x.tsv"


def test_spec_errors_name_file_and_field(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: a\ntype: classification\nformat: tsv\ndata: {all: x}\ntraining: {epochs: 0, lrr: 1}\n")
    with pytest.raises(DetourError) as err:
        load_spec(f)
    assert "s.yaml" in str(err.value) and "training.epochs" in str(err.value) and "training.lrr" in str(err.value)
    f.write_text("name: a\ntype: regression\nformat: tsv\ndata: {all: x}\n")
    with pytest.raises(DetourError, match="unknown task type 'regression'"):
        load_spec(f)


def test_missing_data_says_where(tmp_path):
    with pytest.raises(DetourError, match="train data not found at .*gad/train.tsv"):
        load_splits(load_spec("gad", tmp_path))


def test_a_new_format_is_one_registration(tmp_path, monkeypatch):
    monkeypatch.setitem(FORMATS, "pipe", None)

    @register_format("pipe")
    def read_pipe(path, spec, split=""):
        return [{"text": a, "label": b, "doc": i} for i, (a, b) in enumerate(
            line.split("|") for line in Path(path).read_text().splitlines())]

    (tmp_path / "d.txt").write_text("\n".join(f"t{i}|{i % 2}" for i in range(20)))
    f = tmp_path / "p.yaml"
    f.write_text("name: p\ntype: classification\nformat: pipe\ndata: {all: d.txt}\n")
    splits = load_splits(load_spec(f, tmp_path))
    assert [len(v) for v in splits.values()] == [16, 2, 2]
