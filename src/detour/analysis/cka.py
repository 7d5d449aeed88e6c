"""Per-layer linear CKA between two encoders (`detour analyze cka`): the measure, the features, the analysis.

    detour analyze cka runs/twins/detour/model runs/twins/baseline/model \
        --noise-floor runs/twins-seed2/baseline/model --texts synthetic --n 500 --seeds 3 --out runs/cka

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

`cka_analysis`: for each seed s, n held-out texts are sampled (`detour.analysis.texts`), every
model encodes them, and each hidden state's features give CKA(A_l, B_l). Per layer the output
holds the CKA mean and standard deviation over seeds and the divergence d = 1 - mean CKA. With a
noise floor C (an MLM twin of B trained with another seed) it adds d(C_l, B_l) and the seed-noise
ratio r_l = d(A_l, B_l) / d(C_l, B_l). Writes OUT/cka.json and OUT/cka.png (atomically).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from detour.analysis.layers import LAYERS_NOTE, layer_rows
from detour.analysis.models import check_same_depth, check_same_tokenizer, load_encoder
from detour.analysis.outputs import check_text_options, save_figure, select_device, write_result
from detour.analysis.texts import is_synthetic, sample_texts
from detour.errors import DetourError
from detour.eval.results import display_name
from detour.model.load import load_config, weights_hash

SCHEMA = "detour.cka/2"  # /2: "layer" is the transformer layer from 0 ("emb" the embeddings), beside "hidden_state"


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


# ---- `detour analyze cka`: the analysis, its JSON, figure and table ----

def cka_analysis(model_a: str, model_b: str, noise_floor: str | None = None, texts: str = "synthetic",
                 n: int = 500, seeds: int = 3, max_length: int = 256, batch_size: int = 16, lang: str = "en",
                 text_field: str = "text", device: str | None = None) -> dict:
    """Per-layer CKA of A with B (and of C with B) averaged over `seeds` samples of n texts."""
    check_text_options(n, seeds, max_length, batch_size)
    t0 = time.time()
    refs = {"model_a": model_a, "model_b": model_b}
    if noise_floor is not None:
        refs["noise_floor"] = noise_floor
    loaded = {role: load_config(ref) for role, ref in refs.items()}
    depth = check_same_depth(refs, {role: cfg for role, (_, cfg) in loaded.items()})
    dev = select_device(device)
    samples = [sample_texts(texts, n, seed, lang=lang, text_field=text_field) for seed in range(seeds)]
    encoders = {role: load_encoder(path, refs[role]) for role, (path, _) in loaded.items()}

    per_seed = {"ab": [], "cb": []}  # per seed, a list of L+1 CKA values
    for seed, sample in enumerate(samples):
        check_same_tokenizer(refs, {role: tok for role, (_, tok) in encoders.items()}, sample, max_length)
        feats = {role: layer_features(model, tok, sample, max_length, batch_size, dev)
                 for role, (model, tok) in encoders.items()}
        if any(len(f) != depth + 1 for f in feats.values()):
            raise DetourError(f"expected {depth + 1} hidden states per model, got "
                              f"{ {role: len(f) for role, f in feats.items()} }")
        try:
            per_seed["ab"].append([linear_cka(a, b) for a, b in zip(feats["model_a"], feats["model_b"])])
            if noise_floor is not None:
                per_seed["cb"].append([linear_cka(c, b) for c, b in zip(feats["noise_floor"], feats["model_b"])])
        except ValueError as exc:
            raise DetourError(f"seed {seed}: CKA undefined ({exc}); use more or more varied texts") from exc

    layers = layer_rows(per_seed["ab"], per_seed["cb"] if noise_floor is not None else None, depth)
    return {
        "schema": SCHEMA,
        "config": {
            "model_a": model_a, "model_b": model_b, "noise_floor": noise_floor,
            "weights_hash": {role: weights_hash(path) for role, (path, _) in loaded.items()},
            "texts": texts, "synthetic_texts": is_synthetic(texts), "lang": lang if is_synthetic(texts) else None,
            "n": n, "seeds": list(range(seeds)), "max_length": max_length, "batch_size": batch_size,
            "device": str(dev), "dtype": "float64",
            "features": LAYERS_NOTE,
            "cka": "linear CKA on centred features; divergence = 1 - mean CKA over seeds; std = sample std over seeds",
            "seed_noise_ratio": "d(model_a, model_b) / d(noise_floor, model_b); null when that floor is 0",
        },
        "num_layers": depth,
        "layers": layers,
        "seconds": round(time.time() - t0, 2),
    }


# ---- outputs ----

def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = result["layers"]
    x = [row["hidden_state"] for row in layers]
    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.errorbar(x, [row["divergence"] for row in layers], yerr=[row["cka_std"] for row in layers],
                marker="o", capsize=3, label=f"d(A, B): detour (A) {display_name(cfg['model_a'])} vs baseline (B) "
                      f"{display_name(cfg['model_b'])}")
    if cfg["noise_floor"] is not None:
        ax.errorbar(x, [row["noise_divergence"] for row in layers], yerr=[row["noise_cka_std"] for row in layers],
                    marker="s", ls="--", color="grey", capsize=3,
                    label=f"noise floor d(C, B): {display_name(cfg['noise_floor'])}")
    ax.set_xticks(x, [str(row["layer"]) for row in layers])
    ax.set_xlabel("layer (emb = embeddings; l = output of transformer layer l, from 0)")
    ax.set_ylabel("divergence 1 - linear CKA")
    ax.set_ylim(bottom=0)
    ax.set_title(f"per-layer CKA divergence, {cfg['n']} texts x {len(cfg['seeds'])} seeds"
                 + (" (synthetic texts)" if cfg["synthetic_texts"] else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_outputs(result: dict, out: Path) -> None:
    write_result(out, "cka", result, plot)


def _d(value: float) -> str:
    # Divergences between nearly unchanged layers are of order 1e-5: fixed decimals would show 0.
    return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    noise = cfg["noise_floor"] is not None
    console = Console()
    console.print(f"A = {cfg['model_a']}\nB = {cfg['model_b']}" + (f"\nC = {cfg['noise_floor']}" if noise else ""),
                  highlight=False)
    table = Table(title=f"linear CKA per layer, {cfg['n']} texts x {len(cfg['seeds'])} seeds (mean ± std)")
    table.add_column("layer")
    table.add_column("CKA(A,B)", justify="right")
    table.add_column("d(A,B)", justify="right")
    if noise:
        table.add_column("d(C,B)", justify="right")
        table.add_column("r = d(A,B)/d(C,B)", justify="right")
    for row in result["layers"]:
        cells = [row["name"], f"{row['cka_mean']:.4f} ± {row['cka_std']:.4f}", _d(row["divergence"])]
        if noise:
            ratio = row["seed_noise_ratio"]
            cells += [_d(row["noise_divergence"]), "-" if ratio is None else f"{ratio:.2f}"]
        table.add_row(*cells)
    console.print(table)
