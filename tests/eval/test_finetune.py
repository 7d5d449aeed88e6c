"""Fine-tuning: any AutoModel encoder (a tiny ModernBERT saved with the MiniLM tokenizer), the
linear-probing mode (encoder frozen, head trained), and the best epoch's weights restored."""

import torch

from detour.eval.finetune import Budget, finetune, prepare_task
from detour.eval.tasks import TaskSpec


def cls_spec(tmp_path, n=48):
    rows = ["sentence\tlabel"] + [f"{'fever cough infection' if i % 2 else 'fracture fall trauma'} {i}\t{i % 2}" for i in range(n)]
    (tmp_path / "d.tsv").write_text("\n".join(rows))
    return TaskSpec(name="toy", type="classification", format="tsv", data={"all": "d.tsv"}, root=str(tmp_path),
                    max_length=32, training={"epochs": 2, "batch_size": 8, "lr": 1e-3})


def tiny_modernbert_folder(tmp_path, minilm_tokenizer):
    from transformers import ModernBertModel

    from tests.conftest import tiny_modernbert_config

    torch.manual_seed(0)
    folder = tmp_path / "tiny-modernbert"
    ModernBertModel(tiny_modernbert_config()).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    return str(folder)


def test_modernbert_encoder_fine_tunes(tmp_path, minilm_tokenizer):
    model = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    prep = prepare_task(cls_spec(tmp_path), model, Budget())
    out = finetune(model, prep, seed=0, device="cpu")
    assert out["selected_epoch"] in (1, 2) and len(out["validation"]) == 2
    assert 0.0 <= out["metrics"]["macro_f1"] <= 1.0


def test_linear_probe_freezes_the_encoder(tmp_path, minilm_tokenizer, monkeypatch):
    import detour.eval.finetune as ft

    model = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    prep = prepare_task(cls_spec(tmp_path), model, Budget(epochs=1))
    seen = {}
    real_build = ft.build_model

    def build_and_snapshot(*a, **k):  # the real model; remember its weights before training
        m = real_build(*a, **k)
        seen.update(model=m, encoder={k: v.clone() for k, v in m.encoder.state_dict().items()},
                    head={k: v.clone() for k, v in m.head.state_dict().items()})
        return m

    monkeypatch.setattr(ft, "build_model", build_and_snapshot)
    finetune(model, prep, seed=0, linear_probe=True, device="cpu")
    m = seen["model"]
    assert all(torch.equal(v, seen["encoder"][k]) for k, v in m.encoder.state_dict().items())
    assert not all(torch.equal(v, seen["head"][k]) for k, v in m.head.state_dict().items())
    assert not any(p.requires_grad for p in m.encoder.parameters())
