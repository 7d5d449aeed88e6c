"""detour.lock on its own: one writer per folder, the holder named, nothing stale after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from detour.errors import DetourError
from detour.lock import FolderLocked, folder_lock, holder
from detour.runs import LOCK_FILE

HOLD = "import sys, time; from detour.lock import folder_lock\nwith folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)"


def _holding(folder) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_first_and_a_kill_9_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "run"
    first = _holding(folder)
    try:
        with pytest.raises(FolderLocked, match=rf"{folder} is in use: pid {first.pid} \(.*-c"):
            with folder_lock(folder):
                pass
        assert holder(folder).startswith(f"pid {first.pid}")
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert (folder / LOCK_FILE).exists() and holder(folder) is None  # the file stays, the lock does not
        t0 = time.time()
        with folder_lock(folder):
            assert f"pid {os.getpid()}" in (folder / LOCK_FILE).read_text()
        assert time.time() - t0 < 1
    finally:
        first.kill()
    assert not (folder / LOCK_FILE).exists()


def test_a_writer_that_waits_takes_the_lock_once_the_holder_lets_go_and_one_that_does_not_is_refused(tmp_path):
    folder = tmp_path / "run"
    brief = HOLD.replace("time.sleep(60)", "time.sleep(1.5)")
    first = subprocess.Popen([sys.executable, "-c", brief, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(FolderLocked):
            with folder_lock(folder):
                pass
        with folder_lock(folder, wait_s=30):
            assert first.poll() is not None  # taken only after the holder let go
            assert f"pid {os.getpid()}" in (folder / LOCK_FILE).read_text()
    finally:
        first.kill()


def test_the_holder_may_take_it_again_and_a_folder_it_made_and_left_empty_goes(tmp_path):
    folder = tmp_path / "new"
    with folder_lock(folder):
        with folder_lock(folder):  # the study writing its own report
            assert holder(folder) is not None
    assert not folder.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with folder_lock(kept):
        (kept / "result.json").write_text("{}")
    assert [p.name for p in kept.iterdir()] == ["result.json"]
    (tmp_path / "file").write_text("mine")
    with pytest.raises(DetourError, match="exists and is not a folder"):
        with folder_lock(tmp_path / "file"):
            pass
    assert (tmp_path / "file").read_text() == "mine"
