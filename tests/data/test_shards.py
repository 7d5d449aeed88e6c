import numpy as np
import pytest

from detour.data.shards import PreparedCorpus, ShardWriter, open_prepared, prepared_fingerprint
from detour.errors import DetourError


def test_documents_across_several_shards(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 70_000, size=n, dtype=np.uint32) for n in rng.integers(1, 40, size=50)]
    docs.append(rng.integers(0, 70_000, size=120, dtype=np.uint32))  # longer than a shard: a shard of its own
    writer = ShardWriter(tmp_path / "src", np.dtype("<u4"), shard_tokens=100)
    for i in range(0, len(docs), 7):
        batch = docs[i:i + 7]
        writer.add(np.concatenate(batch), [len(d) for d in batch])
    writer.close({"name": "src", "tokenizer_fingerprint": "abc"})
    corpus = PreparedCorpus(tmp_path / "src")
    assert len(corpus.manifest["shards"]) > 5 and max(s["tokens"] for s in corpus.manifest["shards"]) == 120
    assert corpus.num_documents == len(docs) and corpus.num_tokens == sum(map(len, docs))
    assert corpus.doc_lengths().tolist() == [len(d) for d in docs]
    for i, d in enumerate(docs):
        assert corpus.document(i).tolist() == d.tolist()
    assert prepared_fingerprint(tmp_path / "src") == "abc"
    with pytest.raises(IndexError):
        corpus.document(len(docs))


def test_missing_or_incomplete_corpora_are_refused(tmp_path):
    with pytest.raises(DetourError, match="no manifest.json"):
        PreparedCorpus(tmp_path)
    writer = ShardWriter(tmp_path / "src", np.dtype("<u2"))
    writer.add(np.arange(10), [4, 6])
    writer.close({"name": "src"})
    PreparedCorpus(tmp_path / "src")
    with pytest.raises(DetourError, match="this is one source"):
        open_prepared(tmp_path / "src")
    shard = tmp_path / "src" / "tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DetourError, match="incomplete, tokens-00000.bin has 18 bytes, expected 20"):
        PreparedCorpus(tmp_path / "src")
    shard.unlink()
    with pytest.raises(DetourError, match="tokens-00000.bin is missing"):
        PreparedCorpus(tmp_path / "src")
