"""A CPU training run keeps a step's buffers for the next step (detour.train.heap), unless the environment chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from detour.train import loop
from detour.train.heap import chosen_by_environment, installed_allocator
from tests.conftest import missing

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

# A fresh process takes eight 20 MiB blocks straight from malloc, fills them, frees them from the
# top down, and prints how many MiB of resident memory went back to the kernel: glibc trims the
# heap's top past its trim threshold (torch's aligned requests rarely leave the top free, so plain
# malloc shows the setting). Then it fills eight 24 MiB tensors (an attention buffer's size at
# 8 x 256 tokens and 12 heads, above the 20 MiB glibc's moving threshold has risen to) and prints
# how many MiB of them glibc mapped on their own (mallinfo2's hblkhd): a mapped tensor is unmapped
# when freed, and the next step faults it in again. Under glibc's default, early in a process, both happen; with detour's thresholds neither.
PROBE = """
import ctypes, sys, torch
from detour.train.heap import steady_cpu_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20

set_here = steady_cpu_heap() if sys.argv[1] == "steady" else None
blocks = [libc.malloc(20 << 20) for _ in range(8)]
for block in blocks:
    libc.memset(block, 1, 20 << 20)
before = resident()
for block in reversed(blocks):
    libc.free(block)
returned = before - resident()
mapped = libc.mallinfo2().hblkhd
buffers = [torch.ones(24 << 18) for _ in range(8)]
print(set_here, (libc.mallinfo2().hblkhd - mapped) >> 20, returned)
"""


def _probe(mode: str, **env) -> tuple[str, int, int]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env={**environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


def test_a_steps_buffers_stay_on_the_heap_for_the_next_step():
    default_set, default_mapped, default_returned = _probe("default")
    assert default_set == "None" and default_mapped == 192 and default_returned >= 150  # glibc's own
    assert _probe("steady") == ("True", 0, 0)


def test_a_threshold_the_environment_chose_is_kept():
    assert _probe("steady", MALLOC_MMAP_THRESHOLD_="33554432")[0] == "False"
    assert _probe("steady", MALLOC_TRIM_THRESHOLD_="1000000")[0] == "False"
    assert _probe("steady", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")[0] == "False"
    assert chosen_by_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is False


def test_cpu_training_sets_it_and_says_how_to_start_on_tcmalloc(tiny_recipe, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(loop, "steady_cpu_heap", lambda: calls.append(True))
    monkeypatch.setattr(loop, "allocator_advice", lambda: "start it on tcmalloc")
    recipe = tiny_recipe()
    assert recipe.device in ("cpu", "auto")
    loop.train(recipe, tmp_path / "run", progress=False)
    assert calls == [True] and "tcmalloc" not in capsys.readouterr().err  # quiet without progress
    loop.train(recipe, tmp_path / "again", progress=True)
    assert calls == [True, True] and "detour: note: start it on tcmalloc" in capsys.readouterr().err


def _tcmalloc() -> str:
    library = installed_allocator("tcmalloc")
    if library is None:
        missing("DETOUR_REQUIRE_TCMALLOC", "tcmalloc is not installed (Debian: libtcmalloc-minimal4)")
    return library


NAMES = ("from detour.train.heap import allocator_advice, malloc_library, steady_cpu_heap; "
         "print(malloc_library(), steady_cpu_heap()); print(allocator_advice())")


def test_a_process_names_its_malloc_and_leaves_glibcs_heap_alone_under_a_preloaded_one():
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")
               and not k.startswith("MALLOC_")}

    def run(**env) -> list[str]:
        return subprocess.run([sys.executable, "-c", NAMES], env={**environ, **env}, capture_output=True, text=True,
                              check=True).stdout.splitlines()

    names, advice = run()
    assert names == "libc.so.6 True"
    library = _tcmalloc()
    assert f"LD_PRELOAD={library} detour" in advice  # on glibc: the command that starts on tcmalloc
    assert run(LD_PRELOAD=library) == [f"{os.path.basename(library)} False", "None"]


def test_an_allocator_in_the_active_environment_comes_before_the_systems(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libjemalloc.so.2").write_bytes(b"")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    assert installed_allocator("jemalloc") == str(tmp_path / "lib" / "libjemalloc.so.2")
