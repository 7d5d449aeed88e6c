"""One way to stop: the resumable exit code and the SIGTERM / SIGINT handling of train, eval and study.

    python -c "from detour.stop import RESUMABLE_EXIT, StopFlag, stop_signals_to; \
f = StopFlag(); exec('with stop_signals_to(f): import os, signal; os.kill(os.getpid(), signal.SIGTERM)'); \
print(f.signum, RESUMABLE_EXIT)"

A scheduler's SIGTERM (SLURM before the wall time, a preemption) and Ctrl-C both mean "save and
stop": `detour train` finishes its step and saves a checkpoint, `detour eval` stops at once
unless results are being written, `detour study` passes the signal to its running step. Each
then exits with RESUMABLE_EXIT (75, EX_TEMPFAIL): rerunning the same command continues, and a
batch script can requeue on exactly that code.

A kill -9 cannot be passed on, so the processes a command starts (the study's steps, prepare's
tokenizer workers) ask the kernel to kill them when their parent dies (`die_with_parent`).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Callable

RESUMABLE_EXIT = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopFlag:
    """A handler that only records the signal: the caller checks `signum` where stopping is safe."""

    def __init__(self):
        self.signum = 0

    def __call__(self, signum, _frame):
        self.signum = signum


@contextmanager
def stop_signals_to(handler: Callable):
    """SIGTERM and SIGINT go to `handler` inside the block; the previous handlers come back after it.

    Off the main thread Python cannot take signals, and the block runs with the handlers unchanged.
    """
    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:
            pass
    try:
        yield handler
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In a child process (before it execs, or as a worker starts): die at once (SIGKILL) when the
    parent dies, however it dies.

    SIGKILL, not SIGTERM: a parent killed with -9 means its job is gone, and a child that went on
    saving a checkpoint would still hold its folder while the rerun starts. Every command survives
    a kill -9 by design (atomic checkpoints and results), so only the unsaved part is lost. If the
    parent died before prctl took effect the child exits at once.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return  # not Linux: the folder locks still keep a rerun from racing a survivor
    if os.getppid() != parent:
        os._exit(1)
