"""Packing and sampling: an infinite, seeded, resumable stream of fixed-length token sequences.

    python -m detour.data.packing runs/main/data --seq-len 512 --n 3     # show the first sequences

The stream is one global sequence of documents laid end to end. Without weights, all documents of
all sources form one pool, shuffled anew each epoch with a permutation seeded by (seed, epoch):
every token appears exactly once per epoch. With weights (token shares), each source is cycled in
its own seeded epoch order (seed, source, epoch) and the next document comes from the source
furthest below its share (smallest tokens_emitted / weight, ties to the first source), so small
sources are upsampled. `next_sequence(L)` consumes world_size * L tokens of that global stream and
returns rank r's slice: ranks are disjoint and together cover the stream. Documents longer than a
sequence are split across sequences, never dropped; no padding is ever needed. Position ids
restart at 0 at each document start and at each sequence start, so they stay below L. The state is
a small dict independent of rank, world size and sequence length; resuming from it continues with
exactly the tokens that would have come next.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detour.data.shards import PreparedCorpus, open_prepared, read_manifest
from detour.errors import DetourError

STATE_VERSION = 2  # 2 adds the global sequence count (version-1 states load, see load_state_dict)


@dataclass
class PackedSequence:
    input_ids: np.ndarray     # int64 [L]
    doc_ids: np.ndarray       # int64 [L], segment index within this sequence: 0, 1, 2, ...
    position_ids: np.ndarray  # int64 [L], 0 at each document start and at the sequence start
    index: int = -1           # position of this sequence in the global stream (all ranks): 0, 1, 2, ...

    def __len__(self) -> int:
        return len(self.input_ids)


def validate_seq_len(seq_len: int, max_position_embeddings: int) -> None:
    """DetourError unless 2 <= seq_len <= the model's usable positions.

    Pass the number of positions the model can actually use (RoBERTa-style models, whose positions
    start at pad_id + 1, can use max_position_embeddings - pad_id - 1 of them).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 2:
        raise DetourError(f"seq_len must be an integer >= 2, got {seq_len!r}")
    if seq_len > max_position_embeddings:
        raise DetourError(f"seq_len {seq_len} exceeds the model's maximum positions ({max_position_embeddings}); "
                          f"lower seq_len to at most {max_position_embeddings}")


class PackedStream:
    """Deterministic packed sequences from prepared corpora, for one data-parallel rank."""

    def __init__(self, sources: list[tuple[PreparedCorpus, float | None]], seq_len: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if not sources:
            raise DetourError("PackedStream needs at least one prepared source")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DetourError(f"shuffle seed must be a non-negative integer, got {seed!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DetourError(f"rank {rank} is not in 0..world_size-1 (world_size={world_size})")
        validate_seq_len(seq_len, seq_len)
        weights = [w for _, w in sources]
        if any(w is not None for w in weights) and not all(w is not None and w > 0 for w in weights):
            raise DetourError(f"weights must be given for every source (positive) or for none, got {weights}")
        fingerprints = {c.manifest.get("tokenizer_fingerprint") for c, _ in sources}
        if len(fingerprints) > 1:
            raise DetourError("sources were prepared with different tokenizers: "
                              + ", ".join(f"{c.name} ({str(c.manifest.get('tokenizer_fingerprint'))[:12]})" for c, _ in sources))
        self.corpora = [c for c, _ in sources]
        self.seq_len, self.seed, self.rank, self.world_size = int(seq_len), int(seed), rank, world_size
        self.weighted = weights[0] is not None
        self.weights = np.asarray([w for w in weights], dtype=np.float64) if self.weighted else None
        # uint32 halves the per-rank memory of these per-document arrays (tens of millions of documents at scale)
        self._lengths = [c.doc_lengths().astype(np.uint32) for c in self.corpora]
        self._num_docs = np.asarray([len(x) for x in self._lengths], dtype=np.int64)
        self._pool_starts = np.concatenate([[0], np.cumsum(self._num_docs)])
        self.total_tokens = int(sum(c.num_tokens for c in self.corpora))
        self._perms: dict[int, tuple[int, np.ndarray]] = {}
        n_orders = len(self.corpora) if self.weighted else 1
        self._epochs = [0] * n_orders
        self._positions = [0] * n_orders
        self._emitted = [0] * len(self.corpora)
        self._current: tuple[int, int, int] | None = None  # (source, document, tokens already taken)
        self.tokens_consumed = 0  # global, all ranks together
        self.sequences_consumed = 0  # global: the next sequence of rank r has index sequences_consumed + r

    @classmethod
    def from_paths(cls, paths_and_weights: list[tuple[str, float | None]], seq_len: int, seed: int,
                   rank: int = 0, world_size: int = 1) -> PackedStream:
        """Sources from paths: a `detour prepare --out` folder (all its sources, with its weights)
        or one source folder inside it (with the weight given here)."""
        sources: list[tuple[PreparedCorpus, float | None]] = []
        for path, weight in paths_and_weights:
            if read_manifest(Path(path)).get("sources") is not None:
                if weight is not None:
                    raise DetourError(f"{path}: a prepared folder carries its own weights; give weights to its "
                                      "source sub-folders instead")
                sources.extend(open_prepared(path))
            else:
                sources.append((PreparedCorpus(path), weight))
        return cls(sources, seq_len, seed, rank, world_size)

    # ---- document order ----

    def _permutation(self, order: int, epoch: int) -> np.ndarray:
        cached = self._perms.get(order)
        if cached is None or cached[0] != epoch:
            n = int(self._num_docs[order]) if self.weighted else int(self._pool_starts[-1])
            kind = 1 if self.weighted else 0  # pool and per-source orders never share a random stream
            rng = np.random.default_rng([self.seed, kind, order, epoch])
            perm = rng.permutation(n)
            cached = (epoch, perm.astype(np.uint32) if n < 1 << 32 else perm)
            self._perms[order] = cached
        return cached[1]

    def _next_document(self) -> tuple[int, int]:
        if self.weighted:
            # The source furthest below its share; argmin takes the first on ties.
            order = int(np.argmin(np.asarray(self._emitted, dtype=np.float64) / self.weights))
            limit = int(self._num_docs[order])
        else:
            order, limit = 0, int(self._pool_starts[-1])
        if self._positions[order] == limit:
            self._epochs[order] += 1
            self._positions[order] = 0
        j = int(self._permutation(order, self._epochs[order])[self._positions[order]])
        self._positions[order] += 1
        if self.weighted:
            source, doc = order, j
        else:
            source = int(np.searchsorted(self._pool_starts, j, side="right")) - 1
            doc = j - int(self._pool_starts[source])
        self._emitted[source] += int(self._lengths[source][doc])
        return source, doc

    def _take(self, n: int) -> list[tuple[int, int, int, int]]:
        """Consume n tokens of the global stream: pieces (source, doc, start, end)."""
        pieces = []
        while n > 0:
            if self._current is None:
                self._current = (*self._next_document(), 0)
            source, doc, offset = self._current
            length = int(self._lengths[source][doc])
            k = min(n, length - offset)
            pieces.append((source, doc, offset, offset + k))
            offset, n = offset + k, n - k
            self._current = None if offset == length else (source, doc, offset)
        return pieces

    # ---- sequences ----

    def next_sequence(self, length: int | None = None) -> PackedSequence:
        """The next `length` tokens (default seq_len) for this rank; all ranks call with the same length."""
        length = self.seq_len if length is None else int(length)
        if length < 1:
            raise DetourError(f"sequence length must be >= 1, got {length}")
        self._take(self.rank * length)
        pieces = self._take(length)
        self._take((self.world_size - self.rank - 1) * length)
        self.tokens_consumed += self.world_size * length
        sequence = self._materialise(pieces)
        # The same tokens get the same index on any number of processes: rank r of world w takes the
        # (c*w + r)-th sequence of the one global stream at its c-th call.
        sequence.index = self.sequences_consumed + self.rank
        self.sequences_consumed += self.world_size
        return sequence

    def _materialise(self, pieces: list[tuple[int, int, int, int]]) -> PackedSequence:
        input_ids = np.concatenate([self.corpora[s].document(d)[a:b] for s, d, a, b in pieces]).astype(np.int64)
        sizes = np.asarray([b - a for _, _, a, b in pieces], dtype=np.int64)
        starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
        doc_ids = np.repeat(np.arange(len(pieces), dtype=np.int64), sizes)
        position_ids = np.arange(len(input_ids), dtype=np.int64) - starts
        return PackedSequence(input_ids, doc_ids, position_ids)

    def __iter__(self):
        while True:
            yield self.next_sequence()

    # ---- resumable state ----

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "sources": [c.name for c in self.corpora],
            "documents": [int(n) for n in self._num_docs],
            "weighted": self.weighted,
            "epochs": list(self._epochs),
            "positions": list(self._positions),
            "emitted": list(self._emitted),
            "current": None if self._current is None else list(self._current),
            "tokens_consumed": self.tokens_consumed,
            "sequences_consumed": self.sequences_consumed,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") not in (1, STATE_VERSION):
            raise DetourError(f"sampler state version {state.get('version')!r} is not {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("seed", "sources", "documents", "weighted"):
            if state.get(key) != mine[key]:
                raise DetourError(f"sampler state does not match this stream: {key} is {state.get(key)!r} "
                                  f"in the state, {mine[key]!r} here")
        self._epochs = [int(x) for x in state["epochs"]]
        self._positions = [int(x) for x in state["positions"]]
        self._emitted = [int(x) for x in state["emitted"]]
        self._current = None if state["current"] is None else tuple(int(x) for x in state["current"])
        self.tokens_consumed = int(state["tokens_consumed"])
        # Version 1 did not count sequences; every sequence but a phase's last one is full length.
        self.sequences_consumed = int(state.get("sequences_consumed", -(-self.tokens_consumed // self.seq_len)))


def collate(seqs: list[PackedSequence], pad_id: int) -> dict:
    """Stack sequences into LongTensors [B, max_len]; pads (doc_ids -1, position 0, mask 0) only if lengths differ."""
    import torch

    width = max(len(s) for s in seqs)
    batch = {
        "input_ids": torch.full((len(seqs), width), pad_id, dtype=torch.long),
        "doc_ids": torch.full((len(seqs), width), -1, dtype=torch.long),
        "position_ids": torch.zeros((len(seqs), width), dtype=torch.long),
        "attention_mask": torch.zeros((len(seqs), width), dtype=torch.long),
        "seq_index": torch.tensor([s.index for s in seqs], dtype=torch.long),
    }
    for i, s in enumerate(seqs):
        n = len(s)
        batch["input_ids"][i, :n] = torch.from_numpy(s.input_ids)
        batch["doc_ids"][i, :n] = torch.from_numpy(s.doc_ids)
        batch["position_ids"][i, :n] = torch.from_numpy(s.position_ids)
        batch["attention_mask"][i, :n] = 1
    return batch


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print the first packed sequences of a prepared corpus.")
    parser.add_argument("path")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    stream = PackedStream.from_paths([(args.path, None)], args.seq_len, args.seed)
    for _ in range(args.n):
        seq = stream.next_sequence()
        print(f"{len(seq)} tokens, {int(seq.doc_ids.max()) + 1} segments, first ids {seq.input_ids[:8].tolist()}")
    print(stream.state_dict())
