"""Held-out validation while training: fixed sequences and fixed masks, the same in every arm.

    detour prepare "synthetic:clinical?docs=3000&seed=0" --tokenizer minilm-l6 --out runs/data/synthetic-minilm \
        --validation 0.02
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --set validation.every_tokens=40k
    grep '"kind": "validation"' runs/tiny/metrics.jsonl

The training loss of an MLM step is measured on masks drawn anew every step, on documents the model
is about to learn from: it cannot say whether two arms differ, nor whether a CLM phase hurt the MLM
the decay has to bring back. The validation loss is measured on documents no training stream holds
(`detour prepare --validation`), packed into `validation.sequences` sequences of data.seq_len
tokens in one fixed order (packing seed 0), with MLM masks that are a pure function of
`validation.mask_seed` and the sequence's index (the key "validation/SEED"; never the phase, the
step or the training seed). So every evaluation point of every arm scores the same positions of the
same tokens, and a difference between two numbers is the models', not the masks'.

At each point: the MLM loss at `validation.mask_rate` and the share of masked tokens predicted
right, with bidirectional document-isolated attention as in training; in a CLM phase also the
next-token loss (causal, document-isolated) and its perplexity. The points are the run's start
(global step 0, before the first step), each time the run's tokens cross a multiple of
`validation.every_tokens`, and every phase end. Each point is one record in metrics.jsonl with
"kind": "validation" and a `validation_hash` of the token ids and masked positions it scored;
summary.json keeps the phase-end values under phases.NAME.validation.

Under torchrun, rank r scores sequences r, r + W, ...; the loss sums and counts are summed over the
ranks, so 1 and N processes give the same numbers up to float summation order.
"""

from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext
from pathlib import Path

import torch

from detour.config import PhaseSpec, Recipe
import numpy as np

from detour.data.packing import PackedSequence, PackedStream, collate
from detour.data.shards import prepared_fingerprint, read_manifest, validation_split
from detour.errors import DetourError
from detour.train.world import World

PACKING_SEED = 0  # one order of the held-out documents for every run, whatever its data.shuffle_seed
KIND = "validation"
VALUES = ("mlm_loss", "mlm_accuracy", "clm_loss", "clm_perplexity", "sequences", "masked_tokens", "validation_hash")


def mask_key(mask_seed: int) -> str:
    """The key of the held-out masks: the seed alone, so every arm and every point draws the same ones."""
    return f"validation/{mask_seed}"


def validation_source(recipe: Recipe) -> Path:
    """The prepared folder the held-out sequences come from; DetourError naming the field when there is none."""
    spec = recipe.validation
    if spec.source is not None:
        return Path(spec.source)
    first = recipe.data.sources[0].path
    split = validation_split(first)
    if split is None:
        raise DetourError(f"validation: data.sources.0 ({first}) has no validation split; prepare it with "
                          f"`detour prepare ... --out {first} --validation 0.02` (a fraction, or a count of "
                          "documents), or name a prepared folder in validation.source")
    return split


def check_validation(recipe: Recipe) -> None:
    """Everything about `validation:` that can be known before a weight loads (preflight calls it)."""
    spec = recipe.validation
    source = validation_source(recipe)
    try:
        manifest = read_manifest(source)
        theirs = prepared_fingerprint(source)
    except (DetourError, OSError) as exc:
        raise DetourError(f"validation.source: {exc} (a folder written by `detour prepare`)") from None
    where = source.resolve()
    for i, data in enumerate(recipe.data.sources):
        trained = Path(data.path).resolve()
        if where == trained or trained in where.parents and where.relative_to(trained).parts[0] != "validation":
            raise DetourError(f"validation.source: {source} is data.sources.{i}, which the run trains on; "
                              "held-out documents must be in no training source (`detour prepare --validation`)")
    mine = prepared_fingerprint(recipe.data.sources[0].path)
    if theirs != mine:
        raise DetourError(f"validation.source: {source} was tokenized with another tokenizer than data.sources.0 "
                          f"({theirs[:12]} != {mine[:12]}); prepare both with the model's tokenizer")
    need = spec.sequences * recipe.data.seq_len
    if int(manifest.get("tokens", 0)) < need:
        fits = int(manifest.get("tokens", 0)) // recipe.data.seq_len
        raise DetourError(f"validation.sequences: {spec.sequences} sequences of data.seq_len {recipe.data.seq_len} "
                          f"need {need:,} held-out tokens, and {source} holds {int(manifest.get('tokens', 0)):,}; "
                          f"set validation.sequences to at most {fits}" if fits else
                          f"validation.sequences: {source} holds fewer held-out tokens than one sequence of "
                          f"data.seq_len {recipe.data.seq_len}; prepare with a larger --validation")


class Validation:
    """The held-out sequences of this rank, batched once; `due` says when to score them, `run` scores and logs."""

    def __init__(self, recipe: Recipe, world: World, pad_id: int, device: torch.device):
        spec = recipe.validation
        self.spec, self.world, self.device = spec, world, device
        self.key = mask_key(spec.mask_seed)
        stream = PackedStream.from_paths([(str(validation_source(recipe)), None)], seq_len=recipe.data.seq_len,
                                         seed=PACKING_SEED)
        sequences = [stream.next_sequence() for _ in range(spec.sequences)]
        mine = sequences[world.rank::world.size]
        micro = recipe.batch.micro_batch
        # As many forwards on every rank: FSDP gathers weights in each one (a collective).
        count = -(-(-(-len(sequences) // world.size)) // micro)
        parts = [mine[i:i + micro] for i in range(0, len(mine), micro)]
        # A rank with fewer sequences runs one pad token instead (no label): distributed.stand_in_batch's batch.
        pad = PackedSequence(np.asarray([pad_id]), np.zeros(1, np.int64), np.zeros(1, np.int64), index=-1)
        self.batches = [collate(p, pad_id) for p in parts] + [collate([pad], pad_id)] * (count - len(parts))
        self.token_hashes = {s.index: hashlib.sha256(s.input_ids.astype("<i8").tobytes()
                                                     + s.doc_ids.astype("<i8").tobytes()).hexdigest() for s in mine}
        self.sequences = len(sequences)

    def due(self, tokens_before: int, state: dict, phase_done: bool) -> bool:
        """At every phase end, and when the step crossed a multiple of validation.every_tokens of the run."""
        every = self.spec.every_tokens
        return phase_done or (every is not None and tokens_before // every != state["global_tokens"] // every)

    def run(self, parallel, phase: PhaseSpec, state: dict, record: dict, log, bar) -> dict:
        """Score, write the record to metrics.jsonl and a line to the progress; at the phase end also into
        the phase's `record` (saved in checkpoints, read into summary.json). Every rank calls it."""
        entry = {"kind": KIND, "phase": phase.name, "objective": phase.objective, "step": state["phase_step"],
                 "global_step": state["global_step"], "tokens": state["phase_tokens"],
                 "run_tokens": state["global_tokens"], **self.evaluate(parallel, phase.objective)}
        log.write(entry)
        bar.note(describe(entry))
        if state["phase_tokens"] == phase.tokens:
            record["validation"] = {k: entry[k] for k in ("step", "global_step", "tokens", *VALUES)}
        return entry

    def evaluate(self, parallel, objective: str) -> dict:
        """The held-out values of the model now, all ranks together. `parallel` is the loop's
        DataParallelism: the forward runs through its module, where FSDP gathers the weights."""
        model = parallel.model
        model.eval()  # no dropout; the masks come from their own generators, so training's RNG is untouched
        totals = torch.zeros(5, dtype=torch.float64)
        masked: dict[int, str] = {}
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        try:
            with torch.no_grad(), autocast:
                for batch in self.batches:
                    batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                    scores, labels = parallel.module(batch, objective, self.spec.mask_rate, self.key, held_out=True)
                    totals += scores.detach().cpu()
                    masked.update(self._masked(batch, labels))
        finally:
            model.train()
        mlm_sum, n_masked, correct, clm_sum, n_next = self.world.sum(totals.tolist())
        n_masked = max(int(n_masked), 1)
        clm_loss = clm_sum / n_next if objective == "clm" and n_next else None
        return {"mlm_loss": mlm_sum / n_masked, "mlm_accuracy": correct / n_masked, "clm_loss": clm_loss,
                "clm_perplexity": math.exp(clm_loss) if clm_loss is not None else None,
                "sequences": self.sequences, "masked_tokens": n_masked, "validation_hash": self._hash(masked)}

    def _masked(self, batch: dict, labels: torch.Tensor) -> dict[int, str]:
        """Each real sequence's hash of its tokens and masked positions, by its index."""
        real = labels != -100
        out = {}
        for row, index in enumerate(batch["seq_index"].tolist()):
            if index < 0:  # a stand-in batch
                continue
            positions = real[row].nonzero().flatten().cpu().numpy().astype("<i8").tobytes()
            out[index] = hashlib.sha256(self.token_hashes[index].encode() + positions).hexdigest()
        return out

    def _hash(self, masked: dict[int, str]) -> str:
        """One hash of every scored sequence's tokens and masks in index order: the same on any number of ranks."""
        merged = {i: d for part in self.world.gather(masked) for i, d in part.items()}
        return hashlib.sha256("".join(f"{i}:{merged[i]};" for i in sorted(merged)).encode()).hexdigest()


def describe(entry: dict) -> str:
    """A validation record as one log line's fields."""
    text = (f"step {entry['global_step']} phase {entry['phase']} validation mlm_loss {entry['mlm_loss']:.4f} "
            f"mlm_accuracy {entry['mlm_accuracy']:.4f}")
    if entry["clm_loss"] is not None:
        text += f" clm_loss {entry['clm_loss']:.4f} clm_perplexity {entry['clm_perplexity']:.2f}"
    return text + f" run_tokens {entry['run_tokens']:,}"


def validation_records(records: list[dict]) -> list[dict]:
    """The validation records among a metrics.jsonl's."""
    return [r for r in records if r.get("kind") == KIND]
