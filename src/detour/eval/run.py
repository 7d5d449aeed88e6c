"""`detour eval`: fine-tune and score encoders on downstream tasks over seeds.

    detour eval $(python -c "from detour.paths import minilm_path; print(minilm_path())") \
        --tasks ncbi-disease,gad --seeds 2 --epochs 1 --max-train 64 --max-eval 64 --out runs/eval-smoke

MODEL is any Hugging Face encoder folder or hub name (loaded with AutoModel, no remote code).
Tasks are shipped names (`detour eval --list-tasks`) or spec files (--task-spec). Several models
share the same splits and seeds. Results go to OUT/results.json and OUT/results.md after every
finished (model, task, seed).

Cache: a finished run in OUT/results.json is reused only when everything that determines it is
unchanged: the model's weights (sha256 of its weight files), the task spec's contents, the
examples used (`data_sha256`), the options (--epochs, --max-train, --max-eval, --max-length,
--lr, --batch-size, --linear-probe) and the seed. Any other run of the command is (re)run, and the
command says which and why before it trains. Runs in OUT that the command does not ask for are
kept, unless they would end up in one table beside runs made with other settings: that is refused
before any training, naming the runs and how to include them. `--reuse-from FILE` also takes the
runs of another results.json whose key matches (how `detour study` continues a folder whose
evaluation was one call of every arm).

Progress: one line per epoch on stdout, flushed (so `detour eval ... > log.txt` shows it): model,
task, seed, epoch i/N, the validation headline, the epoch's time and the run's ETA; when stdout
is not a terminal, also a line at least every --log-every-seconds (30) inside an epoch: step,
loss and the epoch's ETA. `--dry-run` reads and checks every task, reporting every finding at
once, and says which runs would be reused or run, before any model loads.

Resume: after every epoch the training state is saved in OUT/epoch-checkpoints (atomically; see
detour.eval.finetune); rerunning resumes an interrupted seed at its next epoch, with the result an
uninterrupted run gives. The file goes once the seed's result is in results.json.

Each run records what `detour compare` checks before comparing two models: the task spec, a
sha256 of the examples used (`data_sha256`), linear_probe and the effective budget.

SIGTERM or SIGINT (Ctrl-C) stops the run where it is and exits with status 75 (as `detour train`
does): the finished runs stay in OUT/results.json, the interrupted seed keeps its last finished
epoch, no temporary file is left, and rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from detour.errors import DetourError, NoSpaceError
from detour.flags import non_negative_int, positive_int, spec_field
from detour.io import ensure_output_dir, is_disk_full, no_space
from detour.lock import folder_lock
from detour.stop import stop_signals_to
from detour.eval.epochs import CHECKPOINT_DIR, CHECKPOINT_MARKER, EpochCheckpoints  # noqa: F401  (the names of its folder, read here by callers)
from detour.eval.finetune import Budget, finetune, prepare_task, read_checkpoint
from detour.eval.results import Results, display_name, setting_of
from detour.eval.runkeys import (TaskPlan, capped_examples, check_runs_not_redone, examples_sha256, groups,
                                 import_runs, reuse_or_run, spec_record)
from detour.eval.tasks import load_spec, load_specs, shipped_tasks
from detour.eval.validate import validate_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL", help="encoder folders or hub names")
    parser.add_argument("--tasks", default="", help="comma-separated shipped task names or spec files")
    parser.add_argument("--task-spec", action="append", default=[], metavar="FILE", help="a task spec YAML (repeatable)")
    parser.add_argument("--seeds", type=positive_int, default=5,
                        help="number of seeds: runs seeds FIRST..FIRST+N-1 (default 5)")
    parser.add_argument("--first-seed", type=non_negative_int, default=0, metavar="FIRST",
                        help="the first seed (default 0): jobs with their own --out can share out the seeds")
    parser.add_argument("--out", default="runs/eval", help="output folder for results.json / results.md")
    parser.add_argument("--data-root", default=None, help="where task paths resolve (default $DETOUR_DATA_ROOT or ../shared/data)")
    parser.add_argument("--reuse-from", default=None, metavar="RESULTS_JSON",
                        help="another results.json (an earlier call with more models): its runs of this command's "
                             "models, tasks and seeds are reused when their key is unchanged; absent: nothing reused")
    add_budget_arguments(parser)
    parser.add_argument("--linear-probe", action="store_true", help="freeze the encoder; train the head only")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--list-tasks", action="store_true", help="list the shipped tasks and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="read and check every task (all findings at once) and say which runs would be reused "
                             "or run; load no model, train nothing, write nothing")
    parser.add_argument("--log-every-seconds", type=float, default=30.0, metavar="S",
                        help="when stdout is not a terminal, a progress line at least every S seconds inside an "
                             "epoch (default 30), besides the line at each epoch's end")


def add_budget_arguments(parser: argparse.ArgumentParser, lr_help: str = "override the spec's learning rate") -> None:
    """The overrides of a task spec's settings, each held to the spec's own rule for that field."""
    from detour.eval.tasks import TaskSpec, Training

    parser.add_argument("--epochs", type=spec_field(Training, "epochs", "training.epochs in a task spec"),
                        default=None, help="override the spec's epochs")
    parser.add_argument("--max-train", type=positive_int, default=None, help="cap train examples (seeded sample)")
    parser.add_argument("--max-eval", type=positive_int, default=None,
                        help="cap validation and test examples (seeded sample)")
    parser.add_argument("--max-length", type=spec_field(TaskSpec, "max_length", "max_length in a task spec"),
                        default=None, help="override the spec's max length (tokens)")
    parser.add_argument("--lr", type=spec_field(Training, "lr", "training.lr in a task spec"), default=None,
                        help=lr_help)
    parser.add_argument("--batch-size", type=spec_field(Training, "batch_size", "training.batch_size in a task spec"),
                        default=None, help="override the spec's batch size")


def _specs(args):
    return load_specs([t.strip() for t in args.tasks.split(",") if t.strip()], list(args.task_spec), args.data_root)


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

    def installed(self):
        """Handle SIGTERM and SIGINT inside the block; the previous handlers come back after it."""
        return stop_signals_to(self.handler)

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


def run(args) -> int:
    if args.list_tasks:
        for name in shipped_tasks():
            spec = load_spec(name, args.data_root)
            print(f"{name:16s} {spec.type:15s} {spec.format:15s} {spec.description}")
        return 0
    if not args.models:
        raise DetourError("give at least one MODEL (an encoder folder or hub name)")
    if args.reuse_from is not None and Path(args.reuse_from).name != "results.json":
        raise DetourError(f"--reuse-from {args.reuse_from}: give a results.json written by detour eval")

    # Models keep the names the user typed (an alias such as minilm-l6 too): results.json and
    # results.md name them so; every loader resolves an alias to its folder.
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    specs = _specs(args)
    budget = Budget(args.epochs, args.max_train, args.max_eval, args.max_length, args.lr, args.batch_size)
    if args.dry_run:
        return _dry_run(args, specs, budget)
    total = len(args.models) * len(specs) * args.seeds
    stop, state = _Stop(), {"doing": "starting", "finished": 0, "saved_epoch": None, "checkpoint": None}
    existed = Path(args.out).exists()
    out_dir = ensure_output_dir(args.out, "--out")  # a file or a read-only folder fails before any training
    # One eval per --out (results.json is rewritten whole); a folder this command made and left
    # empty (it failed before any run finished) goes again.
    with folder_lock(out_dir, remove_if_empty=not existed):
        return _run_locked(args, specs, budget, stop, state, total, out_dir)


def _run_locked(args, specs, budget: Budget, stop: "_Stop", state: dict, total: int, out_dir: Path) -> int:
    from detour.stop import RESUMABLE_EXIT

    try:
        with stop.installed():  # from here on, a signal can never leave a file half-written
            _evaluate(args, specs, budget, stop, state, out_dir)
    except NoSpaceError:
        raise
    except (OSError, RuntimeError) as exc:
        if stop.signum or not is_disk_full(exc):
            raise
        raise NoSpaceError(no_space(f"into {out_dir} (while {state['doing']})", out_dir, exc,
                                    after=f"{state['finished']} of {total} run(s) are finished and kept; free "
                                          "space, then rerun the same command: finished runs are reused")) from None
    except BaseException as exc:
        # After a signal, whatever a library underneath made of it, this is the stop it asked for.
        if not (stop.signum or isinstance(exc, KeyboardInterrupt)):
            raise
        name = signal.Signals(stop.signum).name if stop.signum else "Ctrl-C"
        where = ""
        if state["doing"].startswith("fine-tuning"):
            saved = state["saved_epoch"]
            where = (f"; epoch {saved} of that seed is saved in {state['checkpoint']} and the rerun resumes it at "
                     f"epoch {saved + 1}" if saved else "; no epoch of that seed had finished, so it starts afresh on the rerun")
        kept = (f" and saved in {Path(args.out) / 'results.json'} (and results.md)" if state["finished"]
                else "")
        print(f"detour eval: stopped by {name} while {state['doing']}{where}. {state['finished']} of {total} "
              f"run(s) are finished{kept}. Rerun the same command to resume: finished runs are reused.",
              file=sys.stderr)
        return RESUMABLE_EXIT
    print(f"results: {out_dir / 'results.json'} and results.md")
    return 0


def _seeds(args) -> list[int]:
    return list(range(args.first_seed, args.first_seed + args.seeds))


def _options(args) -> dict:
    """The command-line options that are part of every run's key (None: the spec's value)."""
    return {"epochs": args.epochs, "max_train": args.max_train, "max_eval": args.max_eval,
            "max_length": args.max_length, "lr": args.lr, "batch_size": args.batch_size,
            "linear_probe": bool(args.linear_probe)}


def _task_setting(spec, splits: dict, budget: Budget, args) -> dict:
    """A task's part of every run's key: its spec, the examples used and the command's options."""
    return setting_of({"spec": spec_record(spec), "data_sha256": examples_sha256(capped_examples(splits, budget)),
                       "options": _options(args)})


def _dry_run(args, specs, budget: Budget) -> int:
    """Every check that needs no model, and the runs a real command would reuse or do; nothing written."""
    from detour.model.load import weights_hash

    every_split = validate_tasks(specs, budget)  # every finding of every task, warnings included
    results = Results.open(Path(args.out))  # read only: --out is not created
    weights = {model: weights_hash(model) for model in args.models}
    tasks = []
    for spec in specs:
        splits = every_split[spec.name]
        _say(f"task {spec.name}: " + ", ".join(f"{len(splits[k])} {k}" for k in ("train", "validation", "test"))
             + f" examples ({spec.type}, {spec.format})")
        tasks.append(TaskPlan(spec, None, _task_setting(spec, splits, budget, args)))
    _reuse_from(args, tasks, weights, results)
    _, todo, report = reuse_or_run(tasks, args.models, _seeds(args), weights, results)
    for label in ("reused", "rerun", "new"):
        for line in groups(report[label]):
            _say(f"{label}: {line}")
    _say(f"dry run: the tasks are valid; {len(todo)} run(s) would train, into {Path(args.out) / 'results.json'}")
    return 0


def _say(text: str) -> None:
    """A line on stdout, flushed at once: a log file or a pipe shows it when it happens."""
    print(text, flush=True)


def _plan(args, specs, budget: Budget, results: Results, checkpoints: EpochCheckpoints, state: dict):
    """Which runs are reused, which run, and which are refused, from the per-run keys; before any training."""
    from detour.model.load import weights_hash

    state["doing"] = "reading and checking the tasks"
    every_split = validate_tasks(specs, budget)  # a bad spec or data file fails here, before any model loads
    weights = {}
    for model in args.models:
        state["doing"] = f"hashing the weights of {display_name(model)}"
        weights[model] = weights_hash(model)
    tasks: list[TaskPlan] = []
    for spec in specs:
        splits = every_split.pop(spec.name)
        tasks.append(TaskPlan(spec, splits, _task_setting(spec, splits, budget, args)))
    seeds = _seeds(args)
    _reuse_from(args, tasks, weights, results)
    reused, todo, report = reuse_or_run(tasks, args.models, seeds, weights, results)
    planned = {(m, tp.spec.name, s) for tp in tasks for m in args.models for s in seeds}
    report["kept"] = check_runs_not_redone(results, planned, {tp.spec.name: tp.setting for tp in tasks}, weights)
    resumable = _resumable(todo, checkpoints, report)
    report["new"] = [r for r in report["new"] if r[:3] not in resumable]  # said once, as a resume
    for model, task, seed in reused:  # finished, but stopped before its checkpoint was removed
        path = checkpoints.path(model, task, seed)
        if path.exists():
            checkpoints.remove(path)
    for tp in tasks:
        if not any(t is tp for t, *_ in todo):
            tp.splits = None  # every run of the task is cached: its splits were needed for the key only
    return tasks, weights, reused, todo, report, resumable


def _reuse_from(args, tasks: list[TaskPlan], weights: dict, results: Results) -> None:
    """The runs of --reuse-from whose key equals this command's, into `results` (in memory; written with it)."""
    if args.reuse_from is None:
        return
    path = Path(args.reuse_from)
    if not path.is_file():
        _say(f"reuse from {path}: not there, nothing to reuse")
        return
    taken = import_runs(results, Results.open(path.parent), tasks, args.models, _seeds(args), weights)
    _say(f"reuse from {path}: {taken} run(s) with an unchanged key")


def _resumable(todo: list, checkpoints: EpochCheckpoints, report: dict) -> dict:
    """(model, task, seed) -> the last saved epoch, for the epoch checkpoints saved with this run's key;
    any other is stale, and detour's own stale checkpoints are removed."""
    resumable = {}
    for tp, model, seed, key in todo:
        path = checkpoints.path(model, tp.spec.name, seed)
        if not path.exists():
            continue
        try:
            saved = read_checkpoint(path, mmap=True)
            stale = None if saved["key"] == json.dumps(key, sort_keys=True) else "saved with other settings"
        except DetourError as exc:
            stale = str(exc)
        if stale:
            _say(f"discarded the epoch checkpoint of {display_name(model)} {tp.spec.name} seed {seed} ({stale}); "
                 "that seed starts afresh")
            checkpoints.remove(path)
            continue
        resumable[model, tp.spec.name, seed] = saved["epoch"]
        report["resume"].append((model, tp.spec.name, seed, f"epochs 1-{saved['epoch']} saved" if saved["epoch"] > 1
                                 else "epoch 1 saved"))
    return resumable


def _evaluate(args, specs, budget: Budget, stop: _Stop, state: dict, out_dir: Path) -> None:
    """Every (model, task, seed) of the command not cached in OUT/results.json; `state` says how far it got."""
    results = Results.open(out_dir)
    checkpoints = EpochCheckpoints(out_dir)
    tasks, weights, reused, todo, report, resumable = _plan(args, specs, budget, results, checkpoints, state)
    state["finished"] = len(reused)
    total = len(args.models) * len(specs) * args.seeds
    for label in ("reused", "rerun", "new", "resume", "kept"):
        for line in groups(report[label]):
            _say(f"{label}: {line}")
    if results.runs:
        with stop.writes():
            results.write()  # results.md from the runs so far, even when this rerun has nothing left to do
    _say(f"{len(todo)} of {total} run(s) to do; results go to {out_dir / 'results.json'}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn()]
    with Progress(*columns, disable=not sys.stdout.isatty()) as progress:  # a log gets the epoch lines, not bars
        for tp in tasks:
            task_todo = [(m, s, key) for t, m, s, key in todo if t is tp]
            if not task_todo:
                continue
            spec = tp.spec
            # Models with the same tokenizer share the task's features: tokenized once, kept for this task only.
            token_cache: dict = {}
            for model in args.models:
                seeds = [(s, key) for m, s, key in task_todo if m == model]
                if not seeds:
                    continue
                state["doing"] = f"preparing {display_name(model)} for {spec.name}"
                prep = prepare_task(spec, model, budget, tp.splits, cache=token_cache)
                if examples_sha256(prep.examples) != tp.setting["data_sha256"]:
                    raise DetourError(f"task {spec.name}: the examples prepared for {display_name(model)} are not "
                                      "those the cache key was computed from (the caps disagree); please report this")
                steps = prep.epochs * -(-len(prep.features["train"]) // prep.batch_size)
                for seed, key in seeds:
                    _run_seed(args, spec, model, seed, key, prep, weights[model], results, checkpoints,
                              resumable.get((model, spec.name, seed), 0), steps, progress, stop, state)
            tp.splits = None


def _run_seed(args, spec, model, seed, key, prep, weights, results, checkpoints, resume_epoch, steps, progress, stop, state):
    """Fine-tune one (model, task, seed), printing a line per epoch, and record it."""
    name = f"{display_name(model)} {spec.name} seed {seed}"
    path = checkpoints.path(model, spec.name, seed)
    checkpoints.ready()
    state.update(doing=f"fine-tuning {name}", saved_epoch=resume_epoch or None, checkpoint=path)
    if resume_epoch:
        _say(f"{name}: resuming at epoch {resume_epoch + 1}/{prep.epochs} from {path}")
    per_epoch = steps // prep.epochs
    bar = progress.add_task(name, total=steps, completed=resume_epoch * per_epoch, loss=float("nan"))
    started, epoch_times = time.time(), []
    lines = {"done": resume_epoch * per_epoch, "epoch_start": time.monotonic(), "last": time.monotonic()}

    def on_step(loss):
        progress.update(bar, advance=1, loss=loss)
        lines["done"] += 1
        now = time.monotonic()
        if progress.disable and now - lines["last"] >= args.log_every_seconds:
            # a log file hears from a long epoch before it ends (a terminal has the bar)
            in_epoch = (lines["done"] - 1) % per_epoch + 1 if per_epoch else 0
            rate = in_epoch / (now - lines["epoch_start"])
            left = (per_epoch - in_epoch) / rate if rate > 0 else 0.0
            _say(f"{name} epoch {(lines['done'] - 1) // per_epoch + 1}/{prep.epochs}: step {in_epoch}/{per_epoch}, "
                 f"loss {loss:.4f}, epoch ETA {_duration(left)}")
            lines["last"] = now

    def on_epoch(info):
        lines["epoch_start"] = lines["last"] = time.monotonic()
        state["saved_epoch"] = info["epoch"]
        epoch_times.append(info["seconds"])
        left = (info["epochs"] - info["epoch"]) * sum(epoch_times) / len(epoch_times)
        _say(f"{name} epoch {info['epoch']}/{info['epochs']}: dev {spec.headline} {info['score']:.4f}, "
             f"{info['seconds']:.1f} s, ETA {_duration(left)}")

    try:
        out = finetune(model, prep, seed, args.linear_probe, args.device,
                       on_step=on_step, on_epoch=on_epoch,
                       checkpoint=path, checkpoint_key=json.dumps(key, sort_keys=True))
    except BaseException:
        if not path.exists():
            checkpoints.remove(path)  # stopped before its first epoch: no empty folder stays behind
        raise
    record = {
        "model": model, "task": spec.name, "seed": seed, "headline": spec.headline,
        "metrics": out["metrics"], "answers": out["answers"], "selected_epoch": out["selected_epoch"],
        "budget": {
            "epochs": prep.epochs, "train_examples": len(prep.examples["train"]),
            "validation_examples": len(prep.examples["validation"]),
            "eval_examples": len(prep.examples["test"]), "max_length": prep.max_length,
            "lr": prep.lr, "batch_size": prep.batch_size, "labels": len(prep.labels),
        },
        "spec": spec_record(spec), "data_sha256": key["data_sha256"], "linear_probe": bool(args.linear_probe),
        "weights_sha256": weights, "options": key["options"],
        "timings": {**out["timings"], "wall_s": round(time.time() - started, 3)},
        "compute": out["compute"],
        "validation": out["validation"],
    }
    if out["resumed_after_epoch"]:
        record["resumed_after_epoch"] = out["resumed_after_epoch"]
    with stop.writes():  # a signal now waits until results.json, results.md and the checkpoint are settled
        results.add(record)
        checkpoints.remove(path)
        state.update(finished=state["finished"] + 1, doing="between runs", saved_epoch=None)
    _say(f"{name}: {spec.headline} = {out['metrics'][spec.headline]:.4f} (epoch {out['selected_epoch']})")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
