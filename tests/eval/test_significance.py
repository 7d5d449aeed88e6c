"""`detour compare`: paired bootstrap over tasks x seeds on results.json files written here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from detour.cli import main
from detour.errors import DetourError
from detour.eval.significance import compare, paired_bootstrap

TASKS = ["t1", "t2", "t3", "t4"]


def _results(path, model_scores: dict[str, dict[str, list[float]]], seeds=None):
    """A results.json in `detour eval`'s schema: model -> task -> one macro_f1 per seed."""
    runs = []
    for model, tasks in model_scores.items():
        for task, scores in tasks.items():
            for i, score in enumerate(scores):
                seed = seeds[i] if seeds else i
                runs.append({"model": model, "task": task, "seed": seed, "headline": "macro_f1",
                             "metrics": {"macro_f1": score, "micro_f1": score + 0.01},
                             "selected_epoch": 1, "budget": {}, "timings": {}})
    path.write_text(json.dumps({"schema": "detour.eval/1", "config": {}, "runs": runs, "summary": {}}))
    return path


def _scores(rng, shift=0.0, noise=0.02):
    return {t: list(0.6 + 0.05 * i + shift + rng.normal(0, noise, 5)) for i, t in enumerate(TASKS)}


def test_identical_arms_give_p_one(tmp_path):
    scores = _scores(np.random.default_rng(0))
    path = _results(tmp_path / "r.json", {"a": scores, "b": scores})
    result = compare([path], "a", "b", resamples=2000)
    assert result.delta == 0.0
    assert result.p_value == 1.0
    assert result.ci_low == result.ci_high == 0.0


def test_null_rejection_rate_is_calibrated():
    """500 seeded simulations of a null (paired differences of mean 0, 5 seeds x 4 tasks)."""
    rng = np.random.default_rng(2026)
    scales = (0.01, 0.02, 0.005, 0.03)  # tasks differ in seed noise, as real ones do
    p_values = []
    for sim in range(500):
        diffs = [rng.normal(0.0, s, 5) for s in scales]
        p_values.append(paired_bootstrap(diffs, resamples=1000, seed=sim)[3])
    rate = float(np.mean(np.asarray(p_values) < 0.05))
    assert 0.02 <= rate <= 0.12, rate


def test_known_shift_is_detected(tmp_path):
    rng = np.random.default_rng(1)
    base = _scores(rng)
    better = {t: [s + 0.03 + rng.normal(0, 0.005) for s in v] for t, v in base.items()}
    path = _results(tmp_path / "r.json", {"detour": better, "mlm": base})
    result = compare([path], "detour", "mlm", resamples=5000)
    assert result.p_value < 0.01
    assert 0.02 < result.delta < 0.04
    assert result.ci_low > 0 and result.ci_high < 0.05
    reverse = compare([path], "mlm", "detour", resamples=5000)
    assert reverse.delta == pytest.approx(-result.delta)
    assert reverse.p_value < 0.01


def test_same_seed_same_output_and_seed_matters():
    diffs = [np.random.default_rng(i).normal(0.01, 0.02, 5) for i in range(4)]
    first = paired_bootstrap(diffs, 3000, seed=7)
    assert paired_bootstrap(diffs, 3000, seed=7) == first
    assert paired_bootstrap(diffs, 3000, seed=8) != first


def test_pairs_only_common_seeds(tmp_path):
    path_a = _results(tmp_path / "a.json", {"a": {"t1": [0.5, 0.6, 0.7]}}, seeds=[0, 1, 2])
    path_b = _results(tmp_path / "b.json", {"b": {"t1": [0.4, 0.5]}}, seeds=[1, 2])
    result = compare([path_a, path_b], resamples=100)  # one model a file: A then B
    (task,) = result.tasks
    assert task.seeds == [1, 2]
    assert task.a == [0.6, 0.7] and task.b == [0.4, 0.5]
    assert result.delta == pytest.approx(0.2)


def test_clear_errors(tmp_path):
    path = _results(tmp_path / "r.json", {"a": {"t1": [0.5], "t2": [0.6]}, "b": {"t1": [0.4]}})
    with pytest.raises(DetourError, match="only a: t2"):
        compare([path], "a", "b")
    with pytest.raises(DetourError, match="no runs of model 'b'"):
        compare([path], "a", "b", tasks=["t2"])
    with pytest.raises(DetourError, match="--a 'zzz': not found"):
        compare([path], "zzz", "b")
    with pytest.raises(DetourError, match="no metric 'nope'"):
        compare([path], "a", "b", tasks=["t1"], metric="nope")
    with pytest.raises(DetourError, match="--a a --b b"):
        compare([path])
    with pytest.raises(DetourError, match="no such results file"):
        compare([tmp_path / "missing.json"], "a", "b")


def test_cli_on_two_results_files(tmp_path, capsys):
    rng = np.random.default_rng(3)
    base = _scores(rng)
    _results(tmp_path / "detour.json", {"runs/detour": {t: [s + 0.02 for s in v] for t, v in base.items()}})
    _results(tmp_path / "mlm.json", {"runs/mlm": base})
    out = tmp_path / "cmp" / "compare.json"
    argv = ["compare", str(tmp_path / "detour.json"), str(tmp_path / "mlm.json"), "--a", "detour", "--b", "mlm",
            "--resamples", "500", "--seed", "3", "--tasks", "t1,t2", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "500 resamples, seed 3" in printed and "t1" in printed and "t3" not in printed
    data = json.loads(out.read_text())
    assert data["model_a"] == "runs/detour" and data["model_b"] == "runs/mlm"
    assert [t["task"] for t in data["tasks"]] == ["t1", "t2"]
    assert data["delta"] == pytest.approx(0.02)
    assert data["p_value"] == pytest.approx(1 / 501)  # a constant shift: no resample is as extreme
    assert main(argv[:1] + [str(tmp_path / "detour.json"), "--a", "detour", "--b", "mlm"]) == 2
    # the positional form `detour compare RESULTS... A B`
    assert main(["compare", str(tmp_path / "detour.json"), str(tmp_path / "mlm.json"), "detour", "mlm",
                 "--resamples", "500", "--seed", "3", "--tasks", "t1,t2"]) == 0
    assert "+0.0200" in capsys.readouterr().out
