"""`detour analyze trajectory`: the points of a phase in run folders, and CKA divergence along them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from detour.analysis.trajectory import match_points, parse_points, phase_points
from detour.cli import main
from detour.errors import DetourError

torch.set_num_threads(1)

PHASES = [{"name": "clm", "objective": "clm", "tokens": 8192}, {"name": "decay", "objective": "mlm",
                                                                 "mask_rate": 0.15, "tokens": 4096}]


def _recipe(run: Path, phases=PHASES, source=None, **extra) -> None:
    run.mkdir(parents=True, exist_ok=True)
    model = {"source": source} if source else {"source": None, "config": {"model_type": "modernbert"}}
    (run / "recipe.json").write_text(json.dumps({"name": "tiny", "model": model, "phases": phases, **extra}))


def _stub(folder: Path) -> Path:
    """A folder that reads as an export when only the layout matters."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


# ---- the points of a phase ----

def test_points_are_the_start_each_export_during_the_phase_and_its_end(tmp_path):
    run = tmp_path / "run"
    _recipe(run)
    _stub(run / "export" / "clm")
    for tokens in ("512", "2048", "10", "4096"):  # not in numeric order as names; 4096 is the budget
        _stub(run / "export" / "decay" / tokens)
    _stub(run / "export" / "decay")
    _stub(run / "export" / "decay" / "1024.tmp-77")  # an export being written
    (run / "export" / "decay" / "3000").mkdir()          # no config.json: not an export
    info, points, notes = phase_points(run, None)
    assert info == {"name": "decay", "index": 1, "tokens": 4096}
    assert [(p.tokens, p.where) for p in points] == [(0, "start"), (10, "during"), (512, "during"),
                                                      (2048, "during"), (4096, "end")]
    assert points[0].path == str(run / "export" / "clm")
    assert points[2].path == str(run / "export" / "decay" / "512")
    assert points[-1].path == str(run / "export" / "decay")
    assert notes == []


def test_first_phase_starts_from_a_local_source_or_alias_and_is_skipped_otherwise(tmp_path, minilm):
    _stub(tmp_path / "run" / "export" / "clm")
    _recipe(tmp_path / "run", source=str(_stub(tmp_path / "base")))
    _, points, notes = phase_points(tmp_path / "run", "clm")
    assert [(p.tokens, p.path) for p in points] == [(0, str(tmp_path / "base")),
                                                     (8192, str(tmp_path / "run" / "export" / "clm"))]
    _recipe(tmp_path / "run", source="minilm-l6")
    assert phase_points(tmp_path / "run", "clm")[1][0].path == str(minilm)
    _recipe(tmp_path / "run", source="answerdotai/ModernBERT-base")
    _, points, notes = phase_points(tmp_path / "run", "clm")
    assert [p.tokens for p in points] == [8192]
    assert "no start point for the first phase 'clm'" in notes[0] and "ModernBERT-base" in notes[0]


def test_a_branch_starts_from_its_parents_export(tmp_path):
    parent, branch = tmp_path / "parent", tmp_path / "branch"
    _stub(parent / "export" / "clm")
    _recipe(branch, branch={"run": str(parent), "after_phase": "clm"})
    _stub(branch / "export" / "decay")
    _, points, notes = phase_points(branch, "decay")
    assert [(p.tokens, p.path) for p in points] == [(0, str(parent / "export" / "clm")),
                                                     (4096, str(branch / "export" / "decay"))]


def test_common_points_unmatched_ones_and_chosen_ones(tmp_path):
    for name, subs in [("a", ["1024", "2048"]), ("b", ["2048", "3072"])]:
        _recipe(tmp_path / name)
        _stub(tmp_path / name / "export" / "clm")
        for tokens in subs:
            _stub(tmp_path / name / "export" / "decay" / tokens)
    by_role = {"model_a": phase_points(tmp_path / "a", "decay")[1], "model_b": phase_points(tmp_path / "b", "decay")[1]}
    common, unmatched = match_points(by_role)
    assert common == [0, 2048]  # neither run has its end export yet
    assert [(u["run"], u["tokens"]) for u in unmatched] == [("model_a", 1024), ("model_b", 3072)]
    assert match_points(by_role, parse_points("2048, 0,2048"))[0] == [0, 2048]
    assert parse_points("1k,250M,0") == [0, 1000, 250_000_000]
    with pytest.raises(DetourError, match="--points '1k,ten'"):
        parse_points("1k,ten")
    with pytest.raises(DetourError, match=r"--points 1024: not a point of every run \(points common to all: 0, 2048\)"):
        match_points(by_role, parse_points("1024"))
    with pytest.raises(DetourError, match="share no point"):
        match_points({"model_a": by_role["model_a"][2:], "model_b": by_role["model_b"][2:]})


def test_folder_errors_name_the_folder_and_the_phase(tmp_path):
    with pytest.raises(DetourError, match=rf"{tmp_path}: no recipe.json"):
        phase_points(tmp_path, None)
    _recipe(tmp_path)
    with pytest.raises(DetourError, match=r"recipe.json: no phase 'warmup'; its phases are clm, decay"):
        phase_points(tmp_path, "warmup")
    _stub(tmp_path / "export" / "clm")
    with pytest.raises(DetourError, match=rf"{tmp_path}: phase 'decay' has no exports yet"):
        phase_points(tmp_path, "decay")
    _stub(tmp_path / "export" / "decay" / "5000")
    beyond = r"decay/5000: taken after 5000 tokens, beyond the budget of phase 'decay' \(4096 tokens\)"
    with pytest.raises(DetourError, match=beyond):
        phase_points(tmp_path, "decay")


# ---- divergence along the phase ----

def _save(model, tok, folder: Path) -> None:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _perturbed(model, seed: int, scale: float = 0.01):
    clone = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(scale * torch.randn(param.shape, generator=gen))
    return clone


@pytest.fixture(scope="module")
def runs(minilm, tmp_path_factory):
    """Run folders of tiny 3-layer ModernBERTs: A; B and C share A's clm export, their decay exports differ."""
    from transformers import AutoTokenizer, ModernBertForMaskedLM

    from tests.conftest import tiny_modernbert_config

    tok = AutoTokenizer.from_pretrained(minilm)
    root = tmp_path_factory.mktemp("trajectory-runs")
    torch.manual_seed(0)
    start = ModernBertForMaskedLM(tiny_modernbert_config())
    middle, end = _perturbed(start, 1, 0.02), _perturbed(start, 2, 0.02)
    layout = {
        "a": {"clm": start, "decay/2048": middle, "decay/4096": end, "decay": end},
        "b": {"clm": start, "decay/1024": _perturbed(start, 3), "decay/2048": _perturbed(middle, 4),
              "decay": _perturbed(end, 5)},
        "c": {"clm": start, "decay/2048": _perturbed(middle, 6), "decay": _perturbed(end, 7)},
    }
    folders = {}
    for name, exports in layout.items():
        folders[name] = root / name
        _recipe(folders[name])
        for where, model in exports.items():
            _save(model, tok, folders[name] / "export" / where)
    return folders


def _analyze(*argv) -> int:
    return main(["analyze", "trajectory", *map(str, argv)])


SMALL = ("--n", 8, "--seeds", 2, "--max-length", 32)


def test_the_trajectory_of_a_run_against_itself_is_zero_at_every_point(runs, tmp_path):
    out = tmp_path / "self"
    assert _analyze(runs["a"], runs["a"], "--phase", "decay", *SMALL, "--out", out) == 0
    result = json.loads((out / "trajectory.json").read_text())
    assert [(p["tokens"], p["where"]) for p in result["points"]] == [(0, "start"), (2048, "during"), (4096, "end")]
    for point in result["points"]:
        assert [row["layer"] for row in point["layers"]] == ["emb", 0, 1, 2]
        assert all(abs(row["divergence"]) < 1e-12 for row in point["layers"])
        assert set(point["groups"]) == {"low", "mid", "late", "all"}
        assert all(abs(g["divergence"]) < 1e-12 for g in point["groups"].values())
    assert result["unmatched"] == [] and result["config"]["groups"] == {"low": [0], "mid": [1], "late": [2]}


def test_perturbed_decay_exports_diverge_above_a_noise_floor_end_to_end(runs, tmp_path, capsys):
    out = tmp_path / "trajectory"
    assert _analyze(runs["a"], runs["b"], "--noise-floor", runs["c"], *SMALL, "--out", out) == 0
    assert (out / "trajectory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "trajectory.json").read_text())
    assert result["schema"] == "detour.trajectory/1" and result["config"]["phase"] == "decay"  # the last phase
    assert result["config"]["seeds"] == [0, 1] and result["num_layers"] == 3
    points = {p["tokens"]: p for p in result["points"]}
    assert list(points) == [0, 2048, 4096]
    # 0 tokens: every run's start is the same clm export, so nothing has diverged yet
    assert all(abs(g["divergence"]) < 1e-12 and g["seed_noise_ratio"] is None for g in points[0]["groups"].values())
    for tokens in (2048, 4096):
        for name, group in points[tokens]["groups"].items():
            assert group["divergence"] > 1e-4, (tokens, name)
            assert group["seed_noise_ratio"] == pytest.approx(group["divergence"] / group["noise_divergence"])
            layers = [points[tokens]["layers"][l + 1]["divergence"] for l in group["layers"]]
            assert group["divergence"] == pytest.approx(sum(layers) / len(layers))
        assert points[tokens]["mean"] == points[tokens]["groups"]["all"]["divergence"]
        assert points[tokens]["groups"]["all"]["layers"] == [0, 1, 2]
    assert [(u["run"], u["tokens"]) for u in result["unmatched"]] == [("model_b", 1024)]
    exports = {e["tokens"]: e for e in result["config"]["exports"]}
    assert exports[0]["model_a"]["path"] == str(runs["a"] / "export" / "clm")
    assert exports[4096]["model_b"]["path"] == str(runs["b"] / "export" / "decay")
    assert exports[0]["model_a"]["weights_hash"] == exports[0]["model_b"]["weights_hash"]
    assert exports[2048]["model_a"]["weights_hash"] != exports[2048]["model_b"]["weights_hash"]
    assert not list(out.glob(".*"))  # no temporaries left
    printed = capsys.readouterr().out
    assert "2,048" in printed and "d(C,B)" in printed and "unmatched: baseline (B)" in printed
    assert str(out / "trajectory.json") in printed and str(out / "trajectory.png") in printed


def test_chosen_points_only(runs, tmp_path, capsys):
    out = tmp_path / "chosen"
    assert _analyze(runs["a"], runs["b"], "--points", "4096", *SMALL, "--seeds", 1, "--out", out) == 0
    result = json.loads((out / "trajectory.json").read_text())
    assert [p["tokens"] for p in result["points"]] == [4096] and result["config"]["points_requested"] == [4096]
    assert _analyze(runs["a"], runs["b"], "--points", "1024", *SMALL, "--out", tmp_path / "bad") == 2
    assert "--points 1024: not a point of every run (points common to all: 0, 2048, 4096)" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_bad_run_folders_fail_before_any_model_runs(runs, tmp_path, capsys):
    not_a_run = tmp_path / "twins"
    not_a_run.mkdir()
    assert _analyze(not_a_run, runs["b"], *SMALL, "--out", tmp_path / "out") == 2
    assert f"{not_a_run}: no recipe.json" in capsys.readouterr().err
    assert _analyze(runs["a"], runs["b"], "--phase", "warmup", "--out", tmp_path / "out") == 2
    assert "no phase 'warmup'; its phases are clm, decay" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    _recipe(unfinished)
    _stub(unfinished / "export" / "clm")
    assert _analyze(runs["a"], unfinished, "--out", tmp_path / "out") == 2
    assert f"{unfinished}: phase 'decay' has no exports yet" in capsys.readouterr().err
    other_budget = tmp_path / "other-budget"
    _recipe(other_budget, phases=[PHASES[0], {**PHASES[1], "tokens": 8192}])
    _stub(other_budget / "export" / "decay")
    assert _analyze(runs["a"], other_budget, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "runs disagree on the budget of phase 'decay'" in err and "has 4096" in err and "has 8192" in err
    assert not (tmp_path / "out").exists()
