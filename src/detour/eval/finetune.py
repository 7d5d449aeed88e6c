"""Fine-tune one encoder on one task with one seed: train, pick the best epoch on validation,
score test once with the selected weights.

    python -c "from detour.eval.finetune import *; from detour.eval.tasks import load_spec; \
from detour.paths import minilm_path; m = str(minilm_path()); \
p = prepare_task(load_spec('gad'), m, Budget(epochs=1, max_train=64, max_eval=64, max_length=64)); \
print(finetune(m, p, seed=0)['metrics'])"

The best epoch's weights are kept in memory (a detached copy), never on disk. Everything random
is seeded from the run seed: python, numpy, torch (head init, dropout) and the data order.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from detour.errors import DetourError
from detour.eval.heads import EncoderWithHead
from detour.eval.splits import load_splits, subsample
from detour.eval.tasks import TaskSpec, get_task_type

PADDED = {"input_ids": None, "attention_mask": 0, "token_labels": -100}


@dataclass
class Budget:
    """Overrides of the spec's settings (None keeps the spec's), all recorded in results."""

    epochs: int | None = None
    max_train: int | None = None
    max_eval: int | None = None
    max_length: int | None = None
    lr: float | None = None
    batch_size: int | None = None


@dataclass
class PreparedTask:
    spec: TaskSpec
    labels: list[str]
    examples: dict[str, list[dict]]
    features: dict[str, list[dict]]
    max_length: int
    epochs: int
    lr: float
    batch_size: int
    pad_id: int
    info: dict = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_max_length(model: str, tokenizer) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model)
    limit = getattr(cfg, "max_position_embeddings", None) or 10**9
    if cfg.model_type in ("roberta", "camembert", "xlm-roberta"):
        limit -= 2  # positions start after the padding index
    tok_limit = tokenizer.model_max_length if tokenizer.model_max_length < 10**6 else 10**9
    return min(limit, tok_limit)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except OSError as exc:
        raise DetourError(f"cannot load a tokenizer from {model!r}: {exc}") from None


def prepare_task(spec: TaskSpec, model: str, budget: Budget, splits: dict | None = None) -> PreparedTask:
    """Read (or reuse) the splits, cap them, and tokenize them for `model`'s tokenizer."""
    tokenizer = load_tokenizer(model)
    task_type = get_task_type(spec.type)
    splits = splits or load_splits(spec)
    examples = {
        "train": subsample(splits["train"], budget.max_train),
        "validation": subsample(splits["validation"], budget.max_eval),
        "test": subsample(splits["test"], budget.max_eval),
    }
    for name, exs in examples.items():
        if not exs:
            raise DetourError(f"task {spec.name}: the {name} split is empty")
    labels = task_type.label_set(spec, splits["train"])  # the full train's labels, whatever the cap
    max_length = min(budget.max_length or spec.max_length, model_max_length(model, tokenizer))
    features = {k: task_type.encode(v, tokenizer, spec, labels, max_length) for k, v in examples.items()}
    t = spec.training
    return PreparedTask(
        spec=spec, labels=labels, examples=examples, features=features, max_length=max_length,
        epochs=budget.epochs or t.epochs, lr=budget.lr or t.lr, batch_size=budget.batch_size or t.batch_size,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )


def collate(features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    longest = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key, fill in PADDED.items():
        if key == "attention_mask":
            rows = [[1] * len(f["input_ids"]) + [0] * (longest - len(f["input_ids"])) for f in features]
        elif key in features[0]:
            value = pad_id if fill is None else fill
            rows = [f[key] + [value] * (longest - len(f[key])) for f in features]
        else:
            continue
        batch[key] = torch.tensor(rows, dtype=torch.long)
    if "label" in features[0]:
        batch["label"] = torch.tensor([f["label"] for f in features], dtype=torch.long)
    if "label_vector" in features[0]:
        batch["label_vector"] = torch.tensor([f["label_vector"] for f in features], dtype=torch.float)
    return batch


def _optimizer(model: EncoderWithHead, lr: float, head_lr: float | None, weight_decay: float):
    # No weight decay on biases and norm weights, as in the HF Trainer and the paper.
    groups = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = p.ndim >= 2 and "norm" not in name.lower()
        rate = head_lr if (head_lr and name.startswith("head.")) else lr
        groups.setdefault((decay, rate), []).append(p)
    return torch.optim.AdamW(
        [{"params": ps, "lr": rate, "weight_decay": weight_decay if decay else 0.0} for (decay, rate), ps in groups.items()]
    )


@torch.no_grad()
def predict_logits(model, features, pad_id, batch_size, device) -> list[np.ndarray]:
    """Logits per feature (unpadded rows for token tasks), batched by length for speed."""
    model.eval()
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    out: list = [None] * len(features)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        batch = {k: v.to(device) for k, v in collate([features[i] for i in idx], pad_id).items()}
        with _autocast(device):
            logits, _ = model(batch)
        logits = logits.float().cpu().numpy()
        for row, i in zip(logits, idx):
            out[i] = row[: len(features[i]["input_ids"])] if logits.ndim == 3 else row
    return out


def _autocast(device):
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def evaluate(model, prep: PreparedTask, split: str, device) -> dict[str, float]:
    task_type = get_task_type(prep.spec.type)
    logits = predict_logits(model, prep.features[split], prep.pad_id, prep.batch_size * 2, device)
    preds = task_type.predict(logits, prep.features[split], len(prep.examples[split]), prep.labels)
    metrics = task_type.score(prep.examples[split], preds, prep.labels)
    if prep.spec.headline not in metrics:
        raise DetourError(f"task {prep.spec.name}: headline {prep.spec.headline!r} is not one of {sorted(metrics)}")
    return metrics


def build_model(model_name: str, prep: PreparedTask, linear_probe: bool) -> EncoderWithHead:
    from transformers import AutoModel

    try:
        encoder = AutoModel.from_pretrained(model_name, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise DetourError(f"cannot load an encoder from {model_name!r}: {exc}") from None
    hidden = encoder.config.hidden_size
    head = get_task_type(prep.spec.type).build_head(hidden, prep.spec, prep.labels, prep.features["train"])
    return EncoderWithHead(encoder, head, linear_probe=linear_probe)


def finetune(model_name: str, prep: PreparedTask, seed: int, linear_probe: bool = False,
             device: str | None = None, on_step=None) -> dict:
    """Train `prep.epochs` epochs; returns test metrics at the best validation epoch, and more."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(seed)
    model = build_model(model_name, prep, linear_probe).to(device)
    t = prep.spec.training
    optimizer = _optimizer(model, prep.lr, t.head_lr, t.weight_decay)
    train = prep.features["train"]
    steps_per_epoch = math.ceil(len(train) / prep.batch_size)
    total = steps_per_epoch * prep.epochs
    warmup = int(t.warmup_ratio * total)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    order_rng = torch.Generator().manual_seed(seed)
    head_key = prep.spec.headline
    best = (-math.inf, 0, None)
    history, train_s, eval_s = [], 0.0, 0.0
    for epoch in range(1, prep.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(len(train), generator=order_rng).tolist()
        for s in range(0, len(perm), prep.batch_size):
            batch = {k: v.to(device) for k, v in collate([train[i] for i in perm[s : s + prep.batch_size]], prep.pad_id).items()}
            with _autocast(device):
                _, loss = model(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()
            schedule.step()
            if on_step:
                on_step(loss.item())
        train_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        val = evaluate(model, prep, "validation", device)
        eval_s += time.perf_counter() - t0
        history.append({"epoch": epoch, head_key: val[head_key]})
        if val[head_key] > best[0]:
            best = (val[head_key], epoch, model.trainable_state())
    model.load_trainable_state(best[2])
    t0 = time.perf_counter()
    metrics = evaluate(model, prep, "test", device)
    eval_s += time.perf_counter() - t0
    return {
        "metrics": metrics,
        "selected_epoch": best[1],
        "validation": history,
        "timings": {"train_s": round(train_s, 3), "eval_s": round(eval_s, 3)},
    }
