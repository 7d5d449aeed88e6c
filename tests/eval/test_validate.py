"""Checks before training: headlines against the metrics a type reports, examples of the wrong
kind, labels never seen in train, every task checked up front, and the specs of docs/eval.md run
end to end on corpora written here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from detour.cli import main
from detour.errors import DetourError
from detour import notices
from detour.eval.tasks import TaskSpec, get_task_type, load_spec
from detour.eval.validate import check_spec, validate_tasks

DOCS = Path(__file__).resolve().parents[2] / "docs" / "eval.md"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(notices, "_warned", set())  # each test sees its own warnings


def write_spec(folder: Path, name: str = "t", **fields) -> Path:
    spec = {"name": name, **fields}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def iob_corpus(folder: Path, train_types=("Drug",), test_types=("Drug",)) -> None:
    """train.iob / test.iob: sentences with one entity each, of the given types in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, types in (("train", train_types), ("test", test_types)):
        sentences = [f"patient\tO\ngot\tO\nitem{i}\tB-{types[i % len(types)]}\nx\tI-{types[i % len(types)]}\n.\tO\n"
                     for i in range(20)]
        (folder / f"{split}.iob").write_text("\n".join(sentences))


@pytest.mark.parametrize("task_type, fmt, valid", [
    ("ner", "iob", "micro_f1, macro_f1, precision, recall, f1/<type>"),
    ("nested_ner", "brat_nested", "micro_f1, macro_f1, precision, recall, f1/<type>"),
    ("classification", "tsv", "accuracy, micro_f1, macro_f1, weighted_f1"),
    ("relation", "tsv", "accuracy, micro_f1, macro_f1, weighted_f1"),
    ("multilabel", "hoc", "accuracy, micro_f1, macro_f1, weighted_f1, samples_f1"),
])
def test_a_headline_that_is_not_a_metric_names_file_field_and_valid_names(tmp_path, task_type, fmt, valid):
    f = write_spec(tmp_path, type=task_type, format=fmt, data={"all": "x"}, headline="f1")
    with pytest.raises(DetourError) as err:
        load_spec(f, tmp_path)
    assert f"{f}: headline: 'f1' is not a metric of task type {task_type!r}; valid: {valid}" in str(err.value)


def test_metric_names_are_what_score_returns():
    """The names the check accepts are exactly the keys the scorers produce (less the answer counts)."""
    from detour.eval.metrics import ANSWER_COUNTS

    def names(scores):  # the counts of the model's answers are never a headline
        return {k for k in scores if k not in ANSWER_COUNTS}

    ner = get_task_type("ner")
    labels = ["O", "B-Drug", "I-Drug", "B-Dose"]
    ex = [{"tokens": ["a", "b", "c"], "tags": ["B-Drug", "I-Drug", "B-Dose"]}]
    assert names(ner.score(ex, [{0: "B-Drug", 1: "I-Drug", 2: "B-Dose"}], labels)) == set(ner.metric_names(labels))
    cls = get_task_type("classification")
    assert names(cls.score([{"label": "a"}], ["a"], ["a", "b"])) == set(cls.metric_names(["a", "b"]))
    ml = get_task_type("multilabel")
    assert names(ml.score([{"labels": ["a"]}], [["a"]], ["a", "b"])) == set(ml.metric_names(["a", "b"]))
    nested = get_task_type("nested_ner")
    got = nested.score([{"entities": [(0, 1, "X")]}], [{(0, 1, "X")}], ["X"])
    assert names(got) == set(nested.metric_names(["X"]))


def test_a_per_type_headline_is_checked_against_the_label_set(tmp_path):
    iob_corpus(tmp_path / "d", train_types=("Drug", "Dose"), test_types=("Drug", "Dose"))
    data = {"train": "d/train.iob", "test": "d/test.iob"}
    f = write_spec(tmp_path, "a", type="ner", format="iob", data=data, headline="f1/Disease")
    spec = load_spec(f, tmp_path)  # f1/<something> may be right: only the data can tell
    with pytest.raises(DetourError) as err:
        validate_tasks([spec])
    assert f"{f}: headline: 'f1/Disease' is not a metric of task type 'ner'" in str(err.value)
    assert "f1/Dose, f1/Drug" in str(err.value)
    ok = write_spec(tmp_path, "b", type="ner", format="iob", data=data, headline="f1/Dose")
    assert set(validate_tasks([load_spec(ok, tmp_path)])) == {"b"}


def test_a_per_type_headline_absent_from_the_scored_examples_is_an_error(tmp_path):
    iob_corpus(tmp_path / "d", train_types=("Drug", "Dose"), test_types=("Drug",))
    f = write_spec(tmp_path, type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"},
                   headline="f1/Dose")
    with pytest.raises(DetourError, match=r"t.yaml: headline: 'f1/Dose' needs Dose in the test split, but none of its 20"):
        validate_tasks([load_spec(f, tmp_path)])


def test_examples_of_the_wrong_kind_for_the_type(tmp_path):
    (tmp_path / "d.tsv").write_text("text\tlabel\n" + "".join(f"row {i}\t{i % 2}\n" for i in range(20)))
    f = write_spec(tmp_path, type="ner", format="tsv", data={"all": "d.tsv"})
    with pytest.raises(DetourError) as err:
        validate_tasks([load_spec(f, tmp_path)])
    assert f"{f}: type 'ner' needs examples with tokens, tags, but format 'tsv' read" in str(err.value)


def test_ner_labels_without_o(tmp_path):
    iob_corpus(tmp_path / "d")
    f = write_spec(tmp_path, type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"},
                   labels=["B-Drug", "I-Drug"])
    with pytest.raises(DetourError, match=r"t.yaml: labels: a ner label list needs 'O'"):
        validate_tasks([load_spec(f, tmp_path)])


def test_labels_only_in_test_are_a_warning_naming_them_and_the_split(tmp_path, capsys):
    iob_corpus(tmp_path / "d", train_types=("Drug",), test_types=("Drug", "Dose", "Route"))
    f = write_spec(tmp_path, type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"})
    validate_tasks([load_spec(f, tmp_path)])
    err = capsys.readouterr().err
    assert f"WARNING: task t ({f}): Dose, Route appear(s) in the test split but never in train" in err
    assert "validation split" not in err  # validation is cut from train: nothing new there
    (tmp_path / "c.tsv").write_text("".join(f"s{i}\t{'a' if i < 30 else 'b'}\n" for i in range(40)))
    g = write_spec(tmp_path, "c", type="classification", format="tsv", data={"train": "c.tsv", "test": "c.tsv"},
                   split={"validation_from_train": 0.5, "seed": 1})
    validate_tasks([load_spec(g, tmp_path)])
    assert "WARNING: task c" not in capsys.readouterr().err  # every label has train examples


def test_a_warning_is_printed_once_however_often_the_task_is_read(tmp_path, capsys):
    iob_corpus(tmp_path / "d", train_types=("Drug",), test_types=("Dose",))
    spec = load_spec(write_spec(tmp_path, type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"}),
                     tmp_path)
    validate_tasks([spec])
    validate_tasks([spec])  # as when `detour eval` prepares the task for a second model
    assert capsys.readouterr().err.count("WARNING: task t") == 1


def test_every_task_is_checked_and_all_problems_reported_together(tmp_path):
    iob_corpus(tmp_path / "d")
    good = write_spec(tmp_path, "good", type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"})
    missing = write_spec(tmp_path, "missing", type="ner", format="iob", data={"train": "nope.iob", "test": "d/test.iob"})
    (tmp_path / "d" / "bad.iob").write_text("a\tO\nb\tNN\tB-Drug\n")
    bad = write_spec(tmp_path, "bad", type="ner", format="iob", data={"train": "d/bad.iob", "test": "d/test.iob"})
    with pytest.raises(DetourError) as err:
        validate_tasks([load_spec(p, tmp_path) for p in (good, missing, bad)])
    text = str(err.value)
    assert text.startswith("2 tasks have problems")
    assert "task missing: train data not found at" in text and "bad.iob:2: 3 column(s)" in text


def test_check_spec_on_a_spec_built_in_code():
    spec = TaskSpec(name="t", type="classification", format="tsv", data={"all": "x"}, options={"label_colum": "y"})
    with pytest.raises(DetourError, match=r"task t: options: unknown key\(s\) label_colum for format 'tsv'"):
        check_spec(spec)


def test_detour_eval_refuses_a_bad_spec_before_fine_tuning(tmp_path, minilm, monkeypatch, capsys):
    from detour.eval import run as run_module

    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: pytest.fail("fine-tuning started"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.iob").write_text("a\tO\nb\tI-Drug\tmore\n")
    f = write_spec(tmp_path, type="ner", format="iob", data={"all": "d/x.iob"})
    rc = main(["eval", str(minilm), "--task-spec", str(f), "--seeds", "1", "--data-root", str(tmp_path),
               "--out", str(tmp_path / "out")])
    assert rc == 2 and "x.iob:2: 3 column(s), the spec reads 2" in capsys.readouterr().err


def test_detour_eval_checks_every_task_before_training_the_first(tmp_path, minilm, monkeypatch, capsys):
    """The second task is broken: nothing trains, not even the first task."""
    from detour.eval import run as run_module

    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: pytest.fail("fine-tuning started"))
    iob_corpus(tmp_path / "d")
    good = write_spec(tmp_path, "good", type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"})
    bad = write_spec(tmp_path, "bad", type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"},
                     headline="f1/Dose")
    rc = main(["eval", str(minilm), "--task-spec", str(good), "--task-spec", str(bad), "--seeds", "1",
               "--data-root", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc == 2 and "bad.yaml: headline: 'f1/Dose' is not a metric" in capsys.readouterr().err


def test_prepare_task_checks_the_task_too(tmp_path, minilm):
    """Code that fine-tunes without the CLI gets the same checks."""
    from detour.eval.finetune import Budget, prepare_task

    iob_corpus(tmp_path / "d")
    spec = TaskSpec(name="t", type="ner", format="iob", data={"train": "d/train.iob", "test": "d/test.iob"},
                    headline="f1/Dose", root=str(tmp_path))
    with pytest.raises(DetourError, match=r"task t: headline: 'f1/Dose' is not a metric of task type 'ner'"):
        prepare_task(spec, str(minilm), Budget(max_length=32))


def _docs_specs() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    return {spec["name"]: spec for spec in map(yaml.safe_load, blocks)}


def test_every_spec_in_the_docs_is_valid():
    specs = _docs_specs()
    assert {"my-task", "clinic-ner", "clinic-nested"} <= set(specs)
    for raw in specs.values():
        check_spec(TaskSpec.model_validate(raw))


def test_the_docs_examples_run_end_to_end_on_new_corpora(tmp_path, minilm):
    """The two example specs of docs/eval.md, as written there, on an IOB2 corpus and a nested BRAT
    corpus that exist only in this test."""
    specs = _docs_specs()
    ner, nested = specs["clinic-ner"], specs["clinic-nested"]
    root = tmp_path / "data"
    drugs, doses = ["aspirin", "warfarin", "heparin", "insulin"], ["5 mg", "two tablets"]
    for split, n_docs in (("train", 6), ("test", 3)):
        docs = []
        for d in range(n_docs):
            sentences = []
            for k in range(3):
                dose = doses[(d + k) % 2].split()
                sentences.append(f"patient\tO\nreceived\tO\n{dose[0]}\tB-Dose\n{dose[1]}\tI-Dose\nof\tO\n"
                                 f"{drugs[(d + k) % 4]}\tB-Drug\n.\tO\n")
            docs.append("-DOCSTART-\tO\n\n" + "\n".join(sentences))
        path = root / ner["data"][split]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(docs))
    for split, n_docs in (("train", 6), ("test", 3)):
        folder = root / nested["data"][split]
        folder.mkdir(parents=True)
        for d in range(n_docs):
            drug = drugs[d % 4]
            line = f"Patient on {drug} for chronic pain.\nNo {drug} allergy.\n"
            start = line.index(drug)
            second = line.index(drug, start + 1)
            pain = line.index("chronic pain")
            (folder / f"doc{d}.txt").write_text(line, encoding="utf-8")
            (folder / f"doc{d}.ann").write_text(
                f"T1\tCHEM {start} {start + len(drug)}\t{drug}\n"
                f"T2\tDISO {pain} {pain + 12}\tchronic pain\n"
                f"T3\tDISO {pain + 8} {pain + 12}\tpain\n"  # nested in T2
                f"T4\tCHEM {second} {second + len(drug)}\t{drug}\n"
                f"T5\tDISO {second} {second + len(drug) + 8}\t{drug} allergy\n",  # overlaps T4's span
                encoding="utf-8")
    files = []
    for spec in (ner, nested):
        f = tmp_path / f"{spec['name']}.yaml"
        f.write_text(yaml.safe_dump(spec))
        files += ["--task-spec", str(f)]
    out = tmp_path / "out"
    rc = main(["eval", str(minilm), *files, "--seeds", "1", "--epochs", "1", "--max-length", "32", "--batch-size", "8",
               "--data-root", str(root), "--out", str(out)])
    assert rc == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [r["task"] for r in runs] == ["clinic-ner", "clinic-nested"]
    ner_run, nested_run = runs
    assert ner_run["headline"] == "micro_f1" and ner_run["budget"]["labels"] == 4  # O, B-/I-Dose, B-Drug
    assert nested_run["headline"] == "macro_f1" and nested_run["budget"]["labels"] == 2  # CHEM, DISO
    for r in runs:
        assert 0.0 <= r["metrics"][r["headline"]] <= 1.0
