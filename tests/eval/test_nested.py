"""Nested NER: strict nested span F1 on hand-made cases, the span grid round trip, the span head,
`detour eval` end to end on MiniLM, and linear probing (frozen encoder) on two task types."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from detour.cli import main
from detour.eval.brat import line_examples, read_document
from detour.eval.nested import NestedNER, SpanHead, nested_span_scores
from detour.eval.tasks import TaskSpec, load_spec

D, C = "DISO", "CHEM"


@pytest.mark.parametrize("gold, pred, expected", [
    # nested: the outer entity found, the inner one missed
    ([{(0, 17, D), (0, 8, D)}], [{(0, 17, D)}], (1.0, 0.5)),
    # overlapping (not nested) entities both found, plus a wrong type on a right span
    ([{(0, 17, D), (9, 31, "PHYS")}], [{(0, 17, D), (9, 31, "PHYS"), (9, 31, D)}], (2 / 3, 1.0)),
    # discontinuous "douleurs ... chroniques" is gold as its full extent 0-31: its first fragment is a miss
    ([{(0, 31, D)}], [{(0, 8, D)}], (0.0, 0.0)),
    # empty gold and empty predictions: nothing to find, nothing found
    ([set(), set()], [set(), set()], (0.0, 0.0)),
    # one boundary off by one character is wrong (strict)
    ([{(3, 10, C)}], [{(3, 11, C)}], (0.0, 0.0)),
    # spans are per example: the same offsets in another line do not match
    ([{(0, 4, C)}, set()], [set(), {(0, 4, C)}], (0.0, 0.0)),
])
def test_strict_nested_span_f1_hand_cases(gold, pred, expected):
    scores = nested_span_scores(gold, pred)
    p, r = expected
    f = 2 * p * r / (p + r) if p + r else 0.0
    assert scores["precision"] == pytest.approx(p) and scores["recall"] == pytest.approx(r)
    assert scores["micro_f1"] == pytest.approx(f)


def test_macro_f1_averages_types():
    gold = [{(0, 4, C), (5, 9, D), (10, 14, D)}]
    pred = [{(0, 4, C), (5, 9, D)}]
    scores = nested_span_scores(gold, pred)
    assert scores["f1/CHEM"] == 1.0 and scores["f1/DISO"] == pytest.approx(2 / 3)
    assert scores["macro_f1"] == pytest.approx((1 + 2 / 3) / 2)


def _spec(**options):
    return TaskSpec(name="t", type="nested_ner", format="brat_nested", data={"train": "x", "test": "y"},
                    options={"max_width": 10, **options})


@pytest.fixture
def example(tmp_path):
    text = "Douleurs intenses et chroniques sous ziconotide, nonsmoker.\n"
    ann = ("T1\tDISO 0 17\tDouleurs intenses\nT2\tDISO 0 8\tDouleurs\nT3\tDISO 0 8;21 31\tDouleurs chroniques\n"
           "T4\tPHYS 9 31\tintenses et chroniques\nT5\tCHEM 37 47\tziconotide\nT6\tPHYS 37 47\tziconotide\n"
           "T7\tDISO 49 52\tnon\n")
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "a.ann").write_text(ann, encoding="utf-8")
    examples, _ = line_examples(read_document(tmp_path / "a.txt"))
    return examples


def _oracle_logits(features, n_types):
    """+10 where a cell holds a gold type, -10 elsewhere: what a perfect head would output."""
    out = []
    for f in features:
        width = sum(1 for k in f if k.startswith("span_w"))
        cells = np.stack([f[f"span_w{w}"] for w in range(width)], 1)
        bits = (np.maximum(cells, 0)[:, :, None] >> np.arange(n_types)) & 1
        out.append(np.where(bits > 0, 10.0, -10.0).reshape(len(f["input_ids"]), -1))
    return out


def test_span_grid_round_trip_keeps_nested_overlapping_and_shared_spans(example, minilm_tokenizer):
    task, labels = NestedNER(), ["CHEM", "DISO", "PHYS"]
    spec = _spec()
    features = task.encode(example, minilm_tokenizer, spec, labels, max_length=64)
    pred = task.predict(_oracle_logits(features, 3), features, len(example), labels)
    gold = set(example[0]["entities"])
    # every gold entity but the one ending inside "nonsmoker" is reachable, and found exactly
    assert pred[0] == gold - {(49, 52, "DISO")}
    assert {(37, 47, "CHEM"), (37, 47, "PHYS")} <= pred[0]  # one span, two types
    assert task.score(example, pred, labels)["recall"] == pytest.approx(6 / 7)
    # a narrower width makes the long entities unreachable, and they stay in gold as misses
    narrow = task.encode(example, minilm_tokenizer, _spec(max_width=3), labels, max_length=64)
    got = task.predict(_oracle_logits(narrow, 3), narrow, len(example), labels)[0]
    assert got == {(0, 8, "DISO"), (37, 47, "CHEM"), (37, 47, "PHYS")}  # "Douleurs", "ziconotide": 3 sub-tokens
    assert task.score(example, [got], labels)["recall"] == pytest.approx(3 / 7)


def test_long_lines_are_cut_between_words(example, minilm_tokenizer):
    task, labels = NestedNER(), ["CHEM", "DISO", "PHYS"]
    features = task.encode(example, minilm_tokenizer, _spec(), labels, max_length=10)
    assert len(features) > 1 and all(len(f["input_ids"]) <= 10 for f in features)
    assert all(f["example"] == 0 for f in features)
    pred = task.predict(_oracle_logits(features, 3), features, 1, labels)[0]
    assert (37, 47, "CHEM") in pred and pred <= set(example[0]["entities"])


def test_span_head_loss_and_shapes():
    torch.manual_seed(0)
    head = SpanHead(hidden=16, n_types=3, max_width=4)
    hidden = torch.randn(2, 7, 16, requires_grad=True)
    cells = torch.full((2, 7, 4), -100, dtype=torch.long)
    cells[0, 1, 0], cells[0, 1, 2], cells[1, 3, 1] = 0, 0b101, 0b010
    batch = {f"span_w{w}": cells[:, :, w] for w in range(4)}
    logits, loss = head(hidden, batch)
    assert logits.shape == (2, 7, 12) and torch.isfinite(loss)
    loss.backward()
    assert hidden.grad.abs().sum() > 0
    assert head(hidden, {})[1] is None  # no labels, no loss
    # the loss is BCE over the three candidate cells only, their types decoded from the bitmasks
    grid = logits.reshape(2, 7, 4, 3)
    picked = torch.stack([grid[0, 1, 0], grid[0, 1, 2], grid[1, 3, 1]])
    target = torch.tensor([[0.0, 0, 0], [1, 0, 1], [0, 1, 0]])
    assert loss.item() == pytest.approx(torch.nn.functional.binary_cross_entropy_with_logits(picked, target).item(), rel=1e-5)


def _run_eval(tmp_path, task, *extra):
    from detour.paths import minilm_path

    out = tmp_path / task
    code = main(["eval", str(minilm_path()), "--tasks", task, "--seeds", "1", "--epochs", "1", "--max-train", "16",
                 "--max-eval", "12", "--max-length", "64", "--batch-size", "8", "--out", str(out), *extra])
    assert code == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("task", ["quaero-emea", "social-history"])
def test_detour_eval_runs_nested_tasks_on_minilm(task, tmp_path, minilm, shared_data, monkeypatch):
    monkeypatch.setenv("DETOUR_DATA_ROOT", str(shared_data))
    torch.set_num_threads(1)
    results = _run_eval(tmp_path, task)
    (run,) = results["runs"]
    assert run["task"] == task and run["headline"] == "macro_f1"
    assert run["budget"]["labels"] == len(load_spec(task, shared_data).labels)
    for key in ("micro_f1", "macro_f1", "precision", "recall"):
        assert 0.0 <= run["metrics"][key] <= 1.0


def _encoder_state(model_dir):
    from transformers import AutoModel

    return {k: v.clone() for k, v in AutoModel.from_pretrained(model_dir).state_dict().items()}


@pytest.mark.parametrize("task", ["gad", "quaero-emea"])
def test_linear_probe_trains_the_head_only(task, minilm, shared_data, monkeypatch):
    """Linear probing on a classification task and on the span head: the encoder never moves."""
    from detour.eval.finetune import Budget, finetune, prepare_task

    monkeypatch.setenv("DETOUR_DATA_ROOT", str(shared_data))
    torch.set_num_threads(1)
    prep = prepare_task(load_spec(task, shared_data), str(minilm), Budget(epochs=1, max_train=16, max_eval=8, max_length=48))
    before = _encoder_state(minilm)
    seen = {}
    import detour.eval.finetune as ft

    original = ft.build_model

    def keep(*args, **kwargs):
        seen["model"] = original(*args, **kwargs)
        seen["head0"] = {k: v.clone() for k, v in seen["model"].head.state_dict().items()}
        return seen["model"]

    monkeypatch.setattr(ft, "build_model", keep)
    out = finetune(str(minilm), prep, seed=0, linear_probe=True, device="cpu")
    model = seen["model"]
    assert all(torch.equal(v, before[k]) for k, v in model.encoder.state_dict().items())
    assert any(not torch.equal(v, seen["head0"][k]) for k, v in model.head.state_dict().items() if v.is_floating_point())
    assert np.isfinite(out["metrics"][prep.spec.headline])
