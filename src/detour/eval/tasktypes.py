"""Task types: how a task's examples become model inputs, which head, how outputs become
predictions, and how they are scored. Registered by name in `detour.eval.tasks.TASK_TYPES`.

    python -c "from detour.eval.tasks import get_task_type; print(get_task_type('ner'))"

A task type implements `TaskType`'s methods. Every feature (one model input) carries `example`,
the index of the example it came from: long inputs split into windows give several features
per example, merged back in `predict` (token tasks: each word from the window where it sits most
centrally; text tasks: logits averaged over windows).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from detour.errors import DetourError
from detour.eval.heads import MultiLabelHead, SequenceHead, TokenHead
from detour.eval.metrics import classification_scores, multilabel_scores, span_scores
from detour.eval.tasks import TaskSpec, register_task_type


class TaskType:
    """Interface (and shared helpers) of a task type.

    The class attributes below let `detour.eval.validate` check a spec and its data before any
    training; a task type that leaves them None is simply not checked on that point.
    """

    name = ""
    metrics: tuple[str, ...] | None = None  # the metric names `score` returns whatever the labels
    per_type_f1 = False  # whether `score` also returns `f1/<type>` for each type of the label set
    example_keys: tuple[str, ...] | None = None  # keys every example of this type needs
    spec_options: tuple[str, ...] | None = None  # spec.options keys the type reads (besides the reader's)

    def metric_names(self, labels: list[str] | None) -> list[str] | None:
        """Every name a spec may give as `headline` (per-type names only once labels are known)."""
        if self.metrics is None:
            return None
        per_type = [f"f1/{t}" for t in self.types(labels)] if self.per_type_f1 and labels else []
        return [*self.metrics, *per_type]

    def types(self, labels: list[str]) -> list[str]:
        """The types behind `f1/<type>` metrics, from the label set."""
        return list(labels)

    gold_labels = None  # optional: examples -> set of the labels (entity types) in their gold

    def label_set(self, spec: TaskSpec, train: list[dict]) -> list[str]:
        raise NotImplementedError

    def encode(self, examples, tokenizer, spec: TaskSpec, labels: list[str], max_length: int) -> list[dict]:
        raise NotImplementedError

    def build_head(self, hidden: int, spec: TaskSpec, labels: list[str], train_features: list[dict]):
        raise NotImplementedError

    def predict(self, logits: list[np.ndarray], features: list[dict], n_examples: int, labels: list[str]) -> list:
        raise NotImplementedError

    def score(self, examples: list[dict], predictions: list, labels: list[str]) -> dict[str, float]:
        raise NotImplementedError

    def baseline(self, train: list[dict], n: int, labels: list[str]) -> list:
        """Predictions of the trivial baseline (majority / empty) for n examples."""
        raise NotImplementedError

    def __repr__(self):
        return f"<task type {self.name}>"


def _check_labels(found, labels, spec, field):
    unknown = sorted(set(found) - set(labels))
    if unknown:
        raise DetourError(f"task {spec.name}: train has {field} {unknown[:5]} not in the spec's labels {labels}")


class TokenClassification(TaskType):
    """Flat NER: word tags (IOB2 or IOBES) on each word's first sub-token, -100 elsewhere."""

    name = "ner"
    metrics = ("micro_f1", "macro_f1", "precision", "recall")
    per_type_f1 = True
    example_keys = ("tokens", "tags")
    spec_options = ()

    def types(self, labels):
        return sorted({t[2:] for t in labels if t != "O"})

    def gold_labels(self, examples):
        return {t[2:] for ex in examples for t in ex["tags"] if t != "O"}

    def label_set(self, spec, train):
        found = sorted({t for ex in train for t in ex["tags"]} - {"O"}, key=lambda t: (t[2:], t))
        if spec.labels is not None and "O" not in spec.labels:
            # index 0 stands for O in encode, so a label list without O would mislabel every outside word
            raise DetourError(f"{spec.source or 'task ' + spec.name}: labels: a ner label list needs 'O' "
                              f"(and the B-/I-/E-/S- tags), got {spec.labels}")
        labels = spec.labels or ["O", *found]
        _check_labels({t for ex in train for t in ex["tags"]}, labels, spec, "tags")
        return labels

    def encode(self, examples, tokenizer, spec, labels, max_length):
        index = {t: i for i, t in enumerate(labels)}
        prefix, suffix = _special_ids(tokenizer)
        room = max_length - len(prefix) - len(suffix)
        step = room - min(spec.stride, room // 2) if spec.long_inputs == "window" else None
        enc = tokenizer([ex["tokens"] for ex in examples], is_split_into_words=True, add_special_tokens=False)
        features = []
        for i, ex in enumerate(examples):
            ids, words = enc["input_ids"][i], enc.word_ids(i)
            starts = [0] if step is None else list(range(0, max(1, len(ids) - room + step), step))
            for start in starts:
                chunk_words = words[start : start + room]
                token_labels, word_of = [], []
                for j, w in enumerate(chunk_words):
                    first = w is not None and (start + j == 0 or words[start + j - 1] != w)
                    word_of.append(w if first else -1)
                    token_labels.append(index.get(ex["tags"][w], 0) if first else -100)
                pad = [-100] * len(prefix), [-100] * len(suffix)
                features.append({
                    "example": i,
                    "input_ids": prefix + ids[start : start + room] + suffix,
                    "token_labels": pad[0] + token_labels + pad[1],
                    "word_of": pad[0] + word_of + pad[1],
                })
        return features

    def build_head(self, hidden, spec, labels, train_features):
        return TokenHead(hidden, len(labels), spec.training.dropout)

    def predict(self, logits, features, n_examples, labels):
        best: list[dict[int, tuple[int, int]]] = [{} for _ in range(n_examples)]
        for lg, f in zip(logits, features):
            positions = [j for j, w in enumerate(f["word_of"]) if w >= 0]
            for j in positions:
                centrality = min(j, len(f["word_of"]) - 1 - j)
                w = f["word_of"][j]
                if w not in best[f["example"]] or centrality > best[f["example"]][w][0]:
                    best[f["example"]][w] = (centrality, int(lg[j].argmax()))
        # words cut off by truncation (no window) are predicted O
        return [{w: labels[k] for w, (_, k) in b.items()} for b in best]

    def score(self, examples, predictions, labels):
        pred_tags = [[p.get(w, "O") for w in range(len(ex["tags"]))] for ex, p in zip(examples, predictions)]
        return span_scores([ex["tags"] for ex in examples], pred_tags)

    def baseline(self, train, n, labels):
        return [{} for _ in range(n)]  # no entity anywhere


class TextClassification(TaskType):
    """Single-label classification of a text (linear head on CLS or mean pooling)."""

    name = "classification"
    metrics = ("accuracy", "micro_f1", "macro_f1", "weighted_f1")
    example_keys = ("text", "label")
    spec_options = ()

    def gold_labels(self, examples):
        return {ex["label"] for ex in examples}

    def label_set(self, spec, train):
        labels = spec.labels or sorted({ex["label"] for ex in train})
        _check_labels({ex["label"] for ex in train}, labels, spec, "labels")
        return labels

    def _target(self, ex, index):
        return {"label": index[ex["label"]]} if ex["label"] in index else {"label": -100}

    def encode(self, examples, tokenizer, spec, labels, max_length):
        index = {t: i for i, t in enumerate(labels)}
        return _encode_texts(examples, tokenizer, spec, max_length, lambda ex: self._target(ex, index))

    def build_head(self, hidden, spec, labels, train_features):
        return SequenceHead(hidden, len(labels), spec.pooling, spec.training.dropout)

    def predict(self, logits, features, n_examples, labels):
        return [labels[int(m.argmax())] for m in _mean_by_example(logits, features, n_examples)]

    def score(self, examples, predictions, labels):
        return classification_scores([ex["label"] for ex in examples], predictions)

    def baseline(self, train, n, labels):
        majority = Counter(ex["label"] for ex in train).most_common(1)[0][0]
        return [majority] * n


class RelationClassification(TextClassification):
    """Relation extraction as classification of a sentence whose entity pair is marked in the text
    (e.g. ChemProt's BC6ENTC / BC6ENTG, GAD's @GENE$ / @DISEASE$); markers stay plain text."""

    name = "relation"


class MultiLabelClassification(TaskType):
    """Multi-label classification: weighted BCEWithLogits, labels predicted at sigmoid >= 0.5."""

    name = "multilabel"
    max_pos_weight = 30.0
    metrics = ("accuracy", "micro_f1", "macro_f1", "weighted_f1", "samples_f1")
    example_keys = ("text", "labels")
    spec_options = ()

    def gold_labels(self, examples):
        return {lab for ex in examples for lab in ex["labels"]}

    def label_set(self, spec, train):
        labels = spec.labels or sorted({lab for ex in train for lab in ex["labels"]})
        _check_labels({lab for ex in train for lab in ex["labels"]}, labels, spec, "labels")
        return labels

    def encode(self, examples, tokenizer, spec, labels, max_length):
        index = {t: i for i, t in enumerate(labels)}

        def target(ex):
            vec = [0.0] * len(labels)
            for lab in ex["labels"]:
                if lab in index:
                    vec[index[lab]] = 1.0
            return {"label_vector": vec}

        return _encode_texts(examples, tokenizer, spec, max_length, target)

    def build_head(self, hidden, spec, labels, train_features):
        y = torch.tensor([f["label_vector"] for f in train_features])
        pos = y.sum(0)
        pos_weight = ((len(y) - pos) / pos.clamp_min(1.0)).clamp(1.0, self.max_pos_weight)
        return MultiLabelHead(hidden, len(labels), spec.pooling, spec.training.dropout, pos_weight)

    def predict(self, logits, features, n_examples, labels):
        out = []
        for m in _mean_by_example(logits, features, n_examples):
            out.append([labels[k] for k in np.flatnonzero(m >= 0.0)])  # sigmoid(x) >= 0.5 <=> x >= 0
        return out

    def score(self, examples, predictions, labels):
        index = {t: i for i, t in enumerate(labels)}
        gold, pred = np.zeros((len(examples), len(labels))), np.zeros((len(examples), len(labels)))
        for i, (ex, p) in enumerate(zip(examples, predictions)):
            for lab in ex["labels"]:
                if lab in index:
                    gold[i, index[lab]] = 1
            for lab in p:
                pred[i, index[lab]] = 1
        return multilabel_scores(gold, pred)

    def baseline(self, train, n, labels):
        majority = Counter(tuple(sorted(ex["labels"])) for ex in train).most_common(1)[0][0]
        return [list(majority)] * n


def _special_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single text ([CLS] .. [SEP], <s> .. </s>)."""
    probe = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("x"))
    full = tokenizer("x")["input_ids"]
    for k in range(len(full) - len(probe) + 1):
        if full[k : k + len(probe)] == probe:
            return full[:k], full[k + len(probe) :]
    return [], []


def _encode_texts(examples, tokenizer, spec, max_length, target) -> list[dict]:
    texts = [ex["text"] for ex in examples]
    if spec.long_inputs == "window":
        stride = min(spec.stride, (max_length - sum(map(len, _special_ids(tokenizer)))) // 2)
        enc = tokenizer(texts, truncation=True, max_length=max_length, stride=stride, return_overflowing_tokens=True)
        owners = enc["overflow_to_sample_mapping"]
    else:
        enc = tokenizer(texts, truncation=True, max_length=max_length)
        owners = range(len(texts))
    return [{"example": i, "input_ids": ids, **target(examples[i])} for ids, i in zip(enc["input_ids"], owners)]


def _mean_by_example(logits, features, n_examples) -> list[np.ndarray]:
    sums, counts = [None] * n_examples, [0] * n_examples
    for lg, f in zip(logits, features):
        i = f["example"]
        sums[i] = lg if sums[i] is None else sums[i] + lg
        counts[i] += 1
    return [s / c for s, c in zip(sums, counts)]


for _t in (TokenClassification(), TextClassification(), RelationClassification(), MultiLabelClassification()):
    register_task_type(_t)
