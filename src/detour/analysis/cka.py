"""Linear CKA between two feature matrices, and per-layer mean-pooled features of a frozen encoder.

    python -c "import numpy as np; from detour.analysis.cka import linear_cka; \
x = np.random.default_rng(0).normal(size=(100, 8)); print(linear_cka(x, 3 * x @ np.linalg.qr(x[:8])[0]))"

Linear CKA (Kornblith et al., 2019) of X (n x p) and Y (n x q), rows the same n examples, columns
centred: CKA = tr(KL) / sqrt(tr(K^2) tr(L^2)) with K = X X^T, L = Y Y^T (the kernel form), which
equals ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) (the feature form). The divergence is 1 - CKA.
Both are computed in float64 by default: the divergence between near-identical layers is a small
difference of numbers close to 1, and float32 loses it.

`layer_features` runs a frozen encoder over texts and returns, for each of its L+1 hidden states
(embeddings first, then the output of each transformer layer, before ModernBERT's final_norm),
the mean of each text's hidden vectors over its real (attention-masked) tokens: an (n x hidden)
float64 matrix per layer.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch


# ---- linear CKA ----

def _centred_unit(x, dtype, name: str) -> np.ndarray:
    """Columns centred, then scaled to unit Frobenius norm.

    CKA is invariant to isotropic scaling, so the scaling changes nothing mathematically; it keeps
    the fourth powers inside tr(K^2) away from underflow and overflow whatever the features' scale.
    """
    x = np.asarray(x, dtype=dtype)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D (examples x features) matrix, got shape {x.shape}")
    if x.shape[0] < 2:
        raise ValueError(f"{name}: CKA needs at least 2 examples, got {x.shape[0]}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: features contain NaN or infinite values")
    x = x - x.mean(axis=0, keepdims=True)
    norm = np.linalg.norm(x)
    if norm == 0:
        raise ValueError(f"{name}: features are identical for every example, so CKA is undefined")
    return x / norm


def _pair(x, y, dtype) -> tuple[np.ndarray, np.ndarray]:
    if np.shape(x)[:1] != np.shape(y)[:1]:
        raise ValueError(f"X and Y must have the same number of examples (rows): {np.shape(x)} vs {np.shape(y)}")
    return _centred_unit(x, dtype, "X"), _centred_unit(y, dtype, "Y")


def linear_cka(x, y, dtype=np.float64) -> float:
    """Linear CKA in the feature form, ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F), on centred columns.

    Costs O(n (p + q)^2): the cheaper form when the n examples outnumber the features. `dtype` exists
    to show why float64 is the default; use the default.
    """
    x, y = _pair(x, y, dtype)
    cross = np.linalg.norm(y.T @ x) ** 2
    value = cross / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
    return float(min(value, 1.0))  # rounding can exceed 1 by an ulp


def linear_cka_kernel(x, y, dtype=np.float64) -> float:
    """Linear CKA in the kernel form, tr(KL) / sqrt(tr(K^2) tr(L^2)), K = X X^T and L = Y Y^T centred.

    Costs O(n^2 (p + q)): the cheaper form when features outnumber examples. Equal to `linear_cka`.
    """
    x, y = _pair(x, y, dtype)
    k, l_ = x @ x.T, y @ y.T
    # tr(AB) = sum(A * B^T); K and L are symmetric.
    value = np.sum(k * l_) / np.sqrt(np.sum(k * k) * np.sum(l_ * l_))
    return float(min(value, 1.0))


# ---- per-layer features of a frozen encoder ----

def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, dim) -> (batch, dim) float64: the mean over positions where the mask is 1.

    Padded positions are excluded with a select, not a multiplication, so whatever the model put
    there (even NaN, which some attention kernels give a fully masked query) cannot leak in.
    """
    real = attention_mask.bool().unsqueeze(-1)
    summed = torch.where(real, hidden.to(torch.float64), 0.0).sum(dim=1)
    counts = real.sum(dim=1).to(torch.float64)
    if torch.any(counts == 0):
        raise ValueError("a text has no real tokens (all positions masked)")
    return summed / counts


def hidden_states(model, inputs: dict) -> tuple[torch.Tensor, ...]:
    """The L+1 hidden states of one forward pass: embeddings first, then each layer's output.

    transformers 5 replaces the last entry with `last_hidden_state`, which in ModernBERT has been
    through final_norm; `tie_last_hidden_states = False` keeps the last layer's own output, as
    transformers 4 returned it and as BERT and RoBERTa (no final norm) return it anyway.
    """
    model.config.tie_last_hidden_states = False
    accepted = inspect.signature(model.forward).parameters
    kwargs = {k: v for k, v in inputs.items() if k in accepted}
    out = model(**kwargs, output_hidden_states=True, return_dict=True)
    return tuple(out.hidden_states)


@torch.no_grad()
def layer_features(model, tokenizer, texts: Sequence[str], max_length: int = 256, batch_size: int = 16,
                   device: str | torch.device = "cpu") -> list[np.ndarray]:
    """Per layer (L+1 entries), an (n x hidden) float64 matrix of mean-pooled hidden states.

    The model is put in eval mode (no dropout) and run without gradients. Each text is truncated to
    `max_length` tokens (special tokens included); texts are batched by length to limit padding,
    and padding never changes a text's features (see `mean_pool`).
    """
    if not texts:
        raise ValueError("no texts to encode")
    if tokenizer.pad_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no padding token; batching needs one")
    model.eval().to(device)
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    features: list[np.ndarray] | None = None
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = tokenizer.pad([{k: encoded[k][i] for k in encoded} for i in idx], return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items()}
        states = hidden_states(model, batch)
        if features is None:
            features = [np.empty((len(texts), h.shape[-1]), dtype=np.float64) for h in states]
        for layer, h in enumerate(states):
            features[layer][idx] = mean_pool(h, batch["attention_mask"]).cpu().numpy()
    return features
