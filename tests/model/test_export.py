"""Export: a stock `AutoModelForMaskedLM` folder equal to the trained model, with a card; atomic."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForMaskedLM, pipeline

from detour.model.doctor import packed_batch
from detour.model.export import export_hf
from detour.model.load import config_special_ids, load_mlm_model, tiny_modernbert_config
from detour.model.objectives import clm_loss

CARD = {
    "base_model": "answerdotai/ModernBERT-base",
    "recipe": {"seed": 17, "phases": [{"name": "clm", "tokens": "10B"}]},
    "phases": [{"name": "clm", "objective": "clm", "tokens": 1000, "final_loss": 2.5},
               {"name": "decay", "objective": "mlm", "mask_rate": 0.15, "tokens": 100, "final_loss": 3.25}],
    "data": [{"path": "data/en-biomed", "weight": 1.0, "documents": 12}],
    "notes": "test export",
}


def train_a_little(model, steps=2):
    """A few real CLM steps, so the export carries trained (not initial) weights."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = packed_batch([[20, 12]], 32, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id)
    model.train()
    for _ in range(steps):
        clm_loss(model, batch).loss_sum.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.mark.parametrize("kind,attn", [("modernbert", "sdpa"), ("bert", "eager")])
def test_export_reloads_in_stock_transformers_with_equal_outputs(minilm, tmp_path, kind, attn):
    if kind == "modernbert":
        model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, attn_implementation=attn, seed=0)
    else:
        model, tok = load_mlm_model(minilm, attn_implementation=attn, seed=0)
    before = model.get_input_embeddings().weight.detach().clone()
    train_a_little(model)
    assert not torch.equal(before, model.get_input_embeddings().weight)
    out = export_hf(model, tok, tmp_path / "final", CARD)
    assert out == tmp_path / "final"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp folders left
    config = json.loads((out / "config.json").read_text())
    assert config["is_decoder"] is False and config["architectures"][0].endswith("ForMaskedLM")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    card = (out / "README.md").read_text()
    assert "base_model: answerdotai/ModernBERT-base" in card and "| decay | mlm | 0.15 | 100 |" in card
    assert "3.2500" in card and "data/en-biomed" in card

    reloaded = AutoModelForMaskedLM.from_pretrained(out, attn_implementation=attn).eval()
    ids = tok(["the patient was given aspirin .", "a short one"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model(**ids).logits
        theirs = reloaded(**ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-6
    fill = pipeline("fill-mask", model=str(out), device="cpu")
    predictions = fill("the patient was given [MASK] .")
    assert len(predictions) == 5 and all("token_str" in p for p in predictions)


def test_export_replaces_an_older_export_and_keeps_the_model_config(minilm, tmp_path):
    model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=0)
    target = tmp_path / "model"
    export_hf(model, tok, target, {"base_model": "/abs/path", "phases": []})
    (target / "stale.txt").write_text("from the older export")
    model.config.is_decoder = True  # even if something set it during training, it is never exported
    export_hf(model, tok, target, CARD)
    assert not (target / "stale.txt").exists()
    assert json.loads((target / "config.json").read_text())["is_decoder"] is False
    assert model.config.is_decoder is True  # the live model's config is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_bert_export_keeps_the_pretrained_pooler_for_classification(minilm, tmp_path):
    """Loading an export for classification reports only the new classifier as missing."""
    import subprocess
    import sys

    from safetensors import safe_open

    model, tok = load_mlm_model(minilm)
    assert set(model.extra_export_weights) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    out = export_hf(model, tok, tmp_path / "export", CARD)
    with safe_open(str(minilm / "model.safetensors"), "pt") as base, \
            safe_open(str(out / "model.safetensors"), "pt") as saved:
        assert torch.equal(saved.get_tensor("bert.pooler.dense.weight"), base.get_tensor("pooler.dense.weight"))
    # a clean interpreter with stock transformers, as a user would load it
    code = (
        "import sys, json\n"
        "from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, "
        "AutoModelForTokenClassification\n"
        "report = {}\n"
        "for cls in (AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, "
        "AutoModelForTokenClassification):\n"
        "    _, info = cls.from_pretrained(sys.argv[1], output_loading_info=True)\n"
        "    report[cls.__name__] = sorted(info['missing_keys'])\n"
        "print(json.dumps(report))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True)
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert missing["AutoModel"] == [] and missing["AutoModelForMaskedLM"] == []
    assert missing["AutoModelForSequenceClassification"] == ["classifier.bias", "classifier.weight"]
    assert missing["AutoModelForTokenClassification"] == ["classifier.bias", "classifier.weight"]


def test_the_exported_tokenizer_config_matches_the_model(minilm, tmp_path):
    from transformers import AutoTokenizer

    model, tok = load_mlm_model(None, config={**tiny_modernbert_config(), "max_position_embeddings": 1024},
                                tokenizer=minilm)  # more positions than the tokenizer's 512
    out = export_hf(model, tok, tmp_path / "export", CARD)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == model.config.max_position_embeddings == 1024
    assert not {"is_local", "local_files_only", "max_length"} & set(saved)
    assert AutoTokenizer.from_pretrained(out).model_max_length == 1024
