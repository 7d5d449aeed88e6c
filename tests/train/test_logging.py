"""What a run shows while it trains: log lines in a file, the bar on a terminal, trackers, curves, quiet exports."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from detour.cli import main as detour
from detour.config import load_recipe
from detour.errors import DetourError
from detour.train.loop import train
from detour.train.outdir import check_out_dir
from detour.runs import read_metrics
from detour.train.metrics import Progress, write_curves
from tests.train.conftest import RECIPES, TINY

LINE = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) step (?P<step>\d+) phase (?P<phase>\S+) "
                  r"tokens (?P<done>[\d,]+)/(?P<total>[\d,]+) loss (?P<loss>\S+) lr (?P<lr>\S+) "
                  r"tokens/s (?P<rate>\S+) elapsed (?P<elapsed>\d+:\d\d:\d\d) eta (?P<eta>\S+) run_eta (?P<run_eta>\S+)"
                  r"(?: event (?P<event>start|end)\b.*)?$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Steps of about 0.1 s on one loaded core: 50 CLM steps then 10 MLM steps, no checkpoints or exports
# along the way, so the gaps between lines are the logging interval and not a slow save.
FAST = ["data.seq_len=32", "batch.global_sequences=2", "batch.micro_batch=2", "phases.0.tokens=3200",
        "phases.1.tokens=640", "checkpoint.every_tokens=null"]


def _train_cmd(synthetic_data, out: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "detour.cli", "train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out)]
    for s in [f"data.sources=[{synthetic_data}]", *TINY, *FAST]:
        args += ["--set", s]
    return args + list(extra)


def test_lines_when_stdout_is_a_file_arrive_while_training_at_the_interval(synthetic_data, tmp_path):
    out, log = tmp_path / "run", tmp_path / "train.log"
    arrived: list[tuple[float, str, bool]] = []  # (when read, line, process still running)
    with open(log, "w") as stdout:
        # as under SLURM or nohup: stdout a file, block-buffered unless detour flushes
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        proc = subprocess.Popen(_train_cmd(synthetic_data, out, "--set", "logging.every_seconds=0.5"),
                                stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
        seen = 0
        while True:
            running = proc.poll() is None
            lines = log.read_text().splitlines()
            now = time.monotonic()
            arrived += [(now, line, running) for line in lines[seen:]]
            seen = len(lines)
            if not running:
                break
            time.sleep(0.02)
        assert proc.returncode == 0, proc.stderr.read()
    records = {r["global_step"]: r for r in read_metrics(out / "metrics.jsonl")}
    progress = [(t, LINE.match(line), running) for t, line, running in arrived if " step " in line]
    assert progress and all(m for _, m, _ in progress), [line for _, line, _ in arrived]
    events = [(m["phase"], m["event"]) for _, m, _ in progress if m["event"]]
    assert events == [("clm", "start"), ("clm", "end"), ("decay", "start"), ("decay", "end")]
    # flushed as they happen: each line was in the file while the run still trained
    assert all(running for _, m, running in progress if m["phase"] == "clm")
    for _, m, _ in progress:
        if m["event"] == "start":
            continue
        record = records[int(m["step"])]
        assert int(m["done"].replace(",", "")) == record["tokens"]
        assert float(m["loss"]) == pytest.approx(record["loss"], abs=1e-4)
        assert float(m["lr"]) == pytest.approx(record["lr"], rel=1e-2)
        assert float(m["rate"].replace(",", "")) > 0 and re.fullmatch(r"\d+:\d\d:\d\d", m["eta"])
    clm = [(t, m) for t, m, _ in progress if m["phase"] == "clm"]
    slowest_step = max(64 / r["tokens_per_s"] for r in records.values())
    for (t0, _), (t1, m) in zip(clm, clm[1:]):
        if not m["event"]:  # steps of ~0.1 s: one line per step would come far sooner
            assert t1 - t0 >= 0.4, (t0, t1)  # never more often than every 0.5 s (less the 20 ms polling)
        assert t1 - t0 <= 0.5 + 3 * slowest_step + 1.0, (t0, t1)  # and at least that often, plus a step


def test_line_every_n_steps_and_always_at_phase_ends(tiny_recipe):
    recipe = tiny_recipe("logging.every_seconds=null", "logging.every_steps=2")
    phase = recipe.phases[1]  # 700 tokens: 3 steps of 256, 256 and 188
    stream = io.StringIO()
    with Progress(recipe, console=Console(file=stream, force_terminal=False)) as bar:
        bar.start_phase(phase, 0, step=6)
        for n, step in ((256, 7), (256, 8), (188, 9)):
            bar.advance(n, 5.0, lr=1e-3, step=step)
    lines = [LINE.match(line) for line in stream.getvalue().splitlines()]
    assert all(lines)
    assert [(m["step"], m["done"], m["event"]) for m in lines] == [
        ("6", "0", "start"), ("8", "512", None), ("9", "700", "end")]
    assert lines[0]["loss"] == lines[0]["lr"] == lines[0]["eta"] == "-" and lines[-1]["eta"] == "0:00:00"
    assert lines[-1]["run_eta"] == "0:00:00"  # the end of the last phase is the end of the run


def test_the_run_eta_counts_the_phases_still_to_come(tiny_recipe):
    recipe = tiny_recipe("logging.every_seconds=null", "logging.every_steps=1", "phases.0.tokens=80M",
                         "phases.1.tokens=240M")
    stream = io.StringIO()
    with Progress(recipe, console=Console(file=stream, force_terminal=False)) as bar:
        bar.start_phase(recipe.phases[0], 0, step=0)
        time.sleep(0.2)
        bar.advance(1000, 5.0, lr=1e-3, step=1)
    (line,) = [m for m in map(LINE.match, stream.getvalue().splitlines()) if m and not m["event"]]
    seconds = [sum(int(x) * 60 ** i for i, x in enumerate(reversed(m.split(":")))) for m in (line["eta"], line["run_eta"])]
    # 80M - 1000 tokens left in this phase, 320M - 1000 in the run: the run's ETA is about 4 times the phase's
    assert seconds[0] > 0 and seconds[1] == pytest.approx(4 * seconds[0], rel=1e-3)


@pytest.mark.parametrize("width", [80, 60])
def test_terminal_under_100_columns_shows_elapsed_and_eta_whole(tiny_recipe, width):
    recipe = tiny_recipe("phases.0.tokens=80M")
    stream = io.StringIO()
    console = Console(file=stream, width=width, force_terminal=True, color_system=None)
    with Progress(recipe, console=console) as bar:
        bar.start_phase(recipe.phases[0], 0, step=0)
        for step in range(1, 4):
            time.sleep(0.2)
            bar.advance(4096, 5.6391, lr=2e-4, step=step)
    last = ANSI.sub("", stream.getvalue()).split("\r")[-1]  # the final frame the live display drew
    assert "…" not in last and "━" not in last  # nothing cut short, and no bar to make room for
    flat = " ".join(last.split())
    assert re.search(r"clm 12\.3k/80M tok loss 5\.639 [\d,]+ tok/s elapsed 0:00:0\d eta \d+:\d\d:\d\d", flat), last
    assert " step " not in stream.getvalue()  # a terminal gets the display, not log lines


def test_wide_terminal_gets_the_bar(tiny_recipe):
    recipe = tiny_recipe()
    stream = io.StringIO()
    with Progress(recipe, console=Console(file=stream, width=120, force_terminal=True, color_system=None)) as bar:
        bar.start_phase(recipe.phases[0], 0, step=0)
        bar.advance(640, 9.5, lr=2e-3, step=1)
    last = ANSI.sub("", stream.getvalue()).split("\r")[-1]
    assert "━" in last and "clm (clm) tiny-modernbert" in last and "640/1.3k tok" in last
    assert re.search(r"elapsed 0:00:0\d  eta \d+:\d\d:\d\d", last) and "…" not in last


@pytest.fixture(scope="module")
def tensorboard_run(synthetic_data, tmp_path_factory):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (pip install "
                                              "'clm-detour[tensorboard]')")
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml",
                         [f"data.sources=[{synthetic_data}]", *TINY, "logging.report_to=[tensorboard]"])
    out = tmp_path_factory.mktemp("tb") / "run"
    train(recipe, out, progress=False)
    return out


def _scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _run_tokens(records: list[dict], recipe_json: Path) -> list[int]:
    phases = json.loads(recipe_json.read_text())["phases"]
    offsets = {p["name"]: sum(q["tokens"] for q in phases[:i]) for i, p in enumerate(phases)}
    return [offsets[r["phase"]] + r["tokens"] for r in records]


def test_tensorboard_gets_one_curve_per_quantity_across_phases_on_the_token_axis(tensorboard_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = _scalars(tensorboard_run / "tensorboard")
    records = read_metrics(tensorboard_run / "metrics.jsonl")
    names = ("loss", "lr", "grad_norm", "tokens_per_s")
    assert set(scalars) == set(names)  # one tag per quantity: the CLM -> MLM switch is inside one curve
    tokens = _run_tokens(records, tensorboard_run / "recipe.json")
    assert tokens == sorted(tokens) and len(set(tokens)) == len(records)
    for name in names:
        assert scalars[name] == pytest.approx({t: r[name] for t, r in zip(tokens, records)}, rel=1e-6)
    events = EventAccumulator(str(tensorboard_run / "tensorboard"))
    events.Reload()
    starts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors("phase/text_summary")]
    clm_end = max(t for t, r in zip(tokens, records) if r["phase"] == "clm")
    assert [s for s, _ in starts] == [tokens[0], min(t for t in tokens if t > clm_end)]
    assert starts[0][1].startswith("clm (clm) from 0 tokens") and starts[1][1].startswith(f"decay (mlm) from {clm_end:,}")


def test_a_branch_tensorboard_starts_with_its_parents_steps(tensorboard_run, tiny_recipe, tmp_path):
    child = tiny_recipe("logging.report_to=[tensorboard]", f"branch.run={tensorboard_run}",
                        "branch.after_phase=clm", "phases.1.tokens=512")
    train(child, tmp_path / "child", progress=False)
    parent, mine = _scalars(tensorboard_run / "tensorboard"), _scalars(tmp_path / "child" / "tensorboard")
    records = read_metrics(tmp_path / "child" / "metrics.jsonl")
    tokens = _run_tokens(records, tmp_path / "child" / "recipe.json")
    clm = {t for t, r in zip(tokens, records) if r["phase"] == "clm"}
    assert {t: v for t, v in mine["loss"].items() if t in clm} == {t: v for t, v in parent["loss"].items() if t in clm}
    decay = [(t, r) for t, r in zip(tokens, records) if r["phase"] == "decay"]
    assert {t: v for t, v in mine["loss"].items() if t not in clm} == pytest.approx({t: r["loss"] for t, r in decay},
                                                                                     rel=1e-6)
    assert len(decay) == 2


def test_curves_png_written_at_the_end(tensorboard_run, tmp_path):
    from matplotlib.image import imread

    png = tensorboard_run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = imread(png).shape[:2]
    assert (width, height) == (880, 495)
    assert not [p.name for p in tensorboard_run.iterdir() if p.name.startswith(".curves")]  # no temporary left
    assert write_curves(tmp_path / "none.jsonl", tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_a_resume_may_change_logging_and_older_runs_have_none(tensorboard_run, tiny_recipe, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(tensorboard_run / "checkpoints", run / "checkpoints")
    saved = json.loads((tensorboard_run / "recipe.json").read_text())
    (run / "recipe.json").write_text(json.dumps(saved))
    same = [f"data.sources=[{saved['data']['sources'][0]['path']}]"]
    check_out_dir(run, tiny_recipe(*same, "logging.every_seconds=5", "logging.report_to=[]"), resume=True)
    del saved["logging"]  # a run saved before the field existed
    (run / "recipe.json").write_text(json.dumps(saved))
    check_out_dir(run, tiny_recipe(*same, "logging.report_to=[tensorboard]"), resume=True)
    with pytest.raises(DetourError, match="seed"):
        check_out_dir(run, tiny_recipe(*same, "seed=3"), resume=True)


def _wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file: 32 KiB blocks of (crc, length, type) + data records."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, pending, rows = run_file.read_bytes(), 7, b"", []  # 7: the file header
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pending += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_writes_its_run_folder(tiny_recipe, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb package is not installed (pip install 'clm-detour[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside the test
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    out = tmp_path / "run"
    train(tiny_recipe("logging.report_to=[wandb]", "logging.wandb_project=detour-test"), out, progress=False)
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run_id = (out / "wandb" / "detour-run-id").read_text().strip()
    assert runs[0].name.endswith(run_id)
    history = {row["_step"]: row for row in _wandb_history(runs[0] / f"run-{run_id}.wandb")}
    records = read_metrics(out / "metrics.jsonl")
    assert sorted(history) == [r["global_step"] for r in records]
    for r, tokens in zip(records, _run_tokens(records, out / "recipe.json")):
        row = history[r["global_step"]]
        assert row["loss"] == pytest.approx(r["loss"]) and row["grad_norm"] == pytest.approx(r["grad_norm"])
        assert row["tokens"] == tokens and row["phase_index"] == (0 if r["phase"] == "clm" else 1)


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_missing_tracker_package_is_an_error_before_training(synthetic_data, tmp_path, monkeypatch, capsys,
                                                              tracker):
    monkeypatch.setitem(sys.modules, tracker, None)  # `import tracker` now fails, as when not installed
    out = tmp_path / "run"
    args = ["train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out), "--report-to", tracker]
    for s in [f"data.sources=[{synthetic_data}]", *TINY]:
        args += ["--set", s]
    assert detour(args) == 2
    err = capsys.readouterr().err
    assert f"pip install 'clm-detour[{tracker}]'" in err and f"--report-to {tracker}" in err
    assert not out.exists()


def test_report_to_option(synthetic_data, capsys):
    args = ["twins", str(RECIPES / "tiny-modernbert.yaml"), "--out", "unused", "--dry-run",
            "--report-to", "tensorboard,wandb"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY]:
        args += ["--set", s]
    assert detour(args) == 0
    out = capsys.readouterr().out
    assert out.count("report_to:\n  - tensorboard\n  - wandb") == 2  # both arms carry it
    with pytest.raises(SystemExit) as exc:
        detour(["train", "r.yaml", "--out", "x", "--report-to", "tensorbord"])
    assert exc.value.code == 2 and "expected tensorboard, wandb" in capsys.readouterr().err


def test_no_transformers_bars_in_a_pretrained_run_and_its_settings_restored(minilm, synthetic_data, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    recipe = load_recipe(RECIPES / "minilm-biomed.yaml", [
        f"data.sources=[{synthetic_data}]", "data.seq_len=64", "batch.global_sequences=4", "batch.micro_batch=4",
        "phases.0.tokens=512", "phases.0.lr.warmup_tokens=256", "phases.1.tokens=256", "checkpoint.every_tokens=null"])
    hf_logging.enable_progress_bar()
    hf_logging.set_verbosity_warning()
    try:
        train(recipe, tmp_path / "run", progress=False)
        assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == hf_logging.WARNING
    finally:
        hf_logging.set_verbosity_warning()
    err = capfd.readouterr().err
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert "Writing model shards" not in err and "LOAD REPORT" not in err.upper()


def test_device_flag_sets_the_recipes_device_for_every_arm(synthetic_data, capsys):
    args = ["twins", str(RECIPES / "tiny-modernbert.yaml"), "--out", "unused", "--dry-run", "--device", "cpu"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY]:
        args += ["--set", s]
    assert detour(args) == 0
    assert capsys.readouterr().out.count("device: cpu") == 2  # both arms carry it
    with pytest.raises(SystemExit) as exc:
        detour(["train", "r.yaml", "--out", "x", "--device", "tpu"])
    assert exc.value.code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err

