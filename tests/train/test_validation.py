"""Held-out validation while training: fixed sequences and masks, every arm, resume, branch, 1 and 2 processes.

    OMP_NUM_THREADS=1 python -m pytest -q tests/train/test_validation.py

The corpus is prepared with `--validation 0.1` (72 training documents, 8 held out); the recipe is the
tiny one shrunk as in the other engine tests.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from detour.cli import main as detour
from detour.config import baseline_of, load_recipe, recipe_to_dict
from detour.runs import read_metrics, read_records
from detour.train.distributed import DataParallelism
from detour.train.setup import build_model, build_optimizer
from detour.train.trackers import scalars
from detour.train.twins import check_failures, compare_arms, describe_checks
from detour.train.validation import Validation
from detour.train.world import World
from tests.train.conftest import RECIPES, TINY

REPO = Path(__file__).resolve().parents[2]
RECIPE = RECIPES / "tiny-modernbert.yaml"


@pytest.fixture(scope="module")
def held_out_data(tmp_path_factory, minilm) -> Path:
    out = tmp_path_factory.mktemp("data") / "synthetic"
    assert detour(["prepare", "synthetic:clinical?docs=80&seed=0", "--tokenizer", str(minilm), "--out", str(out),
                   "--workers", "1", "--validation", "0.1"]) == 0
    return out


def _sets(data: Path, *extra: str) -> list[str]:
    return [f"data.sources=[{data}]", *TINY, "validation.sequences=8", *extra]


def _args(verb: str, data: Path, out: Path, *extra: str, sets=()) -> list[str]:
    args = [verb, str(RECIPE), "--out", str(out), *extra]
    for s in _sets(data, *sets):
        args += ["--set", s]
    return args


def _held_out(run: Path) -> list[dict]:
    return [r for r in read_records(run / "metrics.jsonl") if r.get("kind") == "validation"]


def test_held_out_masks_are_the_same_at_every_point_and_in_both_arms(held_out_data):
    recipe = load_recipe(RECIPE, _sets(held_out_data))
    cpu = torch.device("cpu")
    torch.manual_seed(recipe.seed)
    model, tokenizer = build_model(recipe, cpu)
    parallel = DataParallelism(model, build_optimizer(model, recipe.optimizer), recipe, World(), cpu)
    mine = Validation(recipe, World(), tokenizer.pad_token_id, cpu)
    twins = Validation(baseline_of(recipe), World(), tokenizer.pad_token_id, cpu)
    before = mine.evaluate(parallel, "clm")
    assert model.training  # back to training mode
    with torch.no_grad():  # what training does between two points: other weights
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    after, twin = mine.evaluate(parallel, "mlm"), twins.evaluate(parallel, "mlm")
    assert before["validation_hash"] == after["validation_hash"] == twin["validation_hash"]
    assert before["masked_tokens"] == after["masked_tokens"] and before["sequences"] == 8
    assert before["mlm_loss"] != after["mlm_loss"] == twin["mlm_loss"]  # the weights moved, the yardstick did not
    assert before["clm_loss"] > 0 and before["clm_perplexity"] == pytest.approx(math.exp(before["clm_loss"]))
    assert after["clm_loss"] is None and after["clm_perplexity"] is None  # no CLM loss in an MLM phase
    # the hash sees the masks: another mask_seed masks other positions of the same tokens
    other = Validation(load_recipe(RECIPE, _sets(held_out_data, "validation.mask_seed=1")), World(),
                       tokenizer.pad_token_id, cpu).evaluate(parallel, "mlm")
    assert other["validation_hash"] != after["validation_hash"]
    # a split named in validation.source is the same yardstick as the default one
    named = Validation(load_recipe(RECIPE, _sets(held_out_data, f"validation.source={held_out_data / 'validation'}")),
                       World(), tokenizer.pad_token_id, cpu).evaluate(parallel, "mlm")
    assert named == after


def test_a_point_is_a_line_above_the_bar_on_a_terminal(held_out_data):
    import io

    from rich.console import Console

    from detour.train.metrics import Progress

    recipe = load_recipe(RECIPE, _sets(held_out_data))
    stream = io.StringIO()
    with Progress(recipe, console=Console(file=stream, width=120, force_terminal=True, color_system=None)) as bar:
        bar.start_phase(recipe.phases[0], 0, step=0)
        bar.note("step 0 phase clm validation mlm_loss 10.3415 mlm_accuracy 0.0000 run_tokens 0")
    assert "step 0 phase clm validation mlm_loss 10.3415" in stream.getvalue()


def test_a_recipe_without_validation_is_unchanged_and_one_without_a_split_stops_before_training(
        held_out_data, synthetic_data, tmp_path, capsys):
    assert "validation" not in recipe_to_dict(load_recipe(RECIPE, [f"data.sources=[{synthetic_data}]"]))
    assert recipe_to_dict(load_recipe(RECIPE, _sets(held_out_data)))["validation"]["mask_seed"] == 0
    out = tmp_path / "run"
    assert detour(_args("train", synthetic_data, out, "--no-progress", sets=["validation.mask_rate=0.15"])) != 0
    err = capsys.readouterr().err
    assert "validation: data.sources.0" in err and "detour prepare" in err and "--validation" in err
    assert not (out / "recipe.json").exists() and not (out / "metrics.jsonl").exists()
    assert detour(_args("train", held_out_data, out, "--dry-run", sets=["validation.sequences=500"])) != 0
    assert "validation.sequences: 500 sequences" in capsys.readouterr().err
    assert detour(_args("train", held_out_data, out, "--dry-run", sets=["validation.mask_rate=1.5"])) != 0
    assert "validation.mask_rate" in capsys.readouterr().err
    assert detour(_args("train", held_out_data, out, "--dry-run",
                        sets=[f"validation.source={held_out_data}"])) != 0
    assert "which the run trains on" in capsys.readouterr().err


def test_twins_score_the_same_held_out_points_and_say_so(held_out_data, tmp_path, capsys):
    out = tmp_path / "twins"
    rc = detour(_args("twins", held_out_data, out, "--no-progress", "--baseline-arm", "maskseed",
                      "validation.mask_seed=1", sets=["validation.every_tokens=512"]))
    printed = capsys.readouterr()
    assert rc != 0  # the arm with other masks fails the check, by name
    assert "same validation set and masks: NO" in printed.out and "maskseed: NO: validation hashes" in printed.err
    report = json.loads((out / "twins.json").read_text())
    assert report["validation_vs_detour"]["baseline"] == "same validation set and masks"
    assert report["validation_vs_detour"]["maskseed"].startswith("NO")
    points = {arm: _held_out(out / arm) for arm in ("detour", "baseline", "maskseed")}
    # the run's start, each crossing of 512 run tokens, each phase end: the same points in every arm
    where = {arm: [(r["global_step"], r["run_tokens"], r["tokens"]) for r in rs] for arm, rs in points.items()}
    assert where["detour"] == where["baseline"] == where["maskseed"] == [
        (0, 0, 0), (2, 512, 512), (4, 1024, 1024), (6, 1300, 1300), (7, 1556, 256), (9, 2000, 700)]
    assert len({r["validation_hash"] for arm in ("detour", "baseline") for r in points[arm]}) == 1
    assert points["detour"][0]["mlm_loss"] == points["baseline"][0]["mlm_loss"]  # step 0: the same model
    assert [r["objective"] for r in points["detour"]] == ["clm"] * 4 + ["mlm"] * 2
    assert all(r["clm_loss"] is not None for r in points["detour"][:4])
    assert all(r["clm_loss"] is None for r in points["baseline"])
    # summary.json: the values at each phase end; twins.json of the two main arms: yes
    summaries = {arm: json.loads((out / arm / "summary.json").read_text()) for arm in ("detour", "baseline")}
    assert summaries["detour"]["phases"]["decay"]["validation"]["mlm_loss"] == points["detour"][-1]["mlm_loss"]
    assert compare_arms(summaries)["checks"]["validation_equal"] is True
    assert report["end_of_decay_validation_mlm_loss"]["detour"] == points["detour"][-1]["mlm_loss"]
    # readers of the training steps skip the validation records
    assert all("kind" not in r and "loss" in r for r in read_metrics(out / "detour" / "metrics.jsonl"))
    assert set(scalars(points["detour"][1])) == {"validation/mlm_loss", "validation/mlm_accuracy",
                                                 "validation/clm_loss", "validation/clm_perplexity"}
    assert (out / "detour" / "curves.png").is_file()


def test_an_arm_without_validation_is_not_compared_and_fails_no_check():
    def summary(validation_hash):
        phase = {"objective": "mlm", "mask_rate": 0.15, "tokens": 10, "budget": 10, "stream_hash": "s",
                 "mask_hash": "m", "final_loss": 1.0}
        if validation_hash:
            phase["validation"] = {"validation_hash": validation_hash, "mlm_loss": 2.0}
        return {"seed": 17, "phases": {"decay": phase}}

    report = compare_arms({"detour": summary("a"), "baseline": summary(None)})
    assert report["checks"]["validation_equal"] is None
    assert report["validation_vs_detour"]["baseline"].startswith("not compared")
    assert "same validation set and masks: not compared" in describe_checks(report["checks"])
    assert check_failures(report, "twins.json") is None
    assert compare_arms({"detour": summary("a"), "baseline": summary("b")})["checks"]["validation_equal"] is False
    assert "validation_equal" not in compare_arms({"detour": summary(None), "baseline": summary(None)})["checks"]


def test_tensorboard_gets_the_held_out_values_against_the_runs_tokens(held_out_data, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (pip install "
                                              "'clm-detour[tensorboard]')")
    from tests.train.test_logging import _scalars

    out = tmp_path / "run"
    assert detour(_args("train", held_out_data, out, "--no-progress",
                        sets=["logging.report_to=[tensorboard]", "validation.every_tokens=1k"])) == 0
    points, scalars_ = _held_out(out), _scalars(out / "tensorboard")
    assert scalars_["validation/mlm_loss"] == pytest.approx({r["run_tokens"]: r["mlm_loss"] for r in points})
    assert scalars_["validation/clm_loss"] == pytest.approx(
        {r["run_tokens"]: r["clm_loss"] for r in points if r["clm_loss"] is not None})
    assert len(scalars_["loss"]) == len(read_metrics(out / "metrics.jsonl"))  # the steps' curve as before


# -- resume and branch ------------------------------------------------------------------------------

RESUME = ["phases.0.tokens=2600", "validation.every_tokens=768"]


def _cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "detour.cli", *_args("train", data, out, *extra, sets=RESUME)]


@pytest.fixture(scope="module")
def reference(held_out_data, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ref") / "run"
    done = subprocess.run(_cmd(held_out_data, out), check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True)
    return out, done.stdout


def test_the_log_has_a_line_at_each_point(reference):
    run, stdout = reference
    lines = [line for line in stdout.splitlines() if " validation mlm_loss " in line]
    assert len(lines) == len(_held_out(run)) and "clm_perplexity" in lines[0] and "run_tokens 0" in lines[0]


def test_killed_and_resumed_gives_the_held_out_records_of_an_uninterrupted_run(held_out_data, reference, tmp_path):
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"

    def past_a_checkpoint() -> bool:  # a point after the first checkpoint is written: the kill loses it
        try:
            return any(r.get("kind") == "validation" and r["global_step"] == 3 for r in read_records(metrics))
        except (OSError, ValueError):
            return False

    proc = subprocess.Popen(_cmd(held_out_data, out, "--no-progress"), env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while proc.poll() is None and not past_a_checkpoint() and time.time() < deadline:
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (out / "summary.json").exists()
    done = subprocess.run(_cmd(held_out_data, out, "--no-progress", "--resume"), capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    expected, got = _held_out(reference[0]), _held_out(out)
    assert [r["global_step"] for r in got] == [0, 3, 6, 9, 11, 13, 14]  # each point once: none repeated, none skipped
    assert got == expected  # bit for bit, hashes included


def test_a_branch_starts_with_its_parents_points_and_scores_its_own(held_out_data, reference, tmp_path):
    parent = reference[0]
    out = tmp_path / "branch"
    assert detour(_args("train", held_out_data, out, "--no-progress", "--from", str(parent), "--after-phase", "clm",
                        sets=[*RESUME, "phases.1.tokens=512"])) == 0
    mine, theirs = _held_out(out), _held_out(parent)
    carried = [r for r in theirs if r["global_step"] <= 11]
    assert mine[:len(carried)] == carried and len(mine) == len(carried) + 1
    assert mine[-1]["phase"] == "decay" and mine[-1]["tokens"] == 512
    assert mine[-1]["validation_hash"] == theirs[-1]["validation_hash"]
    summary = json.loads((out / "summary.json").read_text())
    # the stream check reads the parent's training steps, never its validation records
    assert summary["branch"]["stream_continues_parent"]["decay"]["equal"] is True


# -- 1 and 2 processes ------------------------------------------------------------------------------

TWO_PROCESSES = ["validation.every_tokens=512", "batch.micro_batch=1"]


@pytest.mark.slow
def test_two_processes_give_the_held_out_losses_of_one(held_out_data, tmp_path):
    single = tmp_path / "single"
    assert detour(_args("train", held_out_data, single, "--no-progress", sets=["validation.every_tokens=512"])) == 0
    plan = [_args("train", held_out_data, tmp_path / strategy, "--no-progress",
                  sets=[*TWO_PROCESSES, f"distributed.strategy={strategy}"]) for strategy in ("ddp", "fsdp")]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(Path(__file__)), str(tmp_path / "plan.json")], capture_output=True, text=True,
                          timeout=500, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    expected = _held_out(single)
    for strategy in ("ddp", "fsdp"):
        got = _held_out(tmp_path / strategy)
        assert [(r["global_step"], r["validation_hash"], r["masked_tokens"]) for r in got] == \
               [(r["global_step"], r["validation_hash"], r["masked_tokens"]) for r in expected], strategy
        for a, b in zip(expected, got):
            for key in ("mlm_loss", "mlm_accuracy", "clm_loss"):
                assert (a[key] is None) == (b[key] is None)
                if a[key] is not None:
                    assert b[key] == pytest.approx(a[key], abs=1e-5), (strategy, a["global_step"], key)


if __name__ == "__main__":  # torchrun ... test_validation.py PLAN: each run of the plan, in one process group
    plan = json.loads(Path(sys.argv[1]).read_text())
    for args in plan:
        if detour(args) != 0:
            sys.exit(1)
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
