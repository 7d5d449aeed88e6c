"""Token ids of documents for `detour prepare`, very long documents encoded piece by piece.

    python -c "from detour.data.encoder import Encoder; from detour.data import tokenize; \
t = tokenize.load_tokenizer('minilm-l6'); e = Encoder(t, tokenize.separator_policy(t)); print(e.encode(['a b'])[1])"

A fast tokenizer needs about 140 bytes of memory per character it encodes at once (a 50 MB
one-line document: some 7 GB). A document over CUT_CHARS is therefore encoded in pieces of about
PIECE_CHARS, cut only at a whitespace where the tokenizer is shown to give the same ids
(`Encoder.cut`), so the ids are exactly those of the whole document. Where no such cut exists,
`warn_long_document` says so before it is encoded.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np

# Long documents (see the module docstring). BYTES_PER_CHAR was measured: MiniLM's fast WordPiece
# tokenizer on 3 MB of PubMed text in one piece peaks at 410 MB above the process's baseline.
CUT_CHARS = 1_000_000
PIECE_CHARS = 1 << 18
BYTES_PER_CHAR = 140
SEAM_WINDOW = 2_000      # characters each side of a candidate cut that are tokenized to check it
SEAM_FAILURES = 64       # candidate cuts rejected in one document before the rest stays in one piece


# Parts of a fast tokenizer whose effect on a character depends only on the characters near it (and
# on the ends of the string, which the check of each cut covers); with a model that encodes each
# pre-token on its own, equal pre-tokens on both sides of a cut give equal ids.
_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip",
                      "Nmt", "Precompiled", "Prepend", "ByteLevel"}
_LOCAL_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "ByteLevel", "Metaspace",
                         "Punctuation", "Digits", "CharDelimiterSplit", "UnicodeScripts"}
_PRE_TOKEN_MODELS = {"WordPiece", "BPE", "Unigram", "WordLevel"}
_PAIRLESS_POST_PROCESSORS = {"BertProcessing", "RobertaProcessing", "TemplateProcessing", "ByteLevel"}
# Regular expressions that match runs of spaces only (or spaces at the ends of the text), as
# transformers' converters write them for SentencePiece models (XLM-R, CamemBERT, T5...).
_LOCAL_REGEXES = {" {2,}", r"\s+", r"\A +| +\z"}


def _not_local(part: dict | None, allowed: set[str], children: str) -> str | None:
    """Why a normalizer or pre-tokenizer (its tokenizer.json entry) may act across a cut, or None."""
    if part is None:
        return None
    kind = part.get("type")
    if kind == "Sequence":
        return next(filter(None, (_not_local(p, allowed, children) for p in part.get(children, []))), None)
    pattern = part.get("pattern") or {}
    if kind in ("Replace", "Split") and ("String" in pattern or pattern.get("Regex") in _LOCAL_REGEXES):
        return None  # a literal pattern (or a run of spaces) reaches only as far as its own length
    if kind == "ByteLevel" and part.get("use_regex") is False:
        return "its ByteLevel pre-tokenizer does not split the text"
    if kind not in allowed:
        return f"its {kind} step may act across a cut"
    return None


def _cut_blocker(tokenizer) -> str | None:
    """Why this tokenizer's documents cannot be cut into exactly equivalent pieces, or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "the tokenizer is a slow (Python) one"
    state = json.loads(backend.to_str())
    if state.get("pre_tokenizer") is None:
        return "the tokenizer has no pre-tokenizer, so its model sees the whole text at once"
    if (state.get("model") or {}).get("type") not in _PRE_TOKEN_MODELS:
        return f"its {state.get('model', {}).get('type')} model is not one that encodes pre-tokens one by one"
    post = state.get("post_processor")
    posts = post.get("processors", []) if post and post.get("type") == "Sequence" else [post] if post else []
    odd = [p.get("type") for p in posts if p.get("type") not in _PAIRLESS_POST_PROCESSORS]
    if odd:
        return f"its {odd[0]} post-processor is not a plain wrapper with special tokens"
    return (_not_local(state.get("normalizer"), _LOCAL_NORMALIZERS, "normalizers")
            or _not_local(state.get("pre_tokenizer"), _LOCAL_PRE_TOKENIZERS, "pretokenizers"))


_CANDIDATE_CUT = re.compile(r"(?<=\S)\s")  # the first whitespace after a word


class Encoder:
    """Token ids of documents: ordinary ones in batches, very long ones piece by piece.

    Every document becomes prefix + text ids + suffix, the tokenizer's own special tokens (or its
    EOS appended, see `tokenize.separator_policy`).
    """

    def __init__(self, tokenizer, policy: dict):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        if self.backend is not None:
            # Some tokenizer.json files carry a truncation setting: it must never cut a document.
            self.backend.no_truncation()
            self.backend.no_padding()
        self.prefix = list(policy["prefix_ids"])
        self.suffix = list(policy["suffix_ids"])
        # A tokenizer that adds no closing token gets its EOS appended by us (`separator_policy`).
        self.eos = self.suffix if policy["append_eos"] else []
        self.own_suffix = [] if policy["append_eos"] else self.suffix
        self.cut_blocker = _cut_blocker(tokenizer)
        if self.cut_blocker is None:
            self.added = sorted({t.content for t in self.backend.get_added_tokens_decoder().values()})
            norm, pre = self.backend.normalizer, self.backend.pre_tokenizer
            self._normalize = norm.normalize_str if norm is not None else (lambda text: text)
            self._pre_tokenize = pre.pre_tokenize_str

    def _batch(self, texts: list[str]) -> list[list[int]]:
        if self.backend is None:
            return self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=True)]

    def _ids(self, text: str, special: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=special).ids

    def encode(self, docs: list) -> tuple[np.ndarray, np.ndarray]:
        """Concatenated ids and lengths of `docs` (texts, or tuples of pieces from `cut`)."""
        texts = [d for d in docs if isinstance(d, str)]
        whole = iter(self._batch(texts) if texts else [])
        arrays = []
        for doc in docs:
            if isinstance(doc, str):
                arrays.append(np.asarray(next(whole) + self.eos, dtype=np.uint32))
            else:  # each piece's ids become a compact array at once: memory stays that of one piece
                parts = [np.asarray(self._ids(piece), dtype=np.uint32) for piece in doc]
                arrays.append(np.concatenate([np.asarray(self.prefix, dtype=np.uint32), *parts,
                                              np.asarray(self.suffix, dtype=np.uint32)]))
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        return np.concatenate(arrays), lengths

    def _exact_cut(self, text: str, k: int) -> bool:
        """Whether cutting `text` before position k leaves the ids unchanged.

        Checked on a window around k: no added token (e.g. "[SEP]" written in the text) nearby, the
        normalized pre-tokens of the window equal those of its two halves (so the model, which
        encodes pre-tokens one by one, sees the same ones), and so do the ids, with and without
        the special tokens the post-processor adds around them.
        """
        a, b = max(0, k - SEAM_WINDOW), min(len(text), k + SEAM_WINDOW)
        window, left, right = text[a:b], text[a:k], text[k:b]
        low, normalized = window.lower(), self._normalize(window)
        if any(t.lower() in low or t in normalized for t in self.added):
            return False

        def pieces(part: str) -> list[str]:
            return [p for p, _ in self._pre_tokenize(self._normalize(part))]

        if pieces(window) != pieces(left) + pieces(right):
            return False
        ids = self._ids(window)
        if ids != self._ids(left) + self._ids(right):
            return False
        return self._ids(window, special=True) == self.prefix + ids + self.own_suffix

    def _next_cut(self, text: str, target: int, budget: int) -> tuple[int | None, int]:
        """The first exact cut at or after `target` among `budget` candidates, and how many failed."""
        failed = 0
        for m in _CANDIDATE_CUT.finditer(text, target):
            if self._exact_cut(text, m.start()):
                return m.start(), failed
            failed += 1
            if failed == budget:
                break
        return None, failed

    def cut(self, text: str) -> tuple[list[str], str | None]:
        """`text` in pieces of about PIECE_CHARS whose ids, joined, are those of `text`.

        Returns the pieces and, when some piece had to stay longer than CUT_CHARS, why.
        """
        if self.cut_blocker is not None:
            return [text], self.cut_blocker
        pieces, start, target, failures = [], 0, PIECE_CHARS, 0
        while len(text) - start > PIECE_CHARS and failures < SEAM_FAILURES:
            cut, failed = self._next_cut(text, target, min(8, SEAM_FAILURES - failures))
            failures += failed
            if cut is None:
                if failed == 0:
                    break  # no whitespace after `target`: nothing left to cut at
                target += PIECE_CHARS  # a bad neighbourhood (added tokens, odd text): try further on
                continue
            pieces.append(text[start:cut])
            start, target = cut, cut + PIECE_CHARS
        pieces.append(text[start:])
        if max(len(p) for p in pieces) <= CUT_CHARS:
            return pieces, None
        return pieces, "no place to cut it where the tokenizer gives the same ids (e.g. no whitespace)"


def warn_long_document(where: str, chars: int, stretch: int, why: str) -> None:
    whole = "in one piece" if stretch == chars else f"partly in one piece of {stretch:,} characters"
    print(f"warning: {where}: a document of {chars:,} characters is tokenized {whole} ({why}); that takes "
          f"about {stretch * BYTES_PER_CHAR / 2**30:.1f} GiB of memory in one process. If it is really "
          "several documents, put one a line (or separate them by blank lines with --blank-line-docs).",
          file=sys.stderr)
