"""Held-out texts for the analyses: n texts sampled with a seed, one sample per analysis seed.

    python -m detour.analysis.texts synthetic --n 3 --seed 0
    python -m detour.analysis.texts ../shared/data/corpora/en-biomed/pubmed-abstracts-1mb.txt --n 3 --seed 1

`synthetic` draws from the embedded SYNTHETIC clinical generator with generator seed
SYNTHETIC_SEED_BASE + seed, so the texts are not the ones a recipe trains on (generator seed 0 by
default, document i depending only on (seed, i)). Any other source is a corpus file or folder in
the syntax of `detour prepare` (`.txt` one document a line, `.jsonl` with a text field, `.parquet`,
a saved HF dataset): it is streamed once per seed and n non-empty documents are drawn uniformly
(reservoir sampling), so memory stays O(n) however large the corpus. The texts should be held out
from both models' training data; nothing here can check that.
"""

from __future__ import annotations

import argparse
import random

from detour.data.sources import iter_texts, parse_source
from detour.data.synthetic import generate_documents
from detour.errors import DetourError

# Far above the generator seeds a recipe uses (0 by default), so analysis texts are held out.
SYNTHETIC_SEED_BASE = 10_000


def sample_texts(source: str, n: int, seed: int, lang: str = "en", text_field: str = "text") -> list[str]:
    """n texts from `source` ('synthetic' or a corpus path), the same for the same (source, n, seed)."""
    if n < 1:
        raise DetourError(f"--n must be at least 1, got {n}")
    if source == "synthetic":
        return list(generate_documents(n, seed=SYNTHETIC_SEED_BASE + seed, lang=lang))
    src = parse_source(source, text_field=text_field)
    if src.weight is not None:
        raise DetourError(f"--texts {source!r}: a mixture weight has no meaning here; give the path alone")
    rng = random.Random(f"detour-analysis-texts:{seed}")
    chosen: list[str] = []
    seen = 0
    for text in iter_texts(src):
        if text is None or not text.strip():
            continue
        seen += 1
        if len(chosen) < n:
            chosen.append(text)
        else:
            j = rng.randrange(seen)
            if j < n:
                chosen[j] = text
    if seen < n:
        raise DetourError(f"--texts {source}: {seen} non-empty documents, fewer than --n {n}")
    return chosen


def is_synthetic(source: str) -> bool:
    return source == "synthetic" or source.startswith("synthetic:")


def main() -> None:
    parser = argparse.ArgumentParser(description="Print a seeded sample of held-out texts.")
    parser.add_argument("source", help="'synthetic' or a corpus file (.txt, .jsonl, .parquet)")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lang", default="en", choices=("en", "fr"))
    args = parser.parse_args()
    for text in sample_texts(args.source, args.n, args.seed, args.lang):
        print(text[:200].replace("\n", " "), "...\n")


if __name__ == "__main__":
    main()
