"""What every analysis shares: its text and device options, and writing its figure then its JSON.

    python -c "from detour.analysis.outputs import write_result; \
write_result('runs/x', 'demo', {'schema': 'demo/1'}, lambda result, path: None)"

The figure is written first and the JSON last, each atomically: if OUT/<name>.json exists, the
analysis finished and its figure is complete.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from detour.io import atomic_write


def add_text_arguments(parser) -> None:
    """The held-out texts and encoding options of the CKA-based analyses (cka, trajectory)."""
    parser.add_argument("--texts", default="synthetic",
                        help="held-out texts: 'synthetic' (default; generator seeds 10000+) or a corpus file "
                             "(.txt one a line, .jsonl, .parquet) sampled per seed")
    parser.add_argument("--text-field", default="text", help="JSONL/Parquet field holding the text (default text)")
    parser.add_argument("--lang", default="en", choices=("en", "fr"), help="language of the synthetic texts")
    parser.add_argument("--n", type=int, default=500, help="texts per seed (default 500, as in the paper)")
    parser.add_argument("--seeds", type=int, default=3, help="independent text samples to average over (default 3)")
    parser.add_argument("--max-length", type=int, default=256,
                        help="tokens per text, special tokens included (default 256)")
    parser.add_argument("--batch-size", type=int, default=16, help="texts per forward pass (default 16)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")


def check_text_options(n: int, seeds: int, max_length: int, batch_size: int) -> None:
    from detour.errors import DetourError

    if n < 2:
        raise DetourError(f"--n must be at least 2 (CKA compares examples with each other), got {n}")
    if seeds < 1 or max_length < 2 or batch_size < 1:
        raise DetourError("--seeds and --batch-size must be at least 1, --max-length at least 2")


def select_device(device: str | None):
    """--device, or cuda when available; a clear error for cuda on a machine without it."""
    import torch

    from detour.errors import DetourError

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DetourError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    return dev


def save_figure(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_result(out: str | Path, name: str, result: dict, plot: Callable[[dict, Path], None]) -> None:
    """OUT/<name>.png, then OUT/<name>.json (written last: its presence means the run completed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / f"{name}.png")
    text = json.dumps(result, indent=2, allow_nan=False) + "\n"
    atomic_write(out / f"{name}.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
