"""detour's fine-tuning loop against the Hugging Face Trainer's, on the same network, initial weights,
batches and dropout draws (detour.eval.reference): every training step's loss is the same, bit for
bit, for a token task and a sentence task with warm-up, weight decay and gradient clipping at work,
on a BERT and on a ModernBERT (whose norms carry no bias: the weight-decay groups are by name), and
for the span and multi-label heads on real task files."""

import pytest
import torch

from detour.eval.finetune import Budget, finetune, prepare_task
from detour.eval.tasks import TaskSpec

pytest.importorskip("accelerate", reason="the Trainer needs accelerate (pip install -e '.[test]')")


def tiny_bert_folder(tmp_path, minilm_tokenizer) -> str:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=minilm_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    folder = tmp_path / "tiny-bert"
    BertModel(config).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    return str(folder)


def ner_spec(tmp_path) -> TaskSpec:
    drugs = ["aspirin", "warfarin", "heparin", "insulin", "metformin"]
    sentences = []
    for i in range(40):
        words = ["the\tO", "patient\tO"] * (i % 4) + ["received\tO", f"{drugs[i % 5]}\tB-Drug"]
        words += ["sodium\tI-Drug"] * (i % 2) + ["today\tO"]
        sentences.append("\n".join(words))
    (tmp_path / "ner.iob").write_text("\n\n".join(sentences) + "\n")
    return TaskSpec(name="toy-ner", type="ner", format="iob", data={"all": "ner.iob"}, root=str(tmp_path),
                    max_length=32, training={"epochs": 2, "batch_size": 4, "lr": 3e-3, "weight_decay": 0.1})


def cls_spec(tmp_path) -> TaskSpec:
    words = ("fever cough infection".split(), "fracture fall trauma".split())
    rows = ["sentence\tlabel"] + [" ".join((words[i % 2] * 6)[: 1 + (i * 5) % 16]) + f"\t{i % 2}" for i in range(60)]
    (tmp_path / "cls.tsv").write_text("\n".join(rows))
    return TaskSpec(name="toy-cls", type="classification", format="tsv", data={"all": "cls.tsv"}, root=str(tmp_path),
                    max_length=32, training={"epochs": 2, "batch_size": 8, "lr": 3e-3, "weight_decay": 0.1,
                                             "warmup_ratio": 0.3})


def tiny_modernbert_folder(tmp_path, minilm_tokenizer) -> str:
    from transformers import ModernBertModel

    from tests.conftest import tiny_modernbert_config

    torch.manual_seed(0)
    folder = tmp_path / "tiny-modernbert"
    ModernBertModel(tiny_modernbert_config(vocab_size=minilm_tokenizer.vocab_size)).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("make_model, make_spec", [(tiny_bert_folder, ner_spec), (tiny_bert_folder, cls_spec),
                                                   (tiny_modernbert_folder, cls_spec)],
                         ids=["bert-ner", "bert-classification-with-warmup", "modernbert-classification-with-warmup"])
def test_detours_loop_trains_as_the_hf_trainers_loop_step_for_step(tmp_path, minilm_tokenizer, make_model, make_spec):
    from detour.eval.reference import trainer_finetune

    model = make_model(tmp_path, minilm_tokenizer)
    prep = prepare_task(make_spec(tmp_path), model, Budget())
    losses = []
    ours = finetune(model, prep, seed=3, device="cpu", on_step=losses.append)
    theirs = trainer_finetune(model, prep, seed=3)
    assert len(losses) == len(theirs["losses"]) == 2 * -(-len(prep.features["train"]) // prep.batch_size)
    # step for step and bit for bit: any difference in the optimizer, its weight-decay groups, the
    # schedule, the clipping or the loss moves the losses from the second step on
    assert losses == theirs["losses"]
    assert losses[0] != losses[-1]  # it trained
    assert ours["validation"] == theirs["validation"]
    assert ours["selected_epoch"] == theirs["selected_epoch"]
    assert ours["metrics"] == theirs["metrics"] and ours["answers"] == theirs["answers"]


@pytest.mark.parametrize("task", ["quaero-emea", "hoc"])
def test_the_span_and_multilabel_heads_train_as_under_the_trainers_loop(task, tmp_path, minilm_tokenizer, shared_data,
                                                                        monkeypatch):
    """The nested-NER span head (its grid travels as one batch key per width) and the multi-label
    head (weighted BCE) on real task files: the same losses, step for step."""
    from detour.eval.reference import trainer_finetune
    from detour.eval.tasks import load_spec

    monkeypatch.setenv("DETOUR_DATA_ROOT", str(shared_data))
    model = tiny_bert_folder(tmp_path, minilm_tokenizer)
    spec = load_spec(task, shared_data)
    # the Trainer has one learning rate for all weights: no head_lr (quaero-emea's spec sets one)
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"head_lr": None})})
    prep = prepare_task(spec, model, Budget(epochs=2, max_train=24, max_eval=8, max_length=48, lr=3e-3, batch_size=8))
    losses = []
    ours = finetune(model, prep, seed=1, device="cpu", on_step=losses.append)
    theirs = trainer_finetune(model, prep, seed=1)
    assert len(losses) == 2 * -(-len(prep.features["train"]) // 8)  # a long line is cut into several inputs
    assert losses == theirs["losses"]
    assert ours["metrics"] == theirs["metrics"]
