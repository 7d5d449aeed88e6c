"""Every step's metrics also to TensorBoard and/or Weights & Biases (`--report-to`), from the main process.

    detour train recipes/tiny-modernbert.yaml --out runs/tiny --report-to tensorboard
    tensorboard --logdir runs/          # finds every RUN/tensorboard/ below, one run each
    WANDB_MODE=offline detour train recipes/tiny-modernbert.yaml --out runs/tiny --report-to wandb

Each step logs loss, lr, grad_norm and tokens_per_s, one tag each for the whole run, against the
tokens the run has trained (the x axis); each validation point (train/validation.py) logs
validation/mlm_loss, validation/mlm_accuracy and, in a CLM phase, validation/clm_loss and
validation/clm_perplexity on the same axis, so one loss curve runs from the CLM phase through the MLM
decay: the numbers of metrics.jsonl, which stays the record. TensorBoard marks where each phase
begins with a text entry `phase` at that token count; Weights & Biases gets `tokens` (the charts'
x axis, through define_metric) and `phase_index` beside the values, at the global step.
TensorBoard writes RUN/tensorboard/, Weights & Biases RUN/wandb/ (project `logging.wandb_project`,
default detour; run name the recipe's name).

A tracker that starts without the earlier steps of the run (a fresh branch, whose metrics.jsonl
begins with its parent's records, or a resume that adds a tracker) first gets every record
already in metrics.jsonl. A resumed TensorBoard log hides the steps after the checkpoint, which are
redone; a resumed Weights & Biases run continues under the same id (RUN/wandb/detour-run-id).

The packages are optional (`pip install 'clm-detour[tensorboard]'`, `[wandb]`); one that is missing
is an error before anything is built or trained.
"""

from __future__ import annotations

import importlib
import secrets
from pathlib import Path

from detour.errors import DetourError
from detour.runs import RunFolder

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s")
VALIDATION_SCALARS = ("mlm_loss", "mlm_accuracy", "clm_loss", "clm_perplexity")
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_available(names) -> None:
    for name in names:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise DetourError(f"logging.report_to: {name} needs the {_MODULES[name]} package, which cannot be "
                              f"imported ({exc}); pip install 'clm-detour[{name}]', or leave out "
                              f"--report-to {name}") from None


def scalars(record: dict) -> dict[str, float]:
    """One metrics.jsonl record as tracker values: one tag per quantity, whatever the phase, so one
    loss curve runs through the CLM -> MLM switch (the phases are marked apart, see Trackers). A
    validation record gives `validation/mlm_loss` and the like."""
    if record.get("kind") == "validation":
        return {f"validation/{key}": float(record[key]) for key in VALIDATION_SCALARS if record.get(key) is not None}
    return {key: float(record[key]) for key in SCALARS if record.get(key) is not None}


def phase_offsets(recipe) -> dict[str, int]:
    """The tokens of the run before each phase begins: the x axis of the trackers is the run's tokens."""
    offsets, total = {}, 0
    for phase in recipe.phases:
        offsets[phase.name] = total
        total += phase.tokens
    return offsets


class Trackers:
    """The trackers of `recipe.logging.report_to`; open (a context manager) from the training loop.

    Records reach it through MetricsLog, only while it is open.
    """

    def __init__(self, recipe, out: Path, enabled: bool = True):
        check_available(recipe.logging.report_to)  # on every process, so all stop before training
        self.recipe = recipe
        self.out = Path(out)
        self.names = list(recipe.logging.report_to) if enabled else []
        self._tensorboard = None
        self._wandb = None
        self._offsets = phase_offsets(recipe)
        self._index = {p.name: i for i, p in enumerate(recipe.phases)}
        self._last_phase: str | None = None

    def __enter__(self):
        from detour.runs import read_records

        metrics = RunFolder(self.out).metrics
        earlier = read_records(metrics) if self.names and metrics.is_file() else []
        if "tensorboard" in self.names:
            self._open_tensorboard(earlier)
        if "wandb" in self.names:
            self._open_wandb(earlier)
        return self

    def __exit__(self, exc_type, *_):
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish(exit_code=0 if exc_type is None else 1)
            self._wandb = None

    def log(self, records: list[dict]) -> None:
        self._send(records, self._tensorboard, self._wandb)

    def run_tokens(self, record: dict) -> int:
        """The tokens the run had trained when `record` was written (its phase's offset plus its own)."""
        return self._offsets.get(record["phase"], 0) + int(record["tokens"])

    def _send(self, records: list[dict], tensorboard, wandb_run) -> None:
        for record in records:
            values, tokens = scalars(record), self.run_tokens(record)
            starts = record["phase"] != self._last_phase
            self._last_phase = record["phase"]
            if tensorboard is not None:
                for tag, value in values.items():
                    tensorboard.add_scalar(tag, value, tokens)
                if starts:  # a marker where each phase begins, on the same token axis
                    tensorboard.add_text("phase", f"{record['phase']} ({record.get('objective', '')}) from "
                                                  f"{tokens - int(record['tokens']):,} tokens", tokens)
            if wandb_run is not None:
                wandb_run.log({**values, "tokens": tokens, "phase_index": self._index.get(record["phase"], -1)},
                              step=record["global_step"])

    def _open_tensorboard(self, earlier: list[dict]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = self.out / "tensorboard"
        continues = bool(earlier) and folder.is_dir() and any(folder.glob("events.out.tfevents.*"))
        # purge_step hides the events an earlier process wrote from that step on: on a resume the steps
        # after the checkpoint (redone now); on a fresh start anything a failed earlier start left.
        first = self.run_tokens(earlier[-1]) + 1 if continues else 1
        if continues:
            self._last_phase = earlier[-1]["phase"]
        self._tensorboard = SummaryWriter(log_dir=str(folder), purge_step=first)
        if not continues:
            self._send(earlier, self._tensorboard, None)

    def _open_wandb(self, earlier: list[dict]) -> None:
        import wandb

        from detour.config import recipe_to_dict

        folder = self.out / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "detour-run-id"
        continues = bool(earlier) and id_file.is_file()
        run_id = id_file.read_text().strip() if continues else secrets.token_hex(4)  # W&B ids: [a-z0-9]
        id_file.write_text(run_id + "\n")
        self._wandb = wandb.init(project=self.recipe.logging.wandb_project or "detour", name=self.recipe.name,
                                 id=run_id, resume="allow", dir=str(self.out), config=recipe_to_dict(self.recipe))
        self._wandb.define_metric("tokens")
        self._wandb.define_metric("*", step_metric="tokens")  # the charts' x axis: the run's tokens
        if not continues:
            self._send(earlier, None, self._wandb)
