"""Loading the encoders an analysis compares, checking they are comparable, and naming their weights.

    python -c "from detour.analysis.models import *; print(weights_hash('minilm-l6'))"

Every analysis loads Hugging Face encoder folders (or hub names, or the alias `minilm-l6`) with
`AutoModel` (an MLM checkpoint loses its head; no remote code), refuses models of different depth
or tokenizer with an error that names them, and records each model's weight hash in its JSON so a
result says exactly which weights it measured.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from detour.errors import DetourError
from detour.quiet import quiet_transformers
from detour.paths import resolve_model_ref

def load_config(ref: str):
    from transformers import AutoConfig

    path = resolve_model_ref(ref)
    if not Path(path).exists() and (Path(path).is_absolute() or path.startswith((".", "~"))):
        raise DetourError(f"model {ref}: no such folder")
    try:
        return path, AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        where = "a folder without a usable config.json" if Path(path).is_dir() else "not a folder here, nor a hub model"
        raise DetourError(f"model {ref}: {where} ({exc})") from exc


def load_encoder(path: str, ref: str):
    import torch
    from transformers import AutoModel, AutoTokenizer

    # An MLM checkpoint loaded as its bare encoder makes transformers list the unused head weights;
    # dropping the head is what we want here.
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModel.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise DetourError(f"model {ref}: cannot load a tokenizer and encoder from {path} ({exc})") from exc
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


def weights_hash(ref: str) -> str:
    """sha256 over a model folder's weight files (safetensors, else bin), in name order.

    Two exports of the same weights hash equal whatever their path; a hub name not on disk gets
    the name itself, marked, since there are no local bytes to hash.
    """
    path = Path(resolve_model_ref(ref))
    files = (sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))) if path.is_dir() else []
    if not files:
        return f"unhashed:{ref}"
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()
