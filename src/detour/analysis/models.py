"""Loading the encoders an analysis compares, checking they are comparable, and naming their weights.

    python -c "from detour.analysis.models import load_encoder; print(load_encoder('minilm-l6', 'minilm-l6')[0].config.model_type)"

Every analysis loads Hugging Face encoder folders (or hub names, or the alias `minilm-l6`) through
`detour.model.load` as bare fp32 encoders (an MLM checkpoint loses its head; no remote code), refuses models of different depth
or tokenizer with an error that names them, and records each model's weight hash in its JSON so a
result says exactly which weights it measured.
"""

from __future__ import annotations

from detour.data.tokenize import load_tokenizer
from detour.errors import DetourError
from detour.model.load import load_encoder as load_encoder_weights


def load_encoder(path: str, ref: str):
    """(frozen fp32 encoder in eval mode, tokenizer); an MLM checkpoint loses its head, as wanted here."""
    tokenizer = load_tokenizer(path)
    model, _ = load_encoder_weights(path, name=ref)
    return model.eval().requires_grad_(False), tokenizer


def check_same_depth(refs: dict[str, str], configs: dict) -> int:
    """The shared number of transformer layers; DetourError if the models differ."""
    depths = {role: getattr(cfg, "num_hidden_layers", None) for role, cfg in configs.items()}
    for role, depth in depths.items():
        if not isinstance(depth, int):
            raise DetourError(f"{role} {refs[role]}: config has no num_hidden_layers; is it a text encoder?")
    if len(set(depths.values())) > 1:
        listed = ", ".join(f"{role} {refs[role]} has {d}" for role, d in depths.items())
        raise DetourError(f"layer counts differ ({listed}): per-layer analyses compare layer i of one model with "
                          "layer i of the other, so the models must have the same number of layers")
    return next(iter(depths.values()))


def check_same_tokenizer(refs: dict[str, str], tokenizers: dict, probe: list[str], max_length: int) -> None:
    """Every tokenizer has model A's vocabulary and splits the probe texts into the same ids."""
    ref_role = next(iter(tokenizers))
    vocab = tokenizers[ref_role].get_vocab()
    ids = tokenizers[ref_role](probe, truncation=True, max_length=max_length)["input_ids"]
    for role, tok in tokenizers.items():
        if role == ref_role:
            continue
        other = tok.get_vocab()
        if other != vocab:
            only_a = sorted(set(vocab) - set(other))[:3]
            only_b = sorted(set(other) - set(vocab))[:3]
            moved = sorted(t for t in set(vocab) & set(other) if vocab[t] != other[t])[:3]
            raise DetourError(
                f"tokenizers differ: {ref_role} {refs[ref_role]} has {len(vocab)} tokens, {role} {refs[role]} "
                f"has {len(other)} (only in the first: {only_a}, only in the second: {only_b}, other ids: {moved}); "
                "both models must share one tokenizer so that they read the same tokens")
        if tok(probe, truncation=True, max_length=max_length)["input_ids"] != ids:
            raise DetourError(f"tokenizers of {ref_role} {refs[ref_role]} and {role} {refs[role]} share a vocabulary "
                              "but split the texts differently (normalisation, lowercasing?); both models must "
                              "share one tokenizer")
