"""`detour compare`: the paired sign-flip test (the p of record, pooled and per task with Holm) and
the bootstrap interval over tasks x seeds, on results.json files written here."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from detour.cli import main
from detour.errors import DetourError
from detour.eval.paired import (bootstrap_statistics, distinct_resamples, holm, paired_bootstrap, seeds_for_holm,
                                sign_flip_test, sign_flip_weights)
from detour.eval.significance import compare, read_comparison

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


def _brute_force_p(diffs: list[np.ndarray], standardise: bool = False) -> float:
    """The two-sided sign-flip p by the definition: every pattern, one at a time."""
    terms = sign_flip_weights(diffs, standardise)
    observed = abs(terms.sum())
    flips = [abs(np.dot(signs, terms)) for signs in itertools.product((1.0, -1.0), repeat=len(terms))]
    return float(np.mean(np.asarray(flips) >= observed - 1e-12))


def test_sign_flip_p_is_the_enumeration_of_every_pattern():
    rng = np.random.default_rng(11)
    for design in ([1], [3], [5], [2, 3], [3, 3, 3], [4, 1, 2], [6, 5], [3] * 4):
        for standardise in (False, True):
            diffs = [rng.normal(0.3, 1.0, n) for n in design]
            result = sign_flip_test(diffs, standardise)
            assert result.exact and result.patterns == 2 ** sum(design) and result.differences == sum(design)
            assert result.p_value == pytest.approx(_brute_force_p(diffs, standardise), abs=1e-12), (design, standardise)
    # ties count as extreme: equal magnitudes, and a zero difference that no flip changes
    for diffs in ([np.array([1.0, -1.0, 1.0]), np.array([0.5, 0.5])], [np.array([0.0, 2.0, -1.0, 1.0])]):
        assert sign_flip_test(diffs).p_value == pytest.approx(_brute_force_p(diffs))


def test_patterns_as_extreme_in_exact_arithmetic_count_despite_float_rounding():
    """Scores such as 0.1 + 0.2 - 0.3 round differently in another order: a pattern that ties the
    observed one in exact arithmetic must still count as extreme (checked against fractions)."""
    from fractions import Fraction

    cases = [["0.1", "0.2", "-0.3", "0.5"], ["0.07", "0.7", "-0.77", "0.35", "0.35"], ["0.3", "-0.1", "-0.2", "0.6", "0.6"]]
    for text in cases:
        exact = [Fraction(x) for x in text]
        observed = abs(sum(exact))
        as_extreme = sum(abs(sum(s * x for s, x in zip(signs, exact))) >= observed
                         for signs in itertools.product((1, -1), repeat=len(exact)))
        assert sign_flip_test([np.array([float(x) for x in text])]).p_value == as_extreme / 2 ** len(exact), text


def test_sign_flip_p_is_two_sided_with_the_floor_of_the_design():
    """3 seeds x 1 task, all positive: 2 of the 8 patterns (it and its mirror image) are as extreme."""
    up = [np.array([0.01, 0.02, 0.03])]
    result = sign_flip_test(up)
    assert result.p_value == 0.25 == result.p_floor and result.exact and result.patterns == 8
    assert sign_flip_test([-up[0]]).p_value == 0.25  # the same p the other way round
    rng = np.random.default_rng(12)
    for _ in range(20):  # a difference and its negation have one p
        diffs = [rng.normal(0.2, 1.0, 5) for _ in range(3)]
        assert sign_flip_test(diffs).p_value == sign_flip_test([-d for d in diffs]).p_value
    assert sign_flip_test([np.full(5, 0.01)] * 4).p_value == 2 / 2**20  # every difference one way
    assert sign_flip_test([np.zeros(4)]).p_value == 1.0


def test_sampled_sign_flip_p_counts_the_observed_pattern_and_is_seeded():
    rng = np.random.default_rng(13)
    diffs = [rng.normal(0.1, 1.0, 6) for _ in range(3)]
    exact = sign_flip_test(diffs).p_value
    sampled = sign_flip_test(diffs, patterns=20_000, seed=1, max_exact=2**10)
    assert not sampled.exact and sampled.patterns == 20_000 and sampled.p_floor == 1 / 20_001
    assert sampled.p_value == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 20_000))
    assert sign_flip_test(diffs, patterns=20_000, seed=1, max_exact=2**10).p_value == sampled.p_value
    assert sign_flip_test(diffs, patterns=20_000, seed=2, max_exact=2**10).p_value != sampled.p_value
    # no sampled pattern is as extreme as all-positive: p is (1 + 0) / (1 + patterns), never 0
    far = sign_flip_test([np.full(9, 0.01)] * 8, patterns=999)
    assert not far.exact and far.differences == 72 and far.p_value == 1 / 1000


@pytest.mark.parametrize("seeds,tasks,patterns", [(3, 1, None), (9, 1, None), (5, 4, None), (9, 4, 999)])
def test_sign_flip_null_rejection_rate_is_exact(seeds, tasks, patterns):
    """2000 seeded nulls a design (heavy-tailed, task scales 10x apart), all at once. An exact p of
    N differences is uniform on the multiples of 2/2^N, so P(p <= alpha) = floor(alpha 2^(N-1)) / 2^(N-1);
    a sampled one is uniform on k / (1 + patterns). The rate must sit within 3.5 binomial s.e. of that."""
    rng = np.random.default_rng(seeds * 100 + tasks)
    nulls = 2000
    diffs = [rng.standard_t(3, (nulls, seeds)) * scale for scale in np.sqrt(np.logspace(0, 1, tasks))]
    result = sign_flip_test(diffs, patterns=patterns or 999, seed=0)
    n = seeds * tasks
    assert result.exact == (patterns is None)
    for alpha in (0.05, 0.01):
        half = 2 ** (n - 1)
        expected = np.floor(alpha * half) / half if result.exact else np.floor(alpha * (1 + patterns)) / (1 + patterns)
        rate = float(np.mean(result.p_value <= alpha))
        band = 3.5 * np.sqrt(expected * (1 - expected) / nulls)
        assert abs(rate - expected) <= band, (alpha, rate, expected)


def test_holm_steps_down_and_keeps_the_order_of_the_raw_p():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; raised to the running max
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == pytest.approx([0.02])  # one task: nothing to correct
    rng = np.random.default_rng(14)
    batch = rng.uniform(0, 0.1, (200, 6))
    adjusted = holm(batch)
    for raw, adj in zip(batch, adjusted):
        order = np.argsort(raw)
        assert np.all(np.diff(adj[order]) >= 0) and np.all(adj >= raw)
        m = len(raw)  # the definition, one p at a time
        expected = [min(1.0, max((m - j) * raw[order[j]] for j in range(k + 1))) for k in range(m)]
        assert adj[order] == pytest.approx(expected)


def test_seeds_for_holm():
    assert seeds_for_holm(1) == 6  # 2/2^5 = 0.0625, 2/2^6 = 0.031
    assert seeds_for_holm(6) == 8  # 6 x 2/2^7 = 0.094, 6 x 2/2^8 = 0.047
    assert seeds_for_holm(8) == 9


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
    assert result.p_value == reverse.p_value == 2 / 2**20 and result.exact  # every difference positive
    assert [t.p_value for t in result.tasks] == [2 / 2**5] * 4  # 5 seeds a task: each at its floor


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
            "--resamples", "500", "--seed", "3", "--tasks", "t1,t2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "500 resamples, seed 3" in printed and "t1" in printed and "t3" not in printed
    assert "p = 0.0020" in printed  # a constant shift: only it and its mirror image are as extreme
    assert ("p: paired sign-flip test over tasks x seeds, two-sided, exact: all 2^10 = 1024 sign patterns of the "
            "10 paired differences; statistic: the mean over tasks of the mean difference; p cannot fall below "
            "2/2^10 = 0.0020") in printed
    assert "95% CI: percentile interval of the paired bootstrap, 500 resamples, seed 3" in printed
    assert ("no task can be significant at 0.05 on its own: that needs 7 seeds a task with 2 task(s)") in printed
    data = json.loads(out.read_text())
    assert data["schema"] == "detour.compare/2" and data["p_method"] == "sign-flip"
    assert data["model_a"] == "runs/detour" and data["model_b"] == "runs/mlm"
    assert [t["task"] for t in data["tasks"]] == ["t1", "t2"]
    assert data["delta"] == pytest.approx(0.02)
    assert data["p_value"] == 2 / 2**10 == data["p_floor"]
    assert data["exact"] is True and data["patterns"] == 1024 and data["differences"] == 10
    assert data["statistic"] == "mean" and data["ci_method"].startswith("paired bootstrap, percentile")
    for task in data["tasks"]:  # 5 seeds: 2/32 each, times 2 under Holm
        assert task["p_value"] == task["p_floor"] == 0.0625 and task["p_holm"] == 0.125
    assert read_comparison(out) == data
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
    assert "a sign-flip p of 1 (2 sign patterns, both as extreme) and a zero-width bootstrap interval" in err
    assert "--allow" in err
    # --allow: the number it refused to print, with the reason beside it, on stderr and in the JSON
    assert main(argv + ["--allow", "--out", str(tmp_path / "cmp.json")]) == 0
    captured = capsys.readouterr()
    assert "WARNING: task t1: 1 seed shared" in captured.err and "WARNING: task t4: 1 seed" in captured.err
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert data["allowed"] is True and len([w for w in data["warnings"] if "1 seed shared" in w]) == 4
    assert data["ci_low"] == data["ci_high"] and all(t["p_value"] == 1.0 for t in data["tasks"])  # what it warned of
    assert data["p_value"] == 2 / 2**4  # the pooled test still flips the 4 tasks' differences


def test_few_distinct_resamples_is_refused_and_the_count_printed(tmp_path, capsys):
    scores = {"t1": [0.5, 0.6], "t2": [0.7, 0.8]}
    _results(tmp_path / "r.json", {"a": {t: [x + 0.02 for x in v] for t, v in scores.items()}, "b": scores})
    argv = ["compare", str(tmp_path / "r.json"), "--a", "a", "--b", "b"]
    assert main(argv) == 2  # the default 10000 resamples
    err = capsys.readouterr().err
    assert "only 9 distinct bootstrap resamples exist for 2 task(s) with 2, 2 seed(s) (C(3,2) x C(3,2))" in err
    assert "fewer than --resamples 10000" in err and "lower --resamples to 9" in err
    assert main(argv + ["--resamples", "9", "--out", str(tmp_path / "cmp.json")]) == 0
    captured = capsys.readouterr()
    assert "9 distinct resamples possible" in captured.out and "WARNING" not in captured.err
    assert json.loads((tmp_path / "cmp.json").read_text())["distinct_resamples"] == 9
    assert main(argv + ["--resamples", "9", "--out", str(tmp_path)]) == 2  # a folder, not a file
    assert "--out " in (err := capsys.readouterr().err) and "is a folder; give a file name" in err
    # the flag's earlier spelling still works, with a warning, for one release
    (tmp_path / "cmp.json").unlink()
    assert main(argv + ["--resamples", "9", "--json", str(tmp_path / "cmp.json")]) == 0
    assert "--json is now --out" in capsys.readouterr().err and (tmp_path / "cmp.json").is_file()


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
    assert main(argv + ["--allow", "--out", str(tmp_path / "cmp.json")]) == 0
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
    from detour.eval.pairing import _resolve_model

    monkeypatch.chdir(tmp_path)
    models = ["runs/twins/detour/model", "runs/twins/baseline/model"]
    for wanted in ("detour/model", "runs/twins/detour/model/", str(tmp_path / "runs/twins/detour/model"),
                   "./runs/twins/detour/model"):
        assert _resolve_model(wanted, models, "--a") == models[0], wanted
    with pytest.raises(DetourError, match="ambiguous"):
        _resolve_model("model", models, "--a")
    with pytest.raises(DetourError, match="not found"):
        _resolve_model("other/model", models, "--a")


def test_per_task_p_with_holm_and_the_floor_notes(tmp_path, capsys):
    rng = np.random.default_rng(7)
    base = {t: list(0.6 + rng.normal(0, 0.02, 9)) for t in ("t1", "t2")}
    better = {"t1": [x + 0.05 for x in base["t1"]], "t2": [x + rng.normal(0, 0.02) for x in base["t2"]]}
    path = _results(tmp_path / "r.json", {"a": better, "b": base})
    result = compare([path], "a", "b", resamples=2000)
    (t1, t2) = result.tasks
    assert t1.p_value == 2 / 2**9 == t1.p_floor and t1.p_holm == 4 / 2**9  # the smallest p, times 2
    assert t2.p_value == sign_flip_test([t2.diffs]).p_value and t2.p_holm == max(t2.p_value, t1.p_holm)
    assert main(["compare", str(path), "--a", "a", "--b", "b", "--resamples", "2000"]) == 0
    printed = capsys.readouterr().out
    assert "Holm's step-down correction across the 2 task(s)" in printed and "cannot be significant" not in printed
    # 3 seeds: no task can pass 0.05 (2/8 = 0.25), and the pooled 3 x 1 design cannot either
    path = _results(tmp_path / "three.json", {"a": {"t1": [0.7, 0.8, 0.9]}, "b": {"t1": [0.5, 0.6, 0.7]}})
    assert main(["compare", str(path), "--a", "a", "--b", "b", "--resamples", "10"]) == 0
    printed = capsys.readouterr().out
    assert "p = 0.2500" in printed
    assert "p cannot fall below 2/2^3 = 0.2500, so this design cannot show significance at 0.05: add seeds or tasks" in printed
    assert "with 3 seed(s) a task's p cannot fall below 0.2500, so no task can be significant at 0.05 on its own: " \
           "that needs 6 seeds a task with 1 task(s)" in printed


def test_sampled_patterns_and_standardise_from_the_cli(tmp_path, capsys):
    rng = np.random.default_rng(8)
    base = {f"t{i}": list(0.5 + rng.normal(0, 0.02, 7)) for i in range(4)}  # 28 differences: 2^28 patterns
    other = {t: [x + rng.normal(0.005, 0.02 * (1 + 5 * (t == "t0"))) for x in v] for t, v in base.items()}
    path = _results(tmp_path / "r.json", {"a": other, "b": base})
    argv = ["compare", str(path), "--a", "a", "--b", "b", "--resamples", "1000", "--out", str(tmp_path / "c.json")]
    assert main(argv + ["--patterns", "5000", "--seed", "4"]) == 0
    printed = capsys.readouterr().out
    assert "sampled: 5000 random sign patterns of the 2^28 = 268435456 (seed 4), p = (1 + #as extreme) / (1 + 5000)" in printed
    assert "p cannot fall below 1/5001 = 0.0002" in printed
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["exact"] is False and data["patterns"] == 5000 and data["differences"] == 28
    diffs = [np.asarray(t["a"]) - np.asarray(t["b"]) for t in data["tasks"]]
    assert data["p_value"] == sign_flip_test(diffs, patterns=5000, seed=4).p_value
    assert main(argv + ["--standardise"]) == 0
    assert "statistic: the mean over tasks of sum(d) / sqrt(sum(d^2))" in capsys.readouterr().out
    std = json.loads((tmp_path / "c.json").read_text())
    assert std["statistic"] == "standardised" and std["delta"] == data["delta"]  # delta stays the mean difference
    assert std["p_value"] == sign_flip_test(diffs, standardise=True, patterns=100_000, seed=0).p_value
    assert [t["p_value"] for t in std["tasks"]] == [sign_flip_test([d]).p_value for d in diffs]  # per task: the same test


def test_compare_json_of_earlier_versions_still_reads(tmp_path):
    old = {"schema": "detour.compare/1", "model_a": "a", "model_b": "b", "metric": "headline", "delta": 0.02,
           "ci_low": 0.01, "ci_high": 0.03, "p_value": 0.0001, "resamples": 10000, "seed": 0, "correction": True,
           "tasks": [{"task": "t1", "metric": "macro_f1", "seeds": [0, 1, 2], "a": [0.6, 0.7, 0.8], "b": [0.5, 0.6, 0.7],
                      "seeds_a": [0, 1, 2], "seeds_b": [0, 1, 2], "mean_diff": 0.1, "mean_a": 0.7, "mean_b": 0.6}],
           "distinct_resamples": 10, "allowed": False, "warnings": [], "unchecked": []}
    (tmp_path / "old.json").write_text(json.dumps(old))
    data = read_comparison(tmp_path / "old.json")
    assert data["p_value"] == 0.0001 and data["p_method"] == "bootstrap-shift" and data["exact"] is None
    assert data["tasks"][0]["p_holm"] is None and data["tasks"][0]["mean_diff"] == 0.1
    (tmp_path / "bad.json").write_text(json.dumps({**old, "schema": "detour.compare/9"}))
    with pytest.raises(DetourError, match="must be one of detour.compare/1, detour.compare/2"):
        read_comparison(tmp_path / "bad.json")
