"""One layer numbering for every analysis and the report, and the per-layer CKA rows of cka and trajectory.

    python -c "from detour.analysis.layers import layer_rows; print(layer_rows([[0.9, 0.8, 0.7]], None, 2))"

"layer" is the transformer layer counted from 0, or "emb" for the embeddings, in cka.json,
trajectory.json, transplant.json, drift.json and the report; a CKA row also gives its
"hidden_state" (0 = embeddings, l + 1 = output of layer l), the index transformers' hidden states
use. No torch here: the report reads the numbering without loading a model library.
"""

from __future__ import annotations

import statistics

LAYERS_NOTE = ("mean over real (attention-masked) tokens of each hidden state; hidden state 0 = embeddings "
               "(layer 'emb'), hidden state l+1 = output of transformer layer l (before ModernBERT's final_norm)")


def layer_name(layer) -> str:
    return "embeddings" if layer == "emb" else f"layer {layer}"


def seed_stats(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def layer_rows(ab: list[list[float]], cb: list[list[float]] | None, depth: int) -> list[dict]:
    """Per hidden state (embeddings, then transformer layers 0..L-1), the CKA of A with B over seeds,
    its divergence, and with a noise floor C the same of C with B and the ratio r."""
    rows = []
    for state in range(depth + 1):
        values = [seed[state] for seed in ab]
        mean, std = seed_stats(values)
        layer = "emb" if state == 0 else state - 1
        row = {"layer": layer, "hidden_state": state, "name": layer_name(layer),
               "cka_mean": mean, "cka_std": std, "cka_per_seed": values, "divergence": 1.0 - mean}
        if cb is not None:
            noise = [seed[state] for seed in cb]
            n_mean, n_std = seed_stats(noise)
            d_noise = 1.0 - n_mean
            row.update(noise_cka_mean=n_mean, noise_cka_std=n_std, noise_cka_per_seed=noise,
                       noise_divergence=d_noise,
                       seed_noise_ratio=(1.0 - mean) / d_noise if d_noise > 0 else None)
        rows.append(row)
    return rows


def read_cka_layers(data: dict) -> list[dict]:
    """The rows of a cka.json in today's numbering; a detour.cka/1 file counted hidden states as "layer"."""
    rows = data.get("layers") or []
    if data.get("schema") != "detour.cka/1":
        return rows
    upgraded = []
    for row in rows:
        state = row.get("layer")
        layer = "emb" if state == 0 else state - 1 if isinstance(state, int) else state
        upgraded.append({**row, "layer": layer, "hidden_state": state, "name": layer_name(layer)})
    return upgraded
