"""Everything the loop needs before its first step: device, model, optimizer, data checks.

    python -c "from detour.config import load_recipe; from detour.train.setup import *; \
r = load_recipe('recipes/tiny-modernbert.yaml'); print(build_model(r, select_device('cpu'))[0])"
"""

from __future__ import annotations

import torch

from detour.config import OptimizerSpec, Recipe
from detour.errors import DetourError
from detour.paths import resolve_model_ref


def select_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise DetourError("device: cuda requested but no CUDA device is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice, local_rank) if choice == "cuda" else torch.device(choice)


def build_model(recipe: Recipe, device: torch.device):
    from detour.model.load import load_mlm_model

    spec = recipe.model
    model, tokenizer = load_mlm_model(
        resolve_model_ref(spec.source) if spec.source else None,
        config=spec.config,
        tokenizer=resolve_model_ref(spec.tokenizer) if spec.tokenizer else None,
        attn_implementation=spec.attn_implementation,
        trust_remote_code=spec.trust_remote_code,
        seed=recipe.seed,
    )
    return model.to(device), tokenizer


def build_optimizer(model, spec: OptimizerSpec) -> torch.optim.AdamW:
    """AdamW over every parameter, with Composer's decoupled weight decay (see detour.config).

    Frozen parameters stay in the optimizer (so their moments survive into a later phase that
    unfreezes them) but get no gradient, and torch's AdamW skips a parameter whose grad is None:
    no moment update and no weight decay.
    """
    from detour.model.freeze import no_decay_parameter_names

    no_decay = no_decay_parameter_names(model)
    decay, plain = [], []
    for name, param in model.named_parameters():
        (plain if name in no_decay else decay).append(param)
    groups = [{"params": decay, "weight_decay": spec.weight_decay / spec.lr},
              {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps)


def check_data_matches_tokenizer(recipe: Recipe, tokenizer) -> None:
    from detour.data.shards import prepared_fingerprint
    from detour.data.tokenize import tokenizer_fingerprint

    mine = tokenizer_fingerprint(tokenizer)
    for source in recipe.data.sources:
        theirs = prepared_fingerprint(source.path)
        if theirs != mine:
            raise DetourError(
                f"data.sources: {source.path} was tokenized with a different tokenizer than the model's "
                f"({theirs[:12]} != {mine[:12]}); re-run `detour prepare` with --tokenizer set to the model's")
