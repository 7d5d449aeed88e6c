"""Fine-tune one encoder on one task with one seed: train, pick the best epoch on validation,
score test once with the selected weights.

    python -c "from detour.eval.finetune import *; from detour.eval.tasks import load_spec; \
from detour.paths import minilm_path; m = str(minilm_path()); \
p = prepare_task(load_spec('gad'), m, Budget(epochs=1, max_train=64, max_eval=64, max_length=64)); \
print(finetune(m, p, seed=0)['metrics'])"

The best epoch's weights are kept in memory (a detached copy). Everything random is seeded from
the run seed: python, numpy, torch (head init, dropout) and the data order.

Speed: each split is tokenized once and padded into tensors once (`prepare_task`; with `cache=`, a
dict kept by the caller, once per tokenizer and budget across models and seeds); a batch is a row
selection of those tensors cut to its longest input. With the spec's `training.group_by_length`
(the default) the train batches hold inputs of about the same length, so little of each batch is
padding; validation and test are scored in batches sorted by length, larger than training's.

With `checkpoint=PATH`, the whole training state is saved there after every epoch (atomically,
tensors and plain values only, read back with `torch.load(weights_only=True)`): the trainable
weights, the optimizer and scheduler, every random generator, the best epoch's weights so far and
the validation history. A later call with the same PATH and `checkpoint_key` resumes after the
saved epoch and ends with the same result as an uninterrupted run (bit for bit on CPU).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from detour.compute import compute_record
from detour.errors import DetourError, NoSpaceError
from detour.io import atomic_write, is_disk_full, no_space
from detour.data.tokenize import load_tokenizer
from detour.eval.heads import EncoderWithHead
from detour.eval.metrics import split_answers
from detour.eval.splits import load_splits, subsample
from detour.eval.tasks import TaskSpec, get_task_type
from detour.eval.validate import validate_task

PADDED = {"input_ids": None, "attention_mask": 0, "token_labels": -100}

# Scoring batches (no gradients, nothing kept for a backward pass) take up to SCORE_ROWS[device]
# times the training batch's inputs, and at most the tokens of SCORE_TOKENS_BATCHES training batches
# at the full max length: sorted by length, short inputs go many to a batch, long ones fewer, and no
# scoring batch holds more attention than two full-length training batches would. On CPU larger
# batches were slower (MiniLM-L6, one thread, NCBI Disease and GAD validation: 8x the training batch
# scored 20-25% fewer inputs a second than 2x), so the CPU keeps 2x; a GPU takes 8x.
SCORE_ROWS = {"cpu": 2, "cuda": 8}
SCORE_TOKENS_BATCHES = 2


@dataclass
class Budget:
    """Overrides of the spec's settings (None keeps the spec's), all recorded in results."""

    epochs: int | None = None
    max_train: int | None = None
    max_eval: int | None = None
    max_length: int | None = None
    lr: float | None = None
    batch_size: int | None = None


def _given(override, spec_value):
    """An override replaces the spec's value even when it is falsy (0 is refused earlier, never swallowed)."""
    return spec_value if override is None else override


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
    tensors: dict[str, "SplitTensors"] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_max_length(model: str, tokenizer) -> int:
    from detour.model.load import load_config

    _, cfg = load_config(model)
    limit = getattr(cfg, "max_position_embeddings", None) or 10**9
    if cfg.model_type in ("roberta", "camembert", "xlm-roberta"):
        limit -= 2  # positions start after the padding index
    tok_limit = tokenizer.model_max_length if tokenizer.model_max_length < 10**6 else 10**9
    return min(limit, tok_limit)


def tokenizer_fingerprint(tokenizer) -> str:
    """A sha256 of what decides how the tokenizer turns text into ids: its whole definition (vocabulary,
    normalizer, pre-tokenizer, special-token template), its special tokens and pad id; not where it was
    read from, nor the python class that wraps it (a folder whose config names another model family
    may load the same definition as another class)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        # the truncation and padding a tokenizer was last called with (or saved with), not what it is:
        # every encode call passes its own
        definition.pop("truncation", None)
        definition.pop("padding", None)
    else:  # a python-only tokenizer: its class is its algorithm
        definition = {"class": type(tokenizer).__name__, "vocab": sorted(tokenizer.get_vocab().items())}
    extra = {"special": tokenizer.special_tokens_map, "pad_token_id": tokenizer.pad_token_id}
    # sorted: two saves of one tokenizer may order their JSON apart
    text = json.dumps({"definition": definition, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _features_key(tokenizer, spec: TaskSpec, labels: list[str], max_length: int, examples: dict) -> str:
    """Everything the features of a task depend on: the tokenizer, the max length, the spec's encoding
    fields (not its training settings), the label list and the examples themselves."""
    spec_part = spec.model_dump(mode="json", exclude={"training", "description", "source", "root"})
    text = json.dumps({"tokenizer": tokenizer_fingerprint(tokenizer), "max_length": max_length, "spec": spec_part,
                       "labels": labels, "examples": examples}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare_task(spec: TaskSpec, model: str, budget: Budget, splits: dict | None = None,
                 cache: dict | None = None) -> PreparedTask:
    """Read (or reuse) the splits, cap them, and tokenize them for `model`'s tokenizer.

    cache: a dict the caller keeps; the features and their tensors are stored in it under a key of
    the tokenizer's fingerprint, the max length, the spec's encoding fields, the labels and the
    examples, and reused by a later call with the same key (another seed, or another model with the
    same tokenizer). `info["features_cached"]` says whether this call reused them.
    """
    tokenizer = load_tokenizer(model)
    task_type = get_task_type(spec.type)
    splits = splits or load_splits(spec)
    validate_task(spec, splits, budget)  # spec and data checked before the tokenizer's work and any training
    examples = {
        "train": subsample(splits["train"], budget.max_train),
        "validation": subsample(splits["validation"], budget.max_eval),
        "test": subsample(splits["test"], budget.max_eval),
    }
    for name, exs in examples.items():
        if not exs:
            raise DetourError(f"task {spec.name}: the {name} split is empty")
    labels = task_type.label_set(spec, splits["train"])  # the full train's labels, whatever the cap
    max_length = min(spec.max_length if budget.max_length is None else budget.max_length, model_max_length(model, tokenizer))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    key = _features_key(tokenizer, spec, labels, max_length, examples) if cache is not None else None
    cached = key in cache if cache is not None else False
    if cached:
        features, tensors = cache[key]
    else:
        features = {k: task_type.encode(v, tokenizer, spec, labels, max_length) for k, v in examples.items()}
        tensors = {k: SplitTensors(v, pad_id) for k, v in features.items()}
        if cache is not None:
            cache[key] = (features, tensors)
    t = spec.training
    return PreparedTask(
        spec=spec, labels=labels, examples=examples, features=features, max_length=max_length,
        epochs=_given(budget.epochs, t.epochs), lr=_given(budget.lr, t.lr),
        batch_size=_given(budget.batch_size, t.batch_size), pad_id=pad_id,
        info={"features_cached": cached}, tensors=tensors,
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


class SplitTensors:
    """One split's features padded once into tensors (to the split's longest input); `batch(rows)`
    selects rows and cuts them to the longest of those rows: the same tensors `collate` makes of
    those features, without building python lists again at every step of every epoch."""

    def __init__(self, features: list[dict], pad_id: int):
        self.lengths = [len(f["input_ids"]) for f in features]
        self._lengths = torch.tensor(self.lengths, dtype=torch.long)
        self._tensors = collate(features, pad_id)

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows: list[int]) -> dict[str, torch.Tensor]:
        index = torch.tensor(rows, dtype=torch.long)
        longest = int(self._lengths[index].max())
        return {k: v[index, :longest] if k in PADDED else v[index] for k, v in self._tensors.items()}


def train_order(lengths: list[int], batch_size: int, group_by_length: bool, generator: torch.Generator) -> list[int]:
    """The order of one epoch's training inputs (consecutive slices of batch_size are the batches).

    group_by_length: the HF Trainer's own length grouping (transformers' `get_length_grouped_indices`,
    called, not copied): a permutation drawn from `generator`, cut into mega-batches of up to 50
    batches, each sorted by length (longest first; the longest input of all in the first batch).
    Otherwise the permutation alone. Either way the generator is drawn from exactly once, by one
    `torch.randperm`, so the saved generator state resumes the same order.
    """
    if not group_by_length:
        return torch.randperm(len(lengths), generator=generator).tolist()
    from transformers.trainer_pt_utils import get_length_grouped_indices

    return get_length_grouped_indices(lengths, batch_size, generator=generator)


def score_batches(lengths: list[int], batch_size: int, max_length: int, device="cpu") -> list[list[int]]:
    """Scoring batches: inputs sorted by length, each batch up to SCORE_ROWS[device] training batches
    of inputs and SCORE_TOKENS_BATCHES full-length training batches of tokens (padding included)."""
    rows = SCORE_ROWS.get(torch.device(device).type, SCORE_ROWS["cpu"]) * batch_size
    tokens = SCORE_TOKENS_BATCHES * batch_size * max_length
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        # sorted ascending, so the batch's longest input is the one being added
        if current and (len(current) == rows or (len(current) + 1) * lengths[i] > tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def _optimizer(model: EncoderWithHead, lr: float, head_lr: float | None, weight_decay: float):
    # No weight decay on biases and norm weights, as in the HF Trainer and the paper.
    groups = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = p.ndim >= 2 and "norm" not in name.lower()
        rate = head_lr if (head_lr and name.startswith("head.")) else lr
        groups.setdefault((decay, rate), []).append(p)
    params = [{"params": ps, "lr": rate, "weight_decay": weight_decay if decay else 0.0}
              for (decay, rate), ps in groups.items()]
    # The fused kernel (as the HF Trainer's default adamw_torch_fused) computes the same update in one
    # pass over the weights: on 2 CPU cores about 6x faster than the per-tensor loop over MiniLM's weights,
    # where the optimizer step had been a large part of each fine-tuning step.
    try:
        return torch.optim.AdamW(params, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype the fused kernel does not take
        return torch.optim.AdamW(params)


@torch.inference_mode()  # no autograd records at all: scoring builds no graph and keeps no version counters
def predict_logits(model, tensors: SplitTensors, batch_size: int, max_length: int, device) -> list[np.ndarray]:
    """Logits per feature (unpadded rows for token tasks), in batches sorted by length (score_batches)."""
    model.eval()
    out: list = [None] * len(tensors)
    for idx in score_batches(tensors.lengths, batch_size, max_length, device):
        batch = {k: v.to(device) for k, v in tensors.batch(idx).items()}
        with _autocast(device):
            logits, _ = model(batch)
        logits = logits.float().cpu().numpy()
        for row, i in zip(logits, idx):
            out[i] = row[: tensors.lengths[i]] if logits.ndim == 3 else row
    return out


def _autocast(device):
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def evaluate(model, prep: PreparedTask, split: str, device) -> dict[str, float]:
    task_type = get_task_type(prep.spec.type)
    logits = predict_logits(model, prep.tensors[split], prep.batch_size, prep.max_length, device)
    preds = task_type.predict(logits, prep.features[split], len(prep.examples[split]), prep.labels)
    metrics = task_type.score(prep.examples[split], preds, prep.labels)
    if prep.spec.headline not in metrics:
        raise DetourError(f"task {prep.spec.name}: headline {prep.spec.headline!r} is not one of {sorted(metrics)}")
    return metrics


def build_model(model_name: str, prep: PreparedTask, linear_probe: bool) -> EncoderWithHead:
    from detour.model.load import load_encoder

    encoder, _ = load_encoder(model_name, attn_implementation="sdpa")
    hidden = encoder.config.hidden_size
    head = get_task_type(prep.spec.type).build_head(hidden, prep.spec, prep.labels, prep.features["train"])
    return EncoderWithHead(encoder, head, linear_probe=linear_probe)


CHECKPOINT_FORMAT = "detour.eval.epoch/1"


def _rng_state(order_rng: torch.Generator) -> dict:
    """Every generator training draws from, as tensors and plain values (numpy's array as ints)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "order": order_rng.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, order_rng: torch.Generator) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    order_rng.set_state(state["order"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """An epoch checkpoint as saved by `finetune`; `mmap=True` reads the tensors only when used
    (enough to look at its key and epoch). Only tensors and plain values can be in it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # truncated, not a torch file, or holding code: never used
        raise DetourError(f"{path}: not a readable epoch checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise DetourError(f"{path}: not an epoch checkpoint of this detour version (format {CHECKPOINT_FORMAT})")
    return state


def finetune(model_name: str, prep: PreparedTask, seed: int, linear_probe: bool = False,
             device: str | None = None, on_step=None, on_epoch=None,
             checkpoint: str | Path | None = None, checkpoint_key: str = "") -> dict:
    """Train `prep.epochs` epochs; returns test metrics at the best validation epoch, and more.

    on_step(loss) after every optimizer step; on_epoch(info) after every epoch, once its state is
    saved, with info = {epoch, epochs, score (validation headline), seconds (train + validation)}.
    checkpoint: the file for the per-epoch training state (see the module docstring); a state
    saved with another checkpoint_key is refused, never resumed.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(seed)
    model = build_model(model_name, prep, linear_probe).to(device)
    t = prep.spec.training
    optimizer = _optimizer(model, prep.lr, t.head_lr, t.weight_decay)
    schedule = _linear_schedule(optimizer, prep)
    order_rng = torch.Generator().manual_seed(seed)
    head_key = prep.spec.headline
    progress = {"best": (-math.inf, 0, None), "history": [], "train_s": 0.0, "eval_s": 0.0, "first": 1}
    if checkpoint is not None and Path(checkpoint).exists():
        progress = _resume(checkpoint, checkpoint_key, prep, model, optimizer, schedule, order_rng)
    best, history, train_s, eval_s, first = (progress[k] for k in ("best", "history", "train_s", "eval_s", "first"))
    for epoch in range(first, prep.epochs + 1):
        t0 = time.perf_counter()
        _train_epoch(model, optimizer, schedule, prep, order_rng, device, on_step)
        epoch_train_s = time.perf_counter() - t0
        train_s += epoch_train_s
        t0 = time.perf_counter()
        val = evaluate(model, prep, "validation", device)
        epoch_eval_s = time.perf_counter() - t0
        eval_s += epoch_eval_s
        history.append({"epoch": epoch, head_key: val[head_key]})
        if val[head_key] > best[0]:
            best = (val[head_key], epoch, model.trainable_state())
        if checkpoint is not None:
            _save_epoch(checkpoint, {
                "format": CHECKPOINT_FORMAT, "key": checkpoint_key, "epoch": epoch, "epochs": prep.epochs,
                "weights": model.trainable_state(), "optimizer": optimizer.state_dict(),
                "scheduler": schedule.state_dict(), "rng": _rng_state(order_rng),
                "best_score": best[0], "best_epoch": best[1],
                # the best weights are the current ones when this epoch is the best: not saved twice
                "best_weights": None if best[1] in (0, epoch) else best[2],
                "history": history, "train_s": train_s, "eval_s": eval_s,
            })
        if on_epoch:
            on_epoch({"epoch": epoch, "epochs": prep.epochs, "score": val[head_key],
                      "seconds": epoch_train_s + epoch_eval_s})
    model.load_trainable_state(best[2])
    t0 = time.perf_counter()
    scores = evaluate(model, prep, "test", device)
    eval_s += time.perf_counter() - t0
    return {
        **split_answers(scores),  # "metrics": scores in [0, 1]; "answers": what it answered
        "selected_epoch": best[1],
        "validation": history,
        "timings": {"train_s": round(train_s, 3), "eval_s": round(eval_s, 3)},
        "compute": compute_record(device),  # equal scores on CPU need equal threads and versions
        "resumed_after_epoch": first - 1,
    }


def _linear_schedule(optimizer, prep: PreparedTask):
    """Linear warm-up over the spec's warmup_ratio of all steps (rounded up), from 0 at the first step,
    then linear decay to 0: the HF Trainer's `linear` schedule, step for step (detour.eval.reference
    checks it)."""
    total = math.ceil(len(prep.features["train"]) / prep.batch_size) * prep.epochs
    warmup = math.ceil(prep.spec.training.warmup_ratio * total)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )


def _resume(checkpoint, checkpoint_key: str, prep: PreparedTask, model, optimizer, schedule,
            order_rng: torch.Generator) -> dict:
    """Every state moved on to where the saved epoch left it; the progress to continue from."""
    saved = read_checkpoint(checkpoint)
    if saved["key"] != checkpoint_key or saved["epochs"] != prep.epochs:
        raise DetourError(f"{checkpoint}: saved for other settings than this run's; remove it to start this seed afresh")
    # The model, optimizer and schedule were built exactly as in the first run (the seeded
    # generators included); now every state moves on to where that run saved it.
    model.load_trainable_state(saved["weights"])
    optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["scheduler"])
    _set_rng_state(saved["rng"], order_rng)
    epoch = saved["epoch"]
    best_weights = model.trainable_state() if saved["best_epoch"] == epoch else saved["best_weights"]
    return {"best": (saved["best_score"], saved["best_epoch"], best_weights), "history": list(saved["history"]),
            "train_s": saved["train_s"], "eval_s": saved["eval_s"], "first": epoch + 1}


def _train_epoch(model, optimizer, schedule, prep: PreparedTask, order_rng: torch.Generator, device,
                 on_step=None) -> None:
    """One pass over the training features in a seeded order, one optimizer step per batch."""
    train = prep.tensors["train"]
    model.train()
    order = train_order(train.lengths, prep.batch_size, prep.spec.training.group_by_length, order_rng)
    for s in range(0, len(order), prep.batch_size):
        batch = {k: v.to(device) for k, v in train.batch(order[s : s + prep.batch_size]).items()}
        with _autocast(device):
            _, loss = model(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        schedule.step()
        if on_step:
            on_step(loss.item())


def _save_epoch(checkpoint, state: dict) -> None:
    Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(checkpoint, lambda tmp: torch.save(state, tmp))
    except (OSError, RuntimeError) as exc:  # torch says "unexpected pos" where the disk is full
        if not is_disk_full(exc):
            raise
        raise NoSpaceError(no_space(f"epoch checkpoint {checkpoint}", Path(checkpoint).parent, exc, _bytes_of(state),
                                    "the temporary file was removed and the earlier epochs' checkpoint, if any, is "
                                    "intact; free space, then rerun the same command")) from None


def _bytes_of(obj) -> int:
    """About the bytes torch.save writes for `obj`: its tensors'."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_bytes_of(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_bytes_of(v) for v in obj)
    return 0
