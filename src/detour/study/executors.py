"""Where a study's steps run: on this machine, several at once, or each as a SLURM job.

    detour study studies/tiny.yaml --out runs/study-tiny --jobs 2                  # two steps at a time here
    detour study studies/modernbert-base-en.yaml --out runs/base-en --executor slurm   # one SLURM job a step

The study (detour.study.run) keeps the order: a step starts once every step it depends on is done,
and its key, cache and state records are the same whichever executor runs it. An executor only
starts a step's command and says how it ended: done (exit 0), failed (another exit) or stopped
(a SIGTERM / preemption / time limit: the step saved what it could and the rerun continues it).

- `local`, `--jobs 1`: one step at a time in the study's own terminal, exactly as before executors
  existed (the study's run_command).
- `local`, `--jobs N`: up to N steps at once. The machine is cut into N slices: one GPU each
  (CUDA_VISIBLE_DEVICES) where GPUs exist, and a slice of the CPU cores this process may use, with
  the step pinned to them and its thread count set to their number (OMP_NUM_THREADS,
  MKL_NUM_THREADS, and `detour eval --threads`). Each step's output goes to its log file only.
- `slurm`: each step is one job submitted with submitit; a training step of several tasks is one
  job whose tasks are the torch.distributed ranks. Job ids live in OUT/.study/state.json (`jobs`),
  so a study whose driver died reattaches to its jobs instead of submitting them again.

A training step whose resources ask for several tasks runs under torchrun locally, and as that
many SLURM tasks on the cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from detour.errors import DetourError
from detour.stop import RESUMABLE_EXIT, die_with_parent
from detour.study.resources import MAX_RESUBMITS, Resources, StepResources
from detour.study.slurm import job_states, slurm_task

EXECUTORS = ("local", "slurm")
THREADED_VERBS = ("eval",)  # the verbs with a --threads flag; the others read OMP_NUM_THREADS
TRAINING = ("train", "base")
SIGNAL_GRACE_S = 120  # SIGTERM this long before the time limit: a step plus a checkpoint write
# the job may still run (or run again); the study's jobs are submitted --no-requeue, so PREEMPTED is an end
# UNKNOWN: squeue did not answer; a job is never taken for ended (and submitted again) on a silent squeue
ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD",
         "REQUEUE_FED", "STAGE_OUT", "SIGNALING", "UNKNOWN")
RC_GRACE_S = 30  # a job ended without its exit file: wait this long for a shared filesystem to show it


@dataclass
class Options:
    """How the study runs its steps (the command line's --executor, --jobs, --cancel-on-exit)."""

    executor: str = "local"
    jobs: int | None = None  # None: 1 locally, no limit on SLURM (the cluster queues them)
    cancel_on_exit: bool = False

    def check(self) -> None:
        """Refuse a bad combination before anything runs, in one line."""
        if self.executor not in EXECUTORS:
            raise DetourError(f"--executor {self.executor}: expected one of {', '.join(EXECUTORS)}")
        if self.jobs is not None and self.jobs < 1:
            raise DetourError(f"--jobs {self.jobs}: give how many steps may run at once, 1 or more")
        if self.cancel_on_exit and self.executor != "slurm":
            raise DetourError("--cancel-on-exit: only with --executor slurm (a local study stops its steps itself)")
        if self.executor == "slurm":
            for tool in ("sbatch", "srun", "squeue", "scancel"):
                if shutil.which(tool) is None:
                    raise DetourError(f"--executor slurm: no {tool} on PATH; run the study where SLURM's commands "
                                      "are (a login node), or use --executor local")


@dataclass
class Outcome:
    name: str
    status: str  # done, failed, stopped
    rc: int
    detail: str = ""  # for a failure: where to look (job id, log)


def log_path(state_dir: Path, step_name: str) -> Path:
    return state_dir / "logs" / f"{step_name.replace(':', '-')}.log"


def _command(step, res: StepResources) -> list[str]:
    """The process to start for a step: detour itself, or torchrun for a training of several tasks (through
    detour.study.torchrun, which exits 75 when the ranks were stopped, so the step resumes on a rerun)."""
    tasks = res.tasks or 1
    if step.kind in TRAINING and tasks > 1:
        return [sys.executable, "-m", "detour.study.torchrun", "--standalone", "--nproc-per-node", str(tasks),
                "-m", "detour.cli", *step.argv]
    return [sys.executable, "-m", "detour.cli", *step.argv]


# ---- local ----

def slices(items: list, n: int) -> list[list]:
    """`items` cut into n nearly equal consecutive slices; with fewer items than slices, they are shared."""
    if not items:
        return [[] for _ in range(n)]
    if len(items) >= n:
        return [items[i * len(items) // n:(i + 1) * len(items) // n] for i in range(n)]
    return [[items[i % len(items)]] for i in range(n)]


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES names them."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [g for g in named.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no usable torch CUDA: a CPU machine
        return []


class _Running:
    def __init__(self, proc: subprocess.Popen, slot: int, log: Path):
        self.proc, self.slot, self.log = proc, slot, log


class LocalExecutor:
    """Steps as child processes of the study: one in the foreground (--jobs 1), or up to N at once."""

    def __init__(self, jobs: int, resources: Resources, sequential, child):
        self.capacity = jobs
        self.resources = resources
        self.sequential = sequential  # run_command(argv, log_path, child): the one-at-a-time path
        self.child = child
        self.signalled = 0
        self.in_action = False
        self.running: dict[str, _Running] = {}
        self.finished: queue.Queue = queue.Queue()
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        gpus = visible_gpus() if jobs > 1 else []  # one at a time: the step sees the machine as before
        self.cpu_slices = slices(cores, jobs)
        self.gpu_slices = slices(gpus, jobs) if gpus else None
        self.free = list(range(jobs))

    @property
    def foreground(self) -> bool:
        return self.capacity == 1

    def handler(self, signum, frame):
        self.signalled = signum
        if self.foreground and not self.running:  # the one-at-a-time path: run_command's own child
            return self.child.handler(signum, frame)
        alive = [r.proc for r in self.running.values() if r.proc.poll() is None]
        for proc in alive:
            proc.send_signal(signum)  # each saves what it can and exits 75
        if not alive or self.in_action:
            raise KeyboardInterrupt

    def adopt(self, step, key) -> bool:
        return False  # a local step's process died with the study before it; it starts again

    def holds(self, name: str) -> bool:
        """Whether the step has a process of this executor's to wait for (the one-at-a-time path has none)."""
        return name in self.running

    def start(self, step, key, log: Path) -> Outcome | None:
        res = self.resources.of(step.kind)
        if self.foreground and (res.tasks or 1) == 1:
            rc = self.sequential(step.argv, log, self.child)
            if self.child.signalled or rc == RESUMABLE_EXIT:
                return Outcome(step.name, "stopped", rc)
            return Outcome(step.name, "done" if rc == 0 else "failed", rc)
        slot = self.free.pop(0)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        argv = list(step.argv)
        cpus = self.cpu_slices[slot] if not self.foreground else []
        if cpus:
            # the slice's cores shared by the step's processes: more threads than cores only spin
            threads = str(max(1, len(cpus) // (res.tasks or 1)))
            env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
            if argv[0] in THREADED_VERBS:
                argv += ["--threads", threads]
        if self.gpu_slices is not None and not self.foreground:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_slices[slot])
        command = _command(dataclasses.replace(step, argv=argv), res)
        log.parent.mkdir(parents=True, exist_ok=True)
        shown = shlex.join(command[command.index("detour.cli") + 1:])
        if self.foreground:
            print(f"  $ {'torchrun --nproc-per-node ' + str(res.tasks) + ' ' if (res.tasks or 1) > 1 else ''}"
                  f"detour {shown}", flush=True)
        with open(log, "a") as fh:
            fh.write(f"$ detour {shown}\n")

        def preexec(parent=os.getpid(), cores=tuple(cpus)):
            die_with_parent(parent)
            if cores:
                os.sched_setaffinity(0, cores)

        # its own session: Ctrl-C on the terminal reaches the study, which passes it on once
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, start_new_session=True, preexec_fn=preexec)
        self.running[step.name] = _Running(proc, slot, log)
        if self.signalled:  # the stop came while this process was being started, after it was passed on
            proc.send_signal(self.signalled)
        threading.Thread(target=self._pump, args=(step.name, proc, log), daemon=True).start()
        return None

    def _pump(self, name: str, proc: subprocess.Popen, log: Path) -> None:
        with open(log, "a") as fh:
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                if self.foreground:  # one step at a time: its lines on the console, as always
                    sys.stdout.write("    " + line)
                    sys.stdout.flush()
        self.finished.put((name, proc.wait()))

    def wait(self, timeout: float) -> list[Outcome]:
        outcomes = []
        try:
            items = [self.finished.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self.finished.get_nowait())
            except queue.Empty:
                break
        for name, rc in items:
            run = self.running.pop(name)
            self.free.append(run.slot)
            self.free.sort()
            if self.signalled or rc == RESUMABLE_EXIT:
                outcomes.append(Outcome(name, "stopped", rc))
            else:
                outcomes.append(Outcome(name, "done" if rc == 0 else "failed", rc, f"its output is in {run.log}"))
        return outcomes

    def stop_all(self, signum: int = signal.SIGTERM) -> None:
        for run in self.running.values():
            if run.proc.poll() is None:
                run.proc.send_signal(signum)

    def leave(self) -> str:
        return ""


# ---- SLURM ----

class SlurmExecutor:
    """Each step one SLURM job (submitit), its id kept in the study's state so a rerun reattaches."""

    POLL_S = 2.0

    def __init__(self, out: Path, state, resources: Resources, jobs: int | None, cancel_on_exit: bool, study: str):
        self.out, self.state, self.resources, self.study = out, state, resources, study
        self.capacity = jobs or 1_000_000  # the cluster queues what it cannot run yet
        self.cancel_on_exit = cancel_on_exit
        self.signalled = 0
        self.in_action = False
        self.running: dict[str, dict] = {}  # step name -> {"job_id", "step", "key", "log"}
        self.foreground = False
        self._next_poll = 0.0

    def handler(self, signum, _frame):
        self.signalled = signum  # the jobs belong to the cluster; the loop decides what to tell it
        if self.in_action:
            raise KeyboardInterrupt

    def _folder(self, name: str) -> Path:
        return self.state.dir / "jobs" / name.replace(":", "-")

    def _rc(self, name: str, job_id: str) -> int | None:
        path = self._folder(name) / f"{job_id}.rc.json"
        try:
            return int(json.loads(path.read_text())["rc"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def adopt(self, step, key) -> bool:
        """A job of this step from an earlier run of the study: still queued or running, or finished
        while no study watched it. True when it is taken over (nothing is submitted)."""
        record = self.state.jobs.get(step.name)
        if not record or record.get("state") in ("failed", "cancelled"):
            return False
        if record.get("state") == "done" and (record["key"] != key or not all(p.exists() for p in step.outputs)):
            return False  # its outputs are gone or of other inputs: run it again
        job_id = record["job_id"]
        alive = job_states([job_id])[job_id] in ALIVE
        if record["key"] != key:
            if alive:  # a job of the step's old inputs: it would write into the folder being replaced
                print(f"  cancelling SLURM job {job_id} of {step.name}: its inputs changed", flush=True)
                subprocess.run(["scancel", job_id], check=False)
                for _ in range(150):
                    if job_states([job_id])[job_id] not in ALIVE:
                        break
                    time.sleep(2)
            return False
        log = log_path(self.state.dir, step.name)
        self.running[step.name] = {"job_id": job_id, "step": step, "key": key, "log": log}
        print(f"  SLURM job {job_id} of {step.name} " + ("still " + job_states([job_id])[job_id].lower() +
                                                         ", reattached" if alive else "ended while the study was away"),
              flush=True)
        self.state.event(step.name, "reattached", job_id=job_id)
        return True

    def holds(self, name: str) -> bool:
        """Whether the step has a SLURM job of this study's."""
        return name in self.running

    def _max(self, step) -> int:
        res = self.resources.of(step.kind)
        return MAX_RESUBMITS if res.max_resubmits is None else res.max_resubmits

    def _submit(self, step, key, log: Path, attempts: int) -> str:
        import submitit

        res = self.resources.of(step.kind)
        folder = self._folder(step.name)
        folder.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        tasks = (res.tasks or 1) if step.kind in TRAINING else 1
        nodes = (res.nodes or 1) if step.kind in TRAINING else 1
        # SIGTERM, not submitit's USR2, before the time limit: detour's steps save and exit 75 on it; and no
        # requeue by SLURM itself, so that only the study resubmits a stopped step (and counts it)
        extra = {"signal": f"TERM@{SIGNAL_GRACE_S}", "no_requeue": True, **res.sbatch_extra()}
        parameters = dict(job_name=f"detour-{self.study}-{step.name.replace(':', '-')}", nodes=nodes,
                          ntasks_per_node=tasks, stderr_to_stdout=True, additional_parameters=extra)
        for name, value in (("cpus_per_task", res.cpus_per_task), ("gpus_per_node", res.gpus_per_node),
                            ("time", res.minutes()), ("partition", res.partition), ("account", res.account),
                            ("qos", res.qos)):
            if value is not None:
                parameters[name] = value
        # no time given: the partition's own limit, not submitit's default of 5 minutes (None is left out)
        parameters.setdefault("time", None)
        executor.update_parameters(**parameters)
        argv = list(step.argv)
        if argv[0] in THREADED_VERBS and res.cpus_per_task:
            argv += ["--threads", str(res.cpus_per_task)]
        try:
            job = executor.submit(slurm_task, argv, str(log), str(folder))
        except Exception as exc:  # sbatch's own message (a bad option, a partition it refuses)
            raise DetourError(f"step {step.name}: sbatch refused the job: {str(exc).strip().splitlines()[-1]}") from None
        return job.job_id

    def start(self, step, key, log: Path) -> Outcome | None:
        record = self.state.jobs.get(step.name)
        # a job stopped by the cluster counts towards max_resubmits; a fresh start (new inputs, a rerun after a
        # failure or a --cancel-on-exit) counts from 1
        attempts = 1 + (record["attempts"] if record and record.get("key") == key
                        and record.get("state") not in ("done", "failed", "cancelled") else 0)
        log.parent.mkdir(parents=True, exist_ok=True)
        job_id = self._submit(step, key, log, attempts)
        self._record(step.name, job_id, key, attempts)
        self.running[step.name] = {"job_id": job_id, "step": step, "key": key, "log": log}
        print(f"  {step.name}: SLURM job {job_id}" + (f" (attempt {attempts})" if attempts > 1 else ""), flush=True)
        return None

    def _record(self, name: str, job_id: str, key: str, attempts: int, state: str = "submitted") -> None:
        self.state.jobs[name] = {"job_id": job_id, "key": key, "attempts": attempts, "state": state,
                                 "submitted": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.state.save()
        self.state.event(name, "submitted", job_id=job_id, attempt=attempts)

    def wait(self, timeout: float) -> list[Outcome]:
        deadline = time.time() + timeout
        while True:
            outcomes = self._poll()
            if outcomes or time.time() >= deadline or self.signalled:
                return outcomes
            time.sleep(min(0.5, max(0.0, deadline - time.time())))

    def _poll(self) -> list[Outcome]:
        if not self.running or time.time() < self._next_poll:
            return []
        self._next_poll = time.time() + self.POLL_S
        ids = {name: run["job_id"] for name, run in self.running.items()}
        states = job_states(list(ids.values()))
        outcomes = []
        for name, job_id in ids.items():
            state = states[job_id]
            if state in ALIVE:
                continue
            rc = self._rc(name, job_id)
            if rc is None and time.time() < self.running[name].setdefault("ended_at", time.time()) + RC_GRACE_S:
                continue
            run = self.running.pop(name)
            outcome = self._ended(run, state, rc)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes

    def _ended(self, run: dict, state: str, rc: int | None) -> Outcome | None:
        name, job_id, step = run["step"].name, run["job_id"], run["step"]
        record = self.state.jobs.get(name, {})
        self._copy_job_log(name, job_id, run["log"])
        if rc == 0:
            record["state"] = "done"
            self.state.save()
            return Outcome(name, "done", 0)
        # stopped by the cluster: the step's SIGTERM exit, or no exit status at all (cancelled, preempted,
        # timed out, its node lost); a training resumes from its checkpoint (--resume)
        if rc == RESUMABLE_EXIT or rc is None:
            attempts = record.get("attempts", 1)
            why = f"SLURM job {job_id} ended {state.lower()}" + (" (the step exited 75)" if rc is not None else "")
            if attempts <= self._max(step):
                self.state.event(name, "resubmit", job_id=job_id, state=state)
                print(f"  {name}: {why}; submitting it again to continue", flush=True)
                new_id = self._submit(step, run["key"], run["log"], attempts + 1)
                self._record(name, new_id, run["key"], attempts + 1)
                self.running[name] = {**run, "job_id": new_id}
                print(f"  {name}: SLURM job {new_id} (attempt {attempts + 1})", flush=True)
                return None
            record["state"] = "failed"
            self.state.save()
            return Outcome(name, "failed", rc if rc is not None else 1,
                           f"{why} {attempts} times (resources max_resubmits {self._max(step)}); "
                           f"its output is in {run['log']}")
        record["state"] = "failed"
        self.state.save()
        return Outcome(name, "failed", rc, f"SLURM job {job_id}; its output is in {run['log']}")

    def _copy_job_log(self, name: str, job_id: str, log: Path) -> None:
        """submitit's own output of the job (a start-up failure, SLURM's messages) appended to the step's log."""
        folder = self._folder(name)
        for path in sorted(folder.glob(f"{job_id}_*_log.*")):
            text = path.read_text(errors="replace").strip()
            if text:
                with open(log, "a") as fh:
                    fh.write(f"--- SLURM job {job_id}, {path.name} ---\n{text}\n")

    def stop_all(self, signum: int = signal.SIGTERM) -> None:
        for run in self.running.values():
            subprocess.run(["scancel", "--signal", "TERM", run["job_id"]], check=False)

    def leave(self) -> str:
        """What becomes of the jobs when the study stops: left to the cluster, or cancelled."""
        if not self.running:
            return ""
        jobs = ", ".join(f"{n} (job {r['job_id']})" for n, r in self.running.items())
        if self.cancel_on_exit:
            subprocess.run(["scancel", *[r["job_id"] for r in self.running.values()]], check=False)
            for name in self.running:
                self.state.jobs[name]["state"] = "cancelled"
            self.state.save()
            return f"cancelled the SLURM jobs of {jobs} (--cancel-on-exit)"
        return (f"left the SLURM jobs of {jobs} to the cluster; run the same command again to reattach to them "
                "(or scancel them)")


def make_executor(options: Options, out: Path, state, resources: Resources, study: str, sequential, child):
    if options.executor == "slurm":
        return SlurmExecutor(out, state, resources, options.jobs, options.cancel_on_exit, study)
    return LocalExecutor(options.jobs or 1, resources, sequential, child)
