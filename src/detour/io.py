"""Atomic file writes: a reader (or a rerun after a crash) never sees a half-written output.

    python -c "from detour.io import write_json; write_json('runs/x.json', {'ok': True})"

Each write goes to a hidden temporary file beside the target, then `os.replace` renames it into
place (atomic on POSIX); on any error the temporary file is removed. A new file gets the mode a
plain open() would give it (0666 less the umask); a replaced one keeps its permission bits.

A full disk is one message for every writer (shards, checkpoints, exports, results, reports):
`no_space` names what was being written, "No space left on device", the space it needed when
known and what is free there (shutil.disk_usage), and says that nothing half-written was kept.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _create_temporary(path: Path) -> str:
    """An empty hidden file beside `path` with the permissions a plain open() would give it.

    tempfile.mkstemp makes 0600 files, so results would be unreadable to the rest of a group;
    os.open with 0666 lets the umask decide (0644 under umask 022), as for any new file. When
    `path` already exists its permission bits are kept, as open(path, "w") would keep them.
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode) & 0o777
    except FileNotFoundError:
        mode = None
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            if mode is not None:
                os.fchmod(fd, mode)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return tmp


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> None:
    """Call `write(tmp_path)` to produce the file, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes, read in chunks (a corpus or a checkpoint may be large)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(path: str | Path, obj: Any, indent: int = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")


def read_yaml_mapping(path: str | Path, what: str) -> dict:
    """A YAML file whose top level must be a mapping (a recipe, a task spec, a data spec)."""
    import yaml

    from detour.errors import DetourError

    path = Path(path)
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DetourError(f"{path}: cannot read {what} ({exc.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DetourError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise DetourError(f"{path}: a {what} must be a YAML mapping, got {type(tree).__name__}")
    return tree


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, decoded line without its newline) of a UTF-8 file, a leading BOM dropped;
    DetourError naming file:line and column on bytes that are not UTF-8."""
    from detour.errors import DetourError

    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DetourError(f"{path}: cannot open ({exc.strerror})") from None
    with f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DetourError(f"{path}:{number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                                  f"{exc.start + 1})") from None


def jsonl_objects(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file (corpora and task data alike);
    DetourError naming file:line on a line that is not a JSON object."""
    from detour.errors import DetourError

    for number, line in text_lines(path):
        if not line.strip():
            continue  # a blank line is not a record
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DetourError(f"{path}:{number}: malformed JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise DetourError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def read_json_mapping(path: str | Path, schema: str | tuple[str, ...] | None = None) -> dict:
    """A JSON file whose top level must be an object, optionally with a `schema` field among `schema`."""
    from detour.errors import DetourError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DetourError(f"{path}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DetourError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DetourError(f"{path}: expected a JSON object, got {type(data).__name__}")
    accepted = (schema,) if isinstance(schema, str) else schema
    if accepted is not None and data.get("schema") not in accepted:
        expected = " or ".join(repr(s) for s in accepted)
        raise DetourError(f"{path}: field 'schema' is {data.get('schema')!r}, expected {expected}")
    return data


def ensure_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create (or accept) an output folder and prove it writable, before any compute.

    A path that is a file, or a folder where nothing can be written, is an error naming the flag
    and the path, so a long run never fails at its very end.
    """
    from detour.errors import DetourError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DetourError(f"{flag} {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise DetourError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return path


def check_output_location(path: str | Path, flag: str = "--out") -> None:
    """An output folder that exists as a folder, or can be created, in a writable place; creates nothing.

    For checks before any compute that must leave no trace when the command then fails on its inputs.
    """
    from detour.errors import DetourError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DetourError(f"{flag} {path}: exists and is not a folder")
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise DetourError(f"{flag} {path}: {probe} is a file, so the folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise DetourError(f"{flag} {path}: {probe} is not writable")


# How writers below Python say "the disk is full" without an errno: torch's zip writer ("unexpected
# pos", "failed writing file"), its C++ streams ("iostream error"), safetensors' Rust I/O error.
_FULL_WORDS = ("No space left", "StorageFull", "os error 28", "Disk quota exceeded", "unexpected pos",
               "iostream error", "failed writing file")


def is_disk_full(exc: BaseException) -> bool:
    """Whether a failed write failed for want of space (ENOSPC, EDQUOT), whoever reported it."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, (OSError, RuntimeError, ValueError)) and any(w in str(exc) for w in _FULL_WORDS)


def free_bytes(path: str | Path) -> int | None:
    """Bytes free on the filesystem that holds `path` (or would: its nearest existing folder)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:,.0f} MiB"


def no_space(what: str, where: str | Path, exc: BaseException | None = None, needed: int | None = None,
             after: str = "nothing half-written was kept; free space, then rerun the same command") -> str:
    """The message of a write that ran out of space: what, how much it needed (if known), what is free."""
    said = ""
    if exc is not None:
        # The failed writer (torch's zip writer) may still hold its unlinked file open through the
        # traceback's frames; let it go first, so the free space is what a rerun will find.
        seen, link = set(), exc
        while link is not None and id(link) not in seen:
            seen.add(id(link))
            link.__traceback__ = None
            link = link.__context__ or link.__cause__
        gc.collect()
    if exc is not None and not (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        said = f" (the writer said: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__})"
    free = free_bytes(where)
    space = "; ".join(([f"it needs about {_mib(needed)}"] if needed else [])
                      + ([f"{_mib(free)} are free there"] if free is not None else []))
    return (f"writing {what} failed: No space left on device{said}" + (f"; {space}" if space else "")
            + f". {after[:1].upper()}{after[1:]}")



def why_missing(path: str | Path) -> str | None:
    """Why `path` cannot be opened, in words, or None when it can: a symbolic link that loops or
    points nowhere is not "no such file", and a user looking for a missing file would not find it."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop (following it leads back to itself)"
        if path.is_symlink():
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        if exc.errno == errno.ENOENT:
            return "no such file or folder"
        return exc.strerror or str(exc)
    return None
