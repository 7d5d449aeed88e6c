"""The held-out split of `detour prepare --validation`: which documents of each source are held out,
and the source's shards split into training and held-out folders.

    python -c "from detour.data.holdout import held_out_documents; print(held_out_documents(100, 0.05, 0, 0))"

A fraction (0 < x < 1) or a count (1 or more) of each source's documents, drawn without
replacement from a generator seeded by the seed and the source's position, go to
DIR/validation/NAME, a prepared folder of its own; the rest stay in DIR/NAME. The held-out
manifest carries a hash of its token ids, so every arm can show it scored the same documents.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np

from detour.data.shards import ShardWriter
from detour.data.sources import Source
from detour.errors import DetourError

# The sub-folder holding the held-out documents (`--validation`): a prepared folder of its own.
VALIDATION_DIR = "validation"
BLOCK_DOCS = 4096  # documents read at a time while splitting a source


def validation_amount(text: str) -> float | int:
    """`--validation`: a fraction of documents (0 < x < 1) or a whole count of documents (1 or more)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.02 or a count such as 200, got {text!r}") from None
    if 0 < value < 1:
        return value
    if value >= 1 and value.is_integer() and "." not in text and "e" not in text.lower():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 (e.g. 0.02) or a whole count of "
                                     f"documents (e.g. 200), got {text!r}")


def check_validation_amount(validation: float | int, sources: list[tuple[Source, str | None]]) -> None:
    """Refuse, before anything is tokenized, an amount that is no fraction or count, or a count that
    would leave a synthetic source (whose size is known now) without a training document."""
    if isinstance(validation, bool) or not (isinstance(validation, int) and validation >= 1 or
                                            isinstance(validation, float) and 0 < validation < 1):
        raise DetourError(f"--validation: expected a fraction between 0 and 1 or a whole count of documents, "
                          f"got {validation!r}")
    for src, _ in sources:
        if src.synthetic and isinstance(validation, int) and validation >= src.options["docs"]:
            raise DetourError(f"--validation {validation}: {src.spec} has {src.options['docs']} documents; at least "
                              "one must stay for training (hold out fewer)")


def held_out_documents(n_documents: int, validation: float | int, seed: int, position: int) -> np.ndarray:
    """The sorted indices of a source's held-out documents: a seeded draw without replacement.

    A fraction holds out round(fraction x documents) of them, at least one.
    """
    k = validation if isinstance(validation, int) else max(1, round(validation * n_documents))
    if k >= n_documents:
        raise DetourError(f"--validation {validation}: would hold out {k} of {n_documents} documents; at least one "
                          "must stay for training")
    rng = np.random.default_rng([seed, position])
    return np.sort(rng.choice(n_documents, size=k, replace=False))


def hold_out(tmp: Path, name: str, spec: str, meta: dict, validation, seed: int, position: int,
              dtype) -> tuple[dict, dict]:
    """Split the source tokenized into tmp/NAME: held-out documents into tmp/validation/NAME, the rest
    back into tmp/NAME. Returns both manifests; the held-out one carries the hash of its tokens."""
    from detour.data.shards import PreparedCorpus

    whole = PreparedCorpus(tmp / name)
    held = held_out_documents(whole.num_documents, validation, seed, position)
    is_held = np.zeros(whole.num_documents, dtype=bool)
    is_held[held] = True
    train = ShardWriter(tmp / f"{name}.train", dtype)
    kept = ShardWriter(tmp / VALIDATION_DIR / name, dtype)
    digest = hashlib.sha256()
    for start in range(0, whole.num_documents, BLOCK_DOCS):
        block = range(start, min(start + BLOCK_DOCS, whole.num_documents))
        for writer, wanted in ((train, False), (kept, True)):
            docs = [whole.document(i) for i in block if is_held[i] == wanted]
            if docs:
                lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
                ids = np.concatenate(docs)
                writer.add(ids, lengths)
                if wanted:
                    digest.update(lengths.astype("<i8").tobytes())
                    digest.update(ids.astype("<i8").tobytes())
    del whole  # its memory maps, before its files go
    train_manifest = train.close({**meta, "validation_documents": len(held)})
    kept_manifest = kept.close({**meta, "split": VALIDATION_DIR, "hash": digest.hexdigest(), "seed": seed})
    shutil.rmtree(tmp / name)
    (tmp / f"{name}.train").rename(tmp / name)
    print(f"  {name}: held out {len(held):,} of {len(held) + train_manifest['documents']:,} documents "
          f"({kept_manifest['tokens']:,} tokens) from {spec}", file=sys.stderr)
    return train_manifest, kept_manifest


def split_hash(held_out: list[dict]) -> str:
    """One hash of the held-out split: its sources' names and token hashes, in order."""
    return hashlib.sha256("".join(f"{e['name']}:{e['hash']};" for e in held_out).encode()).hexdigest()
