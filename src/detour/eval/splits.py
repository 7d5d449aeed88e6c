"""Seeded splits by document, and the train/validation/test examples of a task.

    python -c "from detour.eval.tasks import load_spec; from detour.eval.splits import load_splits; \
print({k: len(v) for k, v in load_splits(load_spec('hoc')).items()})"

A document (an abstract, a file, a `-DOCSTART-` block) is never cut across splits. Where a task
has no validation split, `split.validation_from_train` of train's documents become validation;
where it has one file (`data.all`), its documents are split by `split.ratios`. The split seed is
the spec's (`split.seed`), not the run seed, so every model and every run seed sees the same splits.
"""

from __future__ import annotations

import random

from detour.eval.formats import read_split
from detour.eval.tasks import TaskSpec


def split_by_document(examples: list[dict], ratios: list[float], seed: int) -> list[list[dict]]:
    """Cut examples into len(ratios) parts by their `doc`, shuffled with `seed`; each part gets
    round(ratio * n_docs) documents (the last part takes the rest), at least one where possible."""
    docs = list(dict.fromkeys(ex["doc"] for ex in examples))  # first-seen order, deterministic
    random.Random(seed).shuffle(docs)
    total = sum(ratios)
    bounds, start = [], 0
    for i, r in enumerate(ratios):
        if i == len(ratios) - 1:
            end = len(docs)
        else:
            end = min(len(docs), start + max(1, round(r / total * len(docs))))
        bounds.append(set(docs[start:end]))
        start = end
    return [[ex for ex in examples if ex["doc"] in part] for part in bounds]


def load_splits(spec: TaskSpec) -> dict[str, list[dict]]:
    """{"train", "validation", "test"} -> examples, reading files and making missing splits."""
    seed = spec.split.seed
    if "all" in spec.data:
        train, validation, test = split_by_document(read_split(spec, "all"), list(spec.split.ratios), seed)
        return {"train": train, "validation": validation, "test": test}
    train = read_split(spec, "train")
    test = read_split(spec, "test")
    if "validation" in spec.data:
        validation = read_split(spec, "validation")
    else:
        frac = spec.split.validation_from_train
        train, validation = split_by_document(train, [1 - frac, frac], seed)
    return {"train": train, "validation": validation, "test": test}


def subsample(examples: list[dict], limit: int | None, seed: int = 0) -> list[dict]:
    """A seeded sample of at most `limit` examples, in their original order (same for all runs)."""
    if limit is None or len(examples) <= limit:
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]
