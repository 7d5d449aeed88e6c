"""Typed training recipes: YAML in, validated config out, errors that name the field.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny --dry-run
    detour train recipes/tiny-modernbert.yaml --out runs/tiny --set phases.0.tokens=50k

A recipe is a model, a data mixture, an optimizer, a batch size, a seed and a list of phases.
A phase is data (objective, mask rate, token budget, LR shape, frozen groups), never a branch in
the training loop: the detour and its MLM baseline are the same recipe with one field changed.

Weight decay follows Composer's DecoupledAdamW, which the paper used: every step multiplies each
decayed weight by (1 - weight_decay * lr_t / lr_peak). In `torch.optim.AdamW` terms
(p <- p * (1 - lr_t * wd')) that is wd' = weight_decay / lr_peak, so the paper's 1e-5 at a peak of
2e-4 is AdamW's 0.05. Biases, norm weights and frozen parameters are never decayed.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from detour.errors import DetourError
from detour.io import read_yaml_mapping, why_missing

_SUFFIX = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "m": 10**6, "B": 10**9, "b": 10**9, "G": 10**9, "T": 10**12}


def parse_tokens(value: Any) -> int:
    """'10B' -> 10_000_000_000, '250k' -> 250_000, '1.5M' -> 1_500_000, 4096 -> 4096."""
    if isinstance(value, bool):
        raise ValueError(f"expected a token count, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMbBGT]?)\s*", str(value))
        if not m:
            raise ValueError(f"expected a token count like 4096, 250k, 100M or 10B, got {value!r}")
        n = float(m.group(1)) * _SUFFIX[m.group(2)]
        if not float(n).is_integer():
            raise ValueError(f"token count {value!r} is not a whole number of tokens")
        n = int(n)
    if n <= 0:
        raise ValueError(f"token count must be positive, got {value!r}")
    return n


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ModelSpec(_Strict):
    """Where the encoder comes from: a hub name or folder, or an architecture config + tokenizer."""

    source: str | None = Field(None, description="hub name or local folder of a pretrained encoder")
    config: dict[str, Any] | None = Field(None, description="architecture config (with model_type) to build from scratch")
    tokenizer: str | None = Field(None, description="tokenizer hub name or folder (default: the source's)")
    attn_implementation: Literal["sdpa", "eager", "varlen", "auto"] = Field(
        "sdpa", description="attention backend: sdpa or eager with packed-document masks; varlen (document "
                            "boundaries as cu_seqlens, no L x L mask: flash varlen on CUDA); auto: varlen on CUDA, else sdpa")
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_source(self):
        if (self.source is None) == (self.config is None):
            raise ValueError("give exactly one of model.source (pretrained) or model.config (from scratch)")
        if self.config is not None and self.tokenizer is None:
            raise ValueError("model.tokenizer is required when the model is built from model.config")
        return self


class DataSource(_Strict):
    path: str = Field(description="a folder written by `detour prepare`")
    weight: float | None = Field(None, gt=0, description="token proportion in the mixture")


class DataSpec(_Strict):
    sources: list[DataSource] = Field(min_length=1)
    seq_len: int = Field(gt=1)
    shuffle_seed: int = 42

    @field_validator("sources", mode="before")
    @classmethod
    def _paths_as_strings(cls, v):
        # Accept `sources: [dir1, dir2]` as well as `[{path: dir1, weight: 0.6}, ...]`.
        if isinstance(v, (str, dict)):
            v = [v]
        return [{"path": s} if isinstance(s, str) else s for s in v]


class OptimizerSpec(_Strict):
    lr: float = Field(2e-4, gt=0, description="peak learning rate")
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-6, gt=0)
    weight_decay: float = Field(1e-5, ge=0, description="decoupled (Composer) convention, see module doc")
    grad_clip: float | None = Field(1.0, gt=0)


class BatchSpec(_Strict):
    global_sequences: int | None = Field(None, gt=0)
    global_tokens: int | None = None
    micro_batch: int = Field(gt=0, description="sequences per forward/backward on one process")

    @field_validator("global_tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return None if v is None else parse_tokens(v)

    @model_validator(mode="after")
    def _one_size(self):
        if (self.global_sequences is None) == (self.global_tokens is None):
            raise ValueError("give exactly one of batch.global_sequences or batch.global_tokens")
        return self


class LRSpec(_Strict):
    """LR as a function of t, the tokens consumed in the phase after the step, and T, the budget."""

    shape: Literal["constant", "1-sqrt", "linear", "cosine"] = "constant"
    warmup_tokens: int | None = None
    warmup_fraction: float | None = Field(None, ge=0, le=1)
    final_lr_fraction: float = Field(0.1, ge=0, le=1)
    peak: float | None = Field(None, gt=0, description="peak LR of this phase (default: optimizer.lr)")

    @field_validator("warmup_tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return None if v in (None, 0) else parse_tokens(v)

    @model_validator(mode="after")
    def _one_warmup(self):
        if self.warmup_tokens is not None and self.warmup_fraction is not None:
            raise ValueError("give at most one of warmup_tokens or warmup_fraction")
        return self


class FreezeSpec(_Strict):
    layers: str | None = Field(None, description="encoder layer indices, e.g. '0-7' or '0-3,8'")
    components: list[Literal["attention", "mlp", "embeddings", "norm", "head"]] | None = None

    @field_validator("layers", mode="before")
    @classmethod
    def _layers_as_string(cls, v):
        return None if v is None else str(v)


class PhaseSpec(_Strict):
    name: str
    objective: Literal["clm", "mlm"]
    mask_rate: float | None = Field(None, gt=0, lt=1)
    tokens: int
    lr: LRSpec = LRSpec()
    keep_optimizer_state: bool = True
    freeze: FreezeSpec | None = None

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return parse_tokens(v)

    @model_validator(mode="after")
    def _mask_rate(self):
        if self.objective == "mlm" and self.mask_rate is None:
            raise ValueError(f"phase {self.name!r}: objective mlm needs a mask_rate (e.g. 0.15)")
        if self.objective == "clm" and self.mask_rate is not None:
            raise ValueError(f"phase {self.name!r}: objective clm takes no mask_rate")
        return self


class CheckpointSpec(_Strict):
    every_tokens: int | None = Field(None, description="periodic checkpoint interval (and always at phase end)")
    keep_last: int = Field(2, ge=1, description="periodic checkpoints kept; phase-end ones are kept apart")
    keep_phase_ends: bool = Field(True, description="never prune a phase-end checkpoint (branches start there)")
    export_every_tokens: int | list[int] | None = Field(
        None, description="Hugging Face exports during a phase: every N phase tokens, or at listed phase token counts")
    export_phases: list[str] | None = Field(None, description="phases that get the exports above (default: all)")

    @field_validator("every_tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return None if v is None else parse_tokens(v)

    @field_validator("export_every_tokens", mode="before")
    @classmethod
    def _export_tokens(cls, v):
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            points = sorted({parse_tokens(x) for x in v})
            if not points:
                raise ValueError("give at least one token count, or leave export_every_tokens out")
            return points
        return parse_tokens(v)


class BranchSpec(_Strict):
    """Start from another run's checkpoint at the end of one of its phases (`--from`, `--after-phase`)."""

    run: str = Field(description="the parent run folder (holds recipe.json and checkpoints/)")
    after_phase: str = Field(description="the parent's phase whose end checkpoint this run starts from")


class LoggingSpec(_Strict):
    """What the run prints while it trains and where else its per-step records go; never the training itself."""

    every_seconds: float | None = Field(
        30.0, ge=0, description="with stdout not a terminal: a log line at least this often (and at each phase start/end)")
    every_steps: int | None = Field(None, gt=0, description="with stdout not a terminal: also a line every N steps")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="trackers that also get every step's metrics (main process only)")
    wandb_project: str | None = Field(None, description="Weights & Biases project (default: detour)")

    @field_validator("report_to", mode="before")
    @classmethod
    def _names(cls, v):
        # `--set logging.report_to=tensorboard,wandb` arrives as one string
        if v is None:
            return []
        if isinstance(v, str):
            v = [part.strip() for part in v.split(",") if part.strip()]
        return list(dict.fromkeys(v))


class CardSpec(_Strict):
    """Hub metadata for the model cards of the run's exports; the rest of each card comes from the run."""

    license: str | None = Field(None, description="Hub license id, e.g. apache-2.0 (default: the base model's card's)")
    language: list[str] | None = Field(None, description="languages of the training text, e.g. [en] or [fr]")
    datasets: list[str] | None = Field(None, description="Hub dataset ids the training text comes from")
    tags: list[str] | None = Field(None, description="extra Hub tags")

    @field_validator("language", "datasets", "tags", mode="before")
    @classmethod
    def _as_list(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("license")
    @classmethod
    def _license_id(cls, v):
        # Hub license ids are lowercase: apache-2.0, cc-by-nc-sa-4.0, openrail++, other
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", v):
            raise ValueError(f"expected a Hub license id such as apache-2.0, mit, cc-by-4.0 or other, got {v!r}")
        return v


class DistributedSpec(_Strict):
    """How several processes (torchrun) share a step; never what a step computes (docs/distributed.md)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp: a full model per process, gradients all-reduced; fsdp: weights, gradients "
                           "and optimizer state sharded over the processes (FSDP2)")


class ValidationSpec(_Strict):
    """A held-out MLM (and, in CLM phases, CLM) loss measured while training, on fixed sequences and masks."""

    source: str | None = Field(
        None, description="a folder written by `detour prepare` (default: the validation split of data.sources.0, "
                          "from `detour prepare --validation`)")
    every_tokens: int | None = Field(
        None, description="also evaluate each time the run's tokens cross a multiple of this (always at the run's "
                          "start and at every phase end)")
    sequences: int = Field(32, gt=0, description="held-out packed sequences of data.seq_len tokens")
    mask_rate: float = Field(0.15, gt=0, lt=1, description="MLM masking rate of the held-out sequences")
    mask_seed: int = Field(0, ge=0, description="seed of the held-out masks (the same in every arm and at every point)")

    @field_validator("every_tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return None if v is None else parse_tokens(v)


class Recipe(_Strict):
    name: str = "detour"
    model: ModelSpec
    data: DataSpec
    optimizer: OptimizerSpec = OptimizerSpec()
    batch: BatchSpec
    seed: int = 17
    phases: list[PhaseSpec] = Field(min_length=1)
    checkpoint: CheckpointSpec = CheckpointSpec()
    baseline_mask_rate: float = Field(0.30, gt=0, lt=1, description="Phase-1 mask rate of the MLM twin")
    clm_chunk_size: int = Field(1024, gt=0, description="rows per chunk of the fused CLM head + loss")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    branch: BranchSpec | None = Field(None, description="start from a parent run's phase-end checkpoint")
    card: CardSpec | None = Field(None, description="model-card metadata of the exports: license, language, datasets, tags")
    logging: LoggingSpec = Field(default_factory=LoggingSpec, description="log lines and trackers")
    distributed: DistributedSpec = Field(default_factory=DistributedSpec,
                                         description="multi-process strategy: ddp or fsdp")
    validation: ValidationSpec | None = Field(None, description="held-out loss during training (default: none)")

    @model_validator(mode="after")
    def _unique_phase_names(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phases: names must be unique, got {names}")
        unknown = sorted(set(self.checkpoint.export_phases or ()) - set(names))
        if unknown:
            raise ValueError(f"checkpoint.export_phases: {unknown} are not phases of this recipe ({names})")
        if self.branch is not None:
            if self.branch.after_phase not in names:
                raise ValueError(f"branch.after_phase: {self.branch.after_phase!r} is not a phase of this recipe ({names})")
            if self.branch.after_phase == names[-1]:
                raise ValueError(f"branch.after_phase: {self.branch.after_phase!r} is the last phase; a branch "
                                 "needs at least one phase of its own after it")
        return self

    def phase_index(self, name: str) -> int:
        return [p.name for p in self.phases].index(name)

    # -- derived sizes ---------------------------------------------------------------------
    def sequences_per_step(self) -> int:
        if self.batch.global_sequences is not None:
            return self.batch.global_sequences
        n, rem = divmod(self.batch.global_tokens, self.data.seq_len)
        if rem or n == 0:
            raise DetourError(
                f"batch.global_tokens ({self.batch.global_tokens}) must be a positive multiple of data.seq_len ({self.data.seq_len})"
            )
        return n

    def tokens_per_step(self) -> int:
        return self.sequences_per_step() * self.data.seq_len

    def grad_accumulation(self, world_size: int = 1) -> int:
        seqs = self.sequences_per_step()
        per_rank, rem = divmod(seqs, world_size * self.batch.micro_batch)
        if rem or per_rank == 0:
            fits = [m for m in range(self.batch.micro_batch, 0, -1) if seqs % (world_size * m) == 0]
            hint = (f"e.g. --set batch.micro_batch={fits[0]}" if fits else
                    f"batch.global_sequences must be a multiple of the {world_size} process(es)")
            raise DetourError(
                f"batch: {seqs} sequences per step do not split into micro_batch={self.batch.micro_batch} "
                f"x {world_size} process(es); {hint}"
            )
        return per_rank

    def steps_in_phase(self, phase: PhaseSpec) -> int:
        return math.ceil(phase.tokens / self.tokens_per_step())

    def plan(self) -> list[dict[str, Any]]:
        """Steps and tokens per phase, as `--dry-run` prints them."""
        rows = []
        per_step = self.tokens_per_step()
        for p in self.phases:
            steps = self.steps_in_phase(p)
            last = p.tokens - (steps - 1) * per_step
            rows.append({"phase": p.name, "objective": p.objective, "mask_rate": p.mask_rate, "tokens": p.tokens,
                         "steps": steps, "tokens_per_step": per_step, "last_step_tokens": last,
                         "lr_shape": p.lr.shape})
        return rows


# -- loading ---------------------------------------------------------------------------------


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node: Any = tree
    for i, key in enumerate(keys[:-1]):
        if isinstance(node, list):
            node = node[_index(node, key, dotted)]
        else:
            if key not in node or node[key] is None:
                node[key] = {}
            node = node[key]
    last = keys[-1]
    if isinstance(node, list):
        node[_index(node, last, dotted)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise DetourError(f"--set {dotted}: {'.'.join(keys[:-1])} is not a mapping")


def _index(node: list, key: str, dotted: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise DetourError(f"--set {dotted}: {key!r} is not an index of a list of {len(node)}")
    return int(key)


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` overrides (values parsed as YAML) to a raw recipe tree."""
    tree = copy.deepcopy(tree)
    for item in overrides or []:
        if "=" not in item:
            raise DetourError(f"--set {item!r}: expected KEY=VALUE, e.g. phases.0.tokens=50k")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw))
    return tree


def _format_errors(exc: ValidationError, where: str) -> str:
    lines = [f"invalid recipe {where}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def recipe_from_dict(tree: dict, where: str = "(recipe)") -> Recipe:
    try:
        return Recipe.model_validate(tree)
    except ValidationError as exc:
        raise DetourError(_format_errors(exc, where)) from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    path = Path(path)
    if not path.is_file():
        why = why_missing(path)
        raise DetourError(f"recipe {path}: {why}" if why not in (None, "no such file or folder")
                          else f"recipe not found: {path}")
    tree = read_yaml_mapping(path, "recipe")
    return recipe_from_dict(apply_overrides(tree, overrides or []), str(path))


def recipe_to_dict(recipe: Recipe) -> dict:
    tree = recipe.model_dump(mode="json")
    # The default strategy is left out: a recipe.json, and every key made from a recipe, stays what
    # it was before the field existed.
    if recipe.distributed == DistributedSpec():
        del tree["distributed"]
    if recipe.validation is None:
        del tree["validation"]
    return tree


def baseline_of(recipe: Recipe) -> Recipe:
    """The matched MLM twin: every CLM phase becomes MLM at `baseline_mask_rate`; all else equal.

    A replaced phase's name says what it now is: `clm` becomes `mlm30` (the rate in percent), in the
    twin's logs, export folders and model card. Phases are matched between the arms by position, and
    the other phases keep their names, so the decay's masks (keyed by seed and phase name) are the
    detour's own.
    """
    tree = recipe_to_dict(recipe)
    renamed = {}
    for phase in tree["phases"]:
        if phase["objective"] == "clm":
            phase["objective"] = "mlm"
            phase["mask_rate"] = recipe.baseline_mask_rate
            if "clm" in phase["name"]:
                new = phase["name"].replace("clm", f"mlm{round(recipe.baseline_mask_rate * 100)}")
                if new not in {p.name for p in recipe.phases}:
                    renamed[phase["name"]] = phase["name"] = new
    checkpoint = tree["checkpoint"]
    if checkpoint.get("export_phases"):
        checkpoint["export_phases"] = [renamed.get(n, n) for n in checkpoint["export_phases"]]
    if tree.get("branch"):
        tree["branch"]["after_phase"] = renamed.get(tree["branch"]["after_phase"], tree["branch"]["after_phase"])
    tree["name"] = f"{recipe.name}-mlm-baseline"
    return recipe_from_dict(tree, "(baseline twin)")
