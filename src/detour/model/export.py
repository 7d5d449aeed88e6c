"""Export a trained model as a plain Hugging Face masked-LM folder, with a Hub model card.

    python -c "from transformers import pipeline; print(pipeline('fill-mask', model='RUN/model')('the [MASK] was given.'))"

The folder holds config.json (never causal: `is_decoder` false), model.safetensors, the tokenizer
and README.md, the model card detour.model.card writes. It is written beside the target and
renamed into place, replacing an older export, so a reader never sees half a folder.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

from detour.errors import DetourError, NoSpaceError
from detour.io import is_disk_full, no_space
from detour.model.card import card_text


def export_hf(model, tokenizer, out_dir: str | Path, card: dict) -> Path:
    """Write `out_dir` atomically: config.json, model.safetensors, tokenizer files, README.md."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    old = out_dir.with_name(f"{out_dir.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    saved_config = model.config
    try:
        # export a copy of the config so training-time settings never leak into the saved one
        config = copy.deepcopy(saved_config)
        config.is_decoder = False
        config.add_cross_attention = False
        model.config = config
        model.save_pretrained(tmp, safe_serialization=True)
        _add_extra_weights(tmp, getattr(model, "extra_export_weights", None))
        tokenizer.save_pretrained(tmp)
        _fix_tokenizer_config(tmp / "tokenizer_config.json", model.config)
        (tmp / "README.md").write_text(card_text(card, model), encoding="utf-8")
        _check_config(tmp / "config.json")
        if out_dir.exists():
            # Exports taken during a phase live inside the phase's folder (export/decay/4096/):
            # they move into the new folder rather than leave with the old one.
            for sub in sorted(out_dir.iterdir()):
                if sub.is_dir() and sub.name.isdigit():
                    os.replace(sub, tmp / sub.name)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    except BaseException as exc:
        if out_dir.is_dir() and tmp.is_dir():  # failed before the swap: the sub-exports go back first
            for sub in tmp.iterdir():
                if sub.is_dir() and sub.name.isdigit():
                    os.replace(sub, out_dir / sub.name)
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            needed = sum(p.numel() * p.element_size() for p in model.parameters())
            raise NoSpaceError(no_space(f"export {out_dir}", out_dir.parent, exc, needed,
                                        "its temporary folder was removed and any earlier export is intact; "
                                        "free space, then rerun (a training run: with --resume)")) from None
        raise
    finally:
        model.config = saved_config
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


# Written by the loader or a call's defaults, not properties of the tokenizer a user should inherit.
_LOADER_ONLY_KEYS = ("is_local", "local_files_only", "max_length", "_commit_hash", "cache_dir")


def _fix_tokenizer_config(path: Path, config) -> None:
    """model_max_length from the model's own positions; no loader-only keys."""
    if not path.is_file():
        return
    saved = json.loads(path.read_text(encoding="utf-8"))
    for key in _LOADER_ONLY_KEYS:
        saved.pop(key, None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int):
        if config.model_type in ("roberta", "camembert", "xlm-roberta"):
            positions -= (config.pad_token_id or 0) + 1  # RoBERTa's positions start after the padding index
        saved["model_max_length"] = positions
    path.write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _add_extra_weights(folder: Path, extra: dict | None) -> None:
    """Write the base model's pooler (kept aside at load) into the export's weights file."""
    if not extra:
        return
    from safetensors.torch import load_file, save_file

    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:  # sharded exports: the pooler goes into its own file of the index
        raise DetourError(f"{folder}: expected one safetensors file to add the pooler to, found {len(files)}")
    weights = load_file(str(files[0]))
    weights.update({k: v for k, v in extra.items() if k not in weights})
    save_file(weights, str(files[0]), metadata={"format": "pt"})


def _check_config(path: Path) -> None:
    saved = json.loads(path.read_text())
    if saved.get("is_decoder"):
        raise DetourError(f"{path}: refusing to export a causal config (is_decoder true)")
