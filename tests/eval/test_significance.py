"""`detour compare`: paired bootstrap over tasks x seeds on results.json files written here."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from detour.cli import main
from detour.errors import DetourError
from detour.eval.significance import bootstrap_statistics, compare, distinct_resamples, paired_bootstrap

TASKS = ["t1", "t2", "t3", "t4"]


def _results(path, model_scores: dict[str, dict[str, list[float]]], seeds=None, recorded=None):
    """A results.json in `detour eval`'s schema: model -> task -> one macro_f1 per seed.
    `recorded`: the settings fields each run carries (as `detour eval` writes them); none by default,
    as in results written before they were recorded."""
    runs = []
    for model, tasks in model_scores.items():
        for task, scores in tasks.items():
            for i, score in enumerate(scores):
                seed = seeds[i] if seeds else i
                runs.append({"model": model, "task": task, "seed": seed, "headline": "macro_f1",
                             "metrics": {"macro_f1": score, "micro_f1": score + 0.01},
                             "selected_epoch": 1, "budget": {}, "timings": {}, **json.loads(json.dumps(recorded or {}))})
    path.write_text(json.dumps({"schema": "detour.eval/1", "config": {}, "runs": runs, "summary": {}}))
    return path


def _recorded(train_examples=800, lr=5e-05, data="ab" * 32, description="a task"):
    """The settings one run of `detour eval` records (the names and shapes of detour.eval.run)."""
    return {
        "spec": {"name": "t", "type": "ner", "format": "iob", "description": description, "data": {"all": "x"},
                 "max_length": 256, "training": {"epochs": 10, "lr": lr, "batch_size": 16}},
        "data_sha256": data, "linear_probe": False,
        "budget": {"epochs": 10, "train_examples": train_examples, "validation_examples": 100,
                   "eval_examples": 100, "max_length": 256, "lr": lr, "batch_size": 16, "labels": 3},
    }


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
    # 1 task x 2 seeds: 3 distinct resamples, fewer than 100
    with pytest.raises(DetourError, match="only 3 distinct bootstrap resamples"):
        compare([path_a, path_b], resamples=100)
    result = compare([path_a, path_b], resamples=100, allow=True)  # one model a file: A then B
    (task,) = result.tasks
    assert task.seeds == [1, 2] and task.seeds_a == [0, 1, 2] and task.seeds_b == [1, 2]
    assert task.a == [0.6, 0.7] and task.b == [0.4, 0.5]
    assert result.delta == pytest.approx(0.2)
    assert result.distinct_resamples == 3 and "only 3 distinct" in result.warnings[0]


def test_seeds_of_one_model_only_are_named(tmp_path, capsys):
    path_a = _results(tmp_path / "a.json", {"a": {"t1": [0.5, 0.6, 0.7]}}, seeds=[0, 1, 2])
    path_b = _results(tmp_path / "b.json", {"b": {"t1": [0.4, 0.5]}}, seeds=[1, 2])
    assert main(["compare", str(path_a), str(path_b), "--resamples", "3"]) == 0
    assert "note: task t1: seeds [0] were run by one model only and are left out of the pairs" in capsys.readouterr().out


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


def test_distinct_resamples_is_what_the_bootstrap_can_draw():
    """The count matches an enumeration, and the resampled statistics of bootstrap_statistics."""
    for counts in ([1], [2], [3], [2, 2], [2, 3], [5], [4, 1, 2]):
        multisets = 1
        for n in counts:
            multisets *= len({tuple(sorted(draw)) for draw in itertools.product(range(n), repeat=n)})
        assert distinct_resamples(counts) == multisets, counts
    assert distinct_resamples([2, 2]) == 9 and distinct_resamples([5] * 4) == 126**4
    # seed differences whose every multiset has its own mean, on separate scales per task, so each
    # distinct resample gives a distinct statistic: 20000 draws meet all 10 x 10 = 100 of them
    diffs = [np.array([0.0, 1.0, 4.0]), np.array([0.0, 100.0, 400.0])]
    _, boot = bootstrap_statistics(diffs, resamples=20_000, seed=0, correction=False)
    assert len(np.unique(np.round(boot, 9))) == distinct_resamples([3, 3]) == 100


def test_one_seed_is_refused_and_allow_warns(tmp_path, capsys):
    rng = np.random.default_rng(4)
    scores = {t: [0.6 + rng.normal(0, 0.02)] for t in TASKS}
    _results(tmp_path / "r.json", {"a": {t: [v[0] + 0.01] for t, v in scores.items()}, "b": scores})
    argv = ["compare", str(tmp_path / "r.json"), "--a", "a", "--b", "b", "--resamples", "1000"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "task t1: 1 seed shared by the two models (A ran 1: [0]; B ran 1: [0])" in err
    assert "p = 1/(1+N) = 1/1001 and a zero-width interval" in err and "--allow" in err
    # --allow: the number it refused to print, with the reason beside it, on stderr and in the JSON
    assert main(argv + ["--allow", "--json", str(tmp_path / "cmp.json")]) == 0
    captured = capsys.readouterr()
    assert "WARNING: task t1: 1 seed shared" in captured.err and "WARNING: task t4: 1 seed" in captured.err
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert data["allowed"] is True and len([w for w in data["warnings"] if "1 seed shared" in w]) == 4
    assert data["p_value"] == pytest.approx(1 / 1001) and data["ci_low"] == data["ci_high"]  # what it warned of


def test_few_distinct_resamples_is_refused_and_the_count_printed(tmp_path, capsys):
    scores = {"t1": [0.5, 0.6], "t2": [0.7, 0.8]}
    _results(tmp_path / "r.json", {"a": {t: [x + 0.02 for x in v] for t, v in scores.items()}, "b": scores})
    argv = ["compare", str(tmp_path / "r.json"), "--a", "a", "--b", "b"]
    assert main(argv) == 2  # the default 10000 resamples
    err = capsys.readouterr().err
    assert "only 9 distinct bootstrap resamples exist for 2 task(s) with 2, 2 seed(s) (C(3,2) x C(3,2))" in err
    assert "fewer than --resamples 10000" in err and "lower --resamples to 9" in err
    assert main(argv + ["--resamples", "9", "--json", str(tmp_path / "cmp.json")]) == 0
    captured = capsys.readouterr()
    assert "9 distinct resamples possible" in captured.out and "WARNING" not in captured.err
    assert json.loads((tmp_path / "cmp.json").read_text())["distinct_resamples"] == 9
    assert main(argv + ["--resamples", "9", "--json", str(tmp_path)]) == 2  # a folder, not a file
    assert "is a folder; give a file name" in capsys.readouterr().err


def test_differing_evaluation_settings_are_refused(tmp_path, capsys):
    rng = np.random.default_rng(5)
    base = _scores(rng)
    same = _recorded()
    _results(tmp_path / "a.json", {"A": {t: [x + 0.02 for x in v] for t, v in base.items()}}, recorded=same)
    _results(tmp_path / "same.json", {"B": base}, recorded=_recorded(description="reworded"))
    _results(tmp_path / "other.json", {"B": base}, recorded=_recorded(train_examples=256, lr=3e-05, data="cd" * 32))
    result = compare([tmp_path / "a.json", tmp_path / "same.json"], resamples=500)
    assert result.warnings == [] and result.unchecked == []  # a reworded description is no difference
    argv = ["compare", str(tmp_path / "a.json"), str(tmp_path / "other.json"), "--resamples", "500"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "evaluated with different settings" in err
    for line in ("task t1: train_examples differs (A: 800, B: 256)", "task t4: spec.training.lr differs (A: 5e-05, B: 3e-05)",
                 "task t2: lr differs (A: 5e-05, B: 3e-05)", "task t3: data_sha256 differs (A: abababababab, B: cdcdcdcdcdcd)"):
        assert line in err
    assert "max_length differs" not in err and "epochs differs" not in err
    assert main(argv + ["--allow", "--json", str(tmp_path / "cmp.json")]) == 0
    assert "WARNING: the two models were evaluated with different settings" in capsys.readouterr().err
    warnings = json.loads((tmp_path / "cmp.json").read_text())["warnings"]
    assert any("task t1: train_examples differs (A: 800, B: 256)" in w for w in warnings)


def test_settings_older_results_lack_are_named_as_unchecked(tmp_path, capsys):
    rng = np.random.default_rng(6)
    base = _scores(rng)
    _results(tmp_path / "new.json", {"A": {t: [x + 0.02 for x in v] for t, v in base.items()}}, recorded=_recorded())
    _results(tmp_path / "old.json", {"B": base})  # no spec, data hash, linear_probe nor budget recorded
    assert main(["compare", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--resamples", "500"]) == 0
    err = capsys.readouterr().err
    assert ("note: cannot check spec, data_sha256, linear_probe, epochs, train_examples, validation_examples, "
            "eval_examples, max_length, lr, batch_size, labels for task(s) t1, t2, t3, t4: not recorded in the "
            "results of B") in err
    assert "WARNING" not in err


def test_models_are_found_by_label_by_path_and_with_a_trailing_slash(tmp_path, monkeypatch):
    from detour.eval.significance import _resolve_model

    monkeypatch.chdir(tmp_path)
    models = ["runs/twins/detour/model", "runs/twins/baseline/model"]
    for wanted in ("detour/model", "runs/twins/detour/model/", str(tmp_path / "runs/twins/detour/model"),
                   "./runs/twins/detour/model"):
        assert _resolve_model(wanted, models, "--a") == models[0], wanted
    with pytest.raises(DetourError, match="ambiguous"):
        _resolve_model("model", models, "--a")
    with pytest.raises(DetourError, match="not found"):
        _resolve_model("other/model", models, "--a")
