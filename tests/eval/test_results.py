"""results.json summary statistics and the results.md table (best bold, second underlined)."""

import json

import pytest

from detour.errors import DetourError
from detour.eval.results import Results


def run(model, task, seed, f1):
    return {"model": model, "task": task, "seed": seed, "headline": "macro_f1", "metrics": {"macro_f1": f1, "accuracy": 0.5}}


def test_summary_mean_std_and_markdown(tmp_path):
    config = {"models": ["A", "B", "C"], "tasks": ["t1", "t2"], "seeds": [0, 1]}
    res = Results.open(tmp_path, config)
    scores = {"A": (0.5, 0.7, 0.4, 0.4), "B": (0.65, 0.65, 0.9, 0.9), "C": (0.1, 0.1, 0.8, 0.8)}
    for model, (a, b, c, d) in scores.items():
        for task, vals in (("t1", (a, b)), ("t2", (c, d))):
            for seed, v in enumerate(vals):
                res.add(run(model, task, seed, v))
    data = json.loads((tmp_path / "results.json").read_text())
    s = data["summary"]["A"]["t1"]["macro_f1"]
    assert s["mean"] == pytest.approx(0.6) and s["std"] == pytest.approx(0.1414213, abs=1e-6) and s["n"] == 2
    md = (tmp_path / "results.md").read_text().splitlines()
    assert md[0].split("|")[1:-1][-1].strip() == "Average"
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in md[2:5]}
    assert rows["B"][0] == "**65.0 ± 0.0**" and rows["A"][0] == "<u>60.0 ± 14.1</u>" and rows["C"][0] == "10.0 ± 0.0"
    assert rows["B"][1] == "**90.0 ± 0.0**" and rows["C"][1] == "<u>80.0 ± 0.0</u>" and rows["A"][1] == "40.0 ± 0.0"
    assert rows["B"][2] == "**77.5**" and rows["A"][2] == "<u>50.0</u>" and rows["C"][2] == "45.0"


def test_other_config_is_refused(tmp_path):
    res = Results.open(tmp_path, {"models": ["A"], "tasks": ["t"], "seeds": [0]})
    res.add(run("A", "t", 0, 0.5))
    with pytest.raises(DetourError, match="seeds"):
        Results.open(tmp_path, {"models": ["A"], "tasks": ["t"], "seeds": [0, 1]})
    assert Results.open(tmp_path, {"models": ["A"], "tasks": ["t"], "seeds": [0]}).done() == {("A", "t", 0)}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind


def test_json_and_markdown_are_written_together(tmp_path, monkeypatch):
    """A table that fails to render leaves both files as they were: never a new json beside an old table."""
    from detour.eval import results as results_module

    config = {"models": ["A"], "tasks": ["t"], "seeds": [0, 1]}
    res = Results.open(tmp_path, config)
    res.add(run("A", "t", 0, 0.5))
    before = {name: (tmp_path / name).read_text() for name in ("results.json", "results.md")}

    def broken(*args):
        raise RuntimeError("render failed")

    monkeypatch.setattr(results_module, "markdown_table", broken)
    with pytest.raises(RuntimeError):
        res.add(run("A", "t", 1, 0.7))
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
