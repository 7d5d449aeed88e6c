"""Task heads on top of any Hugging Face `AutoModel` encoder, and the encoder + head wrapper.

    python -c "from detour.eval.heads import TokenHead; print(TokenHead(384, 3))"

Each head maps the encoder's last hidden states (batch, length, hidden) and the batch to
(logits, loss); the loss is None when the batch carries no labels. `EncoderWithHead` freezes the
encoder for linear probing (only the head trains; the encoder runs without gradients).
"""

from __future__ import annotations

import torch
from torch import nn


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    if how == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class SequenceHead(nn.Module):
    """Single-label classification: dropout + linear on the CLS vector or the mean of tokens."""

    def __init__(self, hidden: int, n_labels: int, pooling: str = "cls", dropout: float = 0.1):
        super().__init__()
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, hidden, batch):
        logits = self.out(self.dropout(pool(hidden, batch["attention_mask"], self.pooling)))
        loss = nn.functional.cross_entropy(logits, batch["label"]) if "label" in batch else None
        return logits, loss


class MultiLabelHead(SequenceHead):
    """Multi-label: one logit per label, BCEWithLogits weighted per label by negatives/positives
    in train (capped), so rare labels are not drowned; a label is predicted when sigmoid >= 0.5."""

    def __init__(self, hidden, n_labels, pooling="cls", dropout=0.1, pos_weight: torch.Tensor | None = None):
        super().__init__(hidden, n_labels, pooling, dropout)
        self.register_buffer("pos_weight", pos_weight if pos_weight is not None else torch.ones(n_labels))

    def forward(self, hidden, batch):
        logits = self.out(self.dropout(pool(hidden, batch["attention_mask"], self.pooling)))
        loss = None
        if "label_vector" in batch:
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, batch["label_vector"], pos_weight=self.pos_weight
            )
        return logits, loss


class TokenHead(nn.Module):
    """Token classification: dropout + linear per sub-token; loss on labelled (first) sub-tokens."""

    def __init__(self, hidden: int, n_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, hidden, batch):
        logits = self.out(self.dropout(hidden))
        loss = None
        if "token_labels" in batch:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["token_labels"].flatten(), ignore_index=-100)
        return logits, loss


class EncoderWithHead(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module, linear_probe: bool = False):
        super().__init__()
        self.encoder, self.head, self.linear_probe = encoder, head, linear_probe
        if linear_probe:
            self.encoder.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.linear_probe:
            self.encoder.eval()  # a frozen encoder also keeps its dropout off
        return self

    def forward(self, batch):
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.linear_probe):
            hidden = self.encoder(**kwargs).last_hidden_state
        return self.head(hidden, batch)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of what training changes (the head only, when linear probing)."""
        module = self.head if self.linear_probe else self
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        (self.head if self.linear_probe else self).load_state_dict(state)
