"""The CPU heap of a training run: a step's buffers kept for the next step, not handed back and faulted in anew.

    python -c "from detour.train.heap import steady_cpu_heap; print(steady_cpu_heap())"

On CPU, PyTorch takes tensors from glibc's malloc. By default glibc maps each allocation over a
moving threshold on its own and unmaps it when it is freed; the threshold starts at 128 KiB and
rises (up to 32 MiB) only as mapped blocks are freed, and the heap's top goes back to the kernel
past twice that. A training step allocates and frees the same buffers every step (attention
buffers are 24 MiB each for 8 sequences of 256 tokens at 12 heads), and under those rules the next
step faults many of them in again: on MiniLM-L6, detour's MLM and CLM steps took 75-120 thousand
page faults a step. `detour train` on CPU fixes the threshold at glibc's own ceiling (32 MiB) and
trims the heap's top only past 1 GiB (fixing one threshold turns glibc's moving ones off, and the
fixed trim threshold would otherwise stay at 128 KiB), so the buffers stay in the process between
steps: 8-50 thousand faults a step, and 5-6% less time a step (10 steps a run, three runs an arm,
alternated). The peak RSS stays within its run-to-run spread: the heap grows as large at its peak
as before, it is only no longer handed back between steps.

A value the environment chose (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or either in
`GLIBC_TUNABLES`) is kept, and nothing is set. On CUDA the tensors are not on this heap, and
nothing is changed; nor on a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameter numbers, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # bytes: glibc's ceiling for its own moving threshold on 64-bit
TRIM_THRESHOLD = 1 << 30  # bytes: free memory above this at the heap's top goes back to the kernel
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def chosen_by_environment(environ=os.environ) -> bool:
    """Whether the process was started with a threshold of its own (glibc reads these at start)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _ENVIRONMENT) or any(name in tunables for name in _TUNABLES)


def steady_cpu_heap() -> bool:
    """Fix glibc's mmap and trim thresholds (module docstring); False, and nothing changed, where the
    environment chose one or the C library is not glibc."""
    if chosen_by_environment():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc's alone
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # macOS, musl: other allocators, other rules
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
