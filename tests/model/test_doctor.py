"""`detour doctor`: passes on real architectures, fails when the engine's mask builder is broken."""

from __future__ import annotations

import json

import pytest

import detour.model.masks as masks
from detour.cli import main
from detour.model import varlen


def run_doctor(capsys, *args) -> tuple[int, dict]:
    code = main(["doctor", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "varlen"])
def test_doctor_passes_on_tiny_modernbert(capsys, minilm, attn):
    code, verdict = run_doctor(capsys, "tiny-modernbert", "--attn", attn)
    assert code == 0 and verdict["ok"] and verdict["attn"] == {"varlen": varlen.NAME}.get(attn, attn)
    assert verdict["sliding_window_exercised"]  # 64 tokens > local_attention 8
    assert {c["objective"] for c in verdict["checks"]} == {"clm", "mlm"}
    # the varlen path against the dense masks, both objectives, whichever the model was loaded with
    parity = [c for c in verdict["checks"] if c["check"] == "varlen equals dense masks"]
    assert [c["objective"] for c in parity] == ["clm", "mlm"]
    assert all(c["dense"] == ("sdpa" if attn == "varlen" else attn) for c in parity)
    assert verdict["varlen_vs_dense_max_abs_diff"] == {c["objective"]: c["value"] for c in parity}
    assert all(0 <= c["value"] <= 1e-5 for c in parity)


@pytest.mark.parametrize("broken", ["causal", "boundaries"])
def test_doctor_fails_when_the_varlen_path_is_broken(capsys, minilm, monkeypatch, broken):
    real = varlen.packed_documents

    def packed(doc_ids, causal):
        if broken == "causal":
            return real(doc_ids, False)
        out = real(doc_ids, causal)  # every document boundary one token late
        cu = out.cu_seqlens.clone()
        cu[1:-1] += 1
        return varlen.PackedDocuments(cu, out.max_len + 1, out.causal, out.shape)

    monkeypatch.setattr(varlen, "packed_documents", packed)
    code, verdict = run_doctor(capsys, "tiny-modernbert")  # an sdpa model: only the parity check runs varlen
    failed = {(c["objective"], c["check"].split(" at ")[0]) for c in verdict["checks"] if not c["ok"]}
    assert code == 1
    want = {("clm", "varlen equals dense masks")} | ({("mlm", "varlen equals dense masks")} if broken == "boundaries"
                                                      else set())
    assert failed == want


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
    assert failed == {("clm", "causal"), ("clm", "varlen equals dense masks")}  # varlen stayed causal


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
