"""The Hugging Face Trainer's training loop, run on exactly what `detour.eval.finetune` trains: the
same network and initial weights, the same batches in the same order, the same dropout draws. What
is left to differ is the loop itself (optimizer and its weight-decay groups, learning-rate schedule,
gradient clipping, loss, step order), so the two must end with the same weights; a fine-tune that
scores apart from the Trainer's under the same draws has a loop that computes something else.

    python -c "from detour.eval.reference import *; from detour.eval.finetune import *; \
from detour.eval.tasks import load_spec; from detour.paths import minilm_path; m = str(minilm_path()); \
p = prepare_task(load_spec('gad'), m, Budget(epochs=1, max_train=64, max_eval=64, max_length=64)); \
print(finetune(m, p, seed=0)['metrics']['macro_f1'], trainer_finetune(m, p, seed=0)['metrics']['macro_f1'])"

Needs `accelerate` (the Trainer refuses to start without it). Validation and test are scored by
detour's own `evaluate` in both loops, and the best epoch is chosen as `finetune` chooses it: this
checks the training loop, while the stock Trainer beside detour in `bench/bench_eval.py` checks the
rest (its own model classes, sampler, scoring and model selection) over seeds.
"""

from __future__ import annotations

import math
import tempfile
import time

import torch
from torch import nn

from detour.eval.finetune import PreparedTask, build_model, evaluate, seed_everything, train_order
from detour.eval.metrics import split_answers


class _TrainerModel(nn.Module):
    """detour's encoder + head with the Trainer's calling convention: batch keys as arguments (the
    labels under whatever keys the task type uses), a dict with `loss` back, the head's loss as it is."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.losses: list[float] = []  # each training step's loss, as finetune's on_step sees them

    def forward(self, input_ids, attention_mask, **batch):
        logits, loss = self.inner({"input_ids": input_ids, "attention_mask": attention_mask, **batch})
        if self.training:
            self.losses.append(loss.item())
        return {"loss": loss, "logits": logits}


class _Order(torch.utils.data.Sampler):
    """Batches of training rows, each epoch's order drawn as `finetune` draws it (a generator seeded
    with the run seed, one `train_order` call per epoch)."""

    def __init__(self, prep: PreparedTask, seed: int):
        self.prep, self.generator = prep, torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.prep.tensors["train"]) / self.prep.batch_size)

    def __iter__(self):
        size = self.prep.batch_size
        order = train_order(self.prep.tensors["train"].lengths, size, self.prep.spec.training.group_by_length,
                            self.generator)
        return iter([order[s : s + size] for s in range(0, len(order), size)])


def trainer_finetune(model_name: str, prep: PreparedTask, seed: int, device: str = "cpu") -> dict:
    """`finetune(model_name, prep, seed)` with the training loop of `transformers.Trainer`; returns the
    test metrics at the best validation epoch, the epoch, the validation history,
    every step's training loss, the selected epoch's weights and the seconds inside the epochs
    (`timings.train_s`, as finetune's)."""
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    if prep.spec.training.head_lr:
        raise ValueError("the Trainer has one learning rate for all weights; this spec's training.head_lr has no "
                         "counterpart there")
    seed_everything(seed)
    model = build_model(model_name, prep, linear_probe=False).to(device)
    # The Trainer seeds anew when training starts; detour's loop goes on from the state the head's
    # initialisation left, so that state is put back as the Trainer begins.
    after_init = torch.get_rng_state()
    head_key = prep.spec.headline
    best = {"score": -math.inf, "epoch": 0, "weights": None}
    history = []
    clock = {"train_s": 0.0, "start": 0.0}

    class EpochEnd(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            torch.set_rng_state(after_init)

        def on_epoch_begin(self, args, state, control, **kwargs):
            clock["start"] = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            clock["train_s"] += time.perf_counter() - clock["start"]  # the epoch's steps, before its validation
            epoch = len(history) + 1
            score = evaluate(model, prep, "validation", device)[head_key]
            history.append({"epoch": epoch, head_key: score})
            if score > best["score"]:
                best.update(score=score, epoch=epoch, weights=model.trainable_state())

    class OrderedTrainer(Trainer):
        def get_train_dataloader(self):
            train = prep.tensors["train"]
            # its own generator: a DataLoader without one draws its base seed from torch's global
            # generator each epoch, which would move the dropout draws
            return torch.utils.data.DataLoader(range(len(train)), batch_sampler=_Order(prep, seed),
                                               collate_fn=train.batch, generator=torch.Generator())

    t = prep.spec.training
    # warmup_steps below 1 is a share of all steps (transformers 5); the spec's warmup_ratio is below 1
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, learning_rate=prep.lr, per_device_train_batch_size=prep.batch_size,
            num_train_epochs=prep.epochs, weight_decay=t.weight_decay, warmup_steps=t.warmup_ratio,
            lr_scheduler_type="linear", max_grad_norm=1.0, optim="adamw_torch_fused", seed=seed,
            eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
            dataloader_num_workers=0, remove_unused_columns=False, use_cpu=torch.device(device).type == "cpu",
            bf16=torch.device(device).type == "cuda",  # finetune's bf16 autocast on CUDA
        )
        wrapped = _TrainerModel(model)
        trainer = OrderedTrainer(model=wrapped, args=args, train_dataset=range(len(prep.tensors["train"])),
                                 callbacks=[EpochEnd()])
        trainer.remove_callback(PrinterCallback)  # its end-of-training summary on stdout
        # The head's loss is already the mean finetune takes: no loss keywords for the model, which a
        # forward taking **batch would otherwise count as accepting.
        trainer.model_accepts_loss_kwargs = False
        trainer.train()
    model.load_trainable_state(best["weights"])
    return {**split_answers(evaluate(model, prep, "test", device)), "selected_epoch": best["epoch"], "validation": history,
            "losses": wrapped.losses, "weights": best["weights"], "timings": {"train_s": round(clock["train_s"], 3)}}
