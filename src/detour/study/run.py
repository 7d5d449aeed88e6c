"""`detour study`: a whole matched study from one file, as cached steps, ending in a report.

    detour study studies/tiny.yaml --out runs/study-tiny --dry-run   # the graph, each step's state, estimates
    detour study studies/tiny.yaml --out runs/study-tiny             # run (or continue) it

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
from detour.io import write_json, write_text
from detour.lock import folder_lock
from detour.stop import RESUMABLE_EXIT, die_with_parent, stop_signals_to
from detour.study.graph import BASE, SYNTHETIC_TASK, Step, build_steps, output_hash, step_key
from detour.study.hashes import ContentHashes
from detour.study.spec import StudySpec, load_study
from detour.runs import TWINS_FILE, RunFolder

STATE_SCHEMA = "detour.study-state/1"
DESIGN_SCHEMA = "detour.study/1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="the study file (YAML; see docs/study.md and studies/)")
    parser.add_argument("--out", required=True, help="the study folder (created; rerun with the same --out to continue)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, their state and estimates; run nothing")


# ---- state ----

class State:
    """OUT/.study/state.json (what finished, with which key) and OUT/.study/log.jsonl (every event)."""

    def __init__(self, out: Path):
        self.dir = out / ".study"
        self.path = self.dir / "state.json"
        data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.steps: dict[str, dict] = data.get("steps", {})
        self.started: dict[str, str] = data.get("started", {})
        self.content = ContentHashes(self.dir / "hashes.json")

    def save(self) -> None:
        write_json(self.path, {"schema": STATE_SCHEMA, "steps": self.steps, "started": self.started})
        self.content.save()

    def event(self, step: str, event: str, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        line = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "step": step, "event": event, **fields}
        with open(self.dir / "log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")


def plan(steps: list[Step], out: Path, state: State) -> dict[str, str]:
    """Each step's state: done, to run, stale (finished before, inputs changed) or resume (half done)."""
    hashes, states = {}, {}
    for step in steps:
        record = state.steps.get(step.name)
        if any(d not in hashes for d in step.deps):
            states[step.name] = "stale" if record else "to run"  # its inputs are not there yet
            continue
        key = step_key(step, out, hashes, state.content)
        if record and record["key"] == key and all(p.exists() for p in step.outputs):
            states[step.name] = "done"
            hashes[step.name] = record["output_hash"]
        elif record:
            states[step.name] = "stale"
        else:
            states[step.name] = "resume" if state.started.get(step.name) == key else "to run"
    return states


# ---- the design, for the report ----

def describe_arm(spec: StudySpec, name: str, recipe) -> dict:
    phases = ", then ".join(f"{p.name} {p.objective.upper()}" + (f" {p.mask_rate:.0%}" if p.mask_rate else "")
                            + f" {p.tokens:,} tokens" + (f" (layers {p.freeze.layers} frozen)" if p.freeze and p.freeze.layers else "")
                            for p in recipe.phases)
    if name == "detour":
        role, text = "detour", f"the recipe as written: {phases}"
    elif name == "baseline":
        role, text = "baseline", f"the matched MLM twin (every CLM phase replaced by MLM at {recipe.baseline_mask_rate:.0%}): {phases}"
    else:
        arm = spec.arms[name]
        role = "arm"
        text = arm.description or f"the {arm.base} with " + ", ".join(
            ([f"freeze {arm.freeze}"] if arm.freeze else []) + arm.set) + f": {phases}"
    out = {"role": role, "description": text, "seed": recipe.seed}
    if name in spec.arms and spec.arms[name].against:
        out["against"] = spec.arms[name].against  # the report compares this arm with that one
    if recipe.branch is not None:
        out["branched_from"] = {"arm": Path(recipe.branch.run).name, "after_phase": recipe.branch.after_phase}
    return out


def describe_base(recipe) -> dict:
    """The study's own base encoder, as the report and the capacity comparison describe it."""
    model = recipe.model
    start = f"a {model.config.get('model_type')} built from model.config (random initial weights)" \
        if model.config is not None else f"`{model.source}`"
    phases = ", then ".join(f"{p.name} MLM {p.mask_rate:.0%} {p.tokens:,} tokens" for p in recipe.phases)
    return {"description": f"pretrained by the study from {start}: {phases}", "config": model.config,
            "tokens": sum(p.tokens for p in recipe.phases), "seed": recipe.seed}


def is_synthetic(spec: StudySpec, recipes: dict) -> bool:
    """Synthetic pretraining text or a synthetic task anywhere in the study."""
    sources = [s for p in spec.prepare.values() for s in p.sources]
    if any(s.startswith("synthetic:") for s in sources) or (spec.eval and spec.eval.synthetic_ner):
        return True
    for recipe in recipes.values():
        for source in recipe.data.sources:
            manifest = Path(source.path) / "manifest.json"
            if manifest.is_file() and json.loads(manifest.read_text()).get("synthetic"):
                return True
    return False


def write_design(spec: StudySpec, out: Path, steps: list[Step]) -> None:
    recipes = {s.name.split(":", 1)[1]: s.recipe for s in steps if s.kind == "train"}
    design = {
        "schema": DESIGN_SCHEMA,
        "name": spec.name,
        "description": spec.description,
        "synthetic_data": is_synthetic(spec, recipes),
        "arms": {name: describe_arm(spec, name, r) for name, r in recipes.items()},
        "eval": None if spec.eval is None else {
            "tasks": ([SYNTHETIC_TASK] if spec.eval.synthetic_ner else []) + [Path(t).stem for t in spec.eval.tasks],
            "seeds": spec.eval.seeds,
            "arms": spec.eval.arms or list(recipes),
            "options": spec.eval.model_dump(exclude={"tasks", "arms", "seeds"}, exclude_none=True),
        },
        "analyses": spec.analyses.model_dump(exclude_none=True),
        "steps": [s.name for s in steps],
    }
    base = next((s for s in steps if s.kind == "base"), None)
    if base is not None:
        design["base"] = describe_base(base.recipe)
    write_json(out / "study.json", design)
    if base is not None:
        recipes = {BASE: base.recipe, **recipes}
    for name, recipe in recipes.items():
        from detour.config import recipe_to_dict

        path = out / ".study" / "recipes" / f"{name}.json"
        text = json.dumps(recipe_to_dict(recipe), indent=2) + "\n"
        if not path.is_file() or path.read_text() != text:
            write_text(path, text)


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
    elif step.kind == "report":
        from detour.report.render import write_report

        written = write_report(out)
        print(f"  wrote {written['markdown']} and {written['html']}")


def execute(spec: StudySpec, out: Path, steps: list[Step]) -> int:
    state = State(out)
    write_design(spec, out, steps)
    child = _Child()
    hashes: dict[str, str] = {}
    ran, cached, started_at = [], [], time.time()
    running = None  # the step started and not finished: a stop is recorded on it
    with stop_signals_to(child.handler):  # a stop goes to the running step's process
        try:
            for i, step in enumerate(steps, 1):
                key = step_key(step, out, hashes, state.content)
                record = state.steps.get(step.name)
                if record and record["key"] == key and all(p.exists() for p in step.outputs):
                    hashes[step.name] = record["output_hash"]
                    cached.append(step.name)
                    print(f"[{i}/{len(steps)}] {step.name}: done earlier, kept", flush=True)
                    continue
                print(f"[{i}/{len(steps)}] {step.name}: {'rerun, its inputs changed' if record else 'run'}", flush=True)
                if record or state.started.get(step.name, key) != key:
                    clear_stale(step, out)
                    state.steps.pop(step.name, None)
                state.started[step.name] = key
                state.save()
                state.event(step.name, "start", key=key)
                running = step.name
                t0 = time.time()
                if step.argv is not None:
                    rc = run_command(step.argv, state.dir / "logs" / f"{step.name.replace(':', '-')}.log", child)
                else:
                    _act(step, spec, out)
                    rc = 0
                if child.signalled or rc == RESUMABLE_EXIT:
                    state.event(step.name, "stopped", rc=rc)
                    print(f"detour study: stopped during {step.name}; run the same command again to continue "
                          f"(finished steps are kept)", file=sys.stderr)
                    return RESUMABLE_EXIT
                if rc != 0:
                    state.event(step.name, "failed", rc=rc)
                    raise DetourError(f"step {step.name} failed (exit {rc}); its output is in "
                                      f"{state.dir / 'logs' / (step.name.replace(':', '-') + '.log')}")
                hashes[step.name] = output_hash(step.hash_of, state.content)
                state.steps[step.name] = {"key": key, "output_hash": hashes[step.name],
                                          "seconds": round(time.time() - t0, 1),
                                          "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                state.started.pop(step.name, None)
                state.save()
                state.event(step.name, "done", seconds=round(time.time() - t0, 1))
                running = None
                ran.append(step.name)
        except KeyboardInterrupt:  # also a signal that came before the step's process existed
            if running is not None:
                state.event(running, "stopped", rc=RESUMABLE_EXIT)
            print("detour study: stopped; run the same command again to continue", file=sys.stderr)
            return RESUMABLE_EXIT
    minutes = (time.time() - started_at) / 60
    print(f"study {spec.name}: {len(ran)} steps run, {len(cached)} kept from earlier ({minutes:.1f} min)")
    if (out / "report.html").is_file():
        print(f"report: {out / 'report.html'}  (and {out / 'report.md'})")
    return 0


def print_plan(spec: StudySpec, out: Path, steps: list[Step]) -> None:
    from detour.study.estimate import estimates

    states = plan(steps, out, State(out))
    rough = estimates(spec, steps)
    print(f"study {spec.name}: {len(steps)} steps into {out}")
    width = max(len(s.name) for s in steps)
    for step in steps:
        after = f"  after {', '.join(step.deps)}" if step.deps and len(step.deps) <= 3 else (
            f"  after {len(step.deps)} steps" if step.deps else "")
        print(f"  {states[step.name]:8s} {step.name:{width}s}  {rough.get(step.name, ''):28s}{after}")
    todo = [s for s in steps if states[s.name] != "done"]
    tokens = sum(s.tokens for s in todo)
    print(f"to run: {len(todo)} of {len(steps)} steps, {tokens:,} training tokens; "
          f"estimates are rough (FLOPs at a measured matmul rate), not promises")


def run_study(spec: StudySpec, out: Path, dry_run: bool = False) -> int:
    if spec.sizes is not None:  # one study per size, then the comparison across them
        from detour.study.sizes import run_sizes

        return run_sizes(spec, out, dry_run, run_study)
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
    if dry_run:
        print_plan(spec, out.resolve(), steps)
        return 0
    # One study process per folder; its steps lock their own folders (arms/NAME, eval/TASK), so a
    # rerun cannot start a step whose process from before is still alive.
    with folder_lock(out):
        return execute(spec, out.resolve(), steps)


def run(args: argparse.Namespace) -> int:
    return run_study(load_study(args.study), Path(args.out), args.dry_run)
