"""Transplant blocks: which parameters a block names, and a copy of one model with them taken from another.

    python -c "from detour.analysis.blocks import block_names; from detour.model.load import load_mlm_model; \
m, _ = load_mlm_model('minilm-l6'); print(len(block_names(m, 'low:attention')))"

A block is a layer group (`low`, `mid`, `late`, scaled to the depth as in freezing, or layers such
as `0-2`), a component (`attention`, `mlp`, `norm`, `embeddings`), both (`low:attention`), `all`
(the encoder body) or `none`, read from the same per-architecture table that freezing uses; the
MLM head is never part of a block.
"""

from __future__ import annotations

import copy

from detour.errors import DetourError

BLOCK_COMPONENTS = ("attention", "mlp", "norm", "embeddings")


def parse_block(block: str, n_layers: int) -> tuple[set[int] | None, str | None]:
    """(layers or None for any, component or None for any) of a block; DetourError when malformed.

    `all` and `none` are handled by `block_names`; here they are refused, as they have no parts.
    """
    from detour.model.freeze import parse_layers

    layers_part, sep, component = block.partition(":")
    if not sep:
        if block in BLOCK_COMPONENTS:
            return None, block
        layers_part, component = block, None
    elif component not in BLOCK_COMPONENTS:
        raise DetourError(f"--blocks {block!r}: {component!r} is not a component; use one of "
                          f"{', '.join(BLOCK_COMPONENTS)} after the colon")
    if not layers_part:
        raise DetourError(f"--blocks {block!r}: nothing before the colon; give layers such as low or 0-2")
    try:
        layers = parse_layers(layers_part, n_layers)
    except DetourError as exc:
        raise DetourError(f"--blocks {block!r} is not a block: {str(exc).removeprefix('freeze.layers: ')}; a block is "
                          f"low, mid, late, layers such as 0-2, a component ({', '.join(BLOCK_COMPONENTS)}), "
                          "both as low:attention, all, or none") from None
    return layers, component


def encoder_parameter_names(model) -> set[str]:
    """Every parameter of the encoder body: all of the masked-LM model's but the head's."""
    from detour.model.freeze import parameter_table

    return {name for name, (_, component) in parameter_table(model).items() if component != "head"}


def block_names(model, block: str) -> set[str]:
    """Names (as in `model.named_parameters()`) of a *ForMaskedLM model's parameters in `block`."""
    from detour.model.freeze import parameter_table
    from detour.model.load import encoder_layers

    if block == "none":
        return set()
    if block == "all":
        return encoder_parameter_names(model)
    layers, component = parse_block(block, len(encoder_layers(model)[1]))
    names = {name for name, (layer, comp) in parameter_table(model).items()
             if comp != "head" and (layers is None or layer in layers) and (component is None or comp == component)}
    if not names:
        raise DetourError(f"--blocks {block!r} selects no parameter of this model")
    return names


def transplant(src_model, dst_model, names: set[str]):
    """A copy of `dst_model` whose parameters `names` are those of `src_model` (neither input changes)."""
    import torch

    src, dst_params = dict(src_model.named_parameters()), dict(dst_model.named_parameters())
    missing = sorted(n for n in names if n not in src or n not in dst_params)
    if missing:
        raise DetourError(f"cannot transplant {missing[:3]}: not a parameter of both models")
    shapes = sorted(n for n in names if src[n].shape != dst_params[n].shape)
    if shapes:
        raise DetourError(f"cannot transplant {shapes[:3]}: shapes differ ({tuple(src[shapes[0]].shape)} vs "
                          f"{tuple(dst_params[shapes[0]].shape)})")
    out = copy.deepcopy(dst_model)  # deepcopy keeps weight ties, so a tied decoder follows its embeddings
    params = dict(out.named_parameters())
    with torch.no_grad():
        for name in names:
            params[name].copy_(src[name])
    return out
