"""A study that pretrains its own base encoder, at two model sizes, and compares them.

    python -m pytest -q tests/study/test_sizes.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from detour.cli import main
from detour.model.load import weights_hash
from detour.study.spec import load_study

REPO = Path(__file__).resolve().parents[2]
SIZES = {"3x32": (3, 32, 48, 2), "3x48": (3, 48, 64, 2)}  # layers, hidden, intermediate, heads


def _base_recipe(tmp: Path) -> Path:
    recipe = {
        "name": "tiny-scratch-base",
        "model": {"config": {"model_type": "modernbert", "num_hidden_layers": 3, "hidden_size": 32,
                             "intermediate_size": 48, "num_attention_heads": 2, "max_position_embeddings": 256,
                             "global_attn_every_n_layers": 3, "local_attention": 16},
                  "tokenizer": "minilm-l6"},
        "data": {"sources": ["unused"], "seq_len": 64, "shuffle_seed": 42},
        "optimizer": {"lr": 2.0e-3, "weight_decay": 1.0e-5},
        "batch": {"global_sequences": 8, "micro_batch": 8},
        "seed": 5,
        "phases": [{"name": "mlm", "objective": "mlm", "mask_rate": 0.3, "tokens": "2k",
                    "lr": {"shape": "constant", "warmup_tokens": 512}},
                   {"name": "anneal", "objective": "mlm", "mask_rate": 0.3, "tokens": "1k",
                    "lr": {"shape": "1-sqrt", "final_lr_fraction": 0.1}}],
        "checkpoint": {"every_tokens": "4k", "keep_last": 1},
        "validation": {"sequences": 4, "every_tokens": "1k"},
    }
    path = tmp / "base.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _study(tmp: Path, **changes) -> Path:
    """studies/tiny.yaml with a base pretrained on its own synthetic corpus, at two tiny sizes."""
    spec = yaml.safe_load((REPO / "studies" / "tiny.yaml").read_text())
    spec["name"] = "tiny-sizes"
    spec["prepare"]["general"] = {"sources": ["synthetic:clinical?docs=60&seed=7"], "tokenizer": "minilm-l6",
                                  "validation": 8}
    spec["base"] = {"recipe": str(_base_recipe(tmp)), "data": ["general"]}
    spec["sizes"] = {name: {"set": [f"model.config.num_hidden_layers={n}", f"model.config.hidden_size={h}",
                                    f"model.config.intermediate_size={i}", f"model.config.num_attention_heads={a}"]}
                     for name, (n, h, i, a) in SIZES.items()}
    spec["train"]["recipe"] = str(REPO / "recipes" / "tiny-modernbert.yaml")
    spec["train"]["set"] += ["phases.0.tokens=2k", "phases.1.tokens=1k", "validation.every_tokens=1k"]
    spec["arms"] = {"baseline-seed2": spec["arms"]["baseline-seed2"]}
    spec["eval"] = {"synthetic_ner": {"train": 24, "validation": 12, "test": 12}, "seeds": 2, "epochs": 1,
                    "max_length": 32, "arms": ["detour", "baseline"]}
    spec["analyses"] = {"cka": {"noise_floor": "baseline-seed2", "options": {"n": 12, "seeds": 1, "max_length": 32}}}
    spec["report"] = False  # each size's own report is the ordinary study's, tested there; the comparison is here
    spec.update(changes)
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session")  # kept across the other files a worker runs in between
def capacity(tmp_path_factory, minilm):
    tmp = tmp_path_factory.mktemp("sizes")
    study, out = _study(tmp), tmp / "out"
    # --jobs 2: the two sizes at once, a driver each on half the cores
    assert main(["study", str(study), "--out", str(out), "--jobs", "2"]) == 0
    return out


def test_dry_run_shows_each_size_with_its_base_and_arms(tmp_path, capsys, minilm):
    assert main(["study", str(_study(tmp_path)), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    for size in SIZES:
        section = text.split(f"== size {size}")[1].split("== size")[0]
        assert "to run   base " in section and "after prepare:general" in section
        for arm in ("detour", "baseline", "baseline-seed2"):
            assert f"train:{arm} " in section and "base" in section.split(f"train:{arm} ")[1].splitlines()[0]
        assert "tokens" in section.split("to run   base ")[1].splitlines()[0]  # an estimate
    assert "capacity comparison" in text
    assert "at once" not in text  # one step at a time: the sizes one after another, as always
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    assert main(["study", str(_study(tmp_path)), "--out", str(tmp_path / "out"), "--dry-run", "--jobs", "2"]) == 0
    assert "the sizes run at once, a driver each (3x32 with --jobs 1, 3x48 with --jobs 1)" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("executor, jobs, expected", [
    ("local", 8, {"a": 2, "b": 3, "c": 3}),  # all slots shared out, none idle
    ("local", 2, {"a": 1, "b": 1}),  # c waits for the slot of the first size to finish
    ("local", 3, {"a": 1, "b": 1, "c": 1}),
    ("slurm", None, {"a": None, "b": None, "c": None}),  # the cluster queues every size's jobs
    ("slurm", 4, {"a": 1, "b": 1, "c": 2}),
])
def test_the_jobs_slots_are_shared_out_between_the_sizes_drivers(executor, jobs, expected):
    from detour.study.executors import Options
    from detour.study.sizes_at_once import at_once, shares

    options = Options(executor=executor, jobs=jobs)
    assert shares(options, ["a", "b", "c"]) == expected
    assert at_once(options, ["a", "b", "c"]) and not at_once(options, ["a"])
    assert not at_once(Options(jobs=1), ["a", "b"]) and not at_once(Options(), ["a", "b"])


def test_with_jobs_the_sizes_run_at_once_each_on_its_share_of_the_cores(capacity):
    import os

    from detour.study.executors import slices

    events = {}
    for size in SIZES:
        lines = (capacity / "sizes" / size / ".study" / "log.jsonl").read_text().splitlines()
        events[size] = {(e["step"], e["event"]): e["time"] for e in map(json.loads, lines)}
    a, b = (events[size] for size in SIZES)
    # each size's base started before the other's had finished: side by side, not one size after the other
    assert a["base", "start"] <= b["base", "done"] and b["base", "start"] <= a["base", "done"], events
    cores = len(slices(sorted(os.sched_getaffinity(0)), 2)[0])
    for size in SIZES:
        sessions = json.loads((capacity / "sizes" / size / "base" / "summary.json").read_text())["sessions"]
        assert [s["threads"] for s in sessions] == [cores]  # its driver's half of the cores, not all of them


def test_each_base_is_a_stock_masked_lm_pretrained_from_scratch(capacity):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    for size, (layers, hidden, _, _) in SIZES.items():
        folder = capacity / "sizes" / size / "base" / "model"
        model = AutoModelForMaskedLM.from_pretrained(folder)
        assert (model.config.num_hidden_layers, model.config.hidden_size) == (layers, hidden)
        fill = pipeline("fill-mask", model=model, tokenizer=AutoTokenizer.from_pretrained(folder))
        guesses = fill(f"the patient was {fill.tokenizer.mask_token} to the hospital.")
        assert len(guesses) == 5 and all(g["token_str"] for g in guesses)
        card = (folder / "README.md").read_text()
        assert "MLM pretraining from scratch" in card and "pretraining-from-scratch" in card
        assert "continued" not in card.split("---")[1]  # no "continued-pretraining" tag: there is no base
        # how many tokens, of what: the base's two phases, 2k + 1k, on the study's `general` corpus
        assert "Pretrained from scratch on 3,000 tokens of synthetic-clinical-en" in card, card


def test_the_arms_of_each_size_start_from_that_sizes_base(capacity):
    hashes = {}
    for size in SIZES:
        root = capacity / "sizes" / size
        hashes[size] = weights_hash(str(root / "base" / "model"))
        state = json.loads((root / ".study" / "state.json").read_text())
        assert state["steps"]["base"]["output_hash"] == hashes[size]
        for arm in ("detour", "baseline", "baseline-seed2"):
            summary = json.loads((root / "arms" / arm / "summary.json").read_text())
            assert summary["start"]["weights_hash"] == hashes[size], (size, arm)
        twins = json.loads((root / "twins.json").read_text())
        assert twins["checks"]["start_weights_equal"] is True
        assert twins["checks"]["stream_hashes_equal"] is True and twins["checks"]["mlm_masks_equal"] is True
    assert len(set(hashes.values())) == len(SIZES)  # each size its own base


def test_each_corpus_the_sizes_share_is_tokenized_once_and_linked_into_the_other_size(capacity):
    folders = [capacity / "sizes" / size for size in SIZES]
    events = {f: [json.loads(line) for line in (f / ".study" / "log.jsonl").read_text().splitlines()] for f in folders}
    states = {f: json.loads((f / ".study" / "state.json").read_text())["steps"] for f in folders}
    for name in ("corpus", "general"):
        # the sizes ran at once: either driver may have claimed a corpus, and the other linked it
        linked = {f: [e.get("linked_from") for e in events[f] if e["step"] == f"prepare:{name}" and e["event"] == "start"]
                  for f in folders}
        makers = [f for f in folders if linked[f] == [None]]
        assert len(makers) == 1, linked
        maker, other = makers[0], next(f for f in folders if f != makers[0])
        assert linked[other] == [str((maker / "data" / name).resolve())], linked
        assert states[other][f"prepare:{name}"]["output_hash"] == states[maker][f"prepare:{name}"]["output_hash"]
        assert states[other][f"prepare:{name}"]["key"] == states[maker][f"prepare:{name}"]["key"]
        theirs = {p.relative_to(maker): p.stat().st_ino for p in (maker / "data" / name).rglob("*") if p.is_file()}
        mine = {p.relative_to(other): p.stat().st_ino for p in (other / "data" / name).rglob("*") if p.is_file()}
        assert mine == theirs  # the same files: tokenized and stored once
        assert not (other / ".study" / "logs" / f"prepare-{name}.log").exists()  # no prepare process ran there


def test_a_prepare_another_size_finished_under_another_key_is_not_linked(tmp_path):
    from detour.study.graph import Step
    from detour.study.hashes import ContentHashes
    from detour.study.sizes import link_prepared_elsewhere

    other = tmp_path / "sizes" / "a"
    (other / "data" / "corpus").mkdir(parents=True)
    manifest = other / "data" / "corpus" / "manifest.json"
    manifest.write_text(json.dumps({"format": "detour-prepared/1", "sources": []}))
    (other / ".study").mkdir()
    record = {"key": "k1", "output_hash": ContentHashes(None).of(manifest)}
    (other / ".study" / "state.json").write_text(json.dumps({"steps": {"prepare:corpus": record}}))
    mine = tmp_path / "sizes" / "b"
    step = Step("prepare:corpus", "prepare", argv=["prepare"], hash_of=mine / "data" / "corpus" / "manifest.json")
    assert link_prepared_elsewhere(step, "k2", [other]) is None  # another key: other sources or options
    manifest.write_text(json.dumps({"format": "detour-prepared/1", "sources": [], "rewritten": True}))
    assert link_prepared_elsewhere(step, "k1", [other]) is None  # its corpus is no longer the one recorded
    assert not mine.exists()
    manifest.write_text(json.dumps({"format": "detour-prepared/1", "sources": []}))
    assert link_prepared_elsewhere(step, "k1", [tmp_path / "sizes" / "c", other]) == other / "data" / "corpus"
    assert (mine / "data" / "corpus" / "manifest.json").read_text() == manifest.read_text()


def test_the_capacity_report_puts_the_sizes_side_by_side(capacity):
    data = json.loads((capacity / "capacity.json").read_text())
    rows = {r["size"]: r for r in data["sizes"]}
    assert list(rows) == list(SIZES)  # smallest first
    assert rows["3x32"]["non_embedding_parameters"] < rows["3x48"]["non_embedding_parameters"]
    for row in rows.values():
        assert row["base_mlm_loss"] is not None and len(row["base_curve"]) >= 3
        assert "base_slope" in row
        assert row["detour_mlm_loss"] is not None and row["twin_mlm_loss"] is not None
        assert row["delta"] is not None and row["p_value"] is not None and row["ci"] is not None
        assert set(row["cka_r"]) == {"low", "mid", "late"}
    md = (capacity / "report.md").read_text()
    assert "| size | layers x hidden |" in md and "capacity.png" in md
    assert "base loss change per 1M tokens" in md
    assert (capacity / "report-figures" / "capacity.png").is_file()
    assert "SYNTHETIC" in md
    # `detour report` rewrites the same comparison
    before = md
    assert main(["report", str(capacity)]) == 0
    assert (capacity / "report.md").read_text() == before


def _validation(folder: Path) -> list[dict]:
    return [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "validation"]


def test_each_cell_of_the_capacity_table_is_that_sizes_own_figure(capacity):
    # recomputed here from each size's own files, as a reader of the table would check it
    from transformers import AutoModelForMaskedLM

    from detour.eval.paired import distinct_resamples
    from detour.eval.significance import compare
    from detour.report.tables import RESAMPLES

    rows = {r["size"]: r for r in json.loads((capacity / "capacity.json").read_text())["sizes"]}
    for size in SIZES:
        root, row = capacity / "sizes" / size, rows[size]
        model = AutoModelForMaskedLM.from_pretrained(root / "base" / "model")
        total = sum(p.numel() for p in model.parameters())
        assert row["parameters"] == total
        assert row["non_embedding_parameters"] == total - model.config.vocab_size * model.config.hidden_size
        base = _validation(root / "base")
        assert row["base_curve"] == [[r["run_tokens"], r["mlm_loss"]] for r in base]
        assert row["base_mlm_loss"] == base[-1]["mlm_loss"] and row["base_tokens"] == base[-1]["run_tokens"]
        # held-out MLM loss at the end of the decay: the detour's and the twin's, each its own
        assert row["detour_mlm_loss"] == _validation(root / "arms" / "detour")[-1]["mlm_loss"]
        assert row["twin_mlm_loss"] == _validation(root / "arms" / "baseline")[-1]["mlm_loss"]
        assert row["detour_mlm_loss"] != row["twin_mlm_loss"]
        # the delta, its interval and p: `detour compare` of the detour against the twin, with the
        # report's bootstrap (no more resamples than this small design can tell apart)
        files = sorted((root / "eval").glob("*/results.json"))
        seeds = [len({r["seed"] for r in json.loads(f.read_text())["runs"]}) for f in files]
        result = compare(files, a="detour/model", b="baseline/model", allow=True,
                         resamples=min(RESAMPLES, distinct_resamples(seeds)))
        assert (row["delta"], *row["ci"], row["p_value"]) == pytest.approx(
            (result.delta, result.ci_low, result.ci_high, result.p_value))
        # r per group: the group's mean divergence over its mean seed-noise divergence (3 layers: one each)
        cka = {r["layer"]: r for r in json.loads((root / "analysis" / "cka" / "cka.json").read_text())["layers"]}
        for group, layer in (("low", 0), ("mid", 1), ("late", 2)):
            assert row["cka_r"][group] == pytest.approx(cka[layer]["divergence"] / cka[layer]["noise_divergence"])
            assert row["cka_divergence"][group] == pytest.approx(cka[layer]["divergence"])


def test_the_freeze_columns_take_each_freeze_arm_against_the_twin(capacity, monkeypatch):
    # the fixture has no freeze arm: its significance rows are given here, the rest is the size's own
    from detour.report import capacity as capacity_report
    from detour.report import tables
    from detour.report.tables import Significance

    def rows(s, table):
        def sig(arm, against, delta):
            return Significance(arm=arm, against=against, delta=delta, ci=(delta - 0.01, delta + 0.01), p_value=0.5,
                                tasks=["t"], seeds={"t": 2})
        return [sig("detour", "baseline", 0.03), sig("freeze-low-clm", "baseline", -0.02),
                sig("freeze-mid-clm", "baseline", 0.01), sig("freeze-low-clm", "detour", -0.05)]

    monkeypatch.setattr(tables, "significance_rows", rows)
    row = capacity_report.size_row("3x32", capacity / "sizes" / "3x32")
    assert row.delta == 0.03
    assert {k: (v["arm"], v["delta"]) for k, v in row.freeze.items()} == {
        "freeze_low": ("freeze-low-clm", -0.02), "freeze_mid": ("freeze-mid-clm", 0.01)}
    header, body = capacity_report.table_rows([row])
    cells = dict(zip(header, body[0]))
    assert cells["freeze-low delta"] == "-2.00 (p 0.5000)" and cells["freeze-mid delta"] == "+1.00 (p 0.5000)"
    assert cells["delta [95% CI]"] == "+3.00 [+2.00, +4.00]"


def test_size_runs_only_the_sizes_named_and_compares_those_that_finished(capacity, tmp_path, capsys):
    import shutil

    # a copy of a finished size is that size done: --size reruns nothing of it and starts no other size
    out = tmp_path / "out"
    shutil.copytree(capacity / "sizes" / "3x32", out / "sizes" / "3x32")
    (out / ".study").mkdir()
    assert main(["study", str(_study(tmp_path)), "--out", str(out), "--size", "3x32"]) == 0
    text = capsys.readouterr().out
    assert "== size 3x32" in text and "== size 3x48" not in text
    assert "0 steps run" in text
    assert not (out / "sizes" / "3x48").exists()
    data = json.loads((out / "study.json").read_text())
    assert list(data["sizes"]) == list(SIZES)  # the study's sizes, all of them: the others are still to come
    rows = {r["size"]: r for r in json.loads((out / "capacity.json").read_text())["sizes"]}
    assert rows["3x32"]["delta"] is not None and not rows["3x32"]["missing"]
    assert "the base model" in rows["3x48"]["missing"]
    assert "Not there yet: 3x48" in (out / "report.md").read_text()
    # the dry run of the size still to come says its data will be linked from the finished size
    assert main(["study", str(_study(tmp_path)), "--out", str(out), "--size", "3x48", "--dry-run"]) == 0
    text = capsys.readouterr().out
    for name in ("corpus", "general"):
        line = next(line for line in text.splitlines() if f" prepare:{name} " in line)
        assert line.split()[:2] == ["to", "run"] and "linked from size 3x32" in line, text
    assert not (out / "sizes" / "3x48").exists()  # and links nothing


def test_drivers_of_different_sizes_run_at_once_into_one_out_tokenize_once_and_one_size_never_twice(
        capacity, tmp_path, capsys):
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from detour.lock import holder
    from detour.study.graph import build_steps, step_key
    from detour.study.sizes import PrepareClaim, size_folder, size_spec

    out = tmp_path / "out"
    (out / ".study").mkdir(parents=True)
    # the 3x48's base made long, so that its driver is still running while the others are tried
    long_base = yaml.safe_load(_study(tmp_path).read_text())["sizes"]
    long_base["3x48"]["set"] += ["phases.0.tokens=50M"]
    study = _study(tmp_path, sizes=long_base)
    # the 3x32's driver, started at the same moment, is preparing both corpora: this test holds
    # its real claims
    other = size_folder(out, "3x32").resolve()
    steps = {s.name: s for s in build_steps(size_spec(load_study(study), "3x32"), other)}
    claims = {name: PrepareClaim(steps[f"prepare:{name}"], step_key(steps[f"prepare:{name}"], other, {}), [other])
              for name in ("corpus", "general")}
    assert all(claim.take() for claim in claims.values())
    assert main(["study", str(study), "--out", str(out), "--size", "3x48", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    for name in claims:
        assert "another size's driver prepares it now" in next(line for line in plan.splitlines()
                                                                if f" prepare:{name} " in line), plan
    # its output to a file: a pipe nobody reads would stall the driver once its buffer is full
    log = tmp_path / "3x48.log"

    def wait_for(text: str) -> None:
        end = time.time() + 300
        while text not in log.read_text():
            assert driver.poll() is None, log.read_text()
            assert time.time() < end, f"no {text!r} in: {log.read_text()}"
            time.sleep(0.1)

    with log.open("w") as sink:
        driver = subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out),
                                   "--size", "3x48"], stdout=sink, stderr=subprocess.STDOUT,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    try:
        # it waits for the corpus the other driver prepares, naming that driver
        wait_for("prepare:corpus: waiting: pid ")
        assert f"pid {os.getpid()} " in log.read_text()
        time.sleep(1)
        assert "prepare:corpus: run" not in log.read_text()
        # the other driver ends without finishing it: the step is this driver's now
        claims["corpus"].release()
        wait_for("prepare:general: waiting: ")
        assert "prepare:corpus: run" in log.read_text()
        assert claims["corpus"].take()  # let go of as soon as the step finished, for the drivers after it
        claims["corpus"].release()
        # the other driver finishes the general corpus (and the rest of its size): it is linked, not made again
        shutil.copytree(capacity / "sizes" / "3x32", other)
        claims["general"].release()
        wait_for("prepare:general: linked from")
        assert holder(out / "sizes" / "3x48") is not None
        # the 3x48 a second time is refused, naming the driver that runs it
        assert main(["study", str(study), "--out", str(out), "--size", "3x48"]) == 2
        assert f"pid {driver.pid} " in capsys.readouterr().err
        # so is the whole study with its sizes at once, before the driver of any size starts
        assert main(["study", str(study), "--out", str(out), "--jobs", "2"]) == 2
        captured = capsys.readouterr()
        assert f"size 3x48: {out / 'sizes' / '3x48'} is in use by pid {driver.pid} " in captured.err
        assert "== size" not in captured.out
        # another size runs into the same OUT meanwhile, and writes the comparison
        assert main(["study", str(study), "--out", str(out), "--size", "3x32"]) == 0
        assert "0 steps run" in capsys.readouterr().out
        assert "Not there yet: 3x48" in (out / "report.md").read_text()
        assert driver.poll() is None  # undisturbed
    finally:
        for claim in claims.values():
            claim.release()
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=300)
    assert driver.returncode == 75, log.read_text()  # stopped, to continue on the next run
    text = log.read_text()
    assert text.count("waiting:") == 2 and "prepare:general: run" not in text, text
    mine = size_folder(out, "3x48")
    assert (mine / "data" / "general" / "manifest.json").stat().st_ino == \
        (other / "data" / "general" / "manifest.json").stat().st_ino
    assert not any((out / ".study" / "prepare").iterdir())  # every claim let go of


def _training_processes(out: Path) -> dict[str, int]:
    """size -> pid of the `detour train` running in OUT/sizes/SIZE/, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        argv = [a.decode(errors="replace") for a in argv]
        if "detour.cli" in argv and "train" in argv:
            for size in SIZES:
                if any(a.startswith(str(out / "sizes" / size) + "/") for a in argv):
                    found[size] = int(entry.name)
    return found


def test_sizes_at_once_pin_each_driver_to_its_cores_a_failed_size_stops_no_other_and_a_stop_stops_the_rest(
        tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from detour.study.executors import slices

    out = (tmp_path / "out").resolve()
    sizes = yaml.safe_load(_study(tmp_path).read_text())["sizes"]
    sizes["3x32"]["set"] += ["phases.0.tokens=50M"]  # a base still training when the study is stopped
    # a base that fails once it runs: its held-out split is far smaller than it asks (known only once the
    # data are prepared, so not refused up front)
    sizes["3x48"]["set"] += ["validation.sequences=100000"]
    study = _study(tmp_path, sizes=sizes)
    log = tmp_path / "study.log"
    with log.open("w") as sink:
        driver = subprocess.Popen([sys.executable, "-m", "detour.cli", "study", str(study), "--out", str(out),
                                   "--jobs", "2"], stdout=sink, stderr=subprocess.STDOUT,
                                  # two GPUs by name, as a scheduler sets them (matching no device: the CPU runs)
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    try:
        end = time.time() + 300
        # the 3x32's base trains on after the 3x48 failed
        while "3x32" not in (trainings := _training_processes(out)) or "== size 3x48: failed" not in log.read_text():
            assert driver.poll() is None, log.read_text()
            assert time.time() < end, log.read_text()
            time.sleep(0.2)
        assert driver.poll() is None and "3x32" in _training_processes(out)
        # pinned to the cores of its driver's slot (the machine cut in two), not all of them
        assert os.sched_getaffinity(trainings["3x32"]) == set(slices(sorted(os.sched_getaffinity(0)), 2)[0])
        assert psutil.Process(trainings["3x32"]).environ()["CUDA_VISIBLE_DEVICES"] == "GPU-a"  # and its slot's GPU
        assert "== size 3x32: a driver of its own with --jobs 1" in log.read_text()
    finally:
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=300)
    text = log.read_text()
    assert driver.returncode == 2, text  # the failed size's status: the study did not finish
    assert "== size 3x32: stopped" in text
    assert f"size 3x48 did not finish (exit 2); its output is above and its steps' logs in {out}/sizes/3x48" in text
    assert "detour study: stopped (size 3x32 stopped); run the same command again to continue" in text
    events = [json.loads(line) for line in (out / "sizes" / "3x32" / ".study" / "log.jsonl").read_text().splitlines()]
    assert {"step": "base", "event": "stopped"}.items() <= events[-1].items(), events[-1]
    assert not _training_processes(out)
    assert not (out / "report.md").exists()  # no comparison of a study that did not finish


def test_a_sigterm_while_a_sizes_driver_is_being_started_stops_that_size_too(tmp_path, sigterm_while_starting, capsys,
                                                                             minilm):
    # while the 3x32's driver runs and the 3x48's is being started
    sigterm_while_starting(lambda argv: "--size" in argv and argv[argv.index("--size") + 1] == "3x48")
    out = tmp_path / "out"
    assert main(["study", str(_study(tmp_path)), "--out", str(out), "--jobs", "2"]) == 75
    text = capsys.readouterr().out
    # neither size went on with its study: each driver was stopped, whether or not it had its handler yet
    assert "== size 3x32: stopped" in text and "== size 3x48: stopped" in text, text
    assert not (out / "sizes" / "3x48" / "base" / "model").exists()


def test_size_plans_only_the_sizes_named_and_refuses_a_size_the_study_lacks(tmp_path, capsys, minilm):
    study = _study(tmp_path)
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run", "--size", "3x48"]) == 0
    text = capsys.readouterr().out
    assert "this run: 3x48" in text and "== size 3x48" in text and "== size 3x32" not in text
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--size", "3x48", "--size", "9x9"]) == 2
    err = capsys.readouterr().err
    assert "--size 9x9" in err and "3x32, 3x48" in err
    assert main(["study", str(REPO / "studies" / "tiny.yaml"), "--out", str(tmp_path / "out"), "--size", "3x32"]) == 2
    assert "has no sizes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_base_recipe_with_a_clm_phase_is_refused_naming_the_field(tmp_path, capsys, minilm):
    study = _study(tmp_path)
    base = yaml.safe_load(Path(yaml.safe_load(study.read_text())["base"]["recipe"]).read_text())
    base["phases"][0]["objective"] = "clm"
    base["phases"][0].pop("mask_rate")
    Path(yaml.safe_load(study.read_text())["base"]["recipe"]).write_text(yaml.safe_dump(base))
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "base.recipe: phases.0 (mlm) is CLM" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--dry-run"], [], ["--jobs", "2"]])
def test_a_size_its_architecture_cannot_build_is_refused_before_anything_runs_naming_the_size(
        tmp_path, capsys, minilm, flags):
    sizes = yaml.safe_load(_study(tmp_path).read_text())["sizes"]
    sizes["3x48"]["set"][-1] = "model.config.num_attention_heads=5"  # 48 is not a multiple of 5
    out = tmp_path / "out"
    assert main(["study", str(_study(tmp_path, sizes=sizes)), "--out", str(out), *flags]) == 2
    assert "size 3x48: model.config: The hidden size (48) is not a multiple of the number of attention heads (5)" \
        in capsys.readouterr().err
    # the size before it was not run either: every size is checked before any starts, one by one or at once
    assert not (out / "sizes").exists()


def test_sizes_without_a_base_are_refused(tmp_path, capsys, minilm):
    study = _study(tmp_path)
    spec = yaml.safe_load(study.read_text())
    spec.pop("base")
    study.write_text(yaml.safe_dump(spec))
    assert main(["study", str(study), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "sizes: a study at several sizes pretrains each size's encoder" in capsys.readouterr().err


def test_shipped_capacity_study_loads_with_three_sizes():
    spec = load_study(REPO / "studies" / "modernbert-scratch-capacity.yaml")
    assert len(spec.sizes) == 3 and spec.base is not None
    assert spec.eval.seeds >= 5 and len(spec.eval.tasks) >= 4
    assert {"freeze-low-clm", "freeze-mid-clm", "baseline-seed2"} <= set(spec.arms)


@pytest.mark.parametrize("file, constant, anneal", [("modernbert-scratch-3x192-20m.yaml", "18M", "2M"),
                                                     ("modernbert-scratch-3x192-40m.yaml", "36M", "4M")])
def test_the_long_base_studies_differ_from_the_capacity_studys_smallest_size_by_the_base_alone(file, constant,
                                                                                                 anneal):
    # docs/reproduction/capacity.md sets the answers for 3 x 192 side by side as the effect of the
    # base's length: everything after the base must be the same study
    capacity = load_study(REPO / "studies" / "modernbert-scratch-capacity.yaml")
    long = load_study(REPO / "studies" / file)
    assert long.sizes is None and long.base.recipe == capacity.base.recipe and long.base.data == capacity.base.data
    assert long.base.set[:4] == capacity.sizes["3x192"].set and not capacity.sizes["3x192"].train_set
    assert long.base.set[4:6] == [f"phases.0.tokens={constant}", f"phases.1.tokens={anneal}"]
    for section in ("prepare", "train", "arms", "eval", "analyses"):
        assert getattr(long, section) == getattr(capacity, section), section



def test_the_long_base_capacity_study_differs_from_the_capacity_study_by_the_bases_length_alone(tmp_path):
    # docs/reproduction/capacity.md compares the two capacity answers as the effect of the bases'
    # length, and keeps the 3 x 192 of studies/modernbert-scratch-3x192-20m.yaml as this study's
    # 3 x 192: both hold only while the recipes agree
    from detour.study.graph import build_arms, build_base
    from detour.study.sizes import size_spec

    capacity = load_study(REPO / "studies" / "modernbert-scratch-capacity.yaml")
    long = load_study(REPO / "studies" / "modernbert-scratch-capacity-20m.yaml")
    assert long.base.recipe == capacity.base.recipe and long.base.data == capacity.base.data
    assert not capacity.base.set and long.base.set == [
        "phases.0.tokens=18M", "phases.1.tokens=2M", "validation.every_tokens=1M", "checkpoint.every_tokens=2M"]
    for section in ("prepare", "sizes", "train", "arms", "eval", "analyses"):
        assert getattr(long, section) == getattr(capacity, section), section
    small = size_spec(long, "3x192")
    alone = load_study(REPO / "studies" / "modernbert-scratch-3x192-20m.yaml")
    base = build_base(small, tmp_path)
    assert base.model_dump() == build_base(alone, tmp_path).model_dump()
    assert base.phases[0].tokens + base.phases[1].tokens == 20_000_000
    arms, alone_arms = build_arms(small, tmp_path, base), build_arms(alone, tmp_path, base)
    assert {a: r.model_dump() for a, r in arms.items()} == {a: r.model_dump() for a, r in alone_arms.items()}


def _summary(start_hash: str | None) -> dict:
    phase = {"objective": "mlm", "mask_rate": 0.15, "tokens": 100, "budget": 100, "stream_hash": "s",
             "mask_hash": "m", "final_loss": 1.0}
    summary = {"seed": 17, "phases": {"decay": phase}}
    if start_hash is not None:
        summary["start"] = {"source": "base/model", "weights_hash": start_hash}
    return summary


def test_twins_check_fails_when_an_arm_started_from_other_weights():
    from detour.train.twins import check_failures, compare_arms

    same = compare_arms({"detour": _summary("a"), "baseline": _summary("a")})
    assert same["checks"]["start_weights_equal"] is True and check_failures(same, "twins.json") is None
    other = compare_arms({"detour": _summary("a"), "baseline": _summary("b")})
    assert other["checks"]["start_weights_equal"] is False
    failed = check_failures(other, "twins.json")
    assert "same starting weights: NO" in failed and "baseline started from weights b" in failed
    # arms built from a config record a seed, not a hash: nothing to compare, and no failure
    config = compare_arms({"detour": _summary(None), "baseline": _summary(None)})
    assert "start_weights_equal" not in config["checks"] and check_failures(config, "twins.json") is None


def test_a_sizes_train_set_reaches_its_arms_and_no_other_sizes(tmp_path):
    # a size's own overrides of the arms' recipe (its peak LR, say): every arm of that size, only that size
    from detour.study.graph import build_arms, build_base
    from detour.study.sizes import size_spec

    spec = load_study(REPO / "studies" / "modernbert-scratch-capacity.yaml")
    sizes = {name: entry.model_copy(update={"train_set": ["optimizer.lr=1.0e-4"]}) if name == "6x384" else entry
             for name, entry in spec.sizes.items()}
    spec = spec.model_copy(update={"sizes": sizes})
    peak = load_study(REPO / "studies" / "modernbert-scratch-capacity.yaml")
    for size in spec.sizes:
        one = size_spec(spec, size)
        arms = build_arms(one, tmp_path, build_base(one, tmp_path))
        default = build_arms(size_spec(peak, size), tmp_path, build_base(one, tmp_path))["detour"].optimizer.lr
        assert {a: r.optimizer.lr for a, r in arms.items()} == {a: 1.0e-4 if size == "6x384" else default for a in arms}
    assert default != 1.0e-4
