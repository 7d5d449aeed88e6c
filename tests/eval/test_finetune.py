"""Fine-tuning: any AutoModel encoder (a tiny ModernBERT saved with the MiniLM tokenizer), the
linear-probing mode (encoder frozen, head trained), the best epoch's weights restored, and the
per-epoch checkpoint a stopped run resumes from."""

import pytest
import torch

from detour.errors import DetourError
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


class Killed(Exception):
    """Stands in for SIGTERM at the end of an epoch (the process dies; only the checkpoint remains)."""


def test_resume_from_an_epoch_checkpoint_gives_the_uninterrupted_result(tmp_path, minilm_tokenizer, monkeypatch):
    """Stopped after epoch 1, 2 or 3 of 3, a new call on the same file continues and ends bit for bit
    where the uninterrupted run ends (CPU): the same loss at every later step, the same selected
    weights, the same metrics. Weights, optimizer, schedule, every generator and the best epoch's
    weights (epoch 2 here, saved apart from the last epoch's) all come back."""
    import detour.eval.finetune as ft

    model = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    spec = cls_spec(tmp_path)
    spec.training.epochs = 3
    prep = prepare_task(spec, model, Budget())
    built = []
    real_build = ft.build_model

    def build_and_keep(*a, **k):  # the real model, kept to read its final weights
        built.append(real_build(*a, **k))
        return built[-1]

    monkeypatch.setattr(ft, "build_model", build_and_keep)

    def final_weights():  # the model finetune scored test with: the selected epoch's weights
        return {k: v.clone() for k, v in built[-1].state_dict().items()}

    losses = []
    whole = finetune(model, prep, seed=3, device="cpu", on_step=losses.append)
    whole_weights, per_epoch = final_weights(), len(losses) // 3
    assert whole["selected_epoch"] == 2 and [v["macro_f1"] for v in whole["validation"]][1:] == [1.0, 1.0]
    for stop_after in (1, 2, 3):
        path = tmp_path / f"stopped-{stop_after}" / "state.pt"
        seen = []

        def stop(info, stop_after=stop_after):
            seen.append(info)
            if info["epoch"] == stop_after:
                raise Killed

        with pytest.raises(Killed):
            finetune(model, prep, seed=3, device="cpu", on_epoch=stop, checkpoint=path, checkpoint_key="k")
        assert [i["epoch"] for i in seen] == list(range(1, stop_after + 1)) and seen[0]["epochs"] == 3
        assert seen[0]["score"] == whole["validation"][0]["macro_f1"] and seen[0]["seconds"] > 0
        saved = torch.load(path, weights_only=True)  # tensors and plain values only
        assert saved["epoch"] == stop_after and saved["key"] == "k"
        assert [p.name for p in path.parent.iterdir()] == ["state.pt"]  # no temporary file
        later = []
        resumed = finetune(model, prep, seed=3, device="cpu", on_step=later.append, on_epoch=seen.append,
                           checkpoint=path, checkpoint_key="k")
        assert [i["epoch"] for i in seen[stop_after:]] == list(range(stop_after + 1, 4))
        assert resumed["resumed_after_epoch"] == stop_after
        assert later == losses[stop_after * per_epoch:]
        assert all(torch.equal(v, whole_weights[k]) for k, v in final_weights().items())
        assert resumed["metrics"] == whole["metrics"] and resumed["validation"] == whole["validation"]
        assert resumed["selected_epoch"] == whole["selected_epoch"]


def test_a_checkpoint_saved_for_other_settings_is_refused(tmp_path, minilm_tokenizer):
    model = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    prep = prepare_task(cls_spec(tmp_path), model, Budget(epochs=2))
    path = tmp_path / "state.pt"

    def stop(info):
        raise Killed

    with pytest.raises(Killed):
        finetune(model, prep, seed=0, device="cpu", on_epoch=stop, checkpoint=path, checkpoint_key="lr=1e-3")
    with pytest.raises(DetourError, match="other settings"):
        finetune(model, prep, seed=0, device="cpu", checkpoint=path, checkpoint_key="lr=5e-5")
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(DetourError, match="not a readable epoch checkpoint"):
        finetune(model, prep, seed=0, device="cpu", checkpoint=path, checkpoint_key="lr=1e-3")


def test_the_optimizer_is_the_fused_adamw_with_the_plain_loops_update(tmp_path, minilm_tokenizer):
    """The fused kernel (the fast path) computes AdamW's update: equal to the per-tensor loop's."""
    from detour.eval.finetune import _optimizer, build_model

    model_dir = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    prep = prepare_task(cls_spec(tmp_path), model_dir, Budget())
    models = [build_model(model_dir, prep, linear_probe=False) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    fused = _optimizer(models[0], 1e-3, 1e-2, 0.01)
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW([{**g, "params": [dict(models[1].named_parameters())[n] for n in names]}
                               for g, names in zip(fused.param_groups, _group_names(models[0], fused))],
                              foreach=False)
    from detour.eval.finetune import collate

    batch = collate(prep.features["train"][:8], prep.pad_id)
    for model in models:
        model.eval()  # no dropout: both see the same gradients, so only the optimizers may differ
    for _ in range(3):
        for model, opt in zip(models, (fused, plain)):
            _, loss = model(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert any(g["lr"] == 1e-2 for g in fused.param_groups)  # the head's own rate kept its group


def _group_names(model, optimizer) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]


def _padded_share(order: list[int], lengths: list[int], batch_size: int) -> float:
    """Tokens the batches of `order` hold, padding included, over the real tokens."""
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    return sum(len(b) * max(lengths[i] for i in b) for b in batches) / sum(lengths)


def test_grouped_order_is_a_seeded_permutation_of_batches_of_similar_length():
    """group_by_length: every input once per epoch, batches of about one length (little padding,
    where a plain shuffle pads to about twice the real tokens), the order fixed by the seed alone,
    and the generator moved on exactly as one randperm moves it (what a resumed run restores)."""
    import random

    from detour.eval.finetune import train_order

    rng = random.Random(7)
    lengths = [rng.randint(5, 200) for _ in range(600)]
    grouped = train_order(lengths, 16, True, torch.Generator().manual_seed(3))
    assert sorted(grouped) == list(range(600))
    assert _padded_share(grouped, lengths, 16) < 1.15
    shuffled = train_order(lengths, 16, False, torch.Generator().manual_seed(3))
    assert shuffled == torch.randperm(600, generator=torch.Generator().manual_seed(3)).tolist()
    assert _padded_share(shuffled, lengths, 16) > 1.5
    assert train_order(lengths, 16, True, torch.Generator().manual_seed(3)) == grouped
    assert train_order(lengths, 16, True, torch.Generator().manual_seed(4)) != grouped
    used, fresh = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    train_order(lengths, 16, True, used)
    torch.randperm(600, generator=fresh)
    assert torch.equal(used.get_state(), fresh.get_state())


def test_score_batches_cover_every_input_once_sorted_within_their_budget():
    from detour.eval.finetune import score_batches

    lengths = [3, 250, 40, 41, 8, 256, 100] * 20
    batches = score_batches(lengths, 4, 256, "cpu")
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert all(len(b) <= 8 and len(b) * max(lengths[i] for i in b) <= 2 * 4 * 256 for b in batches)


def varied_cls_spec(tmp_path, n=400):
    """A classification task whose texts run from 1 to 24 words, so the length grouping shows (320
    train inputs make 10 batches of 8 a mega-batch: fewer, and a mega-batch is a single batch)."""
    words = ("fever cough infection".split(), "fracture fall trauma".split())
    rows = ["sentence\tlabel"] + [" ".join((words[i % 2] * 8)[: 1 + (i * 7) % 24]) + f"\t{i % 2}" for i in range(n)]
    (tmp_path / "v.tsv").write_text("\n".join(rows))
    return TaskSpec(name="varied", type="classification", format="tsv", data={"all": "v.tsv"}, root=str(tmp_path),
                    max_length=32, training={"epochs": 2, "batch_size": 8, "lr": 1e-3})


def test_training_batches_are_grouped_by_length_and_resume_bit_for_bit(tmp_path, minilm_tokenizer, monkeypatch):
    """The batches finetune trains on hold inputs of about one length (the spec's group_by_length,
    on by default) and not with it off; stopped after epoch 1, the grouped run resumes to the same
    losses, weights and metrics as the uninterrupted one."""
    import detour.eval.finetune as ft

    model = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    spec = varied_cls_spec(tmp_path)
    assert spec.training.group_by_length is True
    prep = prepare_task(spec, model, Budget())
    seen, watched = [], {"train": prep.tensors["train"]}
    real_batch = ft.SplitTensors.batch

    def recording(self, rows):
        if self is watched["train"]:
            seen.append(list(rows))
        return real_batch(self, rows)

    monkeypatch.setattr(ft.SplitTensors, "batch", recording)
    lengths = prep.tensors["train"].lengths
    losses = []
    whole = finetune(model, prep, seed=5, device="cpu", on_step=losses.append)
    grouped_order = [i for b in seen for i in b]
    assert sorted(grouped_order[: len(lengths)]) == list(range(len(lengths)))
    assert _padded_share(grouped_order[: len(lengths)], lengths, 8) < 1.2

    seen.clear()
    spec_off = spec.model_copy(deep=True)
    spec_off.training.group_by_length = False
    prep_off = prepare_task(spec_off, model, Budget())
    watched["train"] = prep_off.tensors["train"]
    finetune(model, prep_off, seed=5, device="cpu")
    plain_order = [i for b in seen for i in b][: len(lengths)]
    assert _padded_share(plain_order, lengths, 8) > 1.5

    path = tmp_path / "state.pt"

    def stop(info):
        if info["epoch"] == 1:
            raise Killed

    with pytest.raises(Killed):
        finetune(model, prep, seed=5, device="cpu", on_epoch=stop, checkpoint=path, checkpoint_key="k")
    later = []
    resumed = finetune(model, prep, seed=5, device="cpu", on_step=later.append, checkpoint=path, checkpoint_key="k")
    assert later == losses[len(losses) // 2 :]
    assert resumed["metrics"] == whole["metrics"] and resumed["validation"] == whole["validation"]


def test_features_are_tokenized_once_per_tokenizer_and_budget(tmp_path, minilm, minilm_tokenizer):
    """With one cache, a second model with the same tokenizer (another folder) reuses the features and
    their tensors; another max length, or a tokenizer with another vocabulary, tokenizes afresh."""
    other = tiny_modernbert_folder(tmp_path, minilm_tokenizer)
    spec, cache = cls_spec(tmp_path), {}
    first = prepare_task(spec, str(minilm), Budget(), cache=cache)
    again = prepare_task(spec, other, Budget(), cache=cache)
    assert (first.info["features_cached"], again.info["features_cached"]) == (False, True)
    assert again.features is first.features and again.tensors is first.tensors
    shorter = prepare_task(spec, other, Budget(max_length=16), cache=cache)
    assert shorter.info["features_cached"] is False and shorter.max_length == 16
    assert max(shorter.tensors["train"].lengths) <= 16

    from transformers import AutoTokenizer

    grown = tmp_path / "grown"
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["feverish"])
    tiny_modernbert_folder(grown, tok)
    assert prepare_task(spec, str(grown / "tiny-modernbert"), Budget(), cache=cache).info["features_cached"] is False
    assert len(cache) == 3
    fresh = prepare_task(spec, other, Budget())  # no cache: the same features, made again
    assert fresh.info["features_cached"] is False and fresh.features == first.features
