"""Encoding and decoding: labels on first sub-tokens only, windows that give back every word,
multi-label thresholds, majority / empty baselines."""

import numpy as np

from detour.eval.tasks import TaskSpec, get_task_type


def ner_spec(**kw):
    return TaskSpec(name="t", type="ner", format="iob", data={"train": "a", "test": "b"}, **kw)


def test_labels_on_first_subtoken_only(minilm_tokenizer):
    ner = get_task_type("ner")
    ex = {"tokens": ["Hypercholesterolemia", "is", "rare"], "tags": ["B-Disease", "O", "O"], "doc": 0}
    labels = ner.label_set(ner_spec(), [ex])
    assert labels == ["O", "B-Disease"]
    (f,) = ner.encode([ex], minilm_tokenizer, ner_spec(), labels, 64)
    pieces = minilm_tokenizer.convert_ids_to_tokens(f["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    n_first = len(minilm_tokenizer.tokenize("Hypercholesterolemia"))
    assert n_first > 1  # really split into sub-tokens
    assert f["token_labels"][1] == 1 and f["token_labels"][2 : 1 + n_first] == [-100] * (n_first - 1)
    assert [x for x in f["token_labels"] if x != -100] == [1, 0, 0]
    assert f["token_labels"][0] == -100 and f["token_labels"][-1] == -100


def test_windows_cover_every_word_and_decode_back(minilm_tokenizer):
    ner = get_task_type("ner")
    words = [f"word{i}" for i in range(60)]
    tags = ["B-X" if i % 7 == 0 else "O" for i in range(60)]
    ex = {"tokens": words, "tags": tags, "doc": 0}
    spec = ner_spec(long_inputs="window", stride=8)
    labels = ["O", "B-X"]
    feats = ner.encode([ex], minilm_tokenizer, spec, labels, 32)
    assert len(feats) > 2 and all(len(f["input_ids"]) <= 32 for f in feats)
    # oracle logits: put each position's gold label on top, and check the decoder gives back the tags
    logits = []
    for f in feats:
        lg = np.zeros((len(f["input_ids"]), 2))
        for j, lab in enumerate(f["token_labels"]):
            if lab >= 0:
                lg[j, lab] = 1.0
        logits.append(lg)
    (pred,) = ner.predict(logits, feats, 1, labels)
    assert [pred[w] for w in range(60)] == tags
    assert ner.score([ex], [pred], labels)["micro_f1"] == 1.0
    truncated = ner.encode([ex], minilm_tokenizer, ner_spec(), labels, 32)
    assert len(truncated) == 1


def test_multilabel_threshold_and_baseline(minilm_tokenizer):
    ml = get_task_type("multilabel")
    spec = TaskSpec(name="t", type="multilabel", format="hoc", data={"all": "x"}, long_inputs="window", stride=4)
    train = [{"text": "a b", "labels": ["x"], "doc": 0}, {"text": "c", "labels": ["x", "y"], "doc": 1}]
    labels = ml.label_set(spec, train)
    feats = ml.encode([{"text": " ".join(["tok"] * 40), "labels": ["y"], "doc": 0}], minilm_tokenizer, spec, labels, 16)
    assert len(feats) > 1 and feats[0]["label_vector"] == [0.0, 1.0]
    logits = [np.array([-1.0, 0.5])] * len(feats)
    assert ml.predict(logits, feats, 1, labels) == [["y"]]
    assert ml.baseline(train + [train[0]], 2, labels) == [["x"], ["x"]]


def test_classification_baseline_is_majority():
    cls = get_task_type("classification")
    train = [{"text": "", "label": lab, "doc": i} for i, lab in enumerate("aab")]
    assert cls.baseline(train, 3, ["a", "b"]) == ["a", "a", "a"]
