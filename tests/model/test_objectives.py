"""CLM and MLM objectives: labels, masking statistics, chunked head, parity with reference causal models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import BertLMHeadModel, ModernBertDecoderConfig, ModernBertDecoderForCausalLM

from detour.errors import DetourError
from detour.model.doctor import packed_batch
from detour.model.load import config_special_ids, encoder_body, mlm_head_parts, special_token_ids
from detour.model.objectives import (
    clm_labels,
    clm_loss,
    encode,
    head_loss_sum,
    head_rows,
    mlm_loss,
    mlm_masking,
    objective_loss,
)


def batch_for(model, rows, seq_len, seed=0):
    return packed_batch(rows, seq_len, model.config.vocab_size, config_special_ids(model.config),
                        model.config.pad_token_id, seed)


def test_clm_labels_next_token_within_document():
    batch = {
        "input_ids": torch.tensor([[11, 12, 13, 21, 22, 0]]),
        "doc_ids": torch.tensor([[0, 0, 0, 1, 1, -1]]),
    }
    assert clm_labels(batch).tolist() == [[12, 13, -100, 22, -100, -100]]


@pytest.mark.parametrize("kind", ["modernbert", "bert", "roberta"])
def test_packed_clm_loss_is_the_sum_of_each_document_alone(models, kind):
    # document isolation AND per-document positions: packing must not change any document's loss
    model, _ = models(kind)
    packed = batch_for(model, [[9, 14, 5]], 32)
    with torch.no_grad():
        together = clm_loss(model, packed)
        alone = []
        for doc in range(3):
            keep = packed["doc_ids"][0] == doc
            single = {k: v[:, keep] for k, v in packed.items()}
            single["doc_ids"] = torch.zeros_like(single["doc_ids"])
            alone.append(clm_loss(model, single))
    assert together.n_labels == sum(a.n_labels for a in alone) == 8 + 13 + 4
    assert together.loss_sum.item() == pytest.approx(sum(a.loss_sum.item() for a in alone), rel=1e-5)


def _dense_clm(model, batch):
    hidden = encode(model, batch, causal=True).last_hidden_state
    transform, decoder = mlm_head_parts(model)
    logits = decoder(transform(hidden))  # full tokens x vocab: what the chunked path avoids
    return F.cross_entropy(logits.flatten(0, 1), clm_labels(batch).flatten(), reduction="sum")


@pytest.mark.parametrize("kind", ["modernbert", "bert"])
def test_chunked_clm_loss_equals_dense_loss_and_gradients(models, kind):
    model, _ = models(kind)
    batch = batch_for(model, [[20, 10], [31]], 32)
    dense = _dense_clm(model, batch)
    grads_dense = torch.autograd.grad(dense, [p for p in model.parameters()], allow_unused=True)
    chunked = clm_loss(model, batch, chunk_size=7)
    grads_chunked = torch.autograd.grad(chunked.loss_sum, [p for p in model.parameters()], allow_unused=True)
    assert chunked.n_labels == 19 + 9 + 30
    assert chunked.loss_sum.item() == pytest.approx(dense.item(), rel=1e-6)
    compared = 0
    for gd, gc in zip(grads_dense, grads_chunked):
        assert (gd is None) == (gc is None)
        if gd is not None:
            torch.testing.assert_close(gc, gd, rtol=1e-4, atol=1e-5)  # fp32 sums reordered
            compared += 1
    assert compared > 10


def test_head_runs_only_on_labelled_rows(models):
    model, _ = models("modernbert")
    _, decoder = mlm_head_parts(model)
    rows = []
    hook = decoder.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    try:
        batch = batch_for(model, [[20, 6]], 32)
        with torch.no_grad():
            clm = clm_loss(model, batch, chunk_size=8)
            mlm = mlm_loss(model, batch, 0.3, torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert sum(rows) == head_rows(clm.n_labels) + head_rows(mlm.n_labels) < 2 * 32
    assert max(rows) <= 8  # CLM chunks of 8 rows; MLM masks about 8 of 26 tokens


def test_clm_loss_equals_modernbert_decoder_on_same_weights(models):
    model, _ = models("modernbert")
    fields = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "architectures")}
    # the decoder's sliding window is one token narrower on each side: + 2 gives the same window
    fields["local_attention"] = model.config.local_attention + 2
    decoder_model = ModernBertDecoderForCausalLM(ModernBertDecoderConfig(**fields)).eval()
    assert decoder_model.config.layer_types == model.config.layer_types
    state = {}
    for key, value in model.state_dict().items():
        if key.endswith("attn.Wqkv.weight"):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                state[key.replace("Wqkv", name)] = part
        else:
            state[key.replace("head.", "lm_head.", 1) if key.startswith("head.") else key] = value
    missing, unexpected = decoder_model.load_state_dict(state, strict=False)
    assert not unexpected and all("decoder.weight" in k for k in missing)
    decoder_model.tie_weights()
    batch = batch_for(model, [[40], [40]], 40)  # one document per row: the decoder does not pack
    with torch.no_grad():
        ours = clm_loss(model, batch)
        ref = decoder_model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    assert ours.n_labels == 2 * 39
    assert ours.loss_sum.item() / ours.n_labels == pytest.approx(ref.item(), rel=1e-5)


def test_clm_loss_equals_bert_lm_head_model_on_same_weights(models):
    model, _ = models("bert")
    config = model.config.to_dict()
    config.update(is_decoder=True)
    reference = BertLMHeadModel(type(model.config).from_dict(config)).eval()
    missing, unexpected = reference.load_state_dict(model.state_dict(), strict=False)
    assert not missing and not unexpected
    batch = batch_for(model, [[48], [48]], 48)
    with torch.no_grad():
        ours = clm_loss(model, batch)
        ref = reference(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    assert ours.loss_sum.item() / ours.n_labels == pytest.approx(ref.item(), rel=1e-5)


def test_mlm_masking_rate_split_and_specials(minilm_tokenizer):
    special = torch.tensor(special_token_ids(minilm_tokenizer))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30522, (40, 1000), generator=gen)
    ids[:, ::10] = 101  # [CLS]-like separators that must never be masked
    ids[:, -50:] = 0  # padding
    maskable = ~torch.isin(ids, special)
    vocab = torch.arange(30522)
    pool = vocab[~torch.isin(vocab, special)]
    inputs, labels = mlm_masking(ids, maskable, 0.3, torch.Generator().manual_seed(7), 103, pool)
    picked = labels != -100
    assert not picked[~maskable].any()  # specials, separators and padding untouched
    assert torch.equal(inputs[~picked], ids[~picked])
    assert torch.equal(labels[picked], ids[picked])
    rate = picked.sum().item() / maskable.sum().item()
    assert rate == pytest.approx(0.3, abs=0.01)
    n = picked.sum().item()
    as_mask = (inputs[picked] == 103).sum().item() / n
    kept = (inputs[picked] == ids[picked]).sum().item() / n
    randomised = 1 - as_mask - kept
    assert as_mask == pytest.approx(0.8, abs=0.015)
    assert kept == pytest.approx(0.1, abs=0.01)  # a random draw equal to the original counts here: rare
    assert randomised == pytest.approx(0.1, abs=0.01)
    assert not torch.isin(inputs[picked & (inputs != 103)], special).any()
    again, _ = mlm_masking(ids, maskable, 0.3, torch.Generator().manual_seed(7), 103, pool)
    assert torch.equal(again, inputs)  # same generator seed, same masking


def test_mlm_loss_never_labels_special_tokens(models):
    model, tok = models("bert")
    batch = batch_for(model, [[30, 25]], 64)
    batch["input_ids"][0, 0] = tok.cls_token_id
    batch["input_ids"][0, 29] = tok.sep_token_id
    with torch.no_grad():
        out = mlm_loss(model, batch, 1.0, torch.Generator().manual_seed(0))
    assert out.n_labels == 55 - 2  # every real token but [CLS] and [SEP]; never the 9 pads
    assert torch.isfinite(out.loss_sum) and out.loss_sum > 0


def test_objective_dispatch_and_errors(models):
    model, _ = models("modernbert")
    batch = batch_for(model, [[16]], 16)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        assert objective_loss(model, batch, "clm", None, gen).n_labels == 15
        assert objective_loss(model, batch, "mlm", 0.5, gen).n_labels > 0
    with pytest.raises(DetourError, match="mask_rate"):
        objective_loss(model, batch, "mlm", None, gen)
    with pytest.raises(DetourError, match="objective"):
        objective_loss(model, batch, "lm", None, gen)


def test_bert_positions_beyond_table_are_a_clear_error(models):
    model, _ = models("roberta")  # 130 positions, offset 2 -> 128 usable
    batch = batch_for(model, [[100, 100]], 200)
    with pytest.raises(DetourError, match="max_position_embeddings"):
        clm_loss(model, batch)
    assert encoder_body(model) is model.roberta


@pytest.mark.parametrize("kind", ["modernbert", "bert", "roberta"])
def test_mlm_loss_equals_the_stock_masked_lm_loss_on_one_document(models, kind):
    model, _ = models(kind)
    batch = batch_for(model, [[48], [48]], 48)
    with torch.no_grad():
        ours = mlm_loss(model, batch, 0.3, torch.Generator().manual_seed(5))
        # replay the same masking draw, then let the stock class compute its own (mean) loss
        special = torch.tensor(config_special_ids(model.config))
        vocab = torch.arange(model.config.vocab_size)
        inputs, labels = mlm_masking(batch["input_ids"], ~torch.isin(batch["input_ids"], special), 0.3,
                                     torch.Generator().manual_seed(5), model.config.mask_token_id,
                                     vocab[~torch.isin(vocab, special)])
        stock = model(input_ids=inputs, labels=labels).loss
    assert ours.n_labels == int((labels != -100).sum()) > 10
    assert ours.loss_sum.item() / ours.n_labels == pytest.approx(stock.item(), rel=1e-5)


def test_added_special_tokens_are_never_masked(minilm, tmp_path):
    from transformers import AutoTokenizer

    from detour.model.load import load_mlm_model, tiny_modernbert_config
    from detour.model.objectives import mlm_loss

    tok = AutoTokenizer.from_pretrained(minilm)
    tok.add_special_tokens({"additional_special_tokens": ["[NOTE]"]})
    tok.save_pretrained(tmp_path / "tok")
    note = tok.convert_tokens_to_ids("[NOTE]")
    model, _ = load_mlm_model(None, config=tiny_modernbert_config(), tokenizer=tmp_path / "tok")
    assert note in model.never_mask_ids and model.config.vocab_size == len(tok)
    ids = torch.tensor([[101] + [note, 2000] * 30 + [102]])
    batch = {"input_ids": ids, "doc_ids": torch.zeros_like(ids), "position_ids": torch.arange(ids.shape[1])[None],
             "attention_mask": torch.ones_like(ids), "seq_index": torch.tensor([0])}
    out = mlm_loss(model, batch, 0.99, mask_key="17/decay")
    labelled = ids[out.labels != -100]
    assert len(labelled) > 20 and not (labelled == note).any() and not (labelled == 101).any()


def test_the_heads_rows_come_in_a_few_sizes_and_score_as_the_rows_alone(models):
    # an MLM step's masked-row count changes every batch; padded rows keep the head's buffers to a
    # few sizes (glibc reuses a freed block only for a request of its size) and count for nothing
    assert [head_rows(n) for n in (0, 5, 15, 17, 31, 280, 300, 307, 321, 2040)] == \
        [0, 5, 15, 18, 32, 288, 320, 320, 352, 2048]
    assert all(n <= head_rows(n) <= n * 9 / 8 for n in range(1, 5000))
    assert len({head_rows(n) for n in range(257, 513)}) == 8  # eight sizes an octave
    model, _ = models("bert")
    transform, decoder = mlm_head_parts(model)
    seen = []
    handle = transform.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    torch.manual_seed(0)
    try:
        for n in (5, 300, 307):
            rows = torch.randn(n, model.config.hidden_size, requires_grad=True)
            targets = torch.randint(0, model.config.vocab_size, (n,))
            ours = head_loss_sum(model, rows, targets)
            (grad,) = torch.autograd.grad(ours, rows)
            reference = F.cross_entropy(decoder(transform(rows)), targets, reduction="sum")
            assert ours.item() == pytest.approx(reference.item(), rel=1e-5)
            assert torch.allclose(grad, torch.autograd.grad(reference, rows)[0], atol=1e-5)
    finally:
        handle.remove()
    assert seen[0::2] == [5, 320, 320]  # every other: the reference's own
