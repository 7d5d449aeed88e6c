"""Everything the loop needs before its first step: device, model, optimizer, data checks.

    python -c "from detour.config import load_recipe; from detour.train.setup import *; \
r = load_recipe('recipes/tiny-modernbert.yaml'); print(build_model(r, select_device('cpu'))[0])"
"""

from __future__ import annotations

from pathlib import Path

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
        device=device,  # decides attn_implementation auto
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
    groups = [{"params": decay, "weight_decay": spec.weight_decay / spec.lr, "decayed": True},
              {"params": plain, "weight_decay": 0.0, "decayed": False}]
    # The fused kernel (the HF Trainer's default, adamw_torch_fused) makes the same update in one pass
    # over the weights instead of a loop over tensors: over MiniLM's weights on 2 CPU cores about 6x
    # faster, several percent of a training step.
    try:
        return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype the fused kernel does not take
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


def model_depth(recipe: Recipe) -> int:
    """The encoder's number of layers, from its config alone (no weights loaded)."""
    from transformers import CONFIG_MAPPING

    from detour.model.load import _check_type, check_buildable, check_config_keys, load_config

    spec = recipe.model
    if spec.config is not None:
        fields = dict(spec.config)
        model_type = _check_type(fields.pop("model_type", None), "model.config.model_type")
        check_config_keys(model_type, fields)
        check_buildable(model_type, fields)
        return int(fields.get("num_hidden_layers", CONFIG_MAPPING[model_type]().num_hidden_layers))
    _, config = load_config(spec.source, what="model.source", trust_remote_code=spec.trust_remote_code)
    return int(config.num_hidden_layers)


def preflight(recipe: Recipe, out=None, data: bool = True, parent: bool = True) -> None:
    """Everything that can be known before any weight is loaded: `--dry-run` and every run call it.

    The model config's keys, every phase's freeze against the model's depth, every data source's
    manifest and tokenizer fingerprint, the held-out split of `validation:`, a branch's parent, and the output folder. A study checks its
    arms before its data are prepared and its parents trained: `data=False, parent=False`.
    """
    from detour.data.shards import prepared_fingerprint
    from detour.model.freeze import COMPONENTS, parse_layers

    depth = model_depth(recipe)
    for i, phase in enumerate(recipe.phases):
        if phase.freeze is None:
            continue
        if phase.freeze.layers is not None:
            try:
                parse_layers(phase.freeze.layers, depth)
            except DetourError as exc:
                raise DetourError(f"phases.{i}.freeze.layers ({phase.name}): {str(exc).removeprefix('freeze.layers: ')}") from None
        if phase.freeze.layers is None and not phase.freeze.components:
            raise DetourError(f"phases.{i}.freeze ({phase.name}): give layers, components or both")
        assert set(phase.freeze.components or ()) <= set(COMPONENTS)  # the config's Literal guarantees it
    fingerprints = {}
    for i, source in enumerate(recipe.data.sources if data else ()):
        try:
            fingerprints[source.path] = prepared_fingerprint(source.path)
        except (DetourError, OSError) as exc:
            raise DetourError(f"data.sources.{i}: {exc} (prepare it with `detour prepare ... --out {source.path}`)") from None
    if len(set(fingerprints.values())) > 1:
        raise DetourError(f"data.sources: the sources were prepared with different tokenizers: {fingerprints}")
    if data and recipe.validation is not None:
        from detour.train.validation import check_validation

        check_validation(recipe)
    from detour.data.tokenize import load_tokenizer, tokenizer_fingerprint

    spec = recipe.model
    tok_ref = resolve_model_ref(spec.tokenizer or spec.source)
    mine = tokenizer_fingerprint(load_tokenizer(tok_ref, trust_remote_code=spec.trust_remote_code))
    for i, (path, theirs) in enumerate(fingerprints.items()):
        if theirs != mine:
            raise DetourError(f"data.sources.{i}: {path} was tokenized with a different tokenizer than the model's "
                              f"({theirs[:12]} != {mine[:12]}); re-run `detour prepare` with --tokenizer set to the model's")
    from detour.model.card import check_card

    if data:  # synthetic data carry their own license: without the data it is not known yet
        check_card(recipe)  # the exports' model card needs a license: known now, not at the first export
    if recipe.branch is not None and parent:
        from detour.train.branch import branch_start

        branch_start(recipe)
    if out is not None:
        from detour.io import check_output_location

        check_output_location(out)
        check_out_is_not_data(recipe, out)


def check_out_is_not_data(recipe: Recipe, out) -> None:
    """A run folder inside a prepared corpus would mix checkpoints into the data (and a later
    `detour prepare --overwrite` of that corpus would refuse or delete them)."""
    where = Path(out).resolve()
    for i, source in enumerate(recipe.data.sources):
        data = Path(source.path).resolve()
        if where == data or data in where.parents:
            raise DetourError(f"--out {out}: is {'the' if where == data else 'inside the'} data folder of "
                              f"data.sources.{i} ({source.path}); give the run a folder of its own, e.g. "
                              f"--out runs/{recipe.name}")
