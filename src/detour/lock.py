"""One writer per folder: an advisory lock that train, twins, eval, export, study and report take.

    python -c "from detour.lock import folder_lock; exec('with folder_lock(\"runs/x\"): print(open(\"runs/x/.detour-lock\").read())')"

The lock is `fcntl.flock` on FOLDER/.detour-lock (`detour.runs.LOCK_FILE`). The kernel releases it
when the process ends, however it ends, so a kill -9, an OOM kill or a node reboot never leaves a
stale lock behind: the file a killed holder leaves is taken over by the next writer, and no one has
to delete a lock file by hand. A holder that ends normally removes the file. While it is held the file says who
holds it (pid, command, start time), so a second writer fails at once with a message naming the
first instead of racing it: two trainings into one run folder would delete each other's temporary
exports and interleave their checkpoints.

A process that already holds a folder's lock may take it again (the study writes its report in
its own folder). Children started with exec do not inherit the lock (the descriptor is
close-on-exec); forked workers would, so they must not outlive their parent.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from detour.errors import DetourError
from detour.runs import LOCK_FILE


class FolderLocked(DetourError):
    """Another live process writes into this folder."""


# resolved folder -> how many times this process holds it (the descriptor stays open meanwhile)
_HELD: dict[str, list] = {}


def _command() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("detour", "cli.py", "__main__.py"):
        return shlex.join(["detour", *argv[1:]])
    return shlex.join(argv) if argv else "python"


def holder(folder: str | Path) -> str | None:
    """Who holds the folder's lock, as its lock file says; None when nobody holds it."""
    path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(path)
    finally:
        os.close(fd)  # a shared lock taken only to test: released at once
    return None


def _describe(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if "pid" not in fields:
        return "a process that is just starting (it has not written its pid yet)"
    return f"pid {fields['pid']} ({fields.get('command', 'unknown command')}, since {fields.get('started', '?')})"


def _acquire(folder: Path, wait_s: float) -> int:
    path, end = folder / LOCK_FILE, time.monotonic() + wait_s
    while True:
        folder.mkdir(parents=True, exist_ok=True)  # a holder that made it empty removes it on letting go
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < end:
                time.sleep(0.2)
                continue
            raise FolderLocked(f"{folder} is in use: {_describe(path)} is writing into it. Wait for it to "
                               "finish or stop it, then rerun; two writers in one folder would undo each "
                               "other's work") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file was removed (its folder given up) between open and flock: take the new one


@contextmanager
def folder_lock(folder: str | Path, enabled: bool = True, remove_if_empty: bool | None = None,
                wait_s: float = 0.0) -> Iterator[Path]:
    """Hold FOLDER's lock inside the block (the folder is created if missing); FolderLocked if another
    live process holds it (still, after waiting up to `wait_s` seconds for it to let go: for folders
    that several processes take in turn, a file's write at a time).

    The lock file goes when the block ends. A folder this call created and that is empty then is
    removed again, so a command that fails before writing anything leaves no empty folder behind.
    `remove_if_empty` says so for a folder the caller created. `enabled=False` (the other ranks of a
    torchrun job) takes nothing: rank 0 holds the lock for all.
    """
    folder = Path(folder)
    if not enabled:
        yield folder
        return
    if folder.exists() and not folder.is_dir():
        raise DetourError(f"{folder}: exists and is not a folder")
    created = not folder.exists() if remove_if_empty is None else remove_if_empty
    folder.mkdir(parents=True, exist_ok=True)
    key = str(folder.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield folder
        finally:
            _HELD[key][1] -= 1
        return
    fd = _acquire(folder, wait_s)
    try:
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        os.write(fd, f"pid {os.getpid()}\ncommand {_command()}\nstarted {started}\n".encode())
    except OSError:
        pass  # a full disk: the lock holds all the same, only the message about it is poorer
    _HELD[key] = [fd, 1]
    try:
        yield folder
    finally:
        del _HELD[key]
        # Removed while still held: a process that opened the old file meanwhile finds it gone once
        # it has the flock (the inode check in _acquire) and takes a new one.
        try:
            (folder / LOCK_FILE).unlink()
            if created and not any(folder.iterdir()):
                folder.rmdir()  # a command that wrote nothing leaves no empty folder behind
        except OSError:
            pass  # the folder went meanwhile (a study replacing an arm does that under the lock)
        os.close(fd)
