"""A CPU training run maps large tensors on their own (detour.train.heap), unless the environment chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from detour.train import loop
from detour.train.heap import chosen_by_environment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

# A fresh process: glibc's threshold starts at 128 KiB and rises to the size of a mapped block once
# it is freed, so after a 30 MiB tensor comes and goes a 20 MiB one lands on the heap, unless a
# fixed threshold of 16 MiB maps it. mallinfo2's hblkhd counts the bytes in mapped blocks.
PROBE = """
import ctypes, sys, torch
from detour.train.heap import lean_cpu_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
set_here = lean_cpu_heap() if sys.argv[1] == "lean" else None
big = torch.empty(30 << 18)  # 30 MiB of float32
del big
before = libc.mallinfo2().hblkhd
t = torch.empty(20 << 18)  # 20 MiB
print(set_here, (libc.mallinfo2().hblkhd - before) >> 20)
"""


def _probe(mode: str, **env) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env={**environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_a_20_mib_tensor_is_mapped_on_its_own_once_the_threshold_is_set():
    assert _probe("default") == ("None", 0)  # glibc's own: on the heap, where its pages stay after it is freed
    assert _probe("lean") == ("True", 20)


def test_a_threshold_the_environment_chose_is_kept():
    assert _probe("lean", MALLOC_MMAP_THRESHOLD_="33554432") == ("False", 0)
    assert _probe("lean", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432") == ("False", 0)
    assert chosen_by_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is False


def test_cpu_training_sets_it(tiny_recipe, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "lean_cpu_heap", lambda: calls.append(True))
    recipe = tiny_recipe()
    assert recipe.device in ("cpu", "auto")
    loop.train(recipe, tmp_path / "run", progress=False)
    assert calls == [True]
