"""Nested NER: a span-based head over word-aligned sub-token spans, scored with strict nested span F1.

    detour eval <model folder> --tasks quaero-emea --seeds 1 --epochs 3 --max-train 200 --max-eval 200

Task type `nested_ner` (reads the `brat_nested` format, `detour.eval.brat`). Every span that starts
at a word's first sub-token and ends at a word's last sub-token, at most `options.max_width`
sub-tokens long (default 16), is a candidate. Its score is a small MLP over its endpoints,
GELU(A h_start + B h_end + width embedding) -> linear, giving one logit per entity type; a type is
predicted when its sigmoid is >= 0.5, and "none" is no type at all. Independent sigmoids rather
than a softmax over types + "none", because one span can carry two types (social history: "smokes"
is both the Tobacco event and its StatusTime). The loss is BCEWithLogits over all candidate spans,
with a per-type positive weight (negatives / positives in train, capped at `options.max_pos_weight`,
default 10) so the many "none" spans do not drown the rare entities. Simpler than the paper's
BiLSTM + CRF + biaffine French setting; predictions may nest and overlap freely.

Lines longer than the model's max length are cut into chunks of whole words. Gold entities that no
candidate can represent (a boundary inside a word, wider than max_width, across a chunk cut) stay in
the gold set, so they count as misses: the score is strict. The metric is strict nested span F1:
a predicted entity counts only if its exact character span and type are gold (micro and macro over
types present in gold or predictions, as for flat NER).

Plumbing note: the candidates of a sequence form a (length x max_width) grid; `detour.eval.finetune`
pads per-token feature keys listed in its `PADDED` table, so the grid travels as one key per width,
`span_w0` .. `span_w{W-1}`, each holding per start token the bitmask of the gold types (bit k for
type k; -100 where the cell is not a candidate). This module registers those keys.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from detour.errors import DetourError
from detour.eval import finetune as _finetune
from detour.eval.metrics import span_scores_from_sets
from detour.eval.tasks import register_task_type
from detour.eval.tasktypes import TaskType, _special_ids

MAX_WIDTH = 48  # largest options.max_width; one padded batch key per width
MAX_TYPES = 62  # the bitmask of a cell lives in an int64
for _w in range(MAX_WIDTH):
    _finetune.PADDED.setdefault(f"span_w{_w}", -100)


def nested_span_scores(gold: list[set], pred: list[set]) -> dict[str, float]:
    """Strict nested span F1 over per-example sets of (start, end, type): exact span and type."""
    return span_scores_from_sets([set(g) for g in gold], [set(p) for p in pred])


class SpanHead(nn.Module):
    """Scores every (start, width) cell: GELU(A h_start + B h_end + E_width) -> one logit per type."""

    def __init__(self, hidden: int, n_types: int, max_width: int, dropout: float = 0.1,
                 pos_weight: torch.Tensor | None = None, inner: int = 256):
        super().__init__()
        inner = min(inner, hidden)
        self.max_width, self.n_types = max_width, n_types
        self.dropout = nn.Dropout(dropout)
        self.start, self.end = nn.Linear(hidden, inner), nn.Linear(hidden, inner, bias=False)
        self.width = nn.Embedding(max_width, inner)
        self.out = nn.Linear(inner, n_types)
        self.register_buffer("pos_weight", pos_weight if pos_weight is not None else torch.ones(n_types))
        self.register_buffer("bits", 2 ** torch.arange(n_types, dtype=torch.long))

    def forward(self, hidden, batch):
        h = self.dropout(hidden)
        start, end = self.start(h), self.end(h)  # (B, L, d)
        length = h.shape[1]
        # end vector of the cell (p, w) is the one at p + w (zeros past the end; those cells are never candidates)
        ends = torch.stack([nn.functional.pad(end[:, w:], (0, 0, 0, min(w, length)))[:, :length] for w in range(self.max_width)], 2)
        z = nn.functional.gelu(start.unsqueeze(2) + ends + self.width.weight)  # (B, L, W, d)
        logits = self.out(self.dropout(z))  # (B, L, W, types)
        loss = None
        if "span_w0" in batch:
            cells = torch.stack([batch[f"span_w{w}"] for w in range(self.max_width)], 2)  # (B, L, W)
            valid = cells >= 0
            target = ((cells[valid].unsqueeze(-1) & self.bits) > 0).to(logits.dtype)
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits[valid], target, pos_weight=self.pos_weight.to(logits.dtype)
            )
        return logits.flatten(2), loss  # (B, L, W * types): token-shaped, as the harness expects


class NestedNER(TaskType):
    """Nested / overlapping NER over BRAT lines with the span head (see the module docstring)."""

    name = "nested_ner"
    metrics = ("micro_f1", "macro_f1", "precision", "recall")
    per_type_f1 = True
    example_keys = ("tokens", "word_spans", "entities")
    spec_options = ("max_width", "max_pos_weight")

    def gold_labels(self, examples):
        return {t for ex in examples for _, _, t in ex["entities"]}

    def label_set(self, spec, train):
        found = sorted({t for ex in train for _, _, t in ex["entities"]})
        labels = spec.labels or found
        unknown = sorted(set(found) - set(labels))
        if unknown:
            raise DetourError(f"task {spec.name}: train has entity types {unknown} not in the spec's labels {labels}")
        if len(labels) > MAX_TYPES:
            raise DetourError(f"task {spec.name}: {len(labels)} entity types; the span head takes at most {MAX_TYPES}")
        return labels

    @staticmethod
    def _width(spec) -> int:
        width = int(spec.options.get("max_width", 16))
        if not 1 <= width <= MAX_WIDTH:
            raise DetourError(f"task {spec.name}: options.max_width must be in 1..{MAX_WIDTH}, got {width}")
        return width

    def encode(self, examples, tokenizer, spec, labels, max_length):
        width = self._width(spec)
        index = {t: k for k, t in enumerate(labels)}
        prefix, suffix = _special_ids(tokenizer)
        room = max_length - len(prefix) - len(suffix)
        enc = tokenizer([ex["tokens"] for ex in examples], is_split_into_words=True, add_special_tokens=False)
        features = []
        for i, ex in enumerate(examples):
            ids, words = enc["input_ids"][i], enc.word_ids(i)
            for lo, hi in _chunks(words, room):
                features.append(self._feature(i, ex, ids[lo:hi], words[lo:hi], prefix, suffix, width, index))
        return features

    @staticmethod
    def _feature(i, ex, ids, words, prefix, suffix, width, index) -> dict:
        n = len(prefix) + len(ids) + len(suffix)
        first_char, last_char = [-1] * n, [-1] * n
        first_pos, last_pos = {}, {}
        for j, w in enumerate(words):
            p = len(prefix) + j
            if j == 0 or words[j - 1] != w:
                first_char[p], first_pos[w] = ex["word_spans"][w][0], p
            if j == len(words) - 1 or words[j + 1] != w:
                last_char[p], last_pos[w] = ex["word_spans"][w][1], p
        start_word = {ex["word_spans"][w][0]: w for w in first_pos}
        end_word = {ex["word_spans"][w][1]: w for w in last_pos}
        grid = np.full((n, width), -100, dtype=np.int64)
        for p in range(n):
            if first_char[p] < 0:
                continue
            for w in range(min(width, n - p)):
                if last_char[p + w] >= 0:
                    grid[p, w] = 0
        for s, e, t in ex["entities"]:
            if s in start_word and e in end_word and t in index:
                p, q = first_pos[start_word[s]], last_pos[end_word[e]]
                if 0 <= q - p < width:
                    grid[p, q - p] |= 1 << index[t]
        feature = {"example": i, "input_ids": prefix + list(ids) + suffix, "first_char": first_char, "last_char": last_char}
        feature.update({f"span_w{w}": grid[:, w].tolist() for w in range(width)})
        return feature

    def build_head(self, hidden, spec, labels, train_features):
        width = self._width(spec)
        cells = np.concatenate([np.stack([f[f"span_w{w}"] for w in range(width)], 1).ravel() for f in train_features])
        cells = cells[cells >= 0]
        pos = np.array([np.count_nonzero(cells & (1 << k)) for k in range(len(labels))], dtype=np.float64)
        cap = float(spec.options.get("max_pos_weight", 10.0))
        pos_weight = torch.tensor(np.clip((len(cells) - pos) / np.maximum(pos, 1.0), 1.0, cap), dtype=torch.float)
        return SpanHead(hidden, len(labels), width, spec.training.dropout, pos_weight)

    def predict(self, logits, features, n_examples, labels):
        preds: list[set] = [set() for _ in range(n_examples)]
        n_types = len(labels)
        for lg, f in zip(logits, features):
            grid = lg.reshape(lg.shape[0], -1, n_types)  # (L, W, types)
            length, width = grid.shape[:2]
            first, last = np.asarray(f["first_char"]), np.asarray(f["last_char"])
            end_pos = np.arange(length)[:, None] + np.arange(width)[None, :]
            last_of = np.where(end_pos < length, last[np.minimum(end_pos, length - 1)], -1)
            candidate = (first[:, None] >= 0) & (last_of >= 0)
            for p, w, k in zip(*np.nonzero((grid >= 0.0) & candidate[:, :, None])):  # sigmoid >= 0.5
                preds[f["example"]].add((int(first[p]), int(last_of[p, w]), labels[k]))
        return preds

    def score(self, examples, predictions, labels):
        gold = [{(s, e, t) for s, e, t in ex["entities"]} for ex in examples]
        return nested_span_scores(gold, predictions)

    def baseline(self, train, n, labels):
        return [set() for _ in range(n)]  # no entity anywhere


def _chunks(words: list, room: int) -> list[tuple[int, int]]:
    """Sub-token ranges of at most `room`, cut between words (a word longer than room is cut)."""
    if not words:
        return [(0, 0)]
    out, lo = [], 0
    while lo < len(words):
        hi = min(lo + room, len(words))
        if hi < len(words):
            cut = hi
            while cut > lo + 1 and words[cut] == words[cut - 1]:
                cut -= 1
            hi = cut if cut > lo + 1 else hi
        out.append((lo, hi))
        lo = hi
    return out


register_task_type(NestedNER())
