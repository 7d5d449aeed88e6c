"""One way to stop: the resumable exit code and the SIGTERM / SIGINT handling of train, eval and study.

    python -c "from detour.stop import RESUMABLE_EXIT, StopFlag, stop_signals_to; \
f = StopFlag(); exec('with stop_signals_to(f): import os, signal; os.kill(os.getpid(), signal.SIGTERM)'); \
print(f.signum, RESUMABLE_EXIT)"

A scheduler's SIGTERM (SLURM before the wall time, a preemption) and Ctrl-C both mean "save and
stop": `detour train` finishes its step and saves a checkpoint, `detour eval` stops at once
unless results are being written, `detour study` passes the signal to its running step. Each
then exits with RESUMABLE_EXIT (75, EX_TEMPFAIL): rerunning the same command continues, and a
batch script can requeue on exactly that code.
"""

from __future__ import annotations

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
