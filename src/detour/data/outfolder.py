"""The folder a prepared corpus goes to: what `detour prepare` may fill or replace, how it replaces
it whole, and a prepared corpus linked into another folder instead of tokenized again.

    python -c "from detour.data.outfolder import check_out; from pathlib import Path; check_out(Path('runs/data/x'), True, [])"

A folder is replaced whole: the new one is written beside it (DIR.tmp-<pid>) and renamed into place,
the old one renamed away (DIR.old-<pid>) and removed. Nothing is replaced that prepare did not
write, nor a folder that holds an input of the command.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
from pathlib import Path

from detour.data.holdout import VALIDATION_DIR
from detour.data.shards import CORPUS_FORMAT
from detour.errors import DetourError
from detour.io import ensure_output_dir

# What a `detour prepare` run writes inside a source folder (ShardWriter and its manifest's temporary).
_SOURCE_FILE = re.compile(r"manifest\.json(\.tmp)?|offsets\.bin|tokens-\d{5,}\.bin")


def input_inside(folder: Path, inputs: list[Path]) -> Path | None:
    folder = folder.resolve()
    return next((p for p in inputs if p == folder or folder in p.parents), None)


def foreign_entry(folder: Path, nested: bool = True) -> Path | None:
    """The first thing in `folder` that a `detour prepare` run does not write, or None.

    prepare writes manifest.json and one folder per source holding only manifest.json,
    offsets.bin and tokens-NNNNN.bin (plus manifest.json.tmp while writing a manifest), and with
    --validation a `validation` folder laid out the same way.
    """
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            return entry
        if entry.is_file() and entry.name in ("manifest.json", "manifest.json.tmp"):
            continue
        if not entry.is_dir():
            return entry
        if nested and entry.name == VALIDATION_DIR and (entry / "manifest.json").is_file():
            inner = foreign_entry(entry, nested=False)
            if inner is not None:
                return inner
            continue
        for inner in sorted(entry.iterdir()):
            if inner.is_symlink() or not inner.is_file() or not _SOURCE_FILE.fullmatch(inner.name):
                return inner
    return None


def is_prepared(folder: Path) -> bool:
    """Whether `folder` has the manifest.json of a `detour prepare` output (its "format" field)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == CORPUS_FORMAT


def check_out(out: Path, overwrite: bool, inputs: list[Path]) -> None:
    """Refuse an --out that prepare may not fill or replace, before any work; deletes nothing."""
    if out.is_symlink():
        raise DetourError(f"--out {out}: is a symbolic link (to {os.path.realpath(out)}); prepare replaces "
                          "the folder itself, so give a real folder path")
    if not out.exists():
        return
    if not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if os.path.ismount(out):
        raise DetourError(f"--out {out}: is a mount point, which prepare cannot replace; give a new folder "
                          f"inside it (e.g. {out / 'data'})")
    held = input_inside(out, inputs)
    if held is not None:
        raise DetourError(f"--out {out}: contains {held}, an input of this command; prepare never replaces "
                          "a folder holding its inputs (choose a new --out)")
    if input_inside(out, [Path.cwd().resolve()]) is not None:
        raise DetourError(f"--out {out}: is the current folder or holds it, which prepare cannot replace; "
                          "give a new folder (e.g. --out data)")
    if not any(out.iterdir()):
        return  # an empty folder
    if not is_prepared(out):
        raise DetourError(f"--out {out}: exists, is not empty and is not the output of `detour prepare` "
                          f"(no manifest.json with \"format\": \"{CORPUS_FORMAT}\"); prepare writes into a new "
                          "or empty folder, so choose another --out")
    if not overwrite:
        raise DetourError(f"--out {out}: already holds a prepared corpus (use --overwrite to replace it)")
    foreign = foreign_entry(out)
    if foreign is not None:
        raise DetourError(f"--out {out}: holds {foreign}, which `detour prepare` did not write; refusing to "
                          "replace the folder (move that elsewhere first, or choose another --out)")


def _owner_running(pid: int, folder: Path) -> bool:
    """Whether process `pid` is alive and could have written `folder` (it started before the folder's
    last change; a later process only reuses the number of a dead one)."""
    import psutil

    if pid == os.getpid():
        return False  # this process runs one prepare into DIR at a time: the folder is a leftover
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return started <= folder.stat().st_mtime + 2.0  # create_time is rounded: give it slack


def remove_stale_temporaries(out: Path, inputs: list[Path]) -> None:
    """Delete DIR.tmp-<pid> and DIR.old-<pid> folders left by killed runs (their process is gone).

    Only folders named so and holding nothing but what prepare writes: anything else stays.
    """
    pattern = re.compile(re.escape(out.name) + r"\.(?:tmp|old)-(\d+)")
    for folder in sorted(out.parent.glob(f"{glob.escape(out.name)}.*-*")):
        m = pattern.fullmatch(folder.name)
        if m is None or folder.is_symlink() or not folder.is_dir() or _owner_running(int(m.group(1)), folder):
            continue
        if input_inside(folder, inputs) is not None or foreign_entry(folder) is not None:
            print(f"note: left {folder} in place: it looks like a leftover of an interrupted `detour prepare` "
                  "but holds files prepare does not write", file=sys.stderr)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        print(f"note: removed {folder}, left by an interrupted `detour prepare` (process {m.group(1)} is gone)",
              file=sys.stderr)


def commit(tmp: Path, out: Path) -> None:
    """Move the finished folder into place; an old one (empty, or a prepared corpus replaced with
    --overwrite, both checked by `check_out`) is removed after."""
    old = None
    if out.exists():
        old = out.parent / f"{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def link_prepared(source: Path, out: Path, inputs=()) -> None:
    """The prepared corpus `source` (another study folder's, made by the same command) placed at
    `out` without tokenizing again: its files hard-linked, or copied where the filesystem cannot link.

    Safe to link: nothing writes into a prepared folder after it is made; prepare replaces a folder
    whole (a new one renamed into place, the old one's names removed), so the other folder's files
    never change under it. `out` is checked and replaced as `prepare --overwrite` would, through
    OUT.tmp-<pid>, so an interrupted link leaves nothing that looks complete.
    """
    source, out = Path(source), Path(out)
    if not is_prepared(source) or foreign_entry(source) is not None:
        raise DetourError(f"{source}: not a prepared corpus as `detour prepare` writes it; cannot link it")
    protected = [Path(p).resolve() for p in inputs]
    check_out(out, True, protected)
    ensure_output_dir(out.parent, "--out (its parent folder)")
    remove_stale_temporaries(out, protected)
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        raise DetourError(f"{tmp} exists and holds files prepare does not write; move it away")

    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or one without hard links
            shutil.copy2(src, dst)

    try:
        shutil.copytree(source, tmp, copy_function=link_or_copy)
        check_out(out, True, protected)
        commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
