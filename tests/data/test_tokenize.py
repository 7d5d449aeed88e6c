import json
import shutil

import pytest

from detour.data.tokenize import load_tokenizer, separator_policy, tokenizer_fingerprint
from detour.errors import DetourError


def test_fingerprint_is_stable_across_loads(minilm):
    assert tokenizer_fingerprint(load_tokenizer(str(minilm))) == tokenizer_fingerprint(load_tokenizer(str(minilm)))


def test_fingerprint_sees_the_normaliser_and_the_vocabulary(minilm, tmp_path):
    base = tokenizer_fingerprint(load_tokenizer(str(minilm)))
    cased = tmp_path / "cased"
    shutil.copytree(minilm, cased, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    state = json.loads((cased / "tokenizer.json").read_text())
    assert state["normalizer"]["lowercase"] is True
    state["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(state))
    config = json.loads((cased / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False  # transformers 5 rebuilds BERT's normaliser from this flag
    (cased / "tokenizer_config.json").write_text(json.dumps(config))
    cased_tok = load_tokenizer(str(cased))
    assert cased_tok("Fever")["input_ids"] != load_tokenizer(str(minilm))("Fever")["input_ids"]
    assert tokenizer_fingerprint(cased_tok) != base

    renamed = tmp_path / "vocab"
    shutil.copytree(minilm, renamed, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    state["normalizer"]["lowercase"] = True
    state["model"]["vocab"]["fever"], state["model"]["vocab"]["cough"] = (
        state["model"]["vocab"]["cough"], state["model"]["vocab"]["fever"])
    (renamed / "tokenizer.json").write_text(json.dumps(state))
    assert tokenizer_fingerprint(load_tokenizer(str(renamed))) != base


def test_separator_policy_uses_the_tokenizers_own_special_tokens(minilm):
    policy = separator_policy(load_tokenizer(str(minilm)))
    assert policy["template"] == "[CLS] ... [SEP]"
    assert policy["prefix_ids"] == [101] and policy["suffix_ids"] == [102] and not policy["append_eos"]


def test_unloadable_tokenizer_is_a_user_error(tmp_path):
    with pytest.raises(DetourError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path / "nowhere"))
