"""`detour eval` end to end on the real MiniLM: a smoke run of every shipped task, fixed-seed
determinism, resume after an interruption, task specs the project has never seen, SIGTERM / SIGINT
from outside, an unusable --out, and what `detour compare` reads back from real results."""

import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading

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
    assert evaluate(minilm, tmp_path, *args, data_root=shared_data) == 75  # RESUMABLE_EXIT
    err = capsys.readouterr().err
    assert "stopped by Ctrl-C while fine-tuning" in err and "seed 1; that run is dropped. 1 of 2 run(s) are finished" in err
    assert "Rerun the same command to resume" in err
    first = json.loads((tmp_path / "results.json").read_text())
    assert [r["seed"] for r in first["runs"]] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]  # no temp file

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
    """A user's IOB2 folder and classification TSV run without code changes."""
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


SMALL = ["--tasks", "gad", "--epochs", "1", "--max-eval", "8", "--max-length", "32"]


@pytest.fixture(scope="module")
def small_eval(minilm, shared_data, tmp_path_factory):
    """One finished evaluation (gad, 2 seeds, 16 train examples), for the tests that reread it."""
    out = tmp_path_factory.mktemp("small-eval")
    assert evaluate(minilm, out, *SMALL, "--seeds", "2", "--max-train", "16", data_root=shared_data) == 0
    return out


def test_rerun_with_every_run_cached_rewrites_results_md(small_eval, minilm, shared_data, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    shutil.copytree(small_eval, out)
    table = (out / "results.md").read_text()
    (out / "results.md").write_text("| a table from some earlier evaluation |\n")
    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: pytest.fail("a cached run was fine-tuned again"))
    assert evaluate(minilm, out, *SMALL, "--seeds", "2", "--max-train", "16", data_root=shared_data) == 0
    assert (out / "results.md").read_text() == table
    (out / "results.md").unlink()
    assert evaluate(minilm, out, *SMALL, "--seeds", "2", "--max-train", "16", data_root=shared_data) == 0
    assert (out / "results.md").read_text() == table


def test_runs_record_what_compare_checks(small_eval, minilm, shared_data, tmp_path, capsys):
    from detour.eval.significance import RECORDED, run_settings

    (run,) = [r for r in json.loads((small_eval / "results.json").read_text())["runs"] if r["seed"] == 0]
    recorded = {k.split(".")[0] for k in run_settings(run)}
    assert recorded == set(RECORDED)
    assert run["spec"]["name"] == "gad" and "root" not in run["spec"] and len(run["data_sha256"]) == 64
    # the same evaluation twice: nothing differs and nothing is unchecked
    shutil.copy(small_eval / "results.json", tmp_path / "again.json")
    assert main(["compare", str(small_eval / "results.json"), str(tmp_path / "again.json"), "--resamples", "3"]) == 0
    err = capsys.readouterr().err
    assert "WARNING" not in err and "cannot check" not in err
    # the same model on fewer train examples: refused, naming the setting and both values
    assert evaluate(minilm, tmp_path / "b", *SMALL, "--seeds", "2", "--max-train", "8", data_root=shared_data) == 0
    capsys.readouterr()
    assert main(["compare", str(small_eval / "results.json"), str(tmp_path / "b" / "results.json"), "--resamples", "3"]) == 2
    err = capsys.readouterr().err
    assert "task gad: train_examples differs (A: 16, B: 8)" in err and "task gad: data_sha256 differs" in err
    assert "epochs differs" not in err and "spec." not in err


def test_out_that_is_a_file_or_unwritable_fails_before_training(minilm, shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: pytest.fail("fine-tuning started"))
    (tmp_path / "taken").write_text("a user's file\n")
    assert evaluate(minilm, tmp_path / "taken", *TINY, "--tasks", "gad", data_root=shared_data) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "taken").read_text() == "a user's file\n"
    assert evaluate(minilm, tmp_path / "taken" / "sub", *TINY, "--tasks", "gad", data_root=shared_data) == 2
    assert "cannot write there" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes through any mode bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert evaluate(minilm, locked, *TINY, "--tasks", "gad", data_root=shared_data) == 2
        assert "cannot write there" in capsys.readouterr().err


def _start_eval(minilm, shared_data, out, *args):
    """`detour eval` in its own process, and a queue of its stdout lines (None when it closes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "detour.cli", "eval", str(minilm), "--out", str(out), "--data-root", str(shared_data), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def _wait_for(proc, lines, text, timeout=300):
    seen = []
    while (line := lines.get(timeout=timeout)) is not None:
        seen.append(line)
        if text in line:
            return
    proc.wait(timeout=60)
    pytest.fail(f"eval ended (rc {proc.returncode}) before printing {text!r}: {seen} {proc.stderr.read()}")


def test_sigterm_during_fine_tuning_exits_75_keeping_finished_runs(minilm, shared_data, tmp_path):
    proc, lines = _start_eval(minilm, shared_data, tmp_path, *SMALL, "--seeds", "3", "--max-train", "16")
    try:
        _wait_for(proc, lines, "seed 0: macro_f1")  # seed 0 saved; seed 1 is being fine-tuned
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 75
    finally:
        proc.kill()
    err = proc.stderr.read()
    data = json.loads((tmp_path / "results.json").read_text())  # whole, and only finished runs
    seeds = [r["seed"] for r in data["runs"]]
    assert seeds in ([0], [0, 1])
    assert "stopped by SIGTERM while" in err and f"{len(seeds)} of 3 run(s) are finished" in err
    assert "Rerun the same command to resume" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]  # no temp file
    assert data["summary"][str(minilm)]["gad"]["macro_f1"]["n"] == len(seeds)


def test_sigint_before_any_run_finished_exits_75_leaving_no_results(minilm, shared_data, tmp_path):
    out = tmp_path / "eval"
    proc, lines = _start_eval(minilm, shared_data, out, *SMALL, "--seeds", "2", "--max-train", "16")
    try:
        _wait_for(proc, lines, "run(s) to do")  # from here the task is read, tokenized, fine-tuned
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 75
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert "stopped by SIGINT while" in err and "0 of 2 run(s) are finished; nothing was written" in err and "Traceback" not in err
    assert list(out.iterdir()) == []  # no results.json, no temp file


def test_a_signal_while_results_are_written_stops_only_after_the_write(tmp_path):
    from detour.eval.results import Results

    results = Results.open(tmp_path, {"models": ["m"], "tasks": ["t"], "seeds": [0]})
    stop = run_module._Stop()
    with pytest.raises(run_module.EvalStopped), stop.installed(), stop.writes():
        signal.raise_signal(signal.SIGTERM)  # a real SIGTERM, delivered in the middle of the write
        results.add({"model": "m", "task": "t", "seed": 0, "headline": "macro_f1", "metrics": {"macro_f1": 0.5}})
    assert [r["seed"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    assert signal.getsignal(signal.SIGTERM) != stop.handler  # the previous handler is back
