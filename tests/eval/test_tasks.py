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


def test_unknown_keys_are_named_with_the_known_ones(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: a\ntype: ner\nformat: iob\ndata: {all: x}\nepochs: 3\nsplit: {seeds: 1}\n"
                 "options: {column: 3, max_width: 4}\n")
    with pytest.raises(DetourError) as err:
        load_spec(f)
    text = str(err.value)
    assert "s.yaml" in text and "epochs: Extra inputs are not permitted (unknown key; known: name, type," in text
    assert "split.seeds: Extra inputs are not permitted (unknown key; known: seed, validation_from_train, ratios)" in text
    f.write_text("name: a\ntype: ner\nformat: iob\ndata: {all: x}\noptions: {column: 3, max_width: 4}\n")
    with pytest.raises(DetourError) as err:  # reader options too: `column` and the nested_ner-only max_width
        load_spec(f)
    assert (f"{f}: options: unknown key(s) column, max_width for format 'iob' and type 'ner'; "
            "known: columns, strict_tags") in str(err.value)
    f.write_text("name: a\ntype: nested_ner\nformat: brat_nested\ndata: {all: x}\noptions: {max_width: 4, entity_types: [X]}\n")
    assert load_spec(f).options["max_width"] == 4


def _spec_file(folder, name, **extra):
    f = folder / f"{name}.yaml"
    f.write_text(f"name: {name}\ntype: classification\nformat: tsv\ndata: {{all: x.tsv}}\n"
                 + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    return f


def test_tasks_and_task_spec_combine(tmp_path):
    from detour.eval.tasks import load_specs

    x, y = _spec_file(tmp_path, "x"), _spec_file(tmp_path, "y")
    # --task-spec x.yaml --tasks x: the name means that file, run once
    assert [s.name for s in load_specs(["x"], [str(x)])] == ["x"]
    assert [s.name for s in load_specs([str(x)], [str(x)])] == ["x"]  # the same file named twice
    # order: --tasks first, then the spec files no entry named; shipped names still work
    assert [s.name for s in load_specs(["gad", "y"], [str(x), str(y)])] == ["gad", "y", "x"]
    with pytest.raises(DetourError, match="no task 'z'"):
        load_specs(["z"], [str(x)])
    with pytest.raises(DetourError, match="no task: give --tasks"):
        load_specs([], [])
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(DetourError, match=r"task 'x' given twice \(.*x.yaml and .*other/x.yaml\)"):
        load_specs([], [str(x), str(_spec_file(other, "x"))])
    with pytest.raises(DetourError, match="task 'x' given twice in --tasks"):
        load_specs(["x", "x"], [str(x)])


def test_detour_eval_task_spec_with_its_name_in_tasks(tmp_path, minilm):
    import json

    from detour.cli import main

    (tmp_path / "x.tsv").write_text("".join(f"{'fever' if i % 2 else 'fracture'} {i}\t{i % 2}\n" for i in range(30)))
    f = _spec_file(tmp_path, "x", max_length=16, training="{epochs: 1, batch_size: 8}")
    rc = main(["eval", str(minilm), "--task-spec", str(f), "--tasks", "x", "--seeds", "1",
               "--data-root", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc == 0
    assert [r["task"] for r in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]] == ["x"]


def test_every_spec_file_problem_is_reported_together(tmp_path):
    from detour.eval.tasks import load_specs

    a = _spec_file(tmp_path, "a", headline="f1")
    b = _spec_file(tmp_path, "b", options="{text_col: 1}")
    with pytest.raises(DetourError) as err:
        load_specs(["a"], [str(a), str(b)])
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{a}: headline: 'f1'") and lines[1].startswith(f"{b}: options: unknown key(s) text_col")
    assert len(lines) == 2  # `a` names the broken a.yaml: not reported again as an unknown task


def test_an_unknown_type_or_format_names_the_spec_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("name: a\ntype: regresion\nformat: tsv\ndata: {all: x}\n")
    with pytest.raises(DetourError, match=rf"^{f}: type: unknown task type 'regresion'; known: "):
        load_spec(f)
    f.write_text("name: a\ntype: classification\nformat: tvs\ndata: {all: x}\n")
    with pytest.raises(DetourError, match=rf"^{f}: format: unknown task format 'tvs'"):
        load_spec(f)
