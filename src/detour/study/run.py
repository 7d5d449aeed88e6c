"""`detour study`: a whole matched study from one file, as cached steps, ending in a report.

    detour study studies/tiny.yaml --out runs/study-tiny --dry-run   # the graph, each step's state, estimates
    detour study studies/tiny.yaml --out runs/study-tiny             # run (or continue) it
    detour study studies/tiny.yaml --out runs/study-tiny --jobs 2    # independent steps two at a time

The steps (docs/study.md): prepare the data; train the detour, its MLM twin and the extra arms (a
second-seed baseline, freeze arms, decay-length variants, which branch from the arm they share
their first phases with); check that every arm saw the same token stream; evaluate the arms on
each task over seeds; the analyses; the report. Each step is an ordinary detour command, run in
its own process, its output shown and kept in OUT/.study/logs/STEP.log.

A step whose key (see detour.study.graph) is unchanged since it last finished is not rerun; a
step whose inputs changed is rerun, and so is everything downstream whose inputs it changes.
A study stopped by SIGTERM, Ctrl-C or a kill continues where it stopped when the same command is
run again: a half-done training step resumes from its last checkpoint, a half-done evaluation keeps
its finished seeds. SIGTERM and SIGINT are passed to the running step, which stops cleanly; the
study then exits with status 75, as `detour train` does.

`--executor local --jobs N` runs up to N independent steps at once on slices of this machine;
`--executor slurm` makes each step a SLURM job (detour.study.executors, docs/cluster.md). The order,
keys and state records are the same whichever runs them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from detour.errors import DetourError
from detour.io import write_json
from detour.lock import folder_lock
from detour.stop import RESUMABLE_EXIT, die_with_parent, stop_signals_to
from detour.study.design import write_design
from detour.study.graph import BASE, SYNTHETIC_TASK, Step, build_steps, output_hash, step_key
from detour.study.executors import Options, Outcome, log_path, make_executor
from detour.study.slurm import check_partitions
from detour.study.spec import StudySpec, load_study
from detour.study.state import State, plan
from detour.runs import TWINS_FILE, RunFolder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="the study file (YAML; see docs/study.md and studies/)")
    parser.add_argument("--out", required=True, help="the study folder (created; rerun with the same --out to continue)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, their state and estimates; run nothing")
    parser.add_argument("--size", action="append", metavar="NAME", help="only this size of a study with sizes "
                        "(repeatable); the comparison is written over the sizes that have finished")
    add_executor_arguments(parser)


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="where steps run: this machine (default) or one SLURM job a step (docs/cluster.md)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="steps at once: locally each gets "
                        "1/N of the cores (or one GPU); default 1 locally, no limit on SLURM. A study with sizes "
                        "then runs them at once, the N shared between the sizes' drivers")
    parser.add_argument("--cancel-on-exit", action="store_true", help="with --executor slurm: scancel the study's "
                        "jobs when it is stopped (default: leave them to the cluster; a rerun reattaches)")


def executor_options(args: argparse.Namespace) -> Options:
    return Options(executor=args.executor, jobs=args.jobs, cancel_on_exit=args.cancel_on_exit)


# ---- running a step ----

class _Child:
    """The running step's process: SIGTERM / SIGINT to the study are passed on to it."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.signalled = 0

    def handler(self, signum, _frame):
        self.signalled = signum
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
        else:
            raise KeyboardInterrupt


def run_command(argv: list[str], log_path: Path, child: _Child) -> int:
    print(f"  $ detour {shlex.join(argv)}", flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log_path, "a") as log:
        log.write(f"$ detour {shlex.join(argv)}\n")
        # its own session: Ctrl-C on the terminal reaches the study, which passes it on once
        child.proc = subprocess.Popen([sys.executable, "-m", "detour.cli", *argv], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                                      start_new_session=True,
                                      preexec_fn=functools.partial(die_with_parent, os.getpid()))
        for line in child.proc.stdout:
            sys.stdout.write("    " + line)
            sys.stdout.flush()
            log.write(line)
        rc = child.proc.wait()
        child.proc = None
    return rc


def clear_stale(step: Step, out: Path) -> None:
    """A training run of another recipe cannot be resumed: its folder (the study's own) goes."""
    if step.kind not in ("train", "base"):
        return  # eval keeps what still matches (its own cache); analyses and prepare overwrite
    folder = out / BASE if step.kind == "base" else out / "arms" / step.name.split(":", 1)[1]
    if folder.is_dir() and RunFolder(folder).is_run():
        with folder_lock(folder):  # never under a training that still runs there (FolderLocked names it)
            print(f"  replacing {folder}: its inputs changed", flush=True)
            shutil.rmtree(folder)


def _act(step: Step, spec: StudySpec, out: Path) -> None:
    if step.kind == "streams":
        from detour.train.twins import check_failures, compare_arms, describe_checks

        summaries = {s.split(":", 1)[1]: json.loads(RunFolder(out / "arms" / s.split(":", 1)[1]).summary.read_text())
                     for s in step.deps}
        report = compare_arms(summaries)
        write_json(out / TWINS_FILE, report)
        print(f"  checks: {describe_checks(report['checks'])}")
        failed = check_failures(report, out / TWINS_FILE)
        if failed:
            raise DetourError(failed)
    elif step.kind == "task":
        from detour.eval.synthetic_ner import write_task

        t = spec.eval.synthetic_ner
        write_task(out / "data" / "tasks" / SYNTHETIC_TASK, (t.train, t.validation, t.test), seed=t.seed, lang=t.lang)
    elif step.kind == "gather":
        from detour.study.gather import run_gather

        run_gather(step, out)
    elif step.kind == "report":
        from detour.report.render import write_report

        written = write_report(out)
        print(f"  wrote {written['markdown']} and {written['html']}")


def execute(spec: StudySpec, out: Path, steps: list[Step], options: Options | None = None,
            siblings: list[Path] = ()) -> int:
    """Run the steps in dependency order on the chosen executor; cached steps are kept, and a prepare
    step that a sibling size finished with the same key is linked from there."""
    options = options or Options()
    state = State(out)
    write_design(spec, out, steps)
    child = _Child()
    executor = make_executor(options, out, state, spec.resources, spec.name,
                             lambda argv, log, c: run_command(argv, log, c), child)
    # one step at a time, in the listed order, its output on the console: the study as it always ran
    strict = executor.foreground
    number = {s.name: i for i, s in enumerate(steps, 1)}
    hashes: dict[str, str] = {}
    ran, cached, started_at = [], [], time.time()
    failed: dict[str, str] = {}  # step -> why; what depends on it is not started
    skipped: list[str] = []
    pending = list(steps)
    running: dict[str, tuple[Step, str, float]] = {}
    acting = None  # an in-process step being run: a stop is recorded on it
    stopped: list[str] = []  # steps that ended stopped (SIGTERM, Ctrl-C): the study stops too
    claims: dict = {}  # prepare steps shared with the other sizes' drivers: step -> its PrepareClaim
    waiting: set[str] = set()  # prepare steps another size's driver is running now

    def let_go(name: str) -> None:
        claim = claims.pop(name, None)
        if claim is not None:
            claim.release()

    def finish(step: Step, key: str, t0: float) -> None:
        hashes[step.name] = output_hash(step.hash_of, state.content)
        state.steps[step.name] = {"key": key, "output_hash": hashes[step.name], "seconds": round(time.time() - t0, 1),
                                  "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        state.started.pop(step.name, None)
        state.save()
        # a shared prepare's claim is let go of only once its record is saved: a size's driver that takes it
        # next links this output instead of finding no record and tokenizing the corpus again
        let_go(step.name)
        state.event(step.name, "done", seconds=round(time.time() - t0, 1))
        ran.append(step.name)
        if not strict:
            print(f"  {step.name}: done ({time.time() - t0:.1f} s)", flush=True)

    def fail(step: Step, message: str) -> None:
        let_go(step.name)
        if strict:
            raise DetourError(message)
        failed[step.name] = message
        print(f"  {step.name}: FAILED: {message}", flush=True)

    def ended(outcome) -> bool:
        """Record a step's end; False when the study must stop (a step stopped by a signal)."""
        step, key, t0 = running.pop(outcome.name)
        if outcome.status == "stopped":
            let_go(step.name)
            state.event(step.name, "stopped", rc=outcome.rc)
            stopped.append(step.name)
            return False
        if outcome.status == "failed":
            state.event(step.name, "failed", rc=outcome.rc)
            fail(step, f"step {step.name} failed (exit {outcome.rc}); "
                       + (outcome.detail or f"its output is in {log_path(state.dir, step.name)}"))
            return True
        finish(step, key, t0)
        return True

    def start_ready() -> bool:
        """Start (or keep from earlier) every step whose inputs are done, as slots allow; True if any moved."""
        nonlocal acting
        moved = False
        for step in list(pending):
            if executor.signalled:
                return moved
            lost = [d for d in step.deps if d in failed or d in skipped]
            if lost:
                pending.remove(step)
                skipped.append(step.name)
                print(f"[{number[step.name]}/{len(steps)}] {step.name}: not run, {lost[0]} did not finish", flush=True)
                moved = True
                continue
            if any(d not in hashes for d in step.deps):
                if strict:
                    return moved
                continue
            key = step_key(step, out, hashes, state.content)
            record = state.steps.get(step.name)
            if record and record["key"] == key and all(p.exists() for p in step.outputs):
                hashes[step.name] = record["output_hash"]
                cached.append(step.name)
                pending.remove(step)
                print(f"[{number[step.name]}/{len(steps)}] {step.name}: done earlier, kept", flush=True)
                moved = True
                continue
            if len(running) >= executor.capacity:
                if strict:
                    return moved
                continue
            if step.kind == "prepare" and siblings and not state.jobs.get(step.name):
                from detour.study.sizes import PrepareClaim

                # drivers of several sizes started at once: one tokenizes, the others link its output
                claim = claims.setdefault(step.name, PrepareClaim(step, key, siblings))
                if not claim.take():
                    if step.name not in waiting:
                        waiting.add(step.name)
                        print(f"[{number[step.name]}/{len(steps)}] {step.name}: waiting: {claim.holder()} "
                              "prepares the same data; it is linked from there when done", flush=True)
                    if strict:
                        return moved
                    continue
                waiting.discard(step.name)
            pending.remove(step)
            moved = True
            t0 = time.time()
            if step.name in claims:
                from detour.study.sizes import link_prepared_elsewhere

                linked = link_prepared_elsewhere(step, key, siblings)
                if linked is not None:
                    print(f"[{number[step.name]}/{len(steps)}] {step.name}: linked from {linked} (the same step, "
                          "finished there)", flush=True)
                    state.event(step.name, "start", key=key, linked_from=str(linked))
                    finish(step, key, t0)
                    continue
            print(f"[{number[step.name]}/{len(steps)}] {step.name}: {'rerun, its inputs changed' if record else 'run'}",
                  flush=True)
            if step.argv is not None and executor.adopt(step, key):
                running[step.name] = (step, key, t0)
                continue
            if record or state.started.get(step.name, key) != key:
                clear_stale(step, out)
                state.steps.pop(step.name, None)
            state.started[step.name] = key
            state.save()
            state.event(step.name, "start", key=key)
            if step.argv is None:  # in the study's own process, while other steps run on
                acting, executor.in_action = step.name, True
                try:
                    _act(step, spec, out)
                except DetourError as exc:
                    acting, executor.in_action = None, False
                    state.event(step.name, "failed", rc=2)
                    fail(step, str(exc))
                    continue
                acting, executor.in_action = None, False
                finish(step, key, t0)
                continue
            running[step.name] = (step, key, t0)
            outcome = executor.start(step, key, log_path(state.dir, step.name))
            if outcome is not None and not ended(outcome):
                return moved
            if strict:
                return moved
        return moved

    def stop() -> int:
        """The study stops: SLURM jobs are left to the cluster (or cancelled); local steps save and end."""
        left = executor.leave()
        if not left:
            for name in [n for n in running if not executor.holds(n)]:
                # the stop came as its process was being started (or just after it ended): none to wait for,
                # and a rerun runs the step again
                ended(Outcome(name, "stopped", RESUMABLE_EXIT))
            while running:
                for outcome in executor.wait(1.0):
                    ended(outcome)
        if acting:
            state.event(acting, "stopped", rc=RESUMABLE_EXIT)
        if left:
            print(f"detour study: stopped; {left}", file=sys.stderr)
        else:
            during = f" during {', '.join(sorted(stopped))}" if stopped else ""
            print(f"detour study: stopped{during}; run the same command again to continue (finished steps are kept)",
                  file=sys.stderr)
        return RESUMABLE_EXIT

    with stop_signals_to(executor.handler):  # a stop goes to the running steps (locally) or is decided below
        try:
            while not stopped and not executor.signalled:
                while start_ready() and not stopped and not executor.signalled:
                    pass
                if stopped or executor.signalled or not running and not waiting:
                    break
                if not running:  # another size's driver prepares what the next step needs
                    time.sleep(1.0)
                    continue
                for outcome in executor.wait(1.0):
                    ended(outcome)
            if stopped and running:
                executor.stop_all()  # a step stopped by a signal of its own stops the study
            if stopped or executor.signalled:
                return stop()
        except KeyboardInterrupt:  # also a signal that came before the step's process existed
            try:
                return stop()
            except KeyboardInterrupt:
                return RESUMABLE_EXIT
        finally:
            for name in list(claims):
                let_go(name)
    if failed:
        raise DetourError("; ".join(failed.values()) + (f"; not run, as they depend on it: {', '.join(skipped)}"
                                                         if skipped else ""))
    minutes = (time.time() - started_at) / 60
    print(f"study {spec.name}: {len(ran)} steps run, {len(cached)} kept from earlier ({minutes:.1f} min)")
    if (out / "report.html").is_file():
        print(f"report: {out / 'report.html'}  (and {out / 'report.md'})")
    return 0


def print_plan(spec: StudySpec, out: Path, steps: list[Step], options: Options | None = None,
               siblings: list[Path] = ()) -> None:
    from detour.study.estimate import busy_note, estimates
    from detour.study.slurm import job_states
    from detour.study.resources import describe

    state = State(out)
    states = plan(steps, out, state)
    rough = estimates(spec, steps)
    if siblings:  # a prepare another size finished is linked, not run
        from detour.lock import holder
        from detour.study.sizes import PrepareClaim, prepared_elsewhere

        for step in steps:
            if step.kind == "prepare" and states[step.name] != "done":
                key = step_key(step, out, {}, state.content)
                theirs = prepared_elsewhere(step, key, siblings)
                if theirs is not None:
                    rough[step.name] = f"linked from size {theirs.parent.parent.name}"
                elif holder(PrepareClaim(step, key, siblings).folder):
                    rough[step.name] = "another size's driver prepares it now"
    # where each step runs: shown when the study names resources, runs on SLURM or has jobs from before
    placed = options is not None and options.executor == "slurm" or bool(state.jobs) or \
        spec.resources.model_dump(exclude_none=True, exclude_defaults=True) != {}
    live = job_states([j["job_id"] for j in state.jobs.values()]) if state.jobs and shutil.which("squeue") else {}
    print(f"study {spec.name}: {len(steps)} steps into {out}")
    width = max(len(s.name) for s in steps)
    for step in steps:
        after = f"  after {', '.join(step.deps)}" if step.deps and len(step.deps) <= 3 else (
            f"  after {len(step.deps)} steps" if step.deps else "")
        print(f"  {states[step.name]:8s} {step.name:{width}s}  {rough.get(step.name, ''):28s}{after}")
        if placed:
            job = state.jobs.get(step.name)
            where = f"SLURM job {job['job_id']} ({live.get(job['job_id'], job.get('state', '?')).lower()}" \
                    f"{', attempt ' + str(job['attempts']) if job.get('attempts', 1) > 1 else ''}); " if job else ""
            print(f"  {'':8s} {'':{width}s}  {where}{describe(spec.resources.of(step.kind), step.kind)}")
    todo = [s for s in steps if states[s.name] != "done"]
    tokens = sum(s.tokens for s in todo)
    print(f"to run: {len(todo)} of {len(steps)} steps, {tokens:,} training tokens; "
          f"estimates are rough (FLOPs at a measured matmul rate), not promises")
    if todo and (busy := busy_note()):
        print(f"note: {busy}")


def checked_steps(spec: StudySpec, out: Path) -> list[Step]:
    """The study's steps into `out`, once `out` and every input that exists before anything runs
    (recipes, models, data not made by the study) have been checked: a bad one is an error here."""
    if out.exists() and not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / ".study").is_dir():
        raise DetourError(f"--out {out}: a non-empty folder that is not a study folder (no .study inside); "
                          "choose a new or empty folder")
    steps = build_steps(spec, out)
    from detour.train.setup import preflight

    prepared = {str((out / "data" / n).resolve()) for n in spec.prepare}
    for step in steps:  # every arm's inputs that exist before anything runs
        if step.kind == "base":
            preflight(step.recipe, out / BASE, data=not {s.path for s in step.recipe.data.sources} <= prepared)
        if step.kind == "train":
            in_study = {s.path for s in step.recipe.data.sources} <= prepared
            # an arm that starts from the study's base is checked against the base's recipe until it exists
            preflight(step.stand_in or step.recipe, out / "arms" / step.name.split(":", 1)[1], data=not in_study,
                      parent=step.recipe.branch is None or not step.recipe.branch.run.startswith(str(out.resolve())))
    return steps


def run_study(spec: StudySpec, out: Path, dry_run=False, options: Options | None = None, sizes=None,
              siblings: list[Path] = (), study_file: Path | None = None) -> int:
    """Run (or plan) a study into `out`; `siblings`: the other sizes' folders of a study with sizes,
    whose finished prepare steps of the same key are linked rather than run again; `study_file`: the
    file the study was read from, for the drivers of its sizes when they run at once."""
    options = options or Options()
    options.check()
    if options.executor == "slurm":
        check_partitions(spec.resources)
    if spec.sizes is not None or sizes:  # one study per size, then the comparison across them
        from detour.study.sizes import run_sizes
        return run_sizes(spec, out, dry_run,
                         lambda sub, folder, dry, siblings: run_study(sub, folder, dry, options, siblings=siblings),
                         sizes, options, checked_steps, study_file=study_file)
    steps = checked_steps(spec, out)
    if dry_run:
        print_plan(spec, out.resolve(), steps, options, siblings=[Path(s).resolve() for s in siblings])
        return 0
    # One study process per folder; its steps lock their own folders (arms/NAME, eval/TASK), so a
    # rerun cannot start a step whose process from before is still alive.
    with folder_lock(out):
        return execute(spec, out.resolve(), steps, options, siblings=[Path(s).resolve() for s in siblings])


def run(args: argparse.Namespace) -> int:
    return run_study(load_study(args.study), Path(args.out), args.dry_run, executor_options(args), args.size,
                     study_file=Path(args.study))
