"""Rough time estimates for a study's steps: FLOPs at a matmul rate measured on this machine.

    python -c "from detour.study.estimate import matmul_rate; print(matmul_rate() / 1e9, 'GFLOP/s')"

Training costs about 6 x parameters FLOPs per token (forward and backward, the standard dense
estimate; attention's extra term is left out, so long sequences cost more than this says), the
vocabulary head only on the positions with a label (`training_flops`); a
fine-tune the same per example token, for the epochs it runs (the study's `eval.epochs`, else the
task spec's, else the task default; the dry run says which). A run with `validation:` adds its held-out
points: one forward (2 x parameters FLOPs a token) over the held-out sequences at each point, two
in a CLM phase (the MLM loss and the CLM loss). The rate is a half-second fp32 matmul
on the study's device times the efficiency a real step reaches (about 0.6 of it for MiniLM on CPU).
A training step also pays a few seconds to start (STARTUP_S). Checked against the steps of the demo,
studies/minilm-biomed-en.yaml and studies/minilm-decay-length.yaml run on 2 idle CPU cores, the
measured times were 0.8-1.4x these estimates; ChemProt's fine-tunes 1.65-1.8x (its sentences are
longer than half the max length); a 3 x 192 ModernBERT's trainings 0.49-0.60x. It is an order of magnitude for planning, printed as such;
measured times of finished steps are in OUT/.study/state.json. Measured on busy cores the rate is a
share of theirs and the dry run says so (busy_note).
"""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache
from pathlib import Path

from detour.study.graph import SYNTHETIC_TASK

EFFICIENCY = 0.6  # fraction of the matmul rate a training step reaches (measured on CPU, fp32; GPUs differ)
STARTUP_S = 7.0  # a training step's process start, imports, model and data load (MiniLM on CPU)


def busy_note() -> str:
    """A warning for the dry run when this machine was busy as the rate was measured (another
    training on the same cores): the matmul then gets a share of the cores, and every estimate
    comes out too long by about the inverse of that share."""
    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        return ""
    if load < 0.75 * cores:
        return ""
    return (f"this machine was busy as the rate was measured (load average {load:.1f} on {cores} cores): "
            "on idle cores the steps take less than estimated")


@lru_cache(maxsize=1)
def matmul_rate(device: str = "cpu", seconds: float = 0.5) -> float:
    """FLOP/s of a 1024 x 1024 fp32 matmul on `device`."""
    import torch

    a = torch.randn(1024, 1024, device=device)
    b = torch.randn(1024, 1024, device=device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - t0)


@lru_cache(maxsize=8)
def parameter_count(model_json: str) -> tuple[int, int]:
    """(all parameters, token embeddings) of the recipe's model, built on the meta device (no weights read)."""
    import torch
    from transformers import AutoModelForMaskedLM, CONFIG_MAPPING

    from detour.model.load import load_config

    spec = json.loads(model_json)
    if spec.get("config"):
        raw = dict(spec["config"])
        config = CONFIG_MAPPING[raw.pop("model_type")](**raw)
    else:
        _, config = load_config(spec["source"])
    with torch.device("meta"):
        model = AutoModelForMaskedLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), config.vocab_size * config.hidden_size


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"


def estimates(spec, steps) -> dict[str, str]:
    """Step name -> a short "tokens, ~time" string (train and eval steps; others are short)."""
    try:
        rate = matmul_rate() * EFFICIENCY
    except Exception:  # an estimate must never stop a dry run
        return {}
    out = {}
    params = embeddings = None
    for step in steps:
        if step.kind in ("train", "base"):
            try:  # an arm that starts from the study's base: the base's config, before the base exists
                params, embeddings = parameter_count(json.dumps((step.stand_in or step.recipe).model.model_dump()))
            except Exception:  # e.g. a hub model not on this machine: no estimate rather than no dry run
                continue
            points, _ = validation_cost(step.recipe)
            held_out = f" + {points} held-out point{'s' if points != 1 else ''}" if points else ""
            flops = training_flops(step.recipe, params, embeddings)
            out[step.name] = f"{step.tokens:,} tokens{held_out}, {_duration(STARTUP_S + flops / rate)}"
    if spec.eval is not None and params:
        ev = spec.eval
        per_step = ev.seeds  # an eval:TASK:ARM step fine-tunes one arm over the seeds; the gather none
        for step in steps:
            if step.kind != "eval":
                continue
            task = step.name.split(":", 1)[1].rsplit(":", 1)[0]
            synthetic = task == SYNTHETIC_TASK and ev.synthetic_ner is not None
            epochs, whose = task_epochs(ev, step, synthetic)
            earlier = recorded_earlier(step)
            if epochs is None:
                out[step.name] = f"{per_step} fine-tunes{earlier}"
                continue
            runs = f"{per_step} fine-tunes x {epochs} epoch{'s' if epochs != 1 else ''} ({whose})"
            examples = ev.synthetic_ner.train if synthetic else ev.max_train
            if examples is None:  # the task's own training set: its size is not known before loading it
                out[step.name] = runs + earlier
                continue
            if ev.max_train:
                examples = min(examples, ev.max_train)
            # no vocabulary head in a fine-tune; batches are padded to their longest example, about
            # half the max length on sentence tasks
            tokens = examples * epochs * (ev.max_length or 128) / 2 * per_step
            out[step.name] = f"{runs}, {_duration(6 * (params - embeddings) * tokens / rate)}{earlier}"
    return out


def training_flops(recipe, params: int, embeddings: int) -> float:
    """FLOPs of a training run's phases (after its branch point) and of its held-out points.

    The body costs 6 per parameter per token; the vocabulary head (embeddings-sized) only on the
    positions with a label: every one in a CLM phase, the masked share in an MLM phase
    (detour.model.objectives runs the head on those rows alone). On a small model the head is most
    of the parameters (30,522 x 192 against 0.94M in a 3 x 192 body), so counting it on every
    position put an MLM base at 2.5x its time. A held-out point is one forward (2 per parameter per
    token) with the head on the validation mask rate's share; at a CLM point a causal forward too,
    with the head on every position.
    """
    body = params - embeddings
    phases = recipe.phases
    first = [p.name for p in phases].index(recipe.branch.after_phase) + 1 if recipe.branch else 0
    flops = sum(6 * p.tokens * (body + embeddings * (1.0 if p.objective == "clm" else p.mask_rate))
                for p in phases[first:])
    points, forward_tokens = validation_cost(recipe)
    if points:
        per_point = recipe.validation.sequences * recipe.data.seq_len
        clm_points = forward_tokens // per_point - points
        flops += 2 * per_point * (points * (body + embeddings * recipe.validation.mask_rate)
                                  + clm_points * (body + embeddings))
    return flops


def recorded_earlier(step) -> str:
    """For an arm's evaluation step not run yet in a study folder from before the per-arm steps: how many
    of its runs the gathered results.json already holds (`detour eval --reuse-from` takes those whose
    key is unchanged, so they are not fine-tuned again)."""
    argv = step.argv or []
    if "--reuse-from" not in argv or step.hash_of is None or step.hash_of.is_file():
        return ""
    gathered = Path(argv[argv.index("--reuse-from") + 1])
    try:
        runs = json.loads(gathered.read_text()).get("runs", []) if gathered.is_file() else []
        # by the model's path inside the study (arms/ARM/model): a moved study folder's file names the old place
        n = sum(1 for r in runs if Path(str(r.get("model"))).parts[-3:] == Path(argv[1]).parts[-3:])
    except (OSError, ValueError, AttributeError):  # the step itself names a broken file
        return ""
    return f"; {n} in {gathered.parent.name}/results.json, reused if unchanged" if n else ""


def validation_cost(recipe) -> tuple[int, int]:
    """(held-out points, tokens through a forward) of a run's `validation:`, as the loop schedules them
    (detour.train.validation): at the run's start (not a branch's: it starts at its parent's phase
    end, already scored there), at each phase end, and where the run's tokens cross a multiple of
    `every_tokens`; a step in between is ignored (its batch sizes are not known here)."""
    spec = recipe.validation if recipe is not None else None
    if spec is None:
        return 0, 0
    phases = recipe.phases
    first = [p.name for p in phases].index(recipe.branch.after_phase) + 1 if recipe.branch else 0
    start = sum(p.tokens for p in phases[:first])
    ends, position = [], start
    for phase in phases[first:]:
        position += phase.tokens
        ends.append((position, phase.objective))
    points = {} if recipe.branch else {start: phases[0].objective}
    begin = start
    for end, objective in ends:
        if spec.every_tokens:
            for multiple in range(begin // spec.every_tokens + 1, end // spec.every_tokens + 1):
                points[multiple * spec.every_tokens] = objective
        points[end] = objective
        begin = end
    per_point = spec.sequences * recipe.data.seq_len
    forwards = sum(2 if objective == "clm" else 1 for objective in points.values())
    return len(points), forwards * per_point


def task_epochs(ev, step, synthetic: bool) -> tuple[int | None, str]:
    """The epochs an evaluation step fine-tunes for, and whose setting that is (None: unreadable)."""
    if ev.epochs is not None:
        return ev.epochs, "eval.epochs"
    if synthetic:
        from detour.eval.synthetic_ner import TRAINING

        return TRAINING["epochs"], "its spec's"
    from detour.errors import DetourError
    from detour.eval.tasks import Training
    from detour.io import read_yaml_mapping

    try:
        written = (read_yaml_mapping(step.inputs[0], "task spec").get("training") or {}).get("epochs")
        if written is not None:
            return int(written), "its spec's"
    except (DetourError, IndexError, AttributeError, TypeError, ValueError):  # the evaluation step names the error
        return None, ""
    return Training().epochs, "the default: its spec sets none"
