"""What each kind of study step asks of the machine: the study file's `resources:` section.

    python -c "from detour.study.resources import Resources; r = Resources.model_validate({'train': {'tasks': 2}}); print(r.of('train'))"

One entry per step kind (train, eval, analysis, prepare, needle) and a `default` for the kinds not
named; a field an entry leaves out is the default entry's. `--executor local` reads `tasks` (a
training step with tasks > 1 runs under torchrun) and `gpus_per_node`; `--executor slurm` reads
every field: each step is one SLURM job of `nodes` x `tasks` processes (the torch.distributed ranks
of a training step). The base encoder's training (`base`) takes the `train` entry; the in-process
steps (streams, task, report) run in the study's own process and take none.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

KINDS = ("train", "eval", "analysis", "prepare", "needle")
MAX_RESUBMITS = 3  # a step stopped by the cluster more often than this is reported, not retried forever
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepResources(_Strict):
    """One step kind's share: processes, devices, and the SLURM job's limits."""

    nodes: int | None = Field(None, ge=1, description="nodes of the step's job (SLURM)")
    gpus_per_node: int | None = Field(None, ge=0, description="GPUs a node of the step's job holds")
    tasks: int | None = Field(None, ge=1, description="processes per node: torchrun's --nproc-per-node, SLURM's "
                                                      "--ntasks-per-node (ranks of a training step)")
    cpus_per_task: int | None = Field(None, ge=1, description="CPU cores of each process (its thread count)")
    time: str | int | None = Field(None, description="SLURM time limit: minutes (240) or [D-]HH:MM[:SS] (04:00:00)")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_resubmits: int | None = Field(None, ge=0, description="how often a step stopped by the cluster (time "
                                                              "limit, preemption, scancel) is submitted again")
    extra: dict[str, str | int | bool] | list[str] | None = Field(
        None, description="further sbatch options: {mem: 64G} or [--mem=64G, --exclusive]")

    @field_validator("time")
    @classmethod
    def _time(cls, value):
        if value is None:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value <= 0:
                raise ValueError(f"expected a positive number of minutes, got {value}")
            return value
        if isinstance(value, str) and _TIME.match(value.strip()):
            return value.strip()
        raise ValueError(f"expected minutes (240) or [D-]HH:MM[:SS] (04:00:00), got {value!r}")

    @field_validator("extra")
    @classmethod
    def _extra(cls, value):
        if isinstance(value, list):
            for item in value:
                if not item.startswith("--"):
                    raise ValueError(f"expected sbatch options written --name[=value], got {item!r}")
        return value

    def minutes(self) -> int | None:
        """The time limit in whole minutes, as submitit takes it (seconds round up)."""
        if self.time is None or isinstance(self.time, int):
            return self.time
        days, a, b, c = _TIME.match(self.time).groups()
        parts = [int(x) for x in (a, b, c) if x is not None]
        if days is not None:  # D-HH[:MM[:SS]]
            parts += [0] * (3 - len(parts))
            h, m, s = parts
            return int(days) * 1440 + h * 60 + m + (1 if s else 0)
        if len(parts) == 1:
            return parts[0]
        if len(parts) == 2:  # MM:SS, as sbatch reads it
            return parts[0] + (1 if parts[1] else 0)
        h, m, s = parts
        return h * 60 + m + (1 if s else 0)

    def sbatch_extra(self) -> dict[str, str | bool]:
        """`extra` as submitit's slurm_additional_parameters (a list's --name[=value] become keys)."""
        if self.extra is None:
            return {}
        if isinstance(self.extra, dict):
            return {k.lstrip("-").replace("-", "_"): v for k, v in self.extra.items()}
        out: dict[str, str | bool] = {}
        for item in self.extra:
            name, sep, value = item[2:].partition("=")
            out[name.replace("-", "_")] = value if sep else True
        return out


class Resources(_Strict):
    """The `resources:` section: per step kind, with `default` for the kinds not named."""

    default: StepResources = Field(default_factory=StepResources)
    train: StepResources | None = None
    eval: StepResources | None = None
    analysis: StepResources | None = None
    prepare: StepResources | None = None
    needle: StepResources | None = None

    def of(self, kind: str) -> StepResources:
        """A step kind's resources: its own entry over the default entry."""
        kind = "train" if kind == "base" else kind
        own = getattr(self, kind, None) if kind in KINDS else None
        merged = self.default.model_dump()
        if own is not None:
            merged.update(own.model_dump(exclude_none=True))
        return StepResources.model_validate(merged)

    def partitions(self) -> dict[str, str]:
        """field -> partition named, for the check against the cluster's partitions."""
        named = {"resources.default.partition": self.default.partition}
        for kind in KINDS:
            entry = getattr(self, kind)
            if entry is not None:
                named[f"resources.{kind}.partition"] = entry.partition
        return {k: v for k, v in named.items() if v}


def describe(res: StepResources, kind: str) -> str:
    """One line of a step's resources, for --dry-run."""
    if kind in ("streams", "task", "report", "gather"):
        return "in the study's process"
    parts = []
    if (res.nodes or 1) > 1:
        parts.append(f"{res.nodes} nodes")
    parts.append(f"{res.tasks or 1} task{'s' if (res.tasks or 1) > 1 else ''}")
    if res.gpus_per_node:
        parts.append(f"{res.gpus_per_node} GPU{'s' if res.gpus_per_node > 1 else ''}/node")
    if res.cpus_per_task:
        parts.append(f"{res.cpus_per_task} CPU/task")
    if res.time is not None:
        parts.append(f"time {res.time}")
    if res.partition:
        parts.append(f"partition {res.partition}")
    return ", ".join(parts)
