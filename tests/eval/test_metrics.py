"""Scores against hand-computed cases: strict spans (IOB2 and IOBES), classification, multi-label."""

import numpy as np
import pytest

from detour.eval.metrics import classification_scores, multilabel_scores, span_scores, spans_from_tags


def test_spans_from_iob2_and_iobes():
    assert spans_from_tags(["B-D", "I-D", "O", "B-C", "B-C", "I-C"]) == {(0, 2, "D"), (3, 4, "C"), (4, 6, "C")}
    assert spans_from_tags(["S-D", "B-C", "I-C", "E-C", "O", "S-D"]) == {(0, 1, "D"), (1, 4, "C"), (5, 6, "D")}
    # a stray I- opens an entity; a type change inside a run splits it
    assert spans_from_tags(["O", "I-D", "I-D", "I-C"]) == {(1, 3, "D"), (3, 4, "C")}
    assert spans_from_tags(["O", "O"]) == set()


def test_strict_span_f1_hand_computed():
    gold = [["B-D", "I-D", "O", "B-C"], ["B-D", "O", "O", "O"]]
    # sentence 1: D exact (tp), C predicted with wrong boundary (fp + fn)
    # sentence 2: D missed (fn), a spurious C (fp)
    pred = [["B-D", "I-D", "B-C", "I-C"], ["O", "O", "B-C", "I-C"]]
    s = span_scores(gold, pred)
    # micro: tp=1, pred=3 (D, C[2:4], C[2:4] in s2), gold=3  -> P=R=F=1/3
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["micro_f1"] == pytest.approx(1 / 3)
    # per type: D tp=1 pred=1 gold=2 -> P=1 R=.5 F=2/3 ; C tp=0 -> F=0 ; macro = 1/3
    assert s["f1/D"] == pytest.approx(2 / 3) and s["f1/C"] == 0.0
    assert s["macro_f1"] == pytest.approx(1 / 3)


def test_span_f1_perfect_and_empty():
    gold = [["B-D", "I-D", "O"]]
    assert span_scores(gold, gold)["micro_f1"] == 1.0
    empty = span_scores(gold, [["O", "O", "O"]])
    assert empty["micro_f1"] == 0.0 and empty["macro_f1"] == 0.0 and empty["recall"] == 0.0


def test_classification_scores_hand_computed():
    gold = ["a", "a", "a", "b"]
    pred = ["a", "a", "b", "b"]
    s = classification_scores(gold, pred)
    # a: P=1 R=2/3 F=.8 ; b: P=.5 R=1 F=2/3
    assert s["accuracy"] == 0.75 and s["micro_f1"] == 0.75
    assert s["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert s["weighted_f1"] == pytest.approx(0.75 * 0.8 + 0.25 * 2 / 3)


def test_multilabel_scores_hand_computed():
    gold = np.array([[1, 0], [1, 1], [0, 0]])
    pred = np.array([[1, 0], [0, 1], [0, 1]])
    s = multilabel_scores(gold, pred)
    # label 0: tp1 fn1 -> F=2/3 ; label 1: tp1 fp1 -> F=2/3 ; micro tp2 fp1 fn1 -> 2/3
    assert s["micro_f1"] == pytest.approx(2 / 3) and s["macro_f1"] == pytest.approx(2 / 3)
    assert s["accuracy"] == pytest.approx(1 / 3)  # exact set match on row 0 only


def test_a_fine_tune_that_answered_alike_for_every_example_is_named():
    from detour.eval.metrics import collapsed

    # the majority label for everything: ChemProt's "False" at 69%, macro F1 at its floor
    gold = ["False"] * 7 + ["CPR:3", "CPR:4", "CPR:9"]
    one = classification_scores(gold, ["False"] * 10)
    assert one["distinct_predictions"] == 1 and collapsed(one) == "one answer for every example"
    two = classification_scores(gold, ["False"] * 9 + ["CPR:3"])
    assert two["distinct_predictions"] == 2 and collapsed(two) is None
    # a tagger that tags nothing, and one that tags a single entity
    none = span_scores([["B-D", "O"], ["O", "B-C"]], [["O", "O"], ["O", "O"]])
    assert none["predicted_entities"] == 0 and collapsed(none) == "no entity tagged"
    some = span_scores([["B-D", "O"], ["O", "B-C"]], [["O", "O"], ["O", "B-D"]])
    assert some["predicted_entities"] == 1 and collapsed(some) is None
    # multi-label: the same label set for every example, even a non-empty one
    gold_ml = np.array([[1, 0], [0, 1], [1, 1]])
    same = multilabel_scores(gold_ml, np.array([[1, 0], [1, 0], [1, 0]]))
    assert same["distinct_predictions"] == 1 and collapsed(same) == "one answer for every example"
    assert multilabel_scores(gold_ml, np.array([[1, 0], [0, 1], [1, 0]]))["distinct_predictions"] == 2
    # runs scored before the counts existed are not called collapsed
    assert collapsed({}) is None
