"""Loading: MiniLM (no MLM head) gets a tied fresh head; config-built models; clear errors."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from detour.errors import DetourError
from detour.model.load import load_mlm_model, special_token_ids, tiny_modernbert_config


def test_minilm_folder_loads_with_a_tied_fresh_head(minilm, caplog):
    with caplog.at_level(logging.INFO):
        model, tok = load_mlm_model(minilm, seed=0)
    assert type(model).__name__ == "BertForMaskedLM"
    assert model.dtype == torch.float32
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    fresh = [r for r in caplog.records if "no MLM head" in r.getMessage()]
    assert len(fresh) == 1 and "tied" in fresh[0].getMessage()
    assert not any("newly initialized" in r.getMessage() for r in caplog.records)
    assert (model.config.mask_token_id, model.config.pad_token_id) == (tok.mask_token_id, tok.pad_token_id) == (103, 0)
    assert model.config.is_decoder is False
    # the encoder weights are the package's, not random: MiniLM's first word embedding row
    from safetensors.torch import load_file

    stored = load_file(str(minilm / "model.safetensors"))
    key = next(k for k in stored if k.endswith("word_embeddings.weight"))
    assert torch.equal(model.get_input_embeddings().weight, stored[key])
    again, _ = load_mlm_model(minilm, seed=0)
    assert torch.equal(again.cls.predictions.transform.dense.weight, model.cls.predictions.transform.dense.weight)


def test_config_built_model_takes_vocab_and_special_ids_from_tokenizer(minilm, minilm_tokenizer):
    model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=3)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    assert model.config.vocab_size == len(minilm_tokenizer)
    ids = {n: getattr(model.config, f"{n}_token_id") for n in ("pad", "cls", "sep", "mask", "bos", "eos")}
    assert ids == {"pad": 0, "cls": 101, "sep": 102, "mask": 103, "bos": 101, "eos": 102}
    assert model.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    same, _ = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=3)
    other, _ = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=4)
    w = model.get_input_embeddings().weight
    assert torch.equal(w, same.get_input_embeddings().weight)
    assert not torch.equal(w, other.get_input_embeddings().weight)


def test_special_token_ids_cover_all_specials_and_padding(minilm_tokenizer):
    assert special_token_ids(minilm_tokenizer) == [0, 100, 101, 102, 103]


def test_unsupported_model_type_is_named(minilm, tmp_path):
    with pytest.raises(DetourError, match=r"'gpt2'.*modernbert, bert, roberta, camembert, xlm-roberta"):
        load_mlm_model(config={"model_type": "gpt2", "n_layer": 1}, tokenizer=minilm)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2}))
    with pytest.raises(DetourError, match="'gpt2' is not supported"):
        load_mlm_model(folder, tokenizer=minilm)


def test_bad_requests_are_user_errors(minilm, tmp_path):
    with pytest.raises(DetourError, match="tokenizer"):
        load_mlm_model(config=tiny_modernbert_config())
    with pytest.raises(DetourError, match="either"):
        load_mlm_model(minilm, config=tiny_modernbert_config(), tokenizer=minilm)
    with pytest.raises(DetourError, match="cannot"):
        load_mlm_model(tmp_path / "missing")


def test_a_checkpoint_with_its_head_loads_silently_and_intact(minilm, tmp_path, caplog):
    model, tok = load_mlm_model(minilm, seed=0)
    with torch.no_grad():
        model.cls.predictions.bias.add_(0.5)  # a trained-looking head, distinguishable from a fresh one
    model.save_pretrained(tmp_path / "with-head")
    tok.save_pretrained(tmp_path / "with-head")
    caplog.clear()  # the MiniLM load above rightly warned
    with caplog.at_level(logging.INFO):
        again, _ = load_mlm_model(tmp_path / "with-head", seed=1)
    assert not [r for r in caplog.records if "no MLM head" in r.getMessage()]
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight


def test_loading_leaves_transformers_progress_bars_as_it_found_them(minilm):
    from transformers.utils import logging as hf_logging

    from detour.model.load import load_mlm_model

    hf_logging.disable_progress_bar()
    try:
        load_mlm_model(minilm)
        assert not hf_logging.is_progress_bar_enabled()  # a silenced caller stays silent
    finally:
        hf_logging.enable_progress_bar()
    load_mlm_model(minilm)
    assert hf_logging.is_progress_bar_enabled()
