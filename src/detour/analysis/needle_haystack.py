"""Haystacks and pairs for `detour needle`: a fact inserted into a document cut to a length in tokens.

    python -c "from detour.analysis.needle_haystack import *; from transformers import AutoTokenizer; \
from detour.paths import minilm_path; t = AutoTokenizer.from_pretrained(minilm_path()); \
h = Haystacks(read_haystack('synthetic', 'en', 5, 0), t); \
print(t.decode(make_pairs(1, [128], ['middle'], 'en', h, 0)[0].input_ids))"

A pair is `query [SEP] haystack` at the target length: the haystack is cut at a word boundary
(documents chained when one is too short), never the needle; retokenising at the seams may leave
it a token or so short. The needle goes at the start, the end, or the word start nearest the
middle (after a full stop if one is close). Labels alternate within every length x position cell.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from detour.errors import DetourError
from detour.analysis.needle_templates import TEMPLATES, Fact, make_fact


@dataclass
class Pair:
    fact: Fact
    length: int
    position: str
    input_ids: list[int]
    token_type_ids: list[int] | None


def read_haystack(source: str, lang: str, n_docs: int, seed: int) -> list[str]:
    """Documents from `synthetic`, a `.jsonl` file (field "text") or a text file (one a line)."""
    if source == "synthetic":
        from detour.data.synthetic import generate_documents

        return list(generate_documents(n_docs, seed=seed, lang=lang))
    path = Path(source)
    if not path.is_file():
        raise DetourError(f"--haystack {path}: no such file (or say `synthetic`)")
    docs = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DetourError(f"{path}:{lineno}: expected a JSON object with a 'text' field ({exc})") from exc
            else:
                text = line.strip()
            if text.strip():
                docs.append(text.strip())
    if not docs:
        raise DetourError(f"--haystack {path}: no documents in it")
    return docs


class Haystacks:
    """Tokenised documents, cut into haystacks of an exact number of tokens (documents chained)."""

    def __init__(self, docs: list[str], tokenizer):
        self.docs = docs
        self.tokenizer = tokenizer
        self._encoded: dict[int, list[tuple[int, int]]] = {}

    def _offsets(self, i: int) -> list[tuple[int, int]]:
        if i not in self._encoded:
            enc = self.tokenizer(self.docs[i], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            self._encoded[i] = [tuple(o) for o in enc["offset_mapping"]]
        return self._encoded[i]

    def cut(self, n_tokens: int, first_doc: int) -> tuple[str, list[int]]:
        """Text of at most `n_tokens` tokens from document `first_doc` on, ending on a whole word,
        and the char offset where each of its tokens starts."""
        text, starts = "", []
        i, whole_doc = first_doc, True
        while len(starts) < n_tokens:
            if i - first_doc > len(self.docs) + n_tokens:  # every document is empty of tokens
                raise DetourError("the haystack documents produce no tokens")
            doc, offsets = self.docs[i % len(self.docs)], self._offsets(i % len(self.docs))
            take = offsets[: n_tokens - len(starts)]
            i += 1
            if not take:
                continue
            base = len(text) + (1 if text else 0)
            text = (text + " " if text else "") + doc[: take[-1][1]]
            starts += [base + s for s, _ in take]
            whole_doc = len(take) == len(offsets)
        if not whole_doc:
            # End on a whole word: a word cut after one of its sub-tokens would retokenise differently.
            k = max((k for k in range(1, len(starts)) if text[starts[k] - 1].isspace()), default=len(starts))
            text, starts = text[: starts[k]].rstrip(), starts[:k]
        return text, starts


def _insertion_point(text: str, starts: list[int], position: str) -> int:
    """A char offset: 0, the end, or the word start nearest the middle (after a '.' if one is close)."""
    if position == "start":
        return 0
    if position == "end":
        return len(text)
    mid = len(starts) // 2
    word_starts = [k for k in range(1, len(starts)) if text[starts[k] - 1].isspace()]
    if not word_starts:
        return starts[mid] if starts else 0

    def after_period(k: int) -> bool:
        j = starts[k] - 1
        while j >= 0 and text[j].isspace():
            j -= 1
        return j >= 0 and text[j] == "."

    window = max(16, len(starts) // 8)
    sentence = [k for k in word_starts if abs(k - mid) <= window and after_period(k)]
    best = min(sentence or word_starts, key=lambda k: abs(k - mid))
    return starts[best]


def build_pair(fact: Fact, length: int, position: str, hay: Haystacks, first_doc: int) -> Pair:
    """Encode `query [SEP] haystack-with-needle` at exactly `length` tokens, never cutting the needle."""
    tok = hay.tokenizer
    fixed = len(tok(fact.query, fact.needle)["input_ids"])
    budget = length - fixed
    if budget < 8:
        raise DetourError(f"length {length} is too short: the query and the needle alone take {fixed} tokens")
    for _ in range(16):
        text, starts = hay.cut(budget, first_doc)
        at = _insertion_point(text, starts, position)
        haystack = " ".join(p for p in (text[:at].rstrip(), fact.needle, text[at:].lstrip()) if p)
        enc = tok(fact.query, haystack)
        excess = len(enc["input_ids"]) - length
        if excess <= 0:
            break
        budget -= excess  # retokenising at the seams can add a token or two: cut the haystack, not the needle
    else:
        raise DetourError(f"could not fit a haystack to {length} tokens")
    return Pair(fact, length, position, enc["input_ids"], enc.get("token_type_ids"))


def make_pairs(n: int, lengths: list[int], positions: list[str], lang: str, hay: Haystacks, seed: int) -> list[Pair]:
    """n pairs over lengths x positions; labels alternate within each cell; templates cycle."""
    rng = random.Random(seed)
    cells = [(length, pos) for length in lengths for pos in positions]
    names = list(TEMPLATES[lang])
    pairs = []
    for i in range(n):
        length, position = cells[i % len(cells)]
        label = 1 - (i // len(cells)) % 2
        fact = make_fact(names[i % len(names)], lang, label, rng)
        pairs.append(build_pair(fact, length, position, hay, rng.randrange(len(hay.docs))))
    return pairs
