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
nothing is changed; nor on a C library other than glibc, nor where another allocator was preloaded.

What these thresholds cannot mend is glibc's reuse of freed memory: torch asks for 64-byte-aligned
blocks (posix_memalign), and glibc's memalign (2.36, Debian 12's) takes a free chunk only when it is
larger than the request by the alignment and then some, so the hole a freed buffer leaves seldom
fits a request of another size and the heap grows around it (glibc's bug 14581). detour's head pads
its rows to a few sizes (detour.model.objectives.head_rows), without which the MLM step's heap grew
all through a run (MiniLM-L6 at 8 x 256 tokens: 2,765 MiB after 150 steps); with it the step holds
1,713 MiB after 30 steps, flat, for about 1,350 in use. tcmalloc reuses such holes; started under it
(`LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 detour train ...`, Debian's
libtcmalloc-minimal4) the same step holds 1,422 MiB and runs as fast or faster
(`bench/bench_malloc.py`). An allocator has to be chosen when the process starts, so detour does not
choose one itself: `malloc_library()` tells which one a process runs on, and `allocator_advice()` is
what `detour train` prints on CPU under glibc's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

# mallopt's parameter numbers, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # bytes: glibc's ceiling for its own moving threshold on 64-bit
TRIM_THRESHOLD = 1 << 30  # bytes: free memory above this at the heap's top goes back to the kernel
# The shared libraries a user can preload, by allocator: Debian's libtcmalloc-minimal4 and
# libgoogle-perftools4, libjemalloc2; conda-forge's gperftools and jemalloc
PRELOADS = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "jemalloc": ("libjemalloc.so.2",)}
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def chosen_by_environment(environ=os.environ) -> bool:
    """Whether the process was started with a threshold of its own (glibc reads these at start)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _ENVIRONMENT) or any(name in tunables for name in _TUNABLES)


class _DlInfo(ctypes.Structure):  # dladdr's answer, from dlfcn.h
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def malloc_library() -> str | None:
    """The file name of the library whose `malloc` this process calls (`libc.so.6` for glibc's,
    `libtcmalloc_minimal.so.4` under that preload), or None where the dynamic linker cannot say."""
    try:
        process = ctypes.CDLL(None)  # the symbols as the process resolves them: a preload comes first
        dladdr = process.dladdr
        malloc = ctypes.cast(process.malloc, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)], ctypes.c_int
    info = _DlInfo()
    if not dladdr(malloc, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.basename(os.fsdecode(info.dli_fname))


def installed_allocator(name: str) -> str | None:
    """The path of allocator `name`'s library (PRELOADS) in the usual folders, the active venv's
    and conda environment's first; None where it is not installed."""
    folders = [os.path.join(os.environ[v], "lib") for v in ("VIRTUAL_ENV", "CONDA_PREFIX") if v in os.environ]
    folders += ["/usr/local/lib", *sorted(glob.glob("/usr/lib/*-linux-gnu")), "/usr/lib64", "/usr/lib"]
    for library in PRELOADS[name]:
        for folder in folders:
            if os.path.isfile(os.path.join(folder, library)):
                return os.path.join(folder, library)
    return None


def preload_environment(name: str) -> dict[str, str] | None:
    """The LD_PRELOAD that starts a process on allocator `name`, ahead of any preload already set;
    None where it is not installed."""
    library = installed_allocator(name)
    if library is None:
        return None
    return {"LD_PRELOAD": os.pathsep.join(p for p in (library, os.environ.get("LD_PRELOAD")) if p)}


def _on_glibc_malloc() -> bool:
    return (malloc_library() or "").startswith("libc.so")


def steady_cpu_heap() -> bool:
    """Fix glibc's mmap and trim thresholds (module docstring); False, and nothing changed, where the
    environment chose one, the C library is not glibc, or another allocator serves malloc."""
    if chosen_by_environment():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc's alone
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # macOS, musl: other allocators, other rules
        return False
    if not _on_glibc_malloc():  # a preloaded allocator: glibc's heap is unused
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def allocator_advice() -> str | None:
    """What a CPU training run on glibc's malloc could be started with instead (module docstring);
    None where malloc is not glibc's."""
    if not _on_glibc_malloc():
        return None
    library = installed_allocator("tcmalloc")
    how = (f"start it as LD_PRELOAD={library} detour ..." if library else
           "install tcmalloc (Debian/Ubuntu: libtcmalloc-minimal4; conda: gperftools) and start it with "
           "LD_PRELOAD=<its libtcmalloc_minimal.so.4>")
    return (f"this CPU run takes its memory from glibc's malloc, whose heap holds about a quarter more than the "
            f"run uses; {how} to hold it nearer that, a little faster (README: CPU memory)")
