"""Scores: strict entity-level F1 for NER, F1 family and accuracy for (multi-label) classification.

    python -c "from detour.eval.metrics import span_scores; \
print(span_scores([['B-X','I-X','O']], [['B-X','I-X','O']]))"

Each score also counts what the model answered (`distinct_predictions`, `predicted_entities`), so
that a fine-tune that answered alike for every example is named as such (`collapsed`).

Strict spans: an entity counts only if its start, end and type all match. Tags may be IOB2 or
IOBES; a stray I-/E- without a matching opener starts a new entity (the usual lenient decoding,
as in conlleval). Macro F1 averages per-type F1 over the types present in gold or predictions.
"""

from __future__ import annotations

import numpy as np


def spans_from_tags(tags: list[str]) -> set[tuple[int, int, str]]:
    """{(start, end_exclusive, type)} from IOB2 / IOBES tags."""
    spans, start, kind = set(), None, None

    def close(end):
        nonlocal start, kind
        if start is not None:
            spans.add((start, end, kind))
        start, kind = None, None

    for i, tag in enumerate(tags):
        prefix, _, t = tag.partition("-")
        if tag == "O" or not t:
            close(i)
        elif prefix in ("B", "S") or t != kind or start is None:
            close(i)
            start, kind = i, t
        # I-/E- of the running type continues it
        if prefix in ("S", "E") and start is not None:
            close(i + 1)
    close(len(tags))
    return spans


def _prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def span_scores_from_sets(gold: list[set], pred: list[set]) -> dict[str, float]:
    """Strict micro/macro P, R, F1 over per-example sets of (start, end, type) spans."""
    tp, n_pred, n_gold = {}, {}, {}
    for g, p in zip(gold, pred, strict=True):
        for s in g:
            n_gold[s[-1]] = n_gold.get(s[-1], 0) + 1
        for s in p:
            n_pred[s[-1]] = n_pred.get(s[-1], 0) + 1
        for s in g & p:
            tp[s[-1]] = tp.get(s[-1], 0) + 1
    types = sorted(set(n_gold) | set(n_pred))
    micro_p, micro_r, micro_f = _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))
    per_type = {t: _prf(tp.get(t, 0), n_pred.get(t, 0), n_gold.get(t, 0))[2] for t in types}
    macro = float(np.mean(list(per_type.values()))) if types else 0.0
    out = {"micro_f1": micro_f, "macro_f1": macro, "precision": micro_p, "recall": micro_r,
           "predicted_entities": sum(n_pred.values())}  # 0: a model that tags nothing (see collapsed)
    out.update({f"f1/{t}": f for t, f in per_type.items()})
    return out


def span_scores(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> dict[str, float]:
    return span_scores_from_sets([spans_from_tags(g) for g in gold_tags], [spans_from_tags(p) for p in pred_tags])


def classification_scores(gold: list[str], pred: list[str]) -> dict[str, float]:
    """Accuracy and micro/macro/weighted F1 (macro over the labels present in gold or predictions)."""
    # here, not at the top: scikit-learn takes a second to import, and NER scoring never needs it
    from sklearn.metrics import accuracy_score, f1_score

    kw = dict(zero_division=0)
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "micro_f1": float(f1_score(gold, pred, average="micro", **kw)),
        "macro_f1": float(f1_score(gold, pred, average="macro", **kw)),
        "weighted_f1": float(f1_score(gold, pred, average="weighted", **kw)),
        "distinct_predictions": len(set(pred)),  # 1: the same label for every example (see collapsed)
    }


def multilabel_scores(gold: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """Indicator matrices (n x labels). Macro F1 averages every label of the label set (a label
    never gold nor predicted scores 0, as in scikit-learn); accuracy is exact-set match."""
    from sklearn.metrics import accuracy_score, f1_score

    gold, pred = np.asarray(gold, dtype=int), np.asarray(pred, dtype=int)
    kw = dict(zero_division=0)
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "micro_f1": float(f1_score(gold, pred, average="micro", **kw)),
        "macro_f1": float(f1_score(gold, pred, average="macro", **kw)),
        "weighted_f1": float(f1_score(gold, pred, average="weighted", **kw)),
        "samples_f1": float(f1_score(gold, pred, average="samples", **kw)),
        "distinct_predictions": len({tuple(row) for row in pred}),  # label sets: 1 is the same set for all
    }


# What a score counts of the model's answers, beside its metrics: never a headline. A run record
# keeps them apart, under "answers", so that every value under "metrics" is a score in [0, 1].
ANSWER_COUNTS = ("distinct_predictions", "predicted_entities")


def split_answers(scores: dict) -> dict:
    """{"metrics": the scores, "answers": the counts} of a scorer's dict, as a run records them."""
    return {"metrics": {k: v for k, v in scores.items() if k not in ANSWER_COUNTS},
            "answers": {k: scores[k] for k in ANSWER_COUNTS if k in scores}}


def collapsed(answers: dict) -> str | None:
    """What a fine-tune answered alike for every test example, or None: a classifier that gave one
    label (or one label set) to all, a tagger that tagged no entity. Its score is then the floor of
    that one answer (a weak or diverged fine-tune), not the encoder's representation speaking."""
    if answers.get("distinct_predictions") == 1:
        return "one answer for every example"
    if answers.get("predicted_entities") == 0:
        return "no entity tagged"
    return None


def collapsed_seeds(runs: list[dict], key) -> dict:
    """key(run) -> the seeds whose fine-tune collapsed (see collapsed), for the keys with any."""
    out: dict = {}
    for r in runs:
        if collapsed(r.get("answers") or {}):
            out.setdefault(key(r), []).append(int(r["seed"]))
    return {k: sorted(v) for k, v in out.items()}
