"""The sizes of a study at once: one driver process a size, sharing this machine's job slots.

    detour study studies/modernbert-scratch-capacity-20m.yaml --out runs/capacity-20m --jobs 8
    detour study studies/modernbert-scratch-capacity-20m.yaml --out /shared/runs/capacity --executor slurm

With `--jobs N` (N > 1) or `--executor slurm`, a study with several sizes starts one driver per size,
`detour study FILE --out OUT --size SIZE`, as docs/cluster.md runs them by hand, instead of running
the sizes one after another: a size's base (one training, its longest step, on which everything
else of the size waits) no longer holds the other sizes back, and on a cluster every size's jobs
queue at once.

Locally the N slots of `--jobs` are shared out, as `detour.study.executors` cuts the machine: each
driver gets some of the slots (its `--jobs`), the cores of those slots (the driver pinned to them,
their number its thread count) and their GPUs (CUDA_VISIBLE_DEVICES). With more sizes than slots a
size waits, in the study file's order, for the slots a finished size lets go of. On SLURM each
driver gets its share of `--jobs` where one is given (none: the cluster queues them all).

Each driver's lines are shown with its size in front; its steps' logs are in OUT/sizes/SIZE/.study/.
The drivers tokenize each shared corpus once (detour.study.sizes.PrepareClaim). SIGTERM and Ctrl-C
go to every driver, which stops its steps as a study does (exit 75); a size that fails does not stop
the others, and the comparison across sizes is written when every size has finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from detour.stop import RESUMABLE_EXIT, die_with_parent, stop_signals_to
from detour.study.executors import Options, slices, visible_gpus


def at_once(options: Options, sizes: list[str]) -> bool:
    """Whether these sizes run at once: several of them, and slots to share or a cluster to queue on."""
    return len(sizes) > 1 and (options.executor == "slurm" or (options.jobs or 1) > 1)


def _share(slots: int, sizes: int) -> int:
    """A starting size's slots: those left, cut evenly over the sizes still to start (at least one)."""
    return max(1, slots // sizes)


def shares(options: Options, sizes: list[str]) -> dict[str, int | None]:
    """Each size's --jobs when all start together: the slots cut as evenly as they go, the later
    sizes (the larger ones, in a study file that lists them smallest first) the bigger shares.
    Locally with fewer slots than sizes, the sizes past the slots wait (not in the result)."""
    total = options.jobs
    if total is None:  # SLURM without a limit
        return {size: None for size in sizes}
    starting = sizes[:total] if options.executor == "local" else sizes
    out, left = {}, total
    for i, size in enumerate(starting):
        out[size] = _share(left, len(starting) - i)
        left -= out[size]
    return out


def describe(options: Options, sizes: list[str]) -> str:
    """The dry run's line on how the sizes will run."""
    given = shares(options, sizes)
    parts = [f"{size} with --jobs {n}" if n is not None else size for size, n in given.items()]
    waiting = [s for s in sizes if s not in given]
    return (f"the sizes run at once, a driver each ({', '.join(parts)}"
            + (f"; then {', '.join(waiting)} as slots free up" if waiting else "") + ")")


class _Driver:
    def __init__(self, size: str, proc: subprocess.Popen, slots: list[int], pump: threading.Thread):
        self.size, self.proc, self.slots, self.pump = size, proc, slots, pump


def run_sizes_at_once(study_file: Path, out: Path, options: Options, sizes: list[str]) -> int:
    """Run the sizes' drivers side by side until all have ended; 0 if every size finished, 75 if
    any was stopped (a rerun continues), else the exit status of a size that failed."""
    out = Path(out).resolve()
    local = options.executor == "local"
    slots = options.jobs or len(sizes)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpu_slices = slices(cores, slots) if local else None
    gpus = visible_gpus() if local else []
    gpu_slices = slices(gpus, slots) if gpus else None
    free = list(range(slots))
    waiting, running, ended = list(sizes), [], {}
    printing = threading.Lock()
    signalled = []

    def say(line: str) -> None:
        with printing:
            sys.stdout.write(line)
            sys.stdout.flush()

    def pump(size: str, stream) -> None:
        for line in stream:
            say(f"[{size}] {line}")

    def start(size: str, n: int | None) -> None:
        mine = [free.pop(0) for _ in range(n or 0)] if local else []
        argv = [sys.executable, "-m", "detour.cli", "study", str(study_file), "--out", str(out), "--size", size,
                "--executor", options.executor]
        if n is not None:
            argv += ["--jobs", str(n)]
        if options.cancel_on_exit:
            argv.append("--cancel-on-exit")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        pinned = sorted({c for s in mine for c in cpu_slices[s]}) if cpu_slices else []
        if pinned:
            env.update(OMP_NUM_THREADS=str(len(pinned)), MKL_NUM_THREADS=str(len(pinned)))
        if gpu_slices is not None and mine:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(g for s in mine for g in gpu_slices[s]))

        def preexec(parent=os.getpid(), cores=tuple(pinned)):
            die_with_parent(parent)
            if cores:
                os.sched_setaffinity(0, cores)

        where = f" on {len(pinned)} core{'s' if len(pinned) != 1 else ''}" if pinned else ""
        say(f"== size {size}: a driver of its own{f' with --jobs {n}' if n is not None else ''}{where} "
            f"(its steps' logs: {out / 'sizes' / size / '.study' / 'logs'})\n")
        # its own session: a Ctrl-C on the terminal reaches this process, which passes it on once
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, start_new_session=True, preexec_fn=preexec)
        thread = threading.Thread(target=pump, args=(size, proc.stdout), daemon=True)
        thread.start()
        running.append(_Driver(size, proc, mine, thread))
        if signalled:  # the stop came while this driver was being started, after it was passed on
            proc.send_signal(signalled[0])

    def handler(signum, _frame):
        signalled.append(signum)
        for driver in running:
            if driver.proc.poll() is None:
                driver.proc.send_signal(signum)  # each stops its steps, which save what they can

    with stop_signals_to(handler):
        first = shares(options, sizes)
        for size in list(waiting):
            if size in first and not signalled:
                waiting.remove(size)
                start(size, first[size])
        while running:
            time.sleep(0.2)
            for driver in [d for d in running if d.proc.poll() is not None]:
                driver.pump.join()
                running.remove(driver)
                free.extend(driver.slots)
                rc = driver.proc.returncode
                if signalled and -rc in (signal.SIGTERM, signal.SIGINT):  # our stop reached it before its handler
                    rc = RESUMABLE_EXIT
                ended[driver.size] = rc
                how = "finished" if rc == 0 else "stopped" if rc == RESUMABLE_EXIT else f"failed (exit {rc})"
                say(f"== size {driver.size}: {how}\n")
            while waiting and free and not signalled:
                start(waiting[0], _share(len(free), len(waiting)))  # the slots let go of, over the sizes waiting
                waiting.pop(0)
    failed = {s: rc for s, rc in ended.items() if rc not in (0, RESUMABLE_EXIT)}
    for size, rc in failed.items():
        print(f"detour study: size {size} did not finish (exit {rc}); its output is above and its steps' logs in "
              f"{out / 'sizes' / size / '.study' / 'logs'}", file=sys.stderr)
    stopped = [s for s, rc in ended.items() if rc == RESUMABLE_EXIT]
    if failed or stopped or waiting:
        print(f"detour study: {'stopped' if signalled else 'not finished'}"
              + (f" (size {', '.join(stopped)} stopped)" if stopped else "")
              + (f"; not started: {', '.join(waiting)}" if waiting else "")
              + "; run the same command again to continue (finished steps are kept)", file=sys.stderr)
    if failed:
        rc = next(iter(failed.values()))
        return rc if rc > 0 else 1  # a driver killed by a signal: a failure, not a negative exit status
    return RESUMABLE_EXIT if stopped or waiting else 0
