"""results.json summary statistics and results.md: the headline table (best bold, second
underlined), precision and recall, per-type F1, and the seeds actually done."""

import json

import pytest

from detour.errors import DetourError
from detour.eval.results import Results, seed_list


def run(model, task, seed, f1, **metrics):
    return {"model": model, "task": task, "seed": seed, "headline": "macro_f1",
            "metrics": {"macro_f1": f1, "accuracy": 0.5, **metrics}}


def table(md: str, first_header: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header starts with `first_header`, by their first cell
    (joined with the second when the rows are per model and task)."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        per_task = "| Task |" in lines[start]
        rows[" ".join(cells[:2]) if per_task else cells[0]] = cells[2:] if per_task else cells[1:]
    return rows


def test_summary_mean_std_and_markdown(tmp_path):
    res = Results.open(tmp_path)
    scores = {"A": (0.5, 0.7, 0.4, 0.4), "B": (0.65, 0.65, 0.9, 0.9), "C": (0.1, 0.1, 0.8, 0.8)}
    for model, (a, b, c, d) in scores.items():
        for task, vals in (("t1", (a, b)), ("t2", (c, d))):
            for seed, v in enumerate(vals):
                res.add(run(model, task, seed, v))
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"] == {"models": ["A", "B", "C"], "tasks": ["t1", "t2"], "seeds": [0, 1]}
    s = data["summary"]["A"]["t1"]["macro_f1"]
    assert s["mean"] == pytest.approx(0.6) and s["std"] == pytest.approx(0.1414213, abs=1e-6) and s["n"] == 2
    md = (tmp_path / "results.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Model | t1"))
    assert header.split("|")[1:-1][-1].strip() == "Average"
    rows = table(md, "| Model | t1")
    assert rows["B"][0] == "**65.00 ± 0.00**" and rows["A"][0] == "<u>60.00 ± 14.14</u>" and rows["C"][0] == "10.00 ± 0.00"
    assert rows["B"][1] == "**90.00 ± 0.00**" and rows["C"][1] == "<u>80.00 ± 0.00</u>" and rows["A"][1] == "40.00 ± 0.00"
    assert rows["B"][2] == "**77.50**" and rows["A"][2] == "<u>50.00</u>" and rows["C"][2] == "45.00"
    assert "- t1: 2 seeds done (0-1), for every model." in md


def test_precision_recall_per_type_and_one_seed_has_no_spread(tmp_path):
    res = Results.open(tmp_path)
    for seed, (f1, p, r) in enumerate([(0.8, 0.7, 0.9), (0.6, 0.5, 0.7)]):
        res.add(run("A", "ner", seed, f1, precision=p, recall=r, **{"f1/Disease": f1, "f1/Chemical": f1 / 2}))
    res.add(run("A", "cls", 0, 0.55))
    md = (tmp_path / "results.md").read_text()
    rows = table(md, "| Model | Task | Headline")
    assert rows["A ner"] == ["macro_f1", "70.00 ± 14.14", "60.00 ± 14.14", "80.00 ± 14.14", "2"]
    assert rows["A cls"] == ["macro_f1", "55.00 ± n/a", "–", "–", "1"]  # classification reports no P/R
    assert "| A | ner | Chemical | 35.00 ± 7.07 |" in md and "| A | ner | Disease | 70.00 ± 14.14 |" in md
    assert table(md, "| Model | ner")["A"][:2] == ["70.00 ± 14.14", "55.00 ± n/a"]


def test_a_partial_run_says_how_many_seeds_are_done(tmp_path):
    """Seed 0 of three done: the footer counts what is there, never the seeds asked for."""
    res = Results.open(tmp_path)
    res.add(run("A", "t", 0, 0.5))
    res.add(run("B", "t", 0, 0.6))
    res.add(run("B", "t", 1, 0.7))
    md = (tmp_path / "results.md").read_text()
    assert "- t: A: 1 seed done (0); B: 2 seeds done (0-1)." in md
    assert "3 seed" not in md
    assert table(md, "| Model | t")["A"][0] == "<u>50.00 ± n/a</u>"  # second of two


def test_a_run_of_the_same_model_task_and_seed_replaces_the_old_one(tmp_path):
    res = Results.open(tmp_path)
    res.add(run("A", "t", 0, 0.5))
    res.add(run("A", "t", 1, 0.7))
    res.add(run("A", "t", 0, 0.9))
    again = Results.open(tmp_path)
    assert [(r["seed"], r["metrics"]["macro_f1"]) for r in again.runs] == [(0, 0.9), (1, 0.7)]  # in place
    assert again.find("A", "t", 0)["metrics"]["macro_f1"] == 0.9 and again.find("A", "t", 2) is None
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["A"]["t"]["macro_f1"]["n"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind


def test_a_file_of_another_kind_is_refused(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"schema": "other/1", "runs": []}))
    with pytest.raises(DetourError, match="schema 'other/1'"):
        Results.open(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"schema": "detour.eval/1", "runs": [{"model": "A"}]}))
    with pytest.raises(DetourError, match="model, task and seed"):
        Results.open(tmp_path)


def test_seed_ranges():
    assert seed_list([0]) == "seed 0" and seed_list([2, 0, 1]) == "seeds 0-2" and seed_list([0, 2, 3, 4]) == "seeds 0, 2-4"


def test_json_and_markdown_are_written_together(tmp_path, monkeypatch):
    """A table that fails to render leaves both files as they were: never a new json beside an old table."""
    from detour.eval import results as results_module

    res = Results.open(tmp_path)
    res.add(run("A", "t", 0, 0.5))
    before = {name: (tmp_path / name).read_text() for name in ("results.json", "results.md")}

    def broken(*args):
        raise RuntimeError("render failed")

    monkeypatch.setattr(results_module, "markdown_table", broken)
    with pytest.raises(RuntimeError):
        res.add(run("A", "t", 1, 0.7))
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]


def test_runs_of_one_task_made_with_two_settings_are_flagged(tmp_path):
    """A rerun stopped after replacing seed 0 only: the table says its cell mixes two settings."""
    def keyed(seed, lr, weights="sha256:a"):
        return {**run("A", "t", seed, 0.5), "weights_sha256": weights, "data_sha256": "d" * 64,
                "spec": {"name": "t", "training": {"lr": lr}}, "options": {"lr": None}}

    res = Results.open(tmp_path)
    res.add(keyed(0, 1e-3))
    res.add(keyed(1, 1e-3))
    assert "Mixed" not in (tmp_path / "results.md").read_text()
    res.add(keyed(0, 5e-5))
    assert "- t: 2 seeds done (0-1), for A. **Mixed: these runs were made with 2 different settings**" in (tmp_path / "results.md").read_text()
    res.add(keyed(1, 5e-5, weights="sha256:b"))
    md = (tmp_path / "results.md").read_text()
    assert "- t: 2 seeds done (0-1), for A. **Mixed" not in md and "- A: **Mixed: these runs were made with 2 different weights**" in md


def answered(record, **answers):
    return {**record, "answers": answers}


def test_fine_tunes_that_answered_alike_are_listed_by_model_task_and_seed(tmp_path):
    res = Results.open(tmp_path)
    for seed in range(3):
        res.add(answered(run("A", "chemprot", seed, 0.1365), distinct_predictions=1 if seed != 1 else 3))
        res.add(answered(run("B", "chemprot", seed, 0.30), distinct_predictions=4))
        res.add(answered(run("A", "ncbi", seed, 0.0 if seed == 2 else 0.2), predicted_entities=0 if seed == 2 else 17))
    md = (tmp_path / "results.md").read_text()
    rows = table(md, "| Model | Task | Seeds | Of |")
    assert rows == {"A chemprot": ["0, 2", "3"], "A ncbi": ["2", "3"]}  # B never collapsed
    assert "## Fine-tunes that answered alike for every example" in md


def test_no_section_when_no_fine_tune_collapsed(tmp_path):
    res = Results.open(tmp_path)
    res.add(answered(run("A", "chemprot", 0, 0.3), distinct_predictions=4))
    res.add(run("A", "old", 0, 0.3))  # scored before the counts existed
    res.add(run("A", "misplaced", 0, 0.3, distinct_predictions=1))  # only a run's answers are read
    assert "answered alike" not in (tmp_path / "results.md").read_text()
