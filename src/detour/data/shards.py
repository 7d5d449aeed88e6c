"""Memory-mapped token shards: the on-disk form of a prepared corpus, its writer and its reader.

    python -m detour.data.shards runs/main/data          # summary of a `detour prepare --out` folder

Layout of a `detour prepare --out DIR`:
  DIR/manifest.json                 totals, sources and their weights, tokenizer name and fingerprint
  DIR/<source>/manifest.json        this source's counts, dtype, shard list
  DIR/<source>/tokens-00000.bin     token ids, raw little-endian uint16 (vocab <= 65536) or uint32
  DIR/<source>/offsets.bin          int64, documents + 1 entries: document i is tokens [o[i], o[i+1])
  DIR/validation/                   with `--validation`: the held-out documents, laid out as DIR is
Offsets count tokens across the source's shards laid end to end; a document never straddles two
shards. Nothing here depends on a sequence length: packing happens at training time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from detour.errors import DetourError

CORPUS_FORMAT = "detour-prepared/1"
SOURCE_FORMAT = "detour-prepared-source/1"
SHARD_TOKENS = 1 << 28  # 256M tokens a shard file: small enough to copy, few enough to list


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


class ShardWriter:
    """Appends batches of tokenized documents to one source folder, streaming to disk."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS):
        self.folder, self.dtype, self.shard_tokens = Path(folder), np.dtype(dtype), shard_tokens
        self.folder.mkdir(parents=True, exist_ok=False)
        self.shards: list[dict] = []
        self.num_tokens = 0
        self.num_documents = 0
        self._shard_file = None
        self._offsets = open(self.folder / "offsets.bin", "wb")
        self._offsets.write(np.zeros(1, dtype="<i8").tobytes())

    def _new_shard(self) -> None:
        if self._shard_file is not None:
            self._shard_file.close()
        name = f"tokens-{len(self.shards):05d}.bin"
        self._shard_file = open(self.folder / name, "wb")
        self.shards.append({"file": name, "tokens": 0})

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given as their concatenated ids and their lengths."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.sum() != len(ids):
            raise ValueError("lengths do not add up to the ids given")
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        pos, doc = 0, 0
        while doc < len(lengths):
            if not self.shards or (self.shards[-1]["tokens"] and self.shards[-1]["tokens"] + lengths[doc] > self.shard_tokens):
                self._new_shard()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            fits = int(np.searchsorted(np.cumsum(lengths[doc:]), room, side="right"))
            take = max(fits, 1)  # a document longer than a shard gets a shard of its own
            n_tok = int(lengths[doc:doc + take].sum())
            self._shard_file.write(ids[pos:pos + n_tok].tobytes())
            self.shards[-1]["tokens"] += n_tok
            pos, doc = pos + n_tok, doc + take
        ends = self.num_tokens + np.cumsum(lengths)
        self._offsets.write(ends.astype("<i8").tobytes())
        self.num_tokens += int(lengths.sum())
        self.num_documents += len(lengths)

    def close(self, manifest: dict) -> dict:
        """Flush everything, then write the source manifest last (its presence means complete)."""
        if self._shard_file is not None:
            self._shard_file.close()
        self._offsets.close()
        manifest = {"format": SOURCE_FORMAT, **manifest, "documents": self.num_documents,
                    "tokens": self.num_tokens, "dtype": self.dtype.str, "shards": self.shards}
        write_json(self.folder / "manifest.json", manifest)
        return manifest


def read_manifest(path: Path) -> dict:
    file = Path(path) / "manifest.json"
    if not file.is_file():
        raise DetourError(f"{path}: not a prepared corpus (no manifest.json; run `detour prepare` first)")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DetourError(f"{file}: unreadable manifest ({exc})") from None


class PreparedCorpus:
    """One tokenized source, memory-mapped: documents are read lazily from disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if self.manifest.get("format") != SOURCE_FORMAT:
            raise DetourError(f"{self.path}: manifest is not a prepared source (format "
                              f"{self.manifest.get('format')!r}, expected {SOURCE_FORMAT!r})")
        self.name = self.manifest.get("name", self.path.name)
        self.num_documents = int(self.manifest["documents"])
        self.num_tokens = int(self.manifest["tokens"])
        self.dtype = np.dtype(self.manifest["dtype"])
        offsets_file = self.path / "offsets.bin"
        self._check_size(offsets_file, (self.num_documents + 1) * 8)
        self._offsets = np.memmap(offsets_file, dtype="<i8", mode="r")
        self._shards, starts = [], [0]
        for shard in self.manifest["shards"]:
            file = self.path / shard["file"]
            self._check_size(file, shard["tokens"] * self.dtype.itemsize)
            self._shards.append(np.memmap(file, dtype=self.dtype, mode="r") if shard["tokens"] else
                                np.zeros(0, self.dtype))
            starts.append(starts[-1] + shard["tokens"])
        self._shard_starts = np.asarray(starts, dtype=np.int64)
        if starts[-1] != self.num_tokens or int(self._offsets[-1]) != self.num_tokens:
            raise DetourError(f"{self.path}: incomplete (shards hold {starts[-1]} tokens, offsets end at "
                              f"{int(self._offsets[-1])}, manifest says {self.num_tokens})")

    def _check_size(self, file: Path, expected: int) -> None:
        if not file.is_file():
            raise DetourError(f"{self.path}: incomplete, {file.name} is missing")
        if file.stat().st_size != expected:
            raise DetourError(f"{self.path}: incomplete, {file.name} has {file.stat().st_size} bytes, "
                              f"expected {expected}")

    def document(self, i: int) -> np.ndarray:
        """Token ids of document i, including its special tokens (a read-only view)."""
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range (0..{self.num_documents - 1})")
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        s = int(np.searchsorted(self._shard_starts, start, side="right")) - 1
        base = int(self._shard_starts[s])
        return self._shards[s][start - base:end - base]

    def doc_lengths(self) -> np.ndarray:
        return np.diff(np.asarray(self._offsets)).astype(np.int64)

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return f"PreparedCorpus({self.name!r}, documents={self.num_documents}, tokens={self.num_tokens})"


def open_prepared(path: str | Path) -> list[tuple[PreparedCorpus, float | None]]:
    """The sources of a `detour prepare --out` folder, each with its weight (None = no weight)."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("format") != CORPUS_FORMAT:
        hint = " (this is one source; give its parent folder)" if manifest.get("format") == SOURCE_FORMAT else ""
        raise DetourError(f"{path}: not a `detour prepare` output folder{hint}")
    return [(PreparedCorpus(path / s["path"]), s.get("weight")) for s in manifest["sources"]]


def validation_split(path: str | Path) -> Path | None:
    """The held-out split `detour prepare --validation` wrote for a data source, or None.

    `path` is a prepared folder (its split: DIR/validation) or one source folder inside it (that
    source's part of the split: DIR/validation/SOURCE).
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("format") == CORPUS_FORMAT:
        split = manifest.get("validation")
        return path / split["path"] if split else None
    parent = path.parent
    if not (parent / "manifest.json").is_file():
        return None
    split = read_manifest(parent).get("validation")
    if not split or not (parent / split["path"] / path.name / "manifest.json").is_file():
        return None
    return parent / split["path"] / path.name


def prepared_fingerprint(path: str | Path) -> str:
    """The tokenizer fingerprint recorded when the corpus (or one of its sources) was prepared."""
    manifest = read_manifest(Path(path))
    if "tokenizer_fingerprint" not in manifest:
        raise DetourError(f"{path}: manifest has no tokenizer_fingerprint")
    return manifest["tokenizer_fingerprint"]


if __name__ == "__main__":
    top = read_manifest(Path(sys.argv[1]))
    print({k: top[k] for k in ("documents", "tokens", "skipped_documents", "tokenizer", "dtype") if k in top})
    for corpus, weight in open_prepared(sys.argv[1]):
        print(f"  {corpus!r} weight={weight}")
