"""The CPU heap of a training run: large tensors mapped on their own, so the peak RSS follows live memory.

    python -c "from detour.train.heap import lean_cpu_heap; print(lean_cpu_heap())"

On CPU, PyTorch takes tensors from glibc's malloc. By default glibc serves an allocation under a
threshold that grows up to 32 MiB from its heap, which goes back to the kernel only from the top:
the holes a training step leaves (attention scores and their gradients are 24 MiB each for 8
sequences of 256 tokens at 12 heads) keep the peak RSS of a run hundreds of MiB above the peak of
live memory, and different from run to run. A fixed threshold of 16 MiB maps every larger tensor
on its own and unmaps it when freed: on MiniLM-L6 (8 x 256 tokens, one thread) the peak RSS of
detour's MLM step falls from 0.76-0.93x the stock Hugging Face step's to 0.64x, for 7-14% more
time a step (bench/bench_malloc.py measures both sides). `detour train` on CPU sets it, through
mallopt, unless the environment already chooses a threshold: `MALLOC_MMAP_THRESHOLD_=33554432`
(glibc's ceiling) gives back glibc's own behaviour and its speed. On CUDA the tensors are not on
this heap, and nothing is changed; nor on a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

THRESHOLD = 16 << 20  # bytes
M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def chosen_by_environment(environ=os.environ) -> bool:
    """Whether the process was started with an mmap threshold of its own (glibc reads these at start)."""
    return "MALLOC_MMAP_THRESHOLD_" in environ or "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", "")


def lean_cpu_heap(threshold: int = THRESHOLD) -> bool:
    """Set glibc's mmap threshold to `threshold` bytes; False (and nothing changed) where the
    environment chose one, or where the C library is not glibc."""
    if chosen_by_environment():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc's alone
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # macOS, musl: other allocators, other rules
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1
