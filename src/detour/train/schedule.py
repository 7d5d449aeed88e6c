"""Learning-rate shapes, per phase, as a function of tokens (not steps).

    python -c "from detour.train.schedule import lr_at; from detour.config import LRSpec; \
print(lr_at(LRSpec(shape='1-sqrt'), 2e-4, 50, 100))"

t is the number of tokens the phase has consumed after the step, T the phase budget. The schedule
restarts at each phase. Warmup rises linearly to the peak; the decay shapes fall from the peak to
`final_lr_fraction` x peak at t = T:
    constant: 1
    1-sqrt:   f + (1 - f) (1 - sqrt(t / T))
    linear:   f + (1 - f) (1 - t / T)
    cosine:   f + (1 - f) (1 + cos(pi t / T)) / 2
"""

from __future__ import annotations

import math

from detour.config import LRSpec


def warmup_tokens(spec: LRSpec, total: int) -> int:
    if spec.warmup_tokens is not None:
        return spec.warmup_tokens
    if spec.warmup_fraction is not None:
        return int(round(spec.warmup_fraction * total))
    return 0


def lr_at(spec: LRSpec, peak: float, t: int, total: int) -> float:
    """LR for the step after which the phase has consumed t of its `total` tokens."""
    frac = min(max(t / total, 0.0), 1.0)
    f = spec.final_lr_fraction
    if spec.shape == "constant":
        decay = 1.0
    elif spec.shape == "1-sqrt":
        decay = f + (1 - f) * (1 - math.sqrt(frac))
    elif spec.shape == "linear":
        decay = f + (1 - f) * (1 - frac)
    elif spec.shape == "cosine":
        decay = f + (1 - f) * 0.5 * (1 + math.cos(math.pi * frac))
    else:  # pragma: no cover - the config's Literal forbids it
        raise ValueError(spec.shape)
    w = warmup_tokens(spec, total)
    warm = 1.0 if w == 0 else min(1.0, t / w)
    return peak * warm * decay
