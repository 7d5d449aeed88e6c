"""Tiny real models for the model-layer tests (random weights except MiniLM), built once per session."""

from __future__ import annotations

import pytest
import torch

from detour.model.load import load_mlm_model, tiny_modernbert_config

torch.set_num_threads(1)

TINY_ROBERTA = dict(
    model_type="roberta", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=130, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def build(kind: str, minilm, attn: str = "sdpa"):
    """(model, tokenizer) in eval mode: 'modernbert' (tiny, sliding layers), 'bert' (MiniLM), or a
    tiny 'roberta' / 'camembert' / 'xlm-roberta'."""
    if kind == "modernbert":
        model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, attn_implementation=attn, seed=0)
    elif kind == "bert":
        model, tok = load_mlm_model(minilm, attn_implementation=attn, seed=0)
    else:
        config = {**TINY_ROBERTA, "model_type": kind}
        model, tok = load_mlm_model(config=config, tokenizer=minilm, attn_implementation=attn, seed=0)
    return model.eval(), tok


@pytest.fixture(scope="session")
def models(minilm):
    cache = {}

    def get(kind: str, attn: str = "sdpa"):
        if (kind, attn) not in cache:
            cache[kind, attn] = build(kind, minilm, attn)
        return cache[kind, attn]

    return get
