"""The two training objectives on one masked-LM model: CLM (the detour) and MLM.

    python -m pytest -q tests/model/test_objectives.py

Both run the encoder body once with the packed-document masks of `detour.model.masks`, then the
MLM head (transform + decoder tied to the input embeddings) only on the rows that carry a label,
padded to a few sizes (`head_rows`, so a CPU run's heap keeps its size from batch to batch):
the transform by plain autograd, the decoder projection + cross-entropy fused in chunks of rows
(`detour.model.fused_ce`), whose gradients are made in forward, so the (tokens x vocab) logits are
never kept and never recomputed.

Losses are SUMS over label tokens; the training loop divides by the label count of the whole
global batch, so CLM and MLM steps weigh tokens alike.

`held_out_scores` measures without training: the same masks, attention and head, with plain
chunked logits (no gradient to fuse), and also counts the label tokens the head predicts right.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from detour.errors import DetourError
from detour.model import masks
from detour.model.fused_ce import linear_cross_entropy_sum
from detour.model.load import config_special_ids, encoder_body, family, mlm_head_parts

IGNORE = -100
CHUNK_SIZE = 1024


@dataclass
class LossOutput:
    loss_sum: torch.Tensor  # scalar: sum of token losses
    n_labels: int  # label tokens in this micro-batch
    labels: torch.Tensor | None = None  # MLM: the labels drawn (IGNORE where not masked), for the mask hash


def model_position_ids(model, batch: dict) -> torch.Tensor:
    """Per-document position ids as the architecture reads them (RoBERTa's start at pad_id + 1)."""
    positions, real = batch["position_ids"], batch["doc_ids"] >= 0
    fam = family(model)
    offset = model.config.pad_token_id + 1 if fam == "roberta" else 0
    if fam != "modernbert":  # absolute position tables: a position past the table is an error
        limit = model.config.max_position_embeddings - offset
        if positions.shape[1] > limit:
            raise DetourError(
                f"seq_len {positions.shape[1]} exceeds the {limit} positions of this "
                f"{model.config.model_type} model (max_position_embeddings)"
            )
    return torch.where(real, positions + offset, offset - 1 if offset else 0)


def encode(model, batch: dict, causal: bool, input_ids: torch.Tensor | None = None, **kwargs):
    """Run the encoder body with packed-document masks (or varlen boundaries); returns the body's output object."""
    attention = masks.attention_inputs(model, batch["doc_ids"], causal)
    return encoder_body(model)(
        input_ids=batch["input_ids"] if input_ids is None else input_ids,
        position_ids=model_position_ids(model, batch),
        **attention,
        **kwargs,
    )


def head_rows(n: int) -> int:
    """How many rows the head runs for `n` labelled rows: `n` rounded up to an eighth of the power of
    two below it, so at most 8 sizes an octave, for at most 1/8 more rows (none below 16).

    An MLM step's masked-row count changes every batch; on CPU each new size of the head's buffers
    is a new request to glibc's malloc, which seldom reuses a freed block for torch's aligned
    requests and grows its heap around the old ones (detour.train.heap). Padded to a few sizes
    (zero rows, ignored targets), MiniLM-L6's MLM step held 1,765 MiB of RSS after 55 steps instead
    of 2,244.
    """
    step = 1 << max(n.bit_length() - 4, 0)
    return -(-n // step) * step


def head_loss_sum(model, rows: torch.Tensor, targets: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> torch.Tensor:
    """Sum of cross-entropies of the MLM head on `rows` [N, H] against `targets` [N], chunked."""
    transform, decoder = mlm_head_parts(model)
    if rows.shape[0] == 0:  # keep the graph connected so backward still runs
        return rows.sum() * 0.0
    pad = head_rows(rows.shape[0]) - rows.shape[0]
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
        targets = torch.cat([targets, targets.new_full((pad,), IGNORE)])
    hidden = transform(rows)  # [N, H]: small next to the logits, so plain autograd
    # a plain Linear is fused (gradients made in forward, none when nothing needs one); a wrapped
    # decoder (adapters, hooks) must run as a module: checkpointed chunks, logits recomputed
    if type(decoder) is torch.nn.Linear and not decoder._forward_hooks and not decoder._forward_pre_hooks:
        return linear_cross_entropy_sum(hidden, decoder.weight, decoder.bias, targets, chunk_size)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad
                                              or any(p.requires_grad for p in decoder.parameters()))

    def piece(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(decoder(x).float(), y, reduction="sum")

    total = None
    for start in range(0, rows.shape[0], chunk_size):
        x, y = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        part = checkpoint(piece, x, y, use_reentrant=False) if wants_grad else piece(x, y)
        total = part if total is None else total + part
    return total


def clm_labels(batch: dict) -> torch.Tensor:
    """Label at t = token t+1 of the same document; -100 at each document's last token and padding."""
    input_ids, doc_ids = batch["input_ids"], batch["doc_ids"]
    labels = torch.full_like(input_ids, IGNORE)
    same_doc = (doc_ids[:, 1:] == doc_ids[:, :-1]) & (doc_ids[:, :-1] >= 0)
    labels[:, :-1] = torch.where(same_doc, input_ids[:, 1:], IGNORE)
    return labels


def clm_loss(model, batch: dict, chunk_size: int = CHUNK_SIZE) -> LossOutput:
    """Next-token loss at every labelled position, causal and document-isolated attention."""
    hidden = encode(model, batch, causal=True).last_hidden_state
    labels = clm_labels(batch)
    keep = labels != IGNORE
    loss_sum = head_loss_sum(model, hidden[keep], labels[keep], chunk_size)
    return LossOutput(loss_sum=loss_sum, n_labels=int(keep.sum()))


def mlm_masking(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    mask_rate: float,
    generator: torch.Generator,
    mask_token_id: int,
    random_pool: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels): pick `mask_rate` of maskable positions; 80% [MASK], 10% random, 10% kept.

    Random draws use the CPU `generator`, so a run is reproducible on any device.
    """
    shape, device = input_ids.shape, input_ids.device
    pick = torch.rand(shape, generator=generator).to(device) < mask_rate
    pick &= maskable
    action = torch.rand(shape, generator=generator).to(device)
    random_ids = random_pool[torch.randint(len(random_pool), shape, generator=generator)].to(device)
    inputs = torch.where(pick & (action < 0.8), mask_token_id, input_ids)
    inputs = torch.where(pick & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    labels = torch.where(pick, input_ids, IGNORE)
    return inputs, labels


def sequence_generator(mask_key: str, index: int) -> torch.Generator:
    """The generator of one sequence's masks: a pure function of the key (seed/phase) and its stream index."""
    digest = hashlib.sha256(f"{mask_key}/{int(index)}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def stream_masking(input_ids: torch.Tensor, maskable: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor,
                   mask_rate: float, mask_key: str, mask_token_id: int,
                   random_pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`mlm_masking` with each row's draws from its own generator (`sequence_generator`).

    Row i draws exactly `lengths[i]` values per draw (its real tokens, not the batch's padded
    width), so a sequence's masks are the same whatever it is batched with: any micro-batch, any
    number of processes, any resume, and in both twins (same seed, phase and stream).
    """
    inputs, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE)
    for row in range(input_ids.shape[0]):
        n = int(lengths[row])
        if n == 0:
            continue
        gen = sequence_generator(mask_key, int(indices[row]))
        row_inputs, row_labels = mlm_masking(input_ids[row:row + 1, :n], maskable[row:row + 1, :n], mask_rate, gen,
                                             mask_token_id, random_pool)
        inputs[row, :n], labels[row, :n] = row_inputs[0], row_labels[0]
    return inputs, labels


def never_masked_ids(model) -> list[int]:
    """Every special id of the model's tokenizer (added ones included), else those its config records."""
    return getattr(model, "never_mask_ids", None) or config_special_ids(model.config)


def mlm_loss(model, batch: dict, mask_rate: float, generator: torch.Generator | None = None,
             mask_key: str | None = None) -> LossOutput:
    """Masked-LM loss, bidirectional document-isolated attention, head on masked rows only.

    With `mask_key` (training: "seed/phase") each sequence's masks depend only on the key and its
    index in the stream (`batch["seq_index"]`); otherwise they are drawn from `generator`.
    """
    inputs, labels = mlm_inputs(model, batch, mask_rate, generator, mask_key)
    hidden = encode(model, batch, causal=False, input_ids=inputs).last_hidden_state
    keep = labels != IGNORE
    loss_sum = head_loss_sum(model, hidden[keep], labels[keep])
    return LossOutput(loss_sum=loss_sum, n_labels=int(keep.sum()), labels=labels)


def mlm_inputs(model, batch: dict, mask_rate: float, generator: torch.Generator | None = None,
               mask_key: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of an MLM step: special tokens and padding never masked; see `mlm_loss`."""
    config = model.config
    if getattr(config, "mask_token_id", None) is None:
        raise DetourError("MLM needs a mask token: load the model with detour.model.load.load_mlm_model")
    input_ids = batch["input_ids"]
    special = torch.tensor(never_masked_ids(model), dtype=input_ids.dtype)
    maskable = (batch["doc_ids"] >= 0) & ~torch.isin(input_ids, special.to(input_ids.device))
    if "attention_mask" in batch:
        maskable &= batch["attention_mask"].bool()
    vocab = torch.arange(config.vocab_size)
    random_pool = vocab[~torch.isin(vocab, special)]
    if mask_key is not None:
        if "seq_index" not in batch:
            raise DetourError("stream masks need each sequence's stream index (collate's seq_index)")
        lengths = (batch["attention_mask"] if "attention_mask" in batch else batch["doc_ids"] >= 0).sum(dim=1)
        inputs, labels = stream_masking(input_ids, maskable, lengths.cpu(), batch["seq_index"].cpu(), mask_rate,
                                        mask_key, config.mask_token_id, random_pool)
    else:
        inputs, labels = mlm_masking(input_ids, maskable, mask_rate, generator, config.mask_token_id, random_pool)
    return inputs, labels


def _head_scores(model, rows: torch.Tensor, targets: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of cross-entropies, count of argmax == target) of the MLM head on `rows`, chunked, no gradient."""
    transform, decoder = mlm_head_parts(model)
    loss = torch.zeros((), dtype=torch.float64, device=rows.device)
    correct = torch.zeros((), dtype=torch.int64, device=rows.device)
    if rows.shape[0] == 0:
        return loss, correct
    hidden = transform(rows)
    for start in range(0, rows.shape[0], chunk_size):
        logits = decoder(hidden[start:start + chunk_size]).float()
        y = targets[start:start + chunk_size]
        loss += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=-1) == y).sum()
    return loss, correct


def held_out_scores(model, batch: dict, objective: str, mask_rate: float, mask_key: str,
                    chunk_size: int = CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums for a held-out loss on one batch, and the MLM labels drawn (their positions are hashed).

    Returns (scores, labels): scores is float64 [5] = MLM loss sum, MLM label count, MLM correct
    count, CLM loss sum, CLM label count (both CLM entries 0 unless `objective` is "clm"). The MLM
    masks are the stream masks of `mask_key` and each row's `seq_index`: a pure function of both.
    Call under torch.no_grad() with the model in eval mode.
    """
    inputs, labels = mlm_inputs(model, batch, mask_rate, mask_key=mask_key)
    hidden = encode(model, batch, causal=False, input_ids=inputs).last_hidden_state
    keep = labels != IGNORE
    mlm_sum, mlm_correct = _head_scores(model, hidden[keep], labels[keep], chunk_size)
    clm_sum, clm_count = torch.zeros((), dtype=torch.float64, device=hidden.device), 0
    if objective == "clm":
        hidden = encode(model, batch, causal=True).last_hidden_state
        targets = clm_labels(batch)
        known = targets != IGNORE
        clm_sum, _ = _head_scores(model, hidden[known], targets[known], chunk_size)
        clm_count = int(known.sum())
    scores = torch.stack([mlm_sum, torch.tensor(float(keep.sum()), dtype=torch.float64, device=hidden.device),
                          mlm_correct.double(), clm_sum,
                          torch.tensor(float(clm_count), dtype=torch.float64, device=hidden.device)])
    return scores, labels


def objective_loss(model, batch: dict, objective: str, mask_rate: float | None, generator) -> LossOutput:
    """Dispatch on the phase's objective: "clm" or "mlm" (which needs 0 < mask_rate < 1)."""
    if objective == "clm":
        return clm_loss(model, batch)
    if objective == "mlm":
        if mask_rate is None or not 0.0 < mask_rate < 1.0:
            raise DetourError(f"phase objective mlm: mask_rate must be in (0, 1), got {mask_rate}")
        return mlm_loss(model, batch, mask_rate, generator)
    raise DetourError(f"phase objective: {objective!r} is not one of clm, mlm")
