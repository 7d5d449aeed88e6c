"""The training loop: phases of CLM or MLM over one token stream, with exact token budgets.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny

`train(recipe, out)` reads top to bottom: set up (model, data stream, optimizer, maybe resume), then
for each phase: apply its freeze and optimizer policy, run steps until the phase has consumed exactly
its token budget (the last step may be smaller), score the held-out sequences when due (with
`validation:`, see validation.py), checkpoint periodically and at the phase end, and export a
Hugging Face folder. The objective of a phase is data: the same loop runs the detour and
its MLM twin.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from detour.compute import same_compute
from detour.config import PhaseSpec, Recipe, recipe_to_dict
from detour.data.packing import PackedStream, collate, validate_seq_len
from detour.errors import DetourError
from detour.io import write_json
from detour.train.branch import branch_start, parent_metrics, stream_continuity
from detour.train.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from detour.train.distributed import DataParallelism, micro_batches, rank_sequences, stand_in_batch
from detour.train.heap import allocator_advice, steady_cpu_heap
from detour.quiet import quiet_transformers
from detour.train.metrics import MetricsLog, Progress, write_curves
from detour.train.schedule import lr_at
from detour.train.outdir import check_out_dir, start_out_dir
from detour.train.setup import build_model, build_optimizer, check_data_matches_tokenizer, preflight, select_device
from detour.train.world import World, check_strategy, compute_session, init_world, shutdown_world
from detour.train.trackers import Trackers
from detour.train.validation import Validation
from detour.stop import StopFlag, stop_signals_to
from detour.runs import RunFolder
from detour.lock import folder_lock

class TrainingStopped(Exception):
    """A signal asked the run to stop; a checkpoint was saved first."""

    def __init__(self, signum: int, checkpoint: Path):
        super().__init__(f"stopped by signal {signum}; checkpoint saved at {checkpoint}; rerun with --resume")
        self.checkpoint = checkpoint


@dataclass
class TrainResult:
    out: Path
    summary: dict[str, Any]


def fresh_state(world_size: int) -> dict[str, Any]:
    return {"phase_index": 0, "phase_step": 0, "phase_tokens": 0, "global_step": 0, "global_tokens": 0,
            "world_size": world_size, "sampler": None, "phases": {}}


@quiet_transformers()  # detour shows progress itself; transformers' bars and load reports only add noise
def train(recipe: Recipe, out: str | Path, resume: bool = False, progress: bool = True,
          trust_unverified: bool = False) -> TrainResult:
    """Run `recipe` into `out`, holding the folder's lock (detour.lock) from the first check to the end.

    `trust_unverified`: resume from a checkpoint that has no manifest (written by a detour before
    checkpoints carried one), with a warning; without it such a checkpoint is skipped.
    """
    out = Path(out)
    world = init_world()
    device = select_device(recipe.device, world.local_rank)
    if device.type == "cpu":
        steady_cpu_heap()  # a step's buffers stay for the next step, not faulted in anew (detour.train.heap)
        advice = allocator_advice() if progress and world.main else None
        if advice:
            print(f"detour: note: {advice}", file=sys.stderr)
    recipe.grad_accumulation(world.size)  # a full step splits evenly; a phase's last one need not
    check_strategy(recipe, world)
    preflight(recipe, out)
    # Rank 0 holds the lock for the job: every rank writes into the same folder by design.
    with folder_lock(out, enabled=world.main):
        return _train(recipe, out, resume, progress, trust_unverified, world, device)


def _train(recipe: Recipe, out: Path, resume: bool, progress: bool, trust_unverified: bool, world: World,
           device) -> TrainResult:
    run = RunFolder(out)
    trackers = Trackers(recipe, out, enabled=world.main)  # a missing tracker package stops the run here
    check_out_dir(out, recipe, resume)
    # Verified before anything is built or written: a run whose checkpoints are all unusable stops here.
    ckpt = latest_checkpoint(run.checkpoints, warn=None if world.main else lambda _msg: None,
                             trust_unverified=trust_unverified) if resume else None
    if resume and ckpt is None and world.main:
        print(f"detour: --resume: no checkpoint in {run.checkpoints}; starting from the beginning",
              file=sys.stderr)
    branch_ckpt, branch = branch_start(recipe) if recipe.branch is not None else (None, None)
    torch.manual_seed(recipe.seed)  # identical initial weights on every rank
    model, tokenizer = build_model(recipe, device)
    check_data_matches_tokenizer(recipe, tokenizer)
    validate_seq_len(recipe.data.seq_len, model.config.max_position_embeddings)
    groups = check_freezes(model, recipe)
    if groups and progress and world.main:
        print(f"layer groups: {groups}")
    stream = PackedStream.from_paths([(s.path, s.weight) for s in recipe.data.sources], seq_len=recipe.data.seq_len,
                                     seed=recipe.data.shuffle_seed, rank=world.rank, world_size=world.size)
    if world.main:
        start_out_dir(out, recipe, resume)
    world.barrier()
    optimizer = build_optimizer(model, recipe.optimizer)
    # MLM masks come from the stream (see mask_key): this generator is never drawn from, so whether
    # a resume restores its state changes nothing. It stays in checkpoints so that their format,
    # and the runs that read them, do not change.
    generator = torch.Generator().manual_seed(recipe.seed + world.rank)
    log = MetricsLog(run.metrics, enabled=world.main, trackers=trackers)
    state = _starting_state(recipe, ckpt, branch_ckpt, branch, model, optimizer, generator, stream, log, world)
    state.setdefault("sessions", []).append(compute_session(world, device, state["global_step"]))
    per_step = recipe.tokens_per_step()
    # After the restore: FSDP shards the restored weights and moves the optimizer onto the shards.
    parallel = DataParallelism(model, optimizer, recipe, world, device)
    optimizer = parallel.optimizer
    validation = Validation(recipe, world, tokenizer.pad_token_id, device) if recipe.validation else None

    with stop_signals_to(StopFlag()) as stop, trackers, Progress(recipe, enabled=progress and world.main) as bar:
        if validation is not None and state["global_step"] == 0:  # the run's start: where every arm begins
            validation.run(parallel, recipe.phases[0], state, {}, log, bar)
        for index, phase in enumerate(recipe.phases):
            if index < state["phase_index"]:
                continue
            record = state["phases"].setdefault(phase.name, _phase_record(phase))
            if state["phase_tokens"] == 0 and not phase.keep_optimizer_state:
                optimizer.state.clear()  # fresh AdamW moments for this phase
            _apply_freeze(model, phase)
            parallel.start_phase()
            set_phase_weight_decay(optimizer, recipe, phase)
            bar.start_phase(phase, state["phase_tokens"], step=state["global_step"])
            while True:
                n_tokens = min(per_step, phase.tokens - state["phase_tokens"])
                lr = lr_at(phase.lr, phase.lr.peak or recipe.optimizer.lr, state["phase_tokens"] + n_tokens, phase.tokens)
                t0 = time.perf_counter()
                loss, grad_norm, padding = train_step(parallel, optimizer, stream, recipe, phase, n_tokens, lr,
                                                      generator, tokenizer.pad_token_id, record, device, world)
                elapsed = time.perf_counter() - t0
                before = state["global_tokens"]
                _count_step(state, record, n_tokens, loss)
                log.write({"phase": phase.name, "objective": phase.objective, "step": state["phase_step"],
                           "global_step": state["global_step"], "tokens": state["phase_tokens"], "loss": loss,
                           "lr": lr, "grad_norm": grad_norm, "tokens_per_s": n_tokens / elapsed,
                           "padding_tokens": padding, "stream_hash": record["stream_hash"]})
                bar.advance(n_tokens, loss, lr=lr, step=state["global_step"])
                phase_done = state["phase_tokens"] == phase.tokens
                if validation is not None and validation.due(before, state, phase_done):
                    validation.run(parallel, phase, state, record, log, bar)
                # Export first: a crash before the checkpoint redoes the step and rewrites the same export.
                folder = _export_due_at(run, recipe, phase, state, n_tokens, phase_done)
                if folder is not None:
                    full = parallel.full_model()  # FSDP gathers the shards: every rank takes part
                    if world.main:
                        _export(full, tokenizer, recipe, state, folder)
                if phase_done:
                    state.update(phase_index=index + 1, phase_step=0, phase_tokens=0)
                stopping = world.any(stop.signum != 0)
                if phase_done or _checkpoint_due(recipe, before, state) or stopping:
                    path = _checkpoint(run, parallel, stream, generator, state, recipe, world)
                    if stopping:
                        raise TrainingStopped(stop.signum or signal.SIGTERM, path)
                if phase_done:
                    break

        # Still inside the signal guard: a SIGTERM now lets the final export finish (every phase is
        # done and checkpointed) instead of killing it halfway.
        summary = _finish(parallel, tokenizer, recipe, state, run, world)
    world.barrier()
    shutdown_world(world)
    return TrainResult(out, summary)


def _starting_state(recipe: Recipe, ckpt, branch_ckpt, branch, model, optimizer, generator, stream, log,
                    world: World) -> dict[str, Any]:
    """The state training starts from: a checkpoint's (resume), a parent's phase end (a fresh branch), or new."""
    if ckpt is not None:
        restore_checkpoint(ckpt, model, optimizer, generator, world)
        state = ckpt.state
        state["world_size"] = world.size  # a checkpoint may resume on another number of processes
        stream.load_state_dict(state["sampler"])
        log.truncate_after(state["global_step"])
        return state
    if branch is not None:
        restore_checkpoint(branch_ckpt, model, optimizer, generator, world)
        state = copy.deepcopy(branch_ckpt.state)
        state["world_size"] = world.size
        state["branch"] = branch
        stream.load_state_dict(state["sampler"])
        log.write_many(parent_metrics(Path(recipe.branch.run), state["global_step"]))
        return state  # its "start" is its parent's: the weights the whole lineage began from
    state = fresh_state(world.size)
    state["start"] = starting_weights(recipe)
    return state


def starting_weights(recipe: Recipe) -> dict[str, Any]:
    """What the run started from, for the twins check that every arm began from the same weights: a
    pretrained source's weight files hashed (as the study hashes a model), or a config's seed."""
    from detour.model.load import weights_hash

    if recipe.model.source is not None:
        return {"source": recipe.model.source, "weights_hash": weights_hash(recipe.model.source)}
    return {"config": recipe.model.config.get("model_type"), "seed": recipe.seed}


def _count_step(state: dict, record: dict, n_tokens: int, loss: float) -> None:
    state["phase_step"] += 1
    state["global_step"] += 1
    state["phase_tokens"] += n_tokens
    state["global_tokens"] += n_tokens
    record["tokens"] = state["phase_tokens"]
    record["recent_losses"] = (record["recent_losses"] + [loss])[-10:]


def _export_due_at(run: RunFolder, recipe: Recipe, phase: PhaseSpec, state: dict, n_tokens: int,
                   phase_done: bool) -> Path | None:
    """The export folder this step ends in: the phase's end, a mid-phase export point, or none."""
    if phase_done:
        return run.export(phase.name)
    if _export_due(recipe, phase, state["phase_tokens"] - n_tokens, state["phase_tokens"]):
        return run.export(phase.name, state["phase_tokens"])
    return None


def _checkpoint_due(recipe: Recipe, tokens_before: int, state: dict) -> bool:
    """A periodic checkpoint: the step crossed a multiple of checkpoint.every_tokens."""
    every = recipe.checkpoint.every_tokens
    return every is not None and tokens_before // every != state["global_tokens"] // every


def _checkpoint(run: RunFolder, parallel: DataParallelism, stream: PackedStream, generator, state: dict,
                recipe: Recipe, world: World) -> Path:
    """Save everything a resume needs, the stream's position included; the older checkpoints pruned."""
    state["sampler"] = stream.state_dict()
    saved_model, saved_optimizer = parallel.checkpoint_parts()
    return save_checkpoint(run.checkpoints, state["global_step"], saved_model, saved_optimizer, generator, state,
                           recipe.checkpoint.keep_last, world, recipe.checkpoint.keep_phase_ends)


def _finish(parallel: DataParallelism, tokenizer, recipe: Recipe, state: dict, run: RunFolder, world: World) -> dict:
    """The final export, the curves and summary.json (written last: its presence means the run is complete)."""
    summary = {}
    full = parallel.full_model()
    if world.main:
        final = _export(full, tokenizer, recipe, state, run.model)
        summary = _summary(recipe, state, final)
        write_curves(run.metrics, run.curves, recipe.name)
        write_json(run.summary, summary)
    return summary


def train_step(parallel: DataParallelism, optimizer, stream: PackedStream, recipe: Recipe, phase: PhaseSpec,
               n_tokens: int, lr: float, generator: torch.Generator, pad_id: int, record: dict, device,
               world: World) -> tuple[float, float, int]:
    """One optimizer step over exactly `n_tokens` tokens (all ranks together).

    Returns the loss per label token, the gradient norm and the padding tokens, all global.
    """
    model = parallel.model
    sequences = rank_sequences(stream, n_tokens, world)
    record["stream_hash"] = _chain_hash(record["stream_hash"], sequences, world)
    model.train()
    loss_sum, n_labels, padding = 0.0, 0, 0
    masked: dict[int, bytes] = {}  # stream index -> its masked positions, for the phase's mask hash
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    parts = micro_batches(sequences, recipe.batch.micro_batch, n_tokens, recipe.data.seq_len, world)
    for i, part in enumerate(parts):
        batch = collate(part, pad_id) if part else stand_in_batch(pad_id)
        if part:
            padding += int((batch["attention_mask"] == 0).sum())
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with parallel.sync(last=i == len(parts) - 1):  # gradients reduced once, on the last micro-batch
            with autocast:
                loss, labels_here, labels = parallel.module(batch, phase.objective, phase.mask_rate,
                                                            mask_key(recipe, phase))
            # summed, not averaged: normalised once below by the global label count
            (loss if parallel.loss_scale == 1 else loss * parallel.loss_scale).backward()
        if part and phase.objective == "mlm":
            masked.update(_masked_positions(batch, labels))
        loss_sum += float(loss.detach())
        n_labels += int(labels_here)
    if phase.objective == "mlm":
        record["mask_hash"] = _chain_masks(record.get("mask_hash", ""), masked, world)
    loss_sum, n_labels, padding = world.sum([loss_sum, n_labels, padding])
    n_labels, padding = max(int(n_labels), 1), int(padding)
    if not math.isfinite(loss_sum):
        raise DetourError(f"non-finite loss ({loss_sum}) in phase {phase.name!r}; no checkpoint was written "
                          f"for this step; resume from the last checkpoint with a lower LR")
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    for p in params:
        p.grad.div_(n_labels)
    clip = recipe.optimizer.grad_clip
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf")))
    if not math.isfinite(grad_norm):
        raise DetourError(f"non-finite gradient norm in phase {phase.name!r} (loss {loss_sum / n_labels:.4g}); "
                          f"no checkpoint was written for this step; resume from the last one with a lower LR")
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # None, not zero: AdamW then skips frozen params entirely
    return loss_sum / n_labels, grad_norm, padding


# -- helpers ----------------------------------------------------------------------------------


def _phase_record(phase: PhaseSpec) -> dict[str, Any]:
    return {"objective": phase.objective, "mask_rate": phase.mask_rate, "budget": phase.tokens, "tokens": 0,
            "stream_hash": "", "recent_losses": []}


def mask_key(recipe: Recipe, phase: PhaseSpec) -> str:
    """What a sequence's MLM masks depend on, besides its index in the stream: the seed and the phase.

    The twins share both in their decay, so they mask the same positions of the same tokens there.
    """
    return f"{recipe.seed}/{phase.name}"


def _masked_positions(batch: dict, labels) -> dict[int, bytes]:
    real = labels != -100
    return {int(i): real[row].nonzero().flatten().cpu().numpy().astype("<i8").tobytes()
            for row, i in enumerate(batch["seq_index"].tolist())}


def _chain_masks(previous: str, masked: dict[int, bytes], world: World) -> str:
    """Hash of every masked position of the phase, in stream order, chained like the stream hash.

    Each rank's sequences are merged by stream index first, so the hash is the same on any number
    of processes and any micro-batch.
    """
    local = {i: hashlib.sha256(positions).hexdigest() for i, positions in masked.items()}
    merged = {i: d for part in world.gather(local) for i, d in part.items()}
    step = hashlib.sha256("".join(f"{i}:{merged[i]};" for i in sorted(merged)).encode()).hexdigest()
    return hashlib.sha256((previous + step).encode()).hexdigest()


def _chain_hash(previous: str, sequences, world: World) -> str:
    """Hash of every token id consumed so far in the phase (all ranks), chained so it survives a resume.

    Each sequence is hashed under its index in the global stream and the step hashes them in stream
    order, so the value does not depend on how many processes shared the step.
    """
    mine = {int(seq.index): hashlib.sha256(seq.input_ids.astype("<i8").tobytes()).hexdigest() for seq in sequences}
    merged = {i: d for part in world.gather(mine) for i, d in part.items()}
    step = hashlib.sha256("".join(merged[i] for i in sorted(merged)).encode()).hexdigest()
    return hashlib.sha256((previous + step).encode()).hexdigest()


def _export_due(recipe: Recipe, phase: PhaseSpec, before: int, after: int) -> bool:
    """Whether this step crossed one of `checkpoint.export_every_tokens`'s points of the phase."""
    spec = recipe.checkpoint
    if spec.export_every_tokens is None or (spec.export_phases is not None and phase.name not in spec.export_phases):
        return False
    if isinstance(spec.export_every_tokens, int):
        return before // spec.export_every_tokens != after // spec.export_every_tokens
    return any(before < point <= after for point in spec.export_every_tokens)


def check_freezes(model, recipe: Recipe) -> str | None:
    """Validate every phase's freeze against the model before any step; the layer groups if named."""
    from detour.model.freeze import GROUPS, describe_groups, frozen_parameter_names

    named = False
    for phase in recipe.phases:
        if phase.freeze is None:
            continue
        try:
            frozen_parameter_names(model, phase.freeze.layers, phase.freeze.components)
        except DetourError as exc:
            raise DetourError(f"phases: {phase.name}: {exc}") from None
        named |= any(part.strip() in GROUPS for part in (phase.freeze.layers or "").split(","))
    from detour.model.load import encoder_layers

    return describe_groups(len(encoder_layers(model)[1])) if named else None


def set_phase_weight_decay(optimizer, recipe: Recipe, phase: PhaseSpec) -> None:
    """Composer's decay is relative to the peak LR: a phase with its own peak decays relative to that one."""
    peak = phase.lr.peak or recipe.optimizer.lr
    for group in optimizer.param_groups:
        if group.get("decayed"):
            group["weight_decay"] = recipe.optimizer.weight_decay / peak


def _apply_freeze(model, phase: PhaseSpec) -> None:
    from detour.model.freeze import frozen_parameter_names

    frozen: set[str] = set()
    if phase.freeze is not None:
        frozen = frozen_parameter_names(model, phase.freeze.layers, phase.freeze.components)
    for name, param in model.named_parameters():
        param.requires_grad_(name not in frozen)


def _export(model, tokenizer, recipe: Recipe, state: dict, folder: Path) -> Path:
    from detour.model.card import arm_of, card_license, describe_data
    from detour.model.export import export_hf

    arm, replaced = arm_of(recipe)
    phases = [{"name": p.name, "objective": p.objective, "mask_rate": p.mask_rate, "tokens": p.tokens,
               "tokens_done": state["phases"].get(p.name, {}).get("tokens", 0),
               "final_loss": _final_loss(state["phases"].get(p.name)), "replaced": p.name in replaced}
              for p in recipe.phases]
    # The final export comes after the last phase's end; every other one is taken at the end of, or
    # during, the phase the state is in (the state moves to the next phase only after the export).
    index = state["phase_index"]
    taken = None if index >= len(recipe.phases) else {"phase": recipe.phases[index].name,
                                                       "tokens": state["phase_tokens"]}
    # Resolved before training by check_card; a run started without that check gets `other` and a note.
    license_, license_source = card_license(recipe)
    meta = recipe.card
    card = {"name": recipe.name, "arm": arm, "base_model": recipe.model.source,
            "model_type": (recipe.model.config or {}).get("model_type"),
            "license": license_, "license_source": license_source,
            "language": meta.language if meta else None, "datasets": meta.datasets if meta else None,
            "tags": meta.tags if meta else None, "recipe": recipe_to_dict(recipe), "phases": phases,
            "taken": taken, "branch": state.get("branch"),
            "fresh_head": bool(getattr(model, "fresh_mlm_head", False)),
            "seeds": {"seed": recipe.seed, "data.shuffle_seed": recipe.data.shuffle_seed},
            "data": [describe_data(s.path, s.weight) for s in recipe.data.sources]}
    card["synthetic"] = any(d.get("synthetic") for d in card["data"])
    model.eval()
    with quiet_transformers():  # again here: loading a pretrained model turns transformers' bars back on
        return export_hf(model, tokenizer, folder, card)


def _describe_source(path: str, weight) -> dict:
    manifest = Path(path) / "manifest.json"
    info: dict[str, Any] = {"path": path, "weight": weight}
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        info.update({k: m.get(k) for k in ("documents", "tokens", "tokenizer", "synthetic")})
        info["sources"] = [s.get("name") or s.get("path") for s in m.get("sources", [])]
    return info


def _final_loss(record: dict | None) -> float | None:
    if not record or not record["recent_losses"]:
        return None
    return sum(record["recent_losses"]) / len(record["recent_losses"])


def _summary(recipe: Recipe, state: dict, final: Path) -> dict[str, Any]:
    phases = {}
    for p in recipe.phases:
        r = state["phases"][p.name]
        phases[p.name] = {"objective": r["objective"], "mask_rate": r["mask_rate"], "tokens": r["tokens"],
                          "budget": r["budget"], "stream_hash": r["stream_hash"], "mask_hash": r.get("mask_hash"),
                          "final_loss": _final_loss(r), "last_loss": r["recent_losses"][-1]}
        if "validation" in r:
            phases[p.name]["validation"] = r["validation"]
    synthetic = any(_describe_source(s.path, s.weight).get("synthetic") for s in recipe.data.sources)
    summary = {"recipe": recipe.name, "seed": recipe.seed, "model": str(final), "synthetic_data": synthetic,
               "global_steps": state["global_step"], "global_tokens": state["global_tokens"], "phases": phases}
    if state.get("start"):
        summary["start"] = state["start"]
    if state.get("sessions"):
        # a stretch on other threads, devices or versions: equal to an uninterrupted run only to rounding
        summary["sessions"] = state["sessions"]
        summary["same_compute"] = same_compute(state["sessions"])
    if state.get("branch"):
        summary["branch"] = dict(state["branch"], stream_continues_parent=stream_continuity(state["branch"], phases))
    return summary
