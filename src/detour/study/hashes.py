"""Content hashes of a study's input files, remembered by size and modification time.

    python -c "from pathlib import Path; from detour.study.hashes import ContentHashes; \
print(ContentHashes(None).of(Path('studies/tiny.yaml')))"

A step's key must change when what it reads changes, and only then. A modification time alone is
not that: a corpus copied to a cluster's scratch disk, a fresh checkout or an rsync without -t gets
new times for the same bytes, and a study keyed on them would retrain every arm. So a key sees the
sha256 of each file's content; the (size, mtime) pair only says when a file must be read again,
so a multi-gigabyte corpus is hashed once, not at every run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from detour.io import file_sha256, write_json
from detour.runs import LOCK_FILE

SCHEMA = "detour.study.hashes/1"


class ContentHashes:
    """sha256 of files and folders; cached in `path` (a JSON file) when one is given."""

    def __init__(self, path: Path | None):
        self.path = path
        self._known: dict[str, dict] = {}
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}  # a damaged cache only costs a re-read of the files
            if data.get("schema") == SCHEMA:
                self._known = data.get("files", {})
        self._changed = False

    def file(self, path: Path) -> str:
        st = path.stat()
        name = str(path.resolve())
        seen = self._known.get(name)
        if seen and seen["size"] == st.st_size and seen["mtime_ns"] == st.st_mtime_ns:
            return seen["sha256"]
        digest = file_sha256(path)
        self._known[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        self._changed = True
        return digest

    def of(self, path: Path) -> str:
        """A file's sha256, or a folder's: the names and hashes of every file under it."""
        if path.is_file():
            return self.file(path)
        h = hashlib.sha256()
        # the lock file says who writes there now, not what was written
        for f in sorted(p for p in path.rglob("*") if p.is_file() and p.name != LOCK_FILE):
            h.update(f"{f.relative_to(path)}:{self.file(f)}\n".encode())
        return "dir:" + h.hexdigest()

    def save(self) -> None:
        if self.path is not None and self._changed:
            write_json(self.path, {"schema": SCHEMA, "files": self._known})
            self._changed = False
