"""`detour report`: every section present shows the numbers of the file it came from; absent ones are listed."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from detour.cli import main as detour
from detour.errors import DetourError
from detour.report.render import write_report


def rows(md: str, first_cell: str) -> list[list[str]]:
    """The markdown table rows whose first cell is `first_cell`, as lists of cells."""
    out = []
    for line in md.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if cells and cells[0] == first_cell:
                out.append(cells)
    return out


def section(md: str, heading: str) -> str:
    """The text of one `## ` section."""
    start = md.index(f"## {heading}")
    end = md.find("\n## ", start + 1)
    return md[start:] if end < 0 else md[start:end]


def fixed(value, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def accuracy(cell: dict) -> str:
    """A needle cell as the report shows it: accuracy, its 95% interval from needle.json, the count."""
    if cell["accuracy"] is None:
        return "–"
    low, high = cell["ci"]
    return f"{cell['accuracy']:.3f} [{low:.3f}, {high:.3f}] (n {cell['n']})"


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_section_of_a_full_study_appears(study, report, shared_data):
    md = report["md"]
    for heading in ("1. Design", "2. Training curves", "3. Downstream results", "4. Freeze interventions",
                    "5. Per-layer CKA", "6. Trajectory", "7. Transplants", "8. Weight drift", "9. Needle"):
        assert f"## {heading}" in md
    assert "Not run: nothing" in md
    for name in ("curves", "validation", "results", "cka", "trajectory", "transplant", "drift", "needle"):
        assert f"(report-figures/{name}.png)" in md
        assert (report["markdown"].parent / "report-figures" / f"{name}.png").is_file()


def test_design_shows_arms_phases_data_and_stream_checks(study, report):
    md = section(report["md"], "1. Design")
    twins = load(study / "twins.json")
    for arm in ("detour", "baseline", "freeze-low-clm", "baseline-seed2"):
        summary = load(study / "arms" / arm / "summary.json")
        for phase, info in summary["phases"].items():
            (row,) = [r for r in rows(md, arm) if r[1] == phase]
            assert row[6] == f"{info['final_loss']:.4f}"
    (seed2,) = rows(md, "baseline-seed2")[:1]
    assert seed2[3] == "18"
    (freeze,) = rows(md, "freeze-low-clm")[:1]
    assert freeze[4] == "low = layers 0 during clm"  # 3 layers: low is layer 0
    manifest = load(Path(load(study / "arms" / "detour" / "recipe.json")["data"]["sources"][0]["path"]) / "manifest.json")
    source = manifest["sources"][0]
    (data_row,) = [r for r in md.splitlines() if source["input"] in r]
    assert f"{source['documents']:,}" in data_row and f"{source['tokens']:,}" in data_row and "SYNTHETIC" in data_row
    assert all(twins["checks"].values())
    assert "tokens_equal yes, stream_hashes_equal yes, mlm_masks_equal yes" in md


def test_design_says_what_each_arm_computed_on_and_a_resume_on_other_threads(study, report, tmp_path):
    md = section(report["md"], "1. Design")
    for arm in ("detour", "baseline", "freeze-low-clm", "baseline-seed2"):
        (session,) = load(study / "arms" / arm / "summary.json")["sessions"]
        (row,) = [r for r in rows(md, arm) if len(r) == 7 and r[1] == "0"]
        assert row[2:] == [str(session["threads"]), "1", "cpu", session["torch"], "yes"], row
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    path = copy / "arms" / "detour" / "summary.json"
    summary = load(path)
    (first,) = summary["sessions"]
    summary["sessions"].append(dict(first, from_step=7, threads=first["threads"] + 1))
    path.write_text(json.dumps(summary), encoding="utf-8")
    md = section(write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8"), "1. Design")
    (row,) = [r for r in rows(md, "detour") if len(r) == 7 and r[1] == "0, 7"]
    assert row[2] == f"{first['threads']}, {first['threads'] + 1}" and row[6].startswith("**no**"), row


def test_held_out_loss_figure_and_table_come_from_the_validation_records(study, report):
    md = section(report["md"], "2. Training curves")
    assert "### Held-out MLM loss" in md and "(report-figures/validation.png)" in md
    assert "identical sequences and masks: yes" in md  # twins.json's validation_equal
    header = next(line for line in md.splitlines() if line.startswith("| arm | start"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["arm", "start", "end of clm / mlm30", "end of decay"]
    ends = {}
    for arm in ("detour", "baseline", "freeze-low-clm", "baseline-seed2"):
        records = [json.loads(line) for line in (study / "arms" / arm / "metrics.jsonl").read_text().splitlines()]
        held_out = [r for r in records if r.get("kind") == "validation"]
        assert len(held_out) >= 4  # the start, every 512 tokens, each phase end
        first = held_out[1]["phase"]  # clm, or mlm30 in the baselines
        start, clm_end, decay_end = held_out[0], [r for r in held_out if r["phase"] == first][-1], held_out[-1]
        assert start["global_step"] == 0 and decay_end["phase"] == "decay"
        (row,) = rows(md, arm)
        assert row[1:] == [f"{r['mlm_loss']:.4f} ({100 * r['mlm_accuracy']:.1f}%)" for r in (start, clm_end, decay_end)]
        ends[arm] = (start, clm_end, decay_end)
    (diff,) = rows(md, "detour − baseline")
    assert diff[1:] == [f"{a['mlm_loss'] - b['mlm_loss']:.4f}" for a, b in zip(ends["detour"], ends["baseline"])]
    assert diff[1] == "0.0000"  # the same weights at the start: the same sequences and masks give the same loss


def test_synthetic_data_is_flagged_prominently(report):
    md, html = report["md"], report["html_text"]
    banner = md.splitlines()[2]
    assert banner.startswith("> **SYNTHETIC DATA:")
    assert "pretraining source" in banner and "needle haystacks of detour, baseline" in banner
    assert '<div class="synthetic" role="alert">SYNTHETIC DATA:' in html


def test_results_table_and_p_value_come_from_the_results_and_significance(study, report, shared_data):
    from detour.eval.paired import distinct_resamples
    from detour.eval.significance import compare
    from detour.report.page import p_value

    md = section(report["md"], "3. Downstream results")
    results = study / "eval" / "gad" / "results.json"
    runs = load(results)["runs"]
    label = {arm: next(r["model"] for r in runs if f"/{arm}/model" in r["model"]) for arm in ("detour", "baseline")}
    scores = np.array([r["metrics"]["macro_f1"] for r in runs if r["model"] == label["detour"]])
    (row,) = rows(md, "detour")[:1]
    assert row[1].strip("*") == f"{100 * scores.mean():.2f} ± {100 * scores.std(ddof=1):.2f}"
    assert "gad (macro_f1, 2 seeds)" in md
    expected = compare([results], label["detour"], label["baseline"], ["gad"], resamples=distinct_resamples([2]))
    (sig,) = [r for r in rows(md, "detour") if r[1] == "gad 2"]
    assert sig[2] == f"{100 * expected.delta:+.2f}"
    assert sig[3] == f"[{100 * expected.ci_low:+.2f}, {100 * expected.ci_high:+.2f}]"
    assert sig[4] == p_value(expected.p_value) and expected.exact and expected.patterns == 4  # the sign-flip p
    assert expected.p_value >= 0.05 and "not significant" in sig[5]
    assert "p (sign-flip)" in md and "paired sign-flip test over tasks x seeds" in md
    assert ("p: paired sign-flip test over tasks x seeds, two-sided, exact: all 2^2 = 4 sign patterns of the 2 paired "
            "differences; statistic: the mean over tasks of the mean difference; p cannot fall below 2/2^2 = 0.5000, "
            "so this design cannot show significance at 0.05: add seeds or tasks") in md
    assert "the interval rests on 3 bootstrap resamples, all the distinct ones this design allows" in md
    (task,) = expected.tasks
    assert f"Per task (p, Holm p): gad {p_value(task.p_value)}, {p_value(task.p_holm)}" in md
    assert "no task can be significant at 0.05 on its own: that needs 6 seeds a task with 1 task(s)" in md


def test_a_refused_design_shows_why_instead_of_a_p_value(study, tmp_path, shared_data):
    """One seed per task: significance refuses, and the report prints its reason."""
    results = load(study / "eval" / "gad" / "results.json")
    keep = [r for r in results["runs"] if r["seed"] == 0]
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("eval", "model", "export", "checkpoints"))
    from detour.eval.results import Results

    Results(copy / "eval" / "gad", keep).write()  # the results file `detour eval --seeds 1` would have written
    md = write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8")
    (sig,) = [r for r in rows(md, "detour") if r[1] == "gad 1"]
    assert sig[4] == "not computed"
    assert "detour vs baseline: no p-value: cannot compare" in md and "1 seed shared by the two models" in md


def test_an_arm_paired_with_its_own_twin_is_compared_with_it_and_the_twin_is_not_compared(study, tmp_path, shared_data):
    """study.json `against`: the decay-length design pairs each detour decay with the twin's decay of the same length."""
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    meta = load(copy / "study.json")
    meta["arms"]["freeze-low-clm"]["against"] = "baseline-seed2"
    (copy / "study.json").write_text(json.dumps(meta), encoding="utf-8")
    md = write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8")
    results = section(md, "3. Downstream results")
    assert "**Each arm against the arm it is paired with" in results
    assert [r[0] for r in rows(results, "freeze-low-clm vs baseline-seed2")] == ["freeze-low-clm vs baseline-seed2"]
    assert rows(results, "detour vs baseline") and not [line for line in results.splitlines()
                                                       if line.startswith("| baseline-seed2 vs")]
    held_out = section(md, "2. Training curves")
    (diff,) = rows(held_out, "freeze-low-clm − baseline-seed2")
    points = {a: [json.loads(line) for line in (copy / "arms" / a / "metrics.jsonl").read_text().splitlines()
                  if '"kind": "validation"' in line] for a in ("freeze-low-clm", "baseline-seed2")}
    assert diff[-1] == f"{points['freeze-low-clm'][-1]['mlm_loss'] - points['baseline-seed2'][-1]['mlm_loss']:.4f}"
    assert rows(held_out, "detour − baseline")


def test_fine_tunes_that_answered_alike_are_named_under_the_results(study, tmp_path, shared_data):
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    path = copy / "eval" / "gad" / "results.json"
    data = load(path)
    for r in data["runs"]:  # GAD is binary: the freeze arm's seed 1 gave every example one label
        alike = r["model"].endswith("freeze-low-clm/model") and r["seed"] == 1
        r["answers"] = {"distinct_predictions": 1 if alike else 2}
    path.write_text(json.dumps(data), encoding="utf-8")
    results = section(write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8"),
                      "3. Downstream results")
    assert "**Fine-tunes that answered alike for every test example**" in results
    assert "seeds of seeds run: gad: freeze-low-clm 1 of 2." in results

    for r in data["runs"]:
        r["answers"] = {"distinct_predictions": 2}
    path.write_text(json.dumps(data), encoding="utf-8")
    md = write_report(copy, tmp_path / "again")["markdown"].read_text(encoding="utf-8")
    assert "answered alike" not in md


def test_the_intro_ends_a_description_with_one_full_stop(study, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    meta = load(copy / "study.json")
    meta["description"] = "MiniLM on case reports, 3 seeds at each decay's end.\n"
    (copy / "study.json").write_text(json.dumps(meta), encoding="utf-8")
    md = write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8")
    assert "MiniLM on case reports, 3 seeds at each decay's end." in md and "decay's end.." not in md


def test_freeze_table_shows_results_and_low_layer_divergence(study, report):
    md = section(report["md"], "4. Freeze interventions")
    freeze = load(study / "analysis" / "cka-freeze-low-clm" / "cka.json")
    detour_cka = load(study / "analysis" / "cka" / "cka.json")
    low = [r for r in freeze["layers"] if r["layer"] == 0]  # low = layer 0 (hidden state 1)
    (row,) = rows(md, "freeze-low-clm")
    assert row[1] == "low = layers 0 during clm"
    assert row[5] == f"{low[0]['divergence']:.4f}" and row[6] == f"{low[0]['noise_divergence']:.4f}"
    (drow,) = rows(md, "detour")
    assert drow[5] == f"{detour_cka['layers'][1]['divergence']:.4f}"


def test_a_freeze_every_arm_shares_is_no_freeze_arm(study, tmp_path):
    """A head warm-up with the body frozen, in every arm's recipe, leaves the freeze table to the real interventions."""
    copy = tmp_path / "study"
    shutil.copytree(study, copy, symlinks=True, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    for arm in ("detour", "baseline", "baseline-seed2", "freeze-low-clm"):
        recipe = load(copy / "arms" / arm / "recipe.json")
        recipe["phases"][-1]["freeze"] = {"layers": "0"}
        (copy / "arms" / arm / "recipe.json").write_text(json.dumps(recipe), encoding="utf-8")
    md = section(write_report(copy, tmp_path / "out")["markdown"].read_text(encoding="utf-8"), "4. Freeze interventions")
    table = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ")][1:]
    assert table == ["baseline", "detour", "freeze-low-clm"]  # each once; the seed-2 twin is no intervention
    for arm in ("baseline", "detour", "baseline-seed2"):
        recipe = load(copy / "arms" / arm / "recipe.json")
        del recipe["phases"][-1]["freeze"]
        (copy / "arms" / arm / "recipe.json").write_text(json.dumps(recipe), encoding="utf-8")
    md = write_report(copy, tmp_path / "out2")["markdown"].read_text(encoding="utf-8")
    assert "## 4. Freeze interventions" in md  # without the shared freeze, the arm that freezes is still one
    assert not any(line.startswith("| baseline-seed2 |") for line in section(md, "4. Freeze interventions").splitlines())


def test_cka_rows_match_cka_json_with_noise_floor_and_r(study, report):
    md = section(report["md"], "5. Per-layer CKA")
    for folder in ("cka", "cka-freeze-low-clm"):
        data = load(study / "analysis" / folder / "cka.json")
        part = md[md.index(f"analysis/{folder}/cka.json"):]
        for layer in data["layers"]:
            row = rows(part, layer["name"])[0]
            assert row[1] == f"{layer['divergence']:.4f}"
            assert row[3] == f"{layer['noise_divergence']:.4f}"
            assert row[4] == f"{layer['seed_noise_ratio']:.2f}"
        assert f"{data['config']['n']} SYNTHETIC texts (embedded generator) per seed x 2 text seeds" in part


def test_trajectory_transplant_drift_and_needle_match_their_json(study, report, shared_data):
    md = report["md"]
    traj = load(study / "analysis" / "trajectory" / "trajectory.json")
    part = section(md, "6. Trajectory")
    assert len(traj["points"]) == 3  # start, 256 tokens into the decay, end
    for point in traj["points"]:
        g = point["groups"]["low"]
        assert f"{g['divergence']:.4f} / {g['noise_divergence']:.4f} / r {g['seed_noise_ratio']:.2f}" in part
    plant = load(study / "analysis" / "transplant" / "transplant.json")
    part = section(md, "7. Transplants")
    low = plant["tasks"][0]["blocks"]["low"]
    (row,) = rows(part, "low")
    assert row[1] == f"{100 * low['f1_mean']:.2f} ± {100 * low['f1_std']:.2f}"
    assert row[3] == fixed(low["recovery_of_means"], 3)  # None when the two arms tie: no gap to recover
    drift = load(study / "analysis" / "drift-detour" / "drift.json")
    (row,) = rows(section(md, "8. Weight drift"), "detour: detour vs baseline")
    assert row[1:4] == [f"{g['total']:.4f}" for g in drift["groups"]] and row[4] == f"{drift['total']:.4f}"
    part = section(md, "9. Needle")
    for arm in ("detour", "baseline"):
        test = load(study / "needle" / arm / "needle.json")["test"]
        row = rows(part, arm)[0]
        cells = [test["overall"], *test["per_length"].values(), *test["per_position"].values()]
        assert row[1:] == [accuracy(c) for c in cells]
        grid = part[part.index(f"{arm}, by length x position"):]
        for length, by_position in test["per_length_position"].items():
            assert rows(grid, length)[0][1:] == [accuracy(c) for c in by_position.values()]


def test_a_twins_folder_reports_what_it_has_and_lists_what_was_not_run(study, tmp_path):
    paths = write_report(study / "arms", tmp_path)  # `detour twins --out arms` wrote it
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "## 1. Design" in md and "## 2. Training curves" in md and "## 4. Freeze interventions" in md
    assert "## 3." not in md and "## 5." not in md and "## 9." not in md
    (line,) = [x for x in md.splitlines() if "Not run:" in x]
    for absent in ("downstream evaluation", "CKA detour vs baseline", "trajectory", "transplants", "weight drift",
                   "needle probe"):
        assert absent in line
    roles = {r[0]: r[1] for r in (rows(md, a)[0] for a in ("detour", "baseline", "freeze-low-clm", "baseline-seed2"))}
    assert roles == {"detour": "detour", "baseline": "baseline", "freeze-low-clm": "arm", "baseline-seed2": "arm"}
    assert "the baseline with seed = 18" in md  # the arm described by how its recipe differs


def test_html_is_self_contained_with_every_figure_embedded(report):
    html = report["html_text"]
    figures = sorted((report["markdown"].parent / "report-figures").glob("*.png"))
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == len(figures) == 8
    embedded = {base64.b64decode(s.split(",", 1)[1]) for s in sources if s.startswith("data:image/png;base64,")}
    assert embedded == {f.read_bytes() for f in figures}
    assert not re.search(r"<script|<link|https?://|src=\"(?!data:)", html)


def test_cli_end_to_end(study, tmp_path, capsys):
    assert detour(["report", str(study), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'r' / 'report.md'}" in out and f"wrote {tmp_path / 'r' / 'report.html'}" in out
    assert (tmp_path / "r" / "report.html").stat().st_size > 10_000


def test_default_out_is_the_run_dir(study, tmp_path):
    copy = tmp_path / "twins"
    shutil.copytree(study / "arms", copy, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    assert detour(["report", str(copy)]) == 0
    assert (copy / "report.md").is_file() and (copy / "report.html").is_file()
    assert (copy / "report-figures" / "curves.png").is_file()


def test_a_folder_of_neither_layout_is_an_error_naming_what_was_looked_for(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DetourError, match=r"neither a study folder \(no study.json.*nor a twins folder \(no twins.json"):
        write_report(tmp_path)
    assert detour(["report", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written


def test_a_malformed_analysis_is_an_error_naming_the_file(study, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns("model", "export", "checkpoints"))
    (copy / "analysis" / "cka" / "cka.json").write_text('{"schema": "detour.cka/1", "layers": [')
    with pytest.raises(DetourError, match=r"analysis/cka/cka.json: not valid JSON"):
        write_report(copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (copy / "study.json").write_text(json.dumps({"arms": {"detour": {"role": "twin"}}}))
    with pytest.raises(DetourError, match=r"study.json: arm 'detour' has role 'twin'"):
        write_report(copy, tmp_path / "out")
