"""The stream checks meet arms that differ: the study's `streams` step, `detour twins` and compare_arms.

    .venv/bin/python -m pytest -q tests/study/test_streams.py

One tiny study (a ModernBERT of hidden 32, one step a phase) trains the detour, its twin and three
arms that each break the matching in one way: another `data.shuffle_seed`, a corpus with one word
(one token) changed, and a decay whose masks are drawn under another key (masks are keyed by the
seed and the phase's name). The study must stop at `streams`. Then the corpus under the parents'
feet changes by one token, and `detour twins --from` branches the detour and the twin from it: their
decays no longer continue their parents' streams. The corpus is 4 short documents, so every phase
reads every token several times and a single changed token is always seen.

The study's steps run their detour commands in this process instead of one process each: the same
commands, through the same CLI, without ~10 s of imports per step on 2 busy cores.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from detour.cli import main as detour
from detour.train.twins import SCHEMA, check_failures, compare_arms, describe_checks, read_checks

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny-modernbert.yaml"
TEXT = ("The patient presented with fever and a dry cough for three days.\n"
        "Chest radiograph showed a right lower lobe opacity consistent with pneumonia.\n"
        "She was treated with oral amoxicillin and recovered within a week.\n"
        "No history of smoking, diabetes or heart disease was reported.\n")
SETS = ["model.config.hidden_size=32", "model.config.intermediate_size=48", "model.config.num_hidden_layers=3",
        "model.config.num_attention_heads=2", "model.config.local_attention=16", "data.seq_len=64",
        "batch.global_sequences=4", "batch.micro_batch=4", "phases.0.tokens=256", "phases.0.lr.warmup_tokens=0",
        "phases.1.tokens=256", "checkpoint.every_tokens=100000", "card.license=other"]
pytestmark = pytest.mark.slow  # the module's fixture trains seven tiny runs: about 40 s on 2 busy cores
ALL_PASS = "same token counts: yes, same token stream: yes, same MLM masks where the arms' phases match: yes"


def _prepare(text_file: Path, text: str, tokenizer: Path, out: Path) -> Path:
    text_file.parent.mkdir(parents=True, exist_ok=True)
    text_file.write_text(text)
    assert detour(["prepare", str(text_file), "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "1",
                   "--overwrite"]) == 0
    return out


def _in_this_process(argv, log_path, child):
    return detour(argv)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = detour(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory, minilm):
    from detour.study import run as study_run

    root = tmp_path_factory.mktemp("streams")
    edited = TEXT.replace("dry cough", "wet cough")
    corpus = _prepare(root / "notes" / "corpus.txt", TEXT, minilm, root / "corpus")
    changed = _prepare(root / "edited" / "corpus.txt", edited, minilm, root / "changed")
    manifests = [json.loads((c / "manifest.json").read_text()) for c in (corpus, changed)]
    assert manifests[0]["tokens"] == manifests[1]["tokens"]  # one token replaced, none added
    sets = [f"data.sources=[{corpus}]", *SETS]
    spec = {"name": "mismatched", "description": "arms that each break the matching in one way",
            "train": {"recipe": str(RECIPE), "set": sets},
            "arms": {"shuffled": {"base": "baseline", "set": ["data.shuffle_seed=7"]},
                     "one-token": {"base": "baseline", "set": [f"data.sources=[{changed}]"]},
                     "other-masks": {"base": "baseline", "set": ["phases.1.name=decay-b"]}}}
    study = root / "study.yaml"
    study.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = root / "study"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(study_run, "run_command", _in_this_process)
        study_rc, study_out, study_err = _run(["study", str(study), "--out", str(out)])
    # the parents' corpus, edited by one word and prepared again in place; then a decay sweep branched from them
    _prepare(root / "notes" / "corpus.txt", edited, minilm, corpus)
    branched = root / "branched"
    twins_rc, twins_out, twins_err = _run(["twins", str(RECIPE), "--out", str(branched), "--from", str(out / "arms"),
                                           "--after-phase", "clm", "--no-progress",
                                           *[x for s in sets for x in ("--set", s)]])
    return SimpleNamespace(out=out, study_rc=study_rc, study_out=study_out, study_err=study_err,
                           branched=branched, twins_rc=twins_rc, twins_out=twins_out, twins_err=twins_err)


def _summaries(out: Path, *arms: str) -> dict[str, dict]:
    return {a: json.loads((out / "arms" / a / "summary.json").read_text()) for a in arms}


def test_the_study_stops_at_streams_naming_every_arm_that_differs(mismatched):
    assert mismatched.study_rc == 2, mismatched.study_out + mismatched.study_err
    assert ("  checks: same token counts: yes, same token stream: NO, same MLM masks where the arms' phases "
            "match: NO") in mismatched.study_out
    err = mismatched.study_err.splitlines()[-1]
    assert err.startswith("detour study: error: the arms' stream checks did not pass: same token counts: yes, "
                          "same token stream: NO, same MLM masks where the arms' phases match: NO (")
    for row in ("shuffled clm: DIFFERENT", "shuffled decay: DIFFERENT", "one-token clm: DIFFERENT",
                "one-token decay: DIFFERENT", "other-masks decay: equal, DIFFERENT masks"):
        assert row in err
    assert "baseline clm" not in err and "baseline decay" not in err  # the twin itself is matched
    assert f"see {mismatched.out.resolve() / 'twins.json'}" in err
    events = [json.loads(line) for line in (mismatched.out / ".study" / "log.jsonl").read_text().splitlines()]
    started = [e["step"] for e in events if e["event"] == "start"]
    assert started == ["train:detour", "train:baseline", "train:shuffled", "train:one-token", "train:other-masks",
                       "streams"]  # the report never runs on arms that are not matched
    assert ("streams", "done") not in [(e["step"], e["event"]) for e in events]
    saved = json.loads((mismatched.out / "twins.json").read_text())
    assert saved["schema"] == SCHEMA
    assert saved["checks"] == {"tokens_equal": True, "stream_hashes_equal": False, "mlm_masks_equal": False}


def test_a_twin_with_another_shuffle_seed_sees_another_stream(mismatched):
    report = compare_arms(_summaries(mismatched.out, "detour", "baseline", "shuffled"))
    assert report["checks"]["tokens_equal"] is True and report["checks"]["stream_hashes_equal"] is False
    assert report["stream_vs_detour"]["baseline"] == {"clm": "equal", "decay": "equal, same masks"}
    assert [r.split(",")[0] for r in report["stream_vs_detour"]["shuffled"].values()] == ["DIFFERENT", "DIFFERENT"]
    assert "shuffled clm: DIFFERENT" in check_failures(report, "twins.json")


def test_a_corpus_with_one_token_changed_is_another_stream(mismatched):
    report = compare_arms(_summaries(mismatched.out, "detour", "baseline", "one-token"))
    assert report["checks"]["tokens_equal"] is True and report["checks"]["stream_hashes_equal"] is False
    assert [r.split(",")[0] for r in report["stream_vs_detour"]["one-token"].values()] == ["DIFFERENT", "DIFFERENT"]
    assert "same token stream: NO" in describe_checks(report["checks"])


def test_a_decay_with_masks_drawn_under_another_key_has_other_masks(mismatched):
    summaries = _summaries(mismatched.out, "detour", "baseline", "other-masks")
    assert list(summaries["other-masks"]["phases"]) == ["mlm30", "decay-b"]
    report = compare_arms(summaries)
    assert report["checks"] == {"tokens_equal": True, "stream_hashes_equal": True, "mlm_masks_equal": False}
    assert report["stream_vs_detour"]["other-masks"] == {"clm": "equal", "decay": "equal, DIFFERENT masks"}
    assert check_failures(report, "twins.json").endswith(
        "(other-masks decay: equal, DIFFERENT masks); see twins.json")


def test_branches_whose_parents_saw_another_stream_fail_detour_twins(mismatched):
    assert mismatched.twins_rc == 2, mismatched.twins_out + mismatched.twins_err
    assert ("checks: same token counts: yes, same token stream: NO, same MLM masks where the arms' phases "
            "match: yes") in mismatched.twins_out
    report = json.loads((mismatched.branched / "twins.json").read_text())
    assert report["schema"] == SCHEMA and report["checks"]["stream_hashes_equal"] is False
    for arm in ("detour", "baseline"):
        assert report["arms"][arm]["branch"]["stream_continues_parent"]["decay"]["equal"] is False
        assert report["stream_vs_detour"][arm]["decay"] == "DIFFERENT from its parent's stream"
        assert f"{arm} decay: DIFFERENT from its parent's stream" in mismatched.twins_err
    assert f"see {mismatched.branched / 'twins.json'}" in mismatched.twins_err


def test_masks_that_could_not_be_compared_are_never_reported_equal(mismatched, tmp_path):
    from detour.report.collect import collect
    from detour.report.page import Page
    from detour.report.sections import design

    summaries = _summaries(mismatched.out, "detour", "baseline")
    assert compare_arms(summaries)["checks"] == {"tokens_equal": True, "stream_hashes_equal": True,
                                                 "mlm_masks_equal": True}
    for summary in summaries.values():  # as a summary.json written before masks were hashed
        for phase in summary["phases"].values():
            phase["mask_hash"] = None
    report = compare_arms(summaries)
    assert report["checks"] == {"tokens_equal": True, "stream_hashes_equal": True, "mlm_masks_equal": None}
    assert report["stream_vs_detour"]["baseline"]["decay"] == "equal, masks not compared (no mask hash)"
    assert describe_checks(report["checks"]).endswith("same MLM masks where the arms' phases match: not compared")
    assert "baseline decay: equal, masks not compared (no mask hash)" in check_failures(report, "twins.json")

    # a recipe with no MLM phase the arms share: nothing to compare, said so
    single = copy.deepcopy(summaries)
    for summary in single.values():
        summary["phases"] = dict(list(summary["phases"].items())[:1])
    assert compare_arms(single)["checks"]["mlm_masks_equal"] is None
    assert "no MLM phase of an arm matches" in check_failures(compare_arms(single), "twins.json")

    # a twins.json of schema 1 wrote `true` here; it is read as not compared, in the report too
    old = json.loads(json.dumps(report))
    del old["schema"]
    old["checks"]["mlm_masks_equal"] = True
    old["stream_vs_detour"] = {a: {p: r.split(",")[0] for p, r in rows.items()}
                               for a, rows in old["stream_vs_detour"].items()}
    assert read_checks(old)["mlm_masks_equal"] is None
    (tmp_path / "twins.json").write_text(json.dumps(old))
    page = Page()
    design(page, collect(tmp_path))
    assert "mlm_masks_equal **not compared**" in page.markdown()
    # while a schema-1 file whose rows show compared masks keeps its `true`
    compared = json.loads(json.dumps(compare_arms(_summaries(mismatched.out, "detour", "baseline"))))
    del compared["schema"]
    assert read_checks(compared)["mlm_masks_equal"] is True
    assert check_failures(compared, "twins.json") is None and describe_checks(read_checks(compared)) == ALL_PASS
