"""Parameter groups by encoder layer and component: what a phase freezes, what gets no weight decay.

    python -c "from detour.model.freeze import *; from detour.model.load import *; \
from detour.paths import minilm_path; m, _ = load_mlm_model(minilm_path()); \
print(sorted(frozen_parameter_names(m, '0-1', ['attention'])))"

Every parameter has a layer (its encoder layer index, or None outside the layers) and a component:
  attention  the self-attention block (q/k/v and output projections)
  mlp        the feed-forward block
  norm       LayerNorms (inside layers, and ModernBERT's final norm)
  embeddings the embedding block (its norm included)
  head       the MLM head (transform, decoder bias)
Names are those of `model.named_parameters()`, where a tied decoder weight appears once, as the
input embeddings: freezing "embeddings" freezes the tied output projection too, "head" does not.

Layer groups `low`, `mid` and `late` are the paper's 0-7 / 8-14 / 15-21 of ModernBERT-base's 22
layers, mapped proportionally to the model's depth (boundaries at round(8/22 L) and round(15/22 L)):
6 layers (MiniLM) give 0-1 / 2-3 / 4-5, 28 layers (ModernBERT-large) 0-9 / 10-18 / 19-27.
"""

from __future__ import annotations

from torch import nn

from detour.errors import DetourError
from detour.model.load import encoder_layers, head_module_names

COMPONENTS = ("attention", "mlp", "embeddings", "norm", "head")
# First path segment inside a layer -> component (ModernBERT: attn, mlp; BERT/RoBERTa: attention,
# intermediate, output). Norm modules are recognised by type first.
_LAYER_PARTS = {"attn": "attention", "attention": "attention", "mlp": "mlp", "intermediate": "mlp", "output": "mlp"}


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or "Norm" in type(module).__name__


def parameter_table(model) -> dict[str, tuple[int | None, str]]:
    """name -> (layer index or None, component) for every (deduplicated) parameter."""
    layers_name, layers = encoder_layers(model)
    embeddings_name = f"{model.base_model_prefix}.embeddings"
    heads = head_module_names(model)
    table = {}
    for name, _ in model.named_parameters():
        module = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        layer, component = None, "other"
        if name.startswith(layers_name + "."):
            index, _, rest = name[len(layers_name) + 1 :].partition(".")
            layer = int(index)
            component = "norm" if _is_norm(module) else _LAYER_PARTS.get(rest.partition(".")[0], "other")
        elif name.startswith(embeddings_name + "."):
            component = "embeddings"
        elif any(name == h or name.startswith(h + ".") for h in heads):
            component = "head"
        elif _is_norm(module):
            component = "norm"
        table[name] = (layer, component)
    return table


# The paper's groups on its 22-layer model: low 0-7, mid 8-14, late 15-21.
_PAPER_DEPTH, _PAPER_BOUNDS = 22, (8, 15)
GROUPS = ("low", "mid", "late")


def layer_group_ranges(n_layers: int) -> dict[str, range]:
    """`low`, `mid`, `late` for a model of `n_layers`, scaled from the paper's 22-layer split."""
    if n_layers < 3:
        raise DetourError(f"layer groups low/mid/late need at least 3 layers; this model has {n_layers}")
    lo, hi = (max(1, round(b * n_layers / _PAPER_DEPTH)) for b in _PAPER_BOUNDS)
    hi = min(max(hi, lo + 1), n_layers - 1)  # every group keeps at least one layer
    return {"low": range(0, lo), "mid": range(lo, hi), "late": range(hi, n_layers)}


def describe_groups(n_layers: int) -> str:
    """'low 0-1, mid 2-3, late 4-5 (of 6 layers)', as runs print it."""
    parts = [f"{name} {r.start}-{r.stop - 1}" if len(r) > 1 else f"{name} {r.start}"
             for name, r in layer_group_ranges(n_layers).items()]
    return f"{', '.join(parts)} (of {n_layers} layers)"


def parse_layers(spec: str, n_layers: int) -> set[int]:
    """ "0-7", "0-3,8", "low" or "low,mid" -> layer indices; DetourError when malformed or out of range.

    `low`, `mid` and `late` are the depth-scaled groups of `layer_group_ranges`.
    """
    chosen = set()
    for part in spec.split(","):
        part = part.strip()
        if part in GROUPS:
            chosen.update(layer_group_ranges(n_layers)[part])
            continue
        try:
            lo, _, hi = part.partition("-")
            lo, hi = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise DetourError(f"freeze.layers: {spec!r} is not like '0-7', '0-3,8' or one of low, mid, late") from None
        if not 0 <= lo <= hi < n_layers:
            raise DetourError(f"freeze.layers: {part!r} is out of range for a model with {n_layers} layers (0-{n_layers - 1})")
        chosen.update(range(lo, hi + 1))
    return chosen


def frozen_parameter_names(model, layers: str | None, components: list[str] | None) -> set[str]:
    """Names to freeze: whole layers, components in all layers, or their intersection."""
    if layers is None and not components:
        return set()
    unknown = sorted(set(components or ()) - set(COMPONENTS))
    if unknown:
        raise DetourError(f"freeze.components: {unknown} not among {', '.join(COMPONENTS)}")
    n_layers = len(encoder_layers(model)[1])
    chosen_layers = parse_layers(layers, n_layers) if layers is not None else None
    names = {
        name
        for name, (layer, component) in parameter_table(model).items()
        if (chosen_layers is None or layer in chosen_layers) and (not components or component in components)
    }
    if not names:
        raise DetourError(f"freeze: layers {layers!r} with components {components} select no parameter")
    return names


def layer_groups(model) -> list[list[str]]:
    """Parameter names of each encoder layer, in layer order."""
    groups = [[] for _ in range(len(encoder_layers(model)[1]))]
    for name, (layer, _) in parameter_table(model).items():
        if layer is not None:
            groups[layer].append(name)
    return groups


def no_decay_parameter_names(model) -> set[str]:
    """Biases and norm weights (the paper's optimizer applies no weight decay to them)."""
    names = set()
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if name.rpartition(".")[2].endswith("bias") or _is_norm(owner):
            names.add(name)
    return names


def apply_freeze(model, names: set[str]) -> None:
    """Set requires_grad from a frozen-name set (others trainable); the optimizer must skip them too."""
    for name, param in model.named_parameters():
        param.requires_grad_(name not in names)

