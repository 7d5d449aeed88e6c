"""`detour eval` end to end on the real MiniLM: a smoke run of every shipped task, fixed-seed
determinism, resume after an interruption, and task specs the project has never seen."""

import json
import math

import pytest

from detour.cli import main
from detour.eval import run as run_module
from detour.eval.tasks import shipped_tasks

TINY = ["--seeds", "1", "--epochs", "1", "--max-train", "32", "--max-eval", "32", "--max-length", "64"]


def evaluate(minilm, out, *extra, data_root=None):
    argv = ["eval", str(minilm), "--out", str(out), *extra]
    if data_root:
        argv += ["--data-root", str(data_root)]
    return main(argv)


@pytest.mark.parametrize("task", shipped_tasks())
def test_smoke_every_shipped_task(task, minilm, shared_data, tmp_path):
    assert evaluate(minilm, tmp_path, "--tasks", task, *TINY, data_root=shared_data) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["schema"] == "detour.eval/1"
    assert data["config"]["tasks"] == [task] and data["config"]["seeds"] == [0] and data["config"]["epochs"] == 1
    (r,) = data["runs"]
    assert {"model", "task", "seed", "headline", "metrics", "selected_epoch", "budget", "timings"} <= set(r)
    assert r["headline"] in r["metrics"] and r["selected_epoch"] == 1
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in r["metrics"].values())
    assert r["budget"]["train_examples"] <= 32 and r["budget"]["eval_examples"] <= 32 and r["budget"]["max_length"] == 64
    s = data["summary"][str(minilm)][task][r["headline"]]
    assert s == {"mean": r["metrics"][r["headline"]], "std": 0.0, "n": 1}
    md = (tmp_path / "results.md").read_text()
    assert task in md and "Average" in md


def test_fixed_seed_gives_identical_metrics(minilm, shared_data, tmp_path):
    args = ["--tasks", "gad", "--seeds", "1", "--epochs", "2", "--max-train", "24", "--max-eval", "16", "--max-length", "32"]
    runs = []
    for name in ("a", "b"):
        assert evaluate(minilm, tmp_path / name, *args, data_root=shared_data) == 0
        runs.append(json.loads((tmp_path / name / "results.json").read_text())["runs"][0])
    assert runs[0]["metrics"] == runs[1]["metrics"]
    assert runs[0]["validation"] == runs[1]["validation"]


def test_resume_after_interruption_and_refuse_other_config(minilm, shared_data, tmp_path, monkeypatch, capsys):
    args = ["--tasks", "chemprot", "--seeds", "2", "--epochs", "1", "--max-train", "16", "--max-eval", "16", "--max-length", "32"]
    real, calls = run_module.finetune, []

    def killed_on_second(*a, **k):  # the real fine-tuning, then a Ctrl-C as the second run starts
        calls.append(a[2])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(run_module, "finetune", killed_on_second)
    assert evaluate(minilm, tmp_path, *args, data_root=shared_data) == 130
    first = json.loads((tmp_path / "results.json").read_text())
    assert [r["seed"] for r in first["runs"]] == [0]

    calls.clear()
    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: (calls.append(a[2]), real(*a, **k))[1])
    assert evaluate(minilm, tmp_path, *args, data_root=shared_data) == 0
    assert calls == [1]  # only the unfinished seed ran
    final = json.loads((tmp_path / "results.json").read_text())
    assert [r["seed"] for r in final["runs"]] == [0, 1] and final["runs"][0] == first["runs"][0]
    assert final["summary"][str(minilm)]["chemprot"]["macro_f1"]["n"] == 2

    assert evaluate(minilm, tmp_path, *args, "--lr", "1e-4", data_root=shared_data) == 2
    assert "different config" in capsys.readouterr().err
    assert json.loads((tmp_path / "results.json").read_text()) == final


def test_unseen_iob_folder_and_tsv_task_specs(minilm, tmp_path):
    """Acceptance 3: a user's IOB2 folder and classification TSV run without code changes."""
    iob = tmp_path / "mydata" / "ner"
    iob.mkdir(parents=True)
    drugs = ["aspirin", "warfarin", "heparin", "insulin"]
    for d in range(8):
        lines = []
        for k in range(4):
            drug = drugs[(d + k) % 4]
            lines += [f"patient\tO\nreceived\tO\n{drug}\tB-Drug\ntoday\tO\n.\tO\n"]
        (iob / f"doc{d}.iob").write_text("\n".join(lines))
    rows = ["id\tbody\tcategory"] + [f"{i}\t{'fever and cough' if i % 2 else 'broken arm'}\t{'infection' if i % 2 else 'trauma'}" for i in range(40)]
    (tmp_path / "mydata" / "cls.tsv").write_text("\r\n".join(rows) + "\r\n")
    (tmp_path / "ner.yaml").write_text(
        "name: my-ner\ntype: ner\nformat: iob\ndata: {all: ner}\nmax_length: 32\n"
        "training: {epochs: 1, batch_size: 8}\n"
    )
    (tmp_path / "cls.yaml").write_text(
        "name: my-cls\ntype: classification\nformat: tsv\ndata: {train: cls.tsv, test: cls.tsv}\n"
        "options: {text_column: body, label_column: category}\npooling: mean\nmax_length: 32\n"
        "training: {epochs: 1, batch_size: 8}\n"
    )
    rc = main(["eval", str(minilm), "--task-spec", str(tmp_path / "ner.yaml"), "--task-spec", str(tmp_path / "cls.yaml"),
               "--seeds", "1", "--data-root", str(tmp_path / "mydata"), "--out", str(tmp_path / "out")])
    assert rc == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["task"] for r in data["runs"]] == ["my-ner", "my-cls"]
    ner, cls = data["runs"]
    assert ner["budget"]["labels"] == 2 and cls["budget"]["labels"] == 2
    assert set(cls["metrics"]) >= {"accuracy", "micro_f1", "macro_f1", "weighted_f1"}


def test_user_errors_exit_2(minilm, tmp_path, capsys):
    assert main(["eval", str(minilm), "--tasks", "no-such-task", "--out", str(tmp_path)]) == 2
    assert "no task 'no-such-task'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntype: ner\nformat: iob\ndata: {train: a}\nmax_length: 4\n")
    assert main(["eval", str(minilm), "--task-spec", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "max_length" in err and "test" in err
