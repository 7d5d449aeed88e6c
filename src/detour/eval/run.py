"""`detour eval`: fine-tune and score encoders on downstream tasks over seeds.

    detour eval $(python -c "from detour.paths import minilm_path; print(minilm_path())") \
        --tasks ncbi-disease,gad --seeds 2 --epochs 1 --max-train 64 --max-eval 64 --out runs/eval-smoke

MODEL is any Hugging Face encoder folder or hub name (loaded with AutoModel, no remote code).
Tasks are shipped names (`detour eval --list-tasks`) or spec files (--task-spec). Several models
share the same splits and seeds. Results go to OUT/results.json and OUT/results.md after every
finished (model, task, seed); rerunning with the same OUT resumes.

Each run records what `detour compare` checks before comparing two models: the task spec, a
sha256 of the examples used (`data_sha256`), linear_probe and the effective budget.

SIGTERM or SIGINT (Ctrl-C) stops the run where it is and exits with status 75 (as `detour train`
does): the finished runs stay in OUT/results.json, the interrupted one is dropped (its weights
lived only in memory), no temporary file is left, and rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from detour.errors import DetourError
from detour.io import ensure_output_dir
from detour.eval.finetune import Budget, finetune, prepare_task
from detour.eval.results import Results, display_name
from detour.eval.splits import load_splits
from detour.eval.tasks import load_spec, shipped_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL", help="encoder folders or hub names")
    parser.add_argument("--tasks", default="", help="comma-separated shipped task names or spec files")
    parser.add_argument("--task-spec", action="append", default=[], metavar="FILE", help="a task spec YAML (repeatable)")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeds: runs seeds 0..N-1 (default 5)")
    parser.add_argument("--out", default="runs/eval", help="output folder for results.json / results.md")
    parser.add_argument("--data-root", default=None, help="where task paths resolve (default $DETOUR_DATA_ROOT or ../shared/data)")
    parser.add_argument("--epochs", type=int, default=None, help="override the spec's epochs")
    parser.add_argument("--max-train", type=int, default=None, help="cap train examples (seeded sample)")
    parser.add_argument("--max-eval", type=int, default=None, help="cap validation and test examples (seeded sample)")
    parser.add_argument("--max-length", type=int, default=None, help="override the spec's max length (tokens)")
    parser.add_argument("--lr", type=float, default=None, help="override the spec's learning rate")
    parser.add_argument("--batch-size", type=int, default=None, help="override the spec's batch size")
    parser.add_argument("--linear-probe", action="store_true", help="freeze the encoder; train the head only")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--list-tasks", action="store_true", help="list the shipped tasks and exit")


def _specs(args):
    names = [t.strip() for t in args.tasks.split(",") if t.strip()] + list(args.task_spec)
    if not names:
        raise DetourError("no task: give --tasks a,b,c and/or --task-spec FILE (see --list-tasks)")
    specs = [load_spec(n, args.data_root) for n in names]
    seen = set()
    for s in specs:
        if s.name in seen:
            raise DetourError(f"task {s.name!r} given twice")
        seen.add(s.name)
    return specs


class EvalStopped(BaseException):
    """SIGTERM / SIGINT arrived. A BaseException, like KeyboardInterrupt, so that no
    `except Exception` in the libraries underneath can swallow it or turn it into another error."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Stop:
    """Signal handlers that stop the evaluation at once, except while results are being written."""

    def __init__(self):
        self.signum = 0
        self.writing = False

    def handler(self, signum, _frame):
        self.signum = signum
        if not self.writing:
            raise EvalStopped(signum)

    @contextmanager
    def installed(self):
        """Handle SIGTERM and SIGINT inside the block; the previous handlers come back after it."""
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, self.handler)
            except ValueError:  # not the main thread: leave signals alone
                pass
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    @contextmanager
    def writes(self):
        """Results written inside finish writing; a signal that came meanwhile stops right after."""
        self.writing = True
        try:
            yield
        finally:
            self.writing = False
        if self.signum:
            raise EvalStopped(self.signum)


def spec_record(spec) -> dict:
    """The task spec as run, without where it was read from (paths differ between machines)."""
    return spec.model_dump(mode="json", exclude={"source", "root"})


def examples_sha256(examples: dict[str, list[dict]]) -> str:
    """A fingerprint of the train/validation/test examples actually used (after the caps)."""
    text = json.dumps({k: examples[k] for k in sorted(examples)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run(args) -> int:
    if args.list_tasks:
        for name in shipped_tasks():
            spec = load_spec(name, args.data_root)
            print(f"{name:16s} {spec.type:15s} {spec.format:15s} {spec.description}")
        return 0
    if not args.models:
        raise DetourError("give at least one MODEL (an encoder folder or hub name)")
    from detour.paths import resolve_model_ref
    from detour.train.loop import RESUMABLE_EXIT

    args.models = [resolve_model_ref(m) for m in args.models]  # aliases such as minilm-l6
    if args.seeds < 1:
        raise DetourError("--seeds must be >= 1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    specs = _specs(args)
    budget = Budget(args.epochs, args.max_train, args.max_eval, args.max_length, args.lr, args.batch_size)
    config = {
        "models": list(args.models), "tasks": [s.name for s in specs], "seeds": list(range(args.seeds)),
        "epochs": args.epochs, "max_train": args.max_train, "max_eval": args.max_eval,
        "max_length": args.max_length, "lr": args.lr, "batch_size": args.batch_size,
        "linear_probe": bool(args.linear_probe),
    }
    total = len(args.models) * len(specs) * args.seeds
    stop, state = _Stop(), {"doing": "starting", "finished": 0}
    try:
        with stop.installed():  # from here on, a signal can never leave a file half-written
            out_dir = _evaluate(args, specs, budget, config, stop, state)
    except BaseException as exc:
        # After a signal, whatever a library underneath made of it, this is the stop it asked for.
        if not (stop.signum or isinstance(exc, KeyboardInterrupt)):
            raise
        name = signal.Signals(stop.signum).name if stop.signum else "Ctrl-C"
        dropped = "; that run is dropped" if state["doing"].startswith("fine-tuning") else ""
        saved = (f" and saved in {Path(args.out) / 'results.json'} (and results.md)" if state["finished"]
                 else "; nothing was written")
        print(f"detour eval: stopped by {name} while {state['doing']}{dropped}. {state['finished']} of {total} "
              f"run(s) are finished{saved}. Rerun the same command to resume: finished runs are skipped.",
              file=sys.stderr)
        return RESUMABLE_EXIT
    print(f"results: {out_dir / 'results.json'} and results.md")
    return 0


def _evaluate(args, specs, budget: Budget, config: dict, stop: _Stop, state: dict) -> Path:
    """Every (model, task, seed) not yet in OUT/results.json; `state` says how far it got."""
    out_dir = ensure_output_dir(args.out, "--out")  # a file or a read-only folder fails before any training
    results = Results.open(out_dir, config)
    state["finished"] = len(results.runs)
    if results.runs:
        with stop.writes():
            results.write()  # results.md from the runs so far, even when this rerun has nothing left to do
    done = results.done()
    total = len(config["models"]) * len(specs) * len(config["seeds"])
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn()]
    with Progress(*columns) as progress:
        progress.console.print(f"{total - len(done)} of {total} run(s) to do; results go to {out_dir / 'results.json'}")
        for spec in specs:
            todo = [(m, s) for m in args.models for s in config["seeds"] if (m, spec.name, s) not in done]
            if not todo:
                continue
            state["doing"] = f"reading task {spec.name}"
            splits = load_splits(spec)
            for model in args.models:
                seeds = [s for m, s in todo if m == model]
                if not seeds:
                    continue
                state["doing"] = f"preparing {display_name(model)} for {spec.name}"
                prep = prepare_task(spec, model, budget, splits)
                recorded = {"spec": spec_record(spec), "data_sha256": examples_sha256(prep.examples),
                            "linear_probe": bool(args.linear_probe)}
                steps = prep.epochs * -(-len(prep.features["train"]) // prep.batch_size)
                for seed in seeds:
                    state["doing"] = f"fine-tuning {display_name(model)} {spec.name} seed {seed}"
                    bar = progress.add_task(f"{display_name(model)} {spec.name} seed {seed}", total=steps, loss=float("nan"))
                    started = time.time()
                    out = finetune(model, prep, seed, args.linear_probe, args.device,
                                   on_step=lambda loss, bar=bar: progress.update(bar, advance=1, loss=loss))
                    with stop.writes():  # a signal now waits until results.json and results.md are whole
                        results.add({
                            "model": model, "task": spec.name, "seed": seed, "headline": spec.headline,
                            "metrics": out["metrics"], "selected_epoch": out["selected_epoch"],
                            "budget": {
                                "epochs": prep.epochs, "train_examples": len(prep.examples["train"]),
                                "validation_examples": len(prep.examples["validation"]),
                                "eval_examples": len(prep.examples["test"]), "max_length": prep.max_length,
                                "lr": prep.lr, "batch_size": prep.batch_size, "labels": len(prep.labels),
                            },
                            **recorded,
                            "timings": {**out["timings"], "wall_s": round(time.time() - started, 3)},
                            "validation": out["validation"],
                        })
                        state["finished"] = len(results.runs)
                        state["doing"] = "between runs"
                        head = out["metrics"][spec.headline]
                        progress.console.print(f"{display_name(model)} {spec.name} seed {seed}: {spec.headline} = {head:.4f} (epoch {out['selected_epoch']})")
    return out_dir
