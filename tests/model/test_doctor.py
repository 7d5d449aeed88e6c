"""`detour doctor`: passes on real architectures, fails when the engine's mask builder is broken."""

from __future__ import annotations

import json

import pytest

import detour.model.masks as masks
from detour.cli import main


def run_doctor(capsys, *args) -> tuple[int, dict]:
    code = main(["doctor", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_doctor_passes_on_tiny_modernbert(capsys, minilm, attn):
    code, verdict = run_doctor(capsys, "tiny-modernbert", "--attn", attn)
    assert code == 0 and verdict["ok"] and verdict["attn"] == attn
    assert verdict["sliding_window_exercised"]  # 64 tokens > local_attention 8
    assert {c["objective"] for c in verdict["checks"]} == {"clm", "mlm"}


@pytest.mark.parametrize("name", ["folder", "minilm-l6"])  # the alias resolves here as in every verb
def test_doctor_passes_on_minilm(capsys, minilm, name):
    code, verdict = run_doctor(capsys, str(minilm) if name == "folder" else name, "--seq-len", "48")
    assert code == 0 and verdict["ok"] and verdict["model_type"] == "bert"
    assert "sliding_window_exercised" not in verdict


def test_doctor_fails_when_masks_ignore_causality(capsys, minilm, monkeypatch):
    real = masks.build_attention_mask
    monkeypatch.setattr(masks, "build_attention_mask", lambda model, doc_ids, causal: real(model, doc_ids, False))
    code, verdict = run_doctor(capsys, "tiny-modernbert")
    failed = {(c["objective"], c["check"].split(" at ")[0]) for c in verdict["checks"] if not c["ok"]}
    assert code == 1 and not verdict["ok"]
    assert failed == {("clm", "causal")}


def test_doctor_fails_when_masks_ignore_documents(capsys, minilm, monkeypatch):
    real = masks.build_attention_mask
    monkeypatch.setattr(masks, "build_attention_mask",
                        lambda model, doc_ids, causal: real(model, doc_ids.clamp(max=0), causal))
    code, verdict = run_doctor(capsys, str(minilm), "--seq-len", "32")
    failed = {(c["objective"], c["check"]) for c in verdict["checks"] if not c["ok"]}
    assert code == 1
    assert {("clm", "doc0->doc1 isolation"), ("mlm", "doc0->doc1 isolation"),
            ("mlm", "doc1->doc0 isolation")} <= failed


def test_doctor_fails_when_sliding_layers_are_not_causal(capsys, minilm, monkeypatch):
    real = masks.build_attention_mask

    def broken(model, doc_ids, causal):
        out = real(model, doc_ids, causal)
        out["sliding_attention"] = real(model, doc_ids, False)["sliding_attention"]
        return out

    monkeypatch.setattr(masks, "build_attention_mask", broken)
    code, verdict = run_doctor(capsys, "tiny-modernbert")
    assert code == 1
    assert all(not c["ok"] for c in verdict["checks"] if c["check"].startswith("causal"))
