"""The per-step metrics log (`metrics.jsonl`), the progress shown while training, and the loss curves.

    tail -n 3 runs/tiny/detour/metrics.jsonl
    detour train recipes/tiny-modernbert.yaml --out runs/tiny > train.log   # plain lines, every 30 s

One JSON record per optimizer step: phase, objective, step (within the phase), global_step, tokens
(cumulative within the phase), loss, lr, grad_norm, tokens_per_s, padding_tokens, stream_hash (the
phase's chained hash of every token id consumed so far, in stream order and the same on any number of
processes, as summary.json reports it at the phase end).
Between them, with `validation:` in the recipe, records with "kind": "validation" (a held-out
loss, see validation.py); readers of the steps skip every record that has a "kind".
A branch (`--from`) starts with a copy of its parent's records up to the branch point. Each record
also goes to the trackers of `logging.report_to` (see trackers.py). At the end of the run,
RUN/curves.png plots them: loss against tokens per phase, the LR on a second axis, and the held-out
MLM loss as dots.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress as RichProgress, ProgressColumn, TextColumn
from rich.table import Column
from rich.text import Text

from detour.io import atomic_write, write_text
from detour.runs import read_metrics, read_records


class MetricsLog:
    def __init__(self, path: Path, enabled: bool = True, trackers=None):
        self.path = path
        self.enabled = enabled  # only the main process writes
        self.trackers = trackers  # a trackers.Trackers; it takes records once opened

    def write(self, record: dict) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict]) -> None:
        if self.enabled and records:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in records)
            if self.trackers is not None:
                self.trackers.log(records)

    def truncate_after(self, global_step: int) -> None:
        """On resume, drop records of steps the checkpoint does not contain (they will be redone)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill -9
                continue
            if record.get("global_step", 0) <= global_step:
                kept.append(line)
        write_text(self.path, "".join(line + "\n" for line in kept))


# -- progress ---------------------------------------------------------------------------------

WIDE = 100  # terminal columns from which the bar fits beside the numbers


def format_duration(seconds: float | None) -> str:
    """3725.2 -> '1:02:05'; hours are not wrapped into days, so the field stays one number to parse."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _short(tokens: int) -> str:
    """491520 -> '491.5k', 80_000_000 -> '80M'."""
    for size, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if tokens >= size:
            return f"{tokens / size:.1f}".removesuffix(".0") + suffix
    return str(tokens)


class _PhaseClock:
    """Tokens and time of the current phase in this process; rate and ETA from them."""

    def __init__(self, name: str, objective: str, total: int, done: int, step: int, after: int = 0):
        self.name, self.objective, self.total = name, objective, total
        self.after = after  # the tokens of the phases still to come after this one
        self.start_done = self.done = done  # a resumed phase starts part-way
        self.step = step
        self.loss: float | None = None
        self.lr: float | None = None
        self.t0 = self.last_line = time.monotonic()
        self.t_end: float | None = None

    def elapsed(self) -> float:
        return (time.monotonic() if self.t_end is None else self.t_end) - self.t0

    def rate(self) -> float | None:
        """Tokens/s over the whole phase so far (this process): steadier than the last step's."""
        elapsed = self.elapsed()
        return (self.done - self.start_done) / elapsed if elapsed > 0 and self.done > self.start_done else None

    def eta(self) -> float | None:
        if self.done >= self.total:
            return 0.0
        rate = self.rate()
        return (self.total - self.done) / rate if rate else None

    def run_eta(self) -> float | None:
        """The rest of the run at this phase's rate: this phase's remaining tokens and every later phase's."""
        left = self.total - self.done + self.after
        if left <= 0:
            return 0.0
        rate = self.rate()
        return left / rate if rate else None


class _StatusColumn(ProgressColumn):
    """A phase's numbers as one text, which wraps on a narrow terminal: rich would cut separate
    columns that do not fit down to `0…`."""

    def __init__(self, compact: bool):
        self.compact = compact
        super().__init__(table_column=Column(no_wrap=not compact, overflow="fold"))

    def render(self, task) -> Text:
        clock: _PhaseClock = task.fields["clock"]
        rate = clock.rate()
        loss = "-" if clock.loss is None else f"{clock.loss:.3f}"
        speed = "-" if rate is None else f"{rate:,.0f}"
        times = (f"elapsed {format_duration(clock.elapsed())}  eta {format_duration(clock.eta())}"
                 f"  run eta {format_duration(clock.run_eta())}")
        if self.compact:
            return Text(f"{clock.name} {_short(clock.done)}/{_short(clock.total)} tok  loss {loss}  "
                        f"{speed} tok/s  {times}")
        return Text(f"{_short(clock.done)}/{_short(clock.total)} tok  {speed} tok/s  loss {loss}  {times}")


class Progress:
    """Each phase's progress on stdout (main process; silent when disabled).

    On a terminal: a rich bar with tokens, tokens/s, loss, elapsed and ETA; below 100 columns the
    same numbers without the bar. When stdout is a file or a pipe (SLURM, nohup), plain lines instead,
    flushed: one at each phase start and end, and one after a step when `logging.every_seconds` have
    passed since the last (or every `logging.every_steps` steps):

        2025-06-01 12:00:03 step 120 phase clm tokens 491,520/80,000,000 loss 5.6391 lr 2.00e-04 tokens/s 1,508 elapsed 0:05:26 eta 1:23:45 run_eta 1:33:10

    `step` is the global step (as in checkpoint names); tokens, tokens/s, elapsed and eta are of the
    phase, measured in this process (a resumed phase counts from the resume); run_eta is the rest of
    the whole run (this phase and the later ones) at the phase's rate. A value not known yet is `-`;
    phase start and end lines end with `event start` / `event end`.
    """

    def __init__(self, recipe, enabled: bool = True, console: Console | None = None):
        self.recipe = recipe
        self.enabled = enabled
        self.every_seconds = recipe.logging.every_seconds
        self.every_steps = recipe.logging.every_steps
        self.console = console
        self._bar: RichProgress | None = None
        self._task = None
        self._lines = None  # the stream plain lines go to, when stdout is not a terminal
        self._clock: _PhaseClock | None = None

    def __enter__(self):
        if not self.enabled:
            return self
        console = self.console or Console()
        if not console.is_terminal:
            self._lines = console.file
            return self
        if console.width >= WIDE:
            # The name gives way first (cut with an ellipsis), then the bar; the numbers never do.
            name = Column(no_wrap=True, overflow="ellipsis", max_width=max(10, console.width - 75))
            columns = [TextColumn("{task.description}", style="bold", markup=False, table_column=name),
                       BarColumn(bar_width=None), _StatusColumn(compact=False)]
        else:
            columns = [_StatusColumn(compact=True)]
        self._bar = RichProgress(*columns, console=console)
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def start_phase(self, phase, done: int, step: int = 0) -> None:
        if not self.enabled:
            return
        names = [p.name for p in self.recipe.phases]
        later = self.recipe.phases[names.index(phase.name) + 1:] if phase.name in names else []
        self._clock = _PhaseClock(phase.name, phase.objective, phase.tokens, done, step,
                                  after=sum(p.tokens for p in later))
        if self._bar is not None:
            self._task = self._bar.add_task(f"{phase.name} ({phase.objective}) {self.recipe.name}",
                                            total=phase.tokens, completed=done, clock=self._clock)
        self._line("start", f" objective {phase.objective} run {self.recipe.name}")

    def advance(self, n_tokens: int, loss: float, lr: float | None = None, step: int | None = None) -> None:
        clock = self._clock
        if not self.enabled or clock is None:
            return
        clock.done += n_tokens
        clock.loss, clock.lr = loss, lr
        clock.step = clock.step + 1 if step is None else step
        finished = clock.done >= clock.total
        if finished:
            clock.t_end = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, advance=n_tokens)
            return
        if finished:
            self._line("end")
        elif self._line_due(clock):
            self._line()

    def note(self, text: str) -> None:
        """One line of its own (a validation point): above the bar on a terminal, else a plain line."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        elif self._lines is not None:
            self._lines.write(time.strftime("%Y-%m-%d %H:%M:%S ") + text + "\n")
            self._lines.flush()

    def _line_due(self, clock: _PhaseClock) -> bool:
        by_time = self.every_seconds is not None and time.monotonic() - clock.last_line >= self.every_seconds
        return by_time or (self.every_steps is not None and clock.step % self.every_steps == 0)

    def _line(self, event: str | None = None, extra: str = "") -> None:
        clock = self._clock
        if self._lines is None or clock is None:
            return
        rate = clock.rate()
        fields = [
            ("step", str(clock.step)), ("phase", clock.name), ("tokens", f"{clock.done:,}/{clock.total:,}"),
            ("loss", "-" if clock.loss is None else f"{clock.loss:.4f}"),
            ("lr", "-" if clock.lr is None else f"{clock.lr:.2e}"),
            ("tokens/s", "-" if rate is None else f"{rate:,.0f}"),
            ("elapsed", format_duration(clock.elapsed())), ("eta", format_duration(clock.eta())),
            ("run_eta", format_duration(clock.run_eta())),
        ]
        text = time.strftime("%Y-%m-%d %H:%M:%S ") + " ".join(f"{k} {v}" for k, v in fields)
        if event:
            text += f" event {event}{extra}"
        # Written straight to the stream, not through rich: a log file gets no wrapping at 80 columns.
        self._lines.write(text + "\n")
        self._lines.flush()
        clock.last_line = time.monotonic()


# -- curves -----------------------------------------------------------------------------------


def write_curves(metrics: str | Path, png: str | Path, title: str = "") -> Path | None:
    """RUN/curves.png from metrics.jsonl: loss against tokens per phase, LR on a second axis.

    The phases follow each other along one token axis (each starts where the previous ended), with
    a dotted line at every boundary. None when there are no records to plot.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend, nothing left open
    from matplotlib.ticker import FuncFormatter

    records = read_metrics(metrics) if Path(metrics).is_file() else []
    if not records:
        return None
    held_out = [r for r in read_records(metrics) if r.get("kind") == "validation"]
    phases: dict[str, list[dict]] = {}
    for r in records:
        phases.setdefault(r["phase"], []).append(r)
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    lr_ax = ax.twinx()
    offset = 0
    for i, (name, rows) in enumerate(phases.items()):
        x = [offset + r["tokens"] for r in rows]
        color = f"C{i}"
        ax.plot(x, [r["loss"] for r in rows], color=color, lw=1.2, label=f"{name} ({rows[0].get('objective', '?')})")
        lr_ax.plot(x, [r["lr"] for r in rows], color=color, lw=0.8, ls="--", alpha=0.6)
        points = [r for r in held_out if r["phase"] == name]
        if points:
            ax.plot([offset + r["tokens"] for r in points], [r["mlm_loss"] for r in points], "o", color=color,
                    ms=4, label=f"{name}: held-out MLM loss")
        if i:
            ax.axvline(offset, color="grey", ls=":", lw=1)
        ax.annotate(name, (offset, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="grey")
        offset += rows[-1]["tokens"]
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(int(v)) if v >= 0 else ""))
    ax.set_xlabel("tokens (phases one after another)")
    ax.set_ylabel("loss (solid; dots: held-out MLM)" if held_out else "loss (solid)")
    lr_ax.set_ylabel("learning rate (dashed)")
    ax.set_title(f"{title}: loss and LR per step" if title else "loss and LR per step", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")  # losses fall: the top holds the phase names
    fig.tight_layout()
    png = Path(png)
    atomic_write(png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    return png


# -- transformers' own output -----------------------------------------------------------------


