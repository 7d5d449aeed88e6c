"""The varlen attention path equals the dense-mask path: boundaries, windows, causality, losses, gradients."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from detour.cli import main as detour
from detour.errors import DetourError
from detour.model import varlen
from detour.model.doctor import attention_backend as attention, packed_batch
from detour.model.load import load_mlm_model, resolve_attn_implementation, tiny_modernbert_config
from detour.model.objectives import clm_loss, encode, mlm_loss
from tests.conftest import REPO
from tests.model.conftest import TINY_ROBERTA

SEQ = 48  # > local_attention 8 of the tiny ModernBERT: its sliding windows bite
ROWS = [[17, 9, 14], [SEQ], [20, 5]]  # several packed documents; rows 0 and 2 end in padding
EXACT = 1e-5  # fp32: the two paths differ only in the order of sums
TINY_BERT = dict(model_type="bert", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CONFIGS = {"modernbert": tiny_modernbert_config(), "bert": TINY_BERT, "roberta": TINY_ROBERTA}


@pytest.fixture(scope="module")
def varlen_models(tokenizer_dir):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            model, _ = load_mlm_model(config=CONFIGS[kind], tokenizer=tokenizer_dir, attn_implementation="varlen", seed=0)
            assert model.config._attn_implementation == varlen.NAME
            cache[kind] = model.train()  # every dropout of these configs is 0
        return cache[kind]

    return get


@pytest.fixture
def reference_calls(monkeypatch):
    """Counts the varlen path's calls, so a parity test knows varlen really ran: the per-document
    reference (CPU, fp32) and, where torch has it, the CUDA kernel (training on a GPU autocasts)."""
    calls = []

    def counting(real):
        def counted(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)
        return counted

    monkeypatch.setattr(varlen, "reference_attention", counting(varlen.reference_attention))
    try:
        from torch.nn.attention import varlen as torch_varlen
    except ImportError:
        torch_varlen = None
    if torch_varlen is not None and hasattr(torch_varlen, "varlen_attn"):
        monkeypatch.setattr(torch_varlen, "varlen_attn", counting(torch_varlen.varlen_attn))
    return calls


def batch_for(model, rows=ROWS, seq=SEQ):
    return packed_batch(rows, seq, model.config.vocab_size, [0, 100, 101, 102, 103], model.config.pad_token_id)


def forward_backward(model, batch, objective: str):
    """(all hidden states, mean token loss, gradients of that loss) of one objective."""
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        hidden = torch.stack(encode(model, batch, objective == "clm", output_hidden_states=True).hidden_states)
    out = clm_loss(model, batch) if objective == "clm" else mlm_loss(model, batch, 0.3, torch.Generator().manual_seed(0))
    loss = out.loss_sum / out.n_labels  # the mean, as training divides: its rounding is that of a ~10, not a ~500
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return hidden, loss.item(), grads


def max_grad_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_packed_boundaries_one_sequence_per_document_and_per_padding_position():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, -1, -1], [0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 2, 2, 2, -1]])
    cu_seqlens, max_len = varlen.packed_boundaries(doc_ids)
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 3, 5, 6, 7, 14, 16, 17, 20, 21]
    assert max_len == 7
    # the same doc id in consecutive rows is two sequences: a row never continues the previous one
    assert varlen.packed_boundaries(torch.zeros(2, 4, dtype=torch.long))[0].tolist() == [0, 4, 8]
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        varlen.packed_boundaries(torch.zeros(4, dtype=torch.long))


def test_kernel_windows_are_the_dense_masks_windows():
    assert varlen.half_window(5) == 4  # ModernBERT passes local_attention // 2 + 1 (flash's inclusive form)
    assert varlen.half_window(None) is None
    assert varlen.kernel_window(causal=False, half=None) == (-1, -1)
    assert varlen.kernel_window(causal=True, half=None) == (-1, 0)
    assert varlen.kernel_window(causal=False, half=4) == (4, 4)
    assert varlen.kernel_window(causal=True, half=4) == (4, 0)


@pytest.mark.parametrize("objective", ["clm", "mlm"])  # causal and bidirectional
@pytest.mark.parametrize("kind", ["modernbert", "bert", "roberta"])
def test_varlen_equals_dense_masks_on_hidden_states_losses_and_gradients(varlen_models, reference_calls, kind,
                                                                         objective):
    model = varlen_models(kind)
    batch = batch_for(model)
    hidden, loss, grads = forward_backward(model, batch, objective)
    assert len(reference_calls) > 0  # the registered function ran, through the model's own forward
    with attention(model, "sdpa"):
        n_calls = len(reference_calls)
        dense_hidden, dense_loss, dense_grads = forward_backward(model, batch, objective)
        assert len(reference_calls) == n_calls
    assert (hidden - dense_hidden).abs().max().item() <= EXACT  # padding positions included: they see only themselves
    assert abs(loss - dense_loss) <= EXACT
    assert max_grad_diff(grads, dense_grads) <= EXACT
    assert max(g.abs().max().item() for g in grads.values()) > 1e-3  # gradients that say something


def test_plain_forward_with_a_padding_mask_equals_sdpa(varlen_models):
    """Outside detour's packed batches (a stock call with a 2D padding mask) varlen still masks padding."""
    model = varlen_models("bert").eval()
    ids = batch_for(model)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, 30:] = 0
    with torch.no_grad():
        ours = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        with attention(model, "sdpa"):
            dense = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.train()
    real = mask.bool()
    assert (ours - dense)[real].abs().max().item() <= EXACT


class LargestOutput(TorchDispatchMode):
    """Records the largest tensor any aten op returns while active (shape and op)."""

    def __init__(self):
        super().__init__()
        self.numel, self.where = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.where = t.numel(), (str(func), tuple(t.shape))
        return out


def test_no_tensor_of_length_squared_elements_on_the_varlen_path(tokenizer_dir):
    length = 4096
    config = {**tiny_modernbert_config(), "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2,
              "num_hidden_layers": 2, "global_attn_every_n_layers": 2}  # one global, one sliding layer
    model, _ = load_mlm_model(config=config, tokenizer=tokenizer_dir, attn_implementation="varlen", seed=0)
    model.eval()
    batch = batch_for(model, [[1500, 1200, 900, 400]], length)  # then 96 padding positions
    with torch.no_grad():
        for causal in (True, False):
            with LargestOutput() as seen:
                encode(model, batch, causal)
            assert seen.numel < length * length, seen.where
        with attention(model, "sdpa"), LargestOutput() as dense:  # the check sees a dense mask when there is one
            encode(model, batch, causal=True)
    assert dense.numel >= length * length, dense.where


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen flash kernel runs on CUDA only")
@pytest.mark.parametrize("objective", ["clm", "mlm"])
@pytest.mark.parametrize("kind", ["modernbert", "bert"])
def test_cuda_kernel_in_bf16_is_as_close_to_fp32_as_dense_bf16(tokenizer_dir, monkeypatch, kind, objective):
    """bf16 tolerance: the kernel's distance to the fp32 dense result is at most twice the dense bf16
    path's distance, plus 1e-3 (hidden states, mean loss, gradients relative to their norm). A wrong
    boundary, window or causality moves results by O(1), far outside it."""
    kernel_calls = []
    from torch.nn.attention import varlen as torch_varlen

    real = torch_varlen.varlen_attn
    monkeypatch.setattr(torch_varlen, "varlen_attn", lambda *a, **k: kernel_calls.append(1) or real(*a, **k))
    model, _ = load_mlm_model(config=CONFIGS[kind], tokenizer=tokenizer_dir, attn_implementation="varlen", seed=0,
                              device="cuda")
    model = model.cuda().train()
    batch = {k: v.cuda() for k, v in batch_for(model).items()}
    with attention(model, "sdpa"):
        ref = forward_backward(model, batch, objective)  # fp32, dense
        with torch.autocast("cuda", dtype=torch.bfloat16):
            dense = forward_backward(model, batch, objective)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ours = forward_backward(model, batch, objective)
    assert kernel_calls

    def distances(run):
        hidden, loss, grads = run
        g = torch.cat([(grads[n] - ref[2][n]).flatten() for n in grads])
        norm = torch.cat([ref[2][n].flatten() for n in grads]).norm()
        return (hidden.float() - ref[0]).abs().max().item(), abs(loss - ref[1]), (g.norm() / norm).item()

    for mine, theirs in zip(distances(ours), distances(dense)):
        assert mine <= 2 * theirs + 1e-3, (distances(ours), distances(dense))


def test_auto_is_sdpa_off_cuda_and_varlen_warns_once_on_the_cpu(caplog):
    from transformers import ModernBertConfig

    config = ModernBertConfig(**{k: v for k, v in tiny_modernbert_config().items() if k != "model_type"})
    assert resolve_attn_implementation("auto", config, device="cpu") == "sdpa"
    assert resolve_attn_implementation("auto", config, device=None) == "sdpa"
    assert resolve_attn_implementation("eager", config) == "eager"
    with caplog.at_level(logging.WARNING):
        assert resolve_attn_implementation("varlen", config, device="cpu") == varlen.NAME
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "CPU reference" in warned[0]


def test_bad_attention_choices_name_the_recipe_field(minilm):
    with pytest.raises(DetourError, match=r"^model\.attn_implementation: 'flash' is not one of sdpa, eager, varlen"):
        load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, attn_implementation="flash")
    # MiniLM's attention dropout (0.1) does not exist on the varlen kernel: refused, not silently dropped
    with pytest.raises(DetourError, match=r"^model\.attn_implementation: varlen has no attention dropout.*0\.1"):
        load_mlm_model(minilm, attn_implementation="varlen")
    assert resolve_attn_implementation("auto", load_mlm_model(minilm)[0].config, device="cpu") == "sdpa"


def test_cli_trains_the_tiny_recipe_with_varlen_as_with_sdpa(tokenizer_dir, tmp_path, reference_calls):
    data = tmp_path / "data"
    assert detour(["prepare", "synthetic:clinical?docs=30&seed=0", "--tokenizer", str(tokenizer_dir), "--out",
                   str(data), "--workers", "1"]) == 0
    sets = [f"data.sources=[{data}]", f"model.tokenizer={tokenizer_dir}", "model.config.hidden_size=32", "model.config.intermediate_size=48",
            "model.config.num_attention_heads=2", "model.config.local_attention=16", "data.seq_len=64",
            "batch.global_sequences=2", "batch.micro_batch=2", "phases.0.tokens=512", "phases.0.lr.warmup_tokens=128",
            "phases.1.tokens=256", "checkpoint.every_tokens=100k"]
    losses, calls = {}, {}
    for attn in ("varlen", "sdpa"):
        args = ["train", str(REPO / "recipes" / "tiny-modernbert.yaml"), "--out", str(tmp_path / attn), "--no-progress",
                "--set", f"model.attn_implementation={attn}"]
        for s in sets:
            args += ["--set", s]
        before = len(reference_calls)
        assert detour(args) == 0
        calls[attn] = len(reference_calls) - before
        records = [json.loads(line) for line in (tmp_path / attn / "metrics.jsonl").read_text().splitlines()]
        losses[attn] = [r["loss"] for r in records if "loss" in r]
    assert calls["varlen"] > 0 and calls["sdpa"] == 0  # the recipe's field reached the model
    assert len(losses["varlen"]) == len(losses["sdpa"]) >= 6  # CLM steps, then MLM steps
    # fp32 on the CPU: the two differ only in the order of sums. On a GPU training autocasts to bf16,
    # whose rounding (8 bits of mantissa) the two kernels take in different places.
    tolerance = 1e-2 if torch.cuda.is_available() else 1e-4
    assert max(abs(a - b) for a, b in zip(losses["varlen"], losses["sdpa"])) <= tolerance
