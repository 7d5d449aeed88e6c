"""Packing and sampling on corpora prepared with MiniLM: [CLS]=101 opens and [SEP]=102 closes each document."""

import json
from collections import Counter

import numpy as np
import pytest

from detour.data.packing import PackedSequence, PackedStream, collate, validate_seq_len
from detour.data.shards import open_prepared
from detour.errors import DetourError

CLS, SEP = 101, 102


def _stream(path, seq_len=128, seed=0, **kw):
    return PackedStream(open_prepared(path), seq_len, seed, **kw)


def _take(stream, n_tokens, length=None):
    seqs = []
    while sum(map(len, seqs)) < n_tokens:
        seqs.append(stream.next_sequence(length))
    return seqs


def _all_docs(path):
    return [c.document(i).tolist() for c, _ in open_prepared(path) for i in range(c.num_documents)]


def _split_docs(ids):
    """Whole documents of a token stream, cut at each [CLS]."""
    starts = np.flatnonzero(np.asarray(ids) == CLS).tolist() + [len(ids)]
    return [tuple(ids[a:b]) for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("seq_len", [512, 37])
def test_one_epoch_has_every_document_token_exactly_once(small_corpus, seq_len):
    stream = _stream(small_corpus, seq_len)
    docs = _all_docs(small_corpus)
    assert stream.total_tokens == sum(map(len, docs))
    # the epoch ends mid-sequence in general: take exactly total_tokens tokens
    n_full, rest = divmod(stream.total_tokens, seq_len)
    seqs = [stream.next_sequence() for _ in range(n_full)] + ([stream.next_sequence(rest)] if rest else [])
    packed = np.concatenate([s.input_ids for s in seqs]).tolist()
    assert Counter(packed) == Counter(t for d in docs for t in d)
    # stronger: the epoch is a permutation of whole documents (long ones split, none dropped)
    assert sorted(_split_docs(packed)) == sorted(map(tuple, docs))
    assert stream.state_dict()["current"] is None


def test_doc_ids_and_positions_at_every_boundary(small_corpus):
    stream = _stream(small_corpus, 64)
    for seq in _take(stream, 3 * stream.total_tokens // 2):  # crosses an epoch boundary too
        ids, doc, pos = seq.input_ids, seq.doc_ids, seq.position_ids
        assert len(ids) == 64 and ids.dtype == doc.dtype == pos.dtype == np.int64
        starts = np.flatnonzero(ids == CLS)
        new_segment = np.zeros(64, bool)
        new_segment[0] = True
        new_segment[starts] = True
        assert (pos[new_segment] == 0).all() and (np.diff(pos)[~new_segment[1:]] == 1).all()
        assert doc[0] == 0 and (np.diff(doc) == new_segment[1:]).all()
        # a document never continues past its [SEP] within a segment
        after_sep = np.flatnonzero(ids[:-1] == SEP) + 1
        assert new_segment[after_sep].all()
        assert pos.max() < 64


def test_same_seed_same_stream_other_seed_other_order(small_corpus):
    a = [s.input_ids for s in _take(_stream(small_corpus, 100, seed=7), 5000)]
    b = [s.input_ids for s in _take(_stream(small_corpus, 100, seed=7), 5000)]
    c = [s.input_ids for s in _take(_stream(small_corpus, 100, seed=8), 5000)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # a new epoch is a new order of the same documents
    stream = _stream(small_corpus, 50)
    epoch1 = np.concatenate([stream.next_sequence(t).input_ids for t in [50] * (stream.total_tokens // 50)
                             + [stream.total_tokens % 50]])
    epoch2 = np.concatenate([stream.next_sequence(t).input_ids for t in [50] * (stream.total_tokens // 50)
                             + [stream.total_tokens % 50]])
    assert not np.array_equal(epoch1, epoch2) and sorted(_split_docs(epoch1.tolist())) == sorted(_split_docs(epoch2.tolist()))


@pytest.mark.parametrize("corpus", ["small_corpus", "weighted_corpus"])
def test_resume_from_state_continues_identically(corpus, request):
    path = request.getfixturevalue(corpus)
    reference = _stream(path, 96, seed=3)
    _take(reference, reference.total_tokens // 3 + 17)  # mid-epoch, and in general mid-document
    state = json.loads(json.dumps(reference.state_dict()))
    assert len(json.dumps(state)) < 1000 and state["current"] is not None
    resumed = _stream(path, 96, seed=3)
    resumed.load_state_dict(state)
    for _ in range(2 * reference.total_tokens // 96):  # well past the next epoch boundary
        x, y = reference.next_sequence(), resumed.next_sequence()
        assert np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.doc_ids, y.doc_ids)
    with pytest.raises(DetourError, match="seed"):
        _stream(path, 96, seed=4).load_state_dict(state)


def test_mixture_proportions_match_weights_and_small_source_is_upsampled(weighted_corpus):
    sources = open_prepared(weighted_corpus)
    owner = {tuple(c.document(i).tolist()): k for k, (c, _) in enumerate(sources) for i in range(c.num_documents)}
    stream = PackedStream(sources, 256, seed=0)
    french_epoch = sources[1][0].num_tokens
    n = 4 * stream.total_tokens  # many epochs of the small French source
    ids = np.concatenate([s.input_ids for s in _take(stream, n)]).tolist()
    tokens = Counter()
    seen = Counter()
    for doc in _split_docs(ids)[:-1]:  # the last one may be cut
        tokens[owner[doc]] += len(doc)
        seen[doc] += 1
    share = tokens[1] / (tokens[0] + tokens[1])
    assert abs(share - 0.7) < 0.01, share
    assert tokens[1] > 10 * french_epoch  # upsampled: cycled through many epochs
    # each epoch of a source shows each of its documents once: counts differ by at most one
    french_counts = [seen[tuple(sources[1][0].document(i).tolist())] for i in range(sources[1][0].num_documents)]
    assert max(french_counts) - min(french_counts) <= 1


def test_ranks_are_disjoint_and_cover_the_stream(small_corpus):
    world, steps, length = 3, 40, 48
    single = _stream(small_corpus, length, seed=5)
    expected = np.concatenate([single.next_sequence().input_ids for _ in range(world * steps)])
    ranks = [_stream(small_corpus, length, seed=5, rank=r, world_size=world) for r in range(world)]
    got = np.concatenate([ranks[r].next_sequence().input_ids for _ in range(steps) for r in range(world)])
    assert np.array_equal(got, expected)
    # a short last step (all ranks with the same length) keeps them aligned
    tail = [ranks[r].next_sequence(5).input_ids for r in range(world)]
    after = [single.next_sequence(5).input_ids for _ in range(world)]
    assert all(np.array_equal(a, b) for a, b in zip(tail, after))
    with pytest.raises(DetourError, match="rank"):
        _stream(small_corpus, 48, rank=3, world_size=3)


def test_from_paths_weights_and_tokenizer_checks(small_corpus, weighted_corpus):
    stream = PackedStream.from_paths([(str(small_corpus / "synthetic-clinical-en"), 0.5),
                                      (str(small_corpus / "synthetic-clinical-fr"), 0.5)], 64, 0)
    assert stream.weighted and stream.next_sequence().input_ids.shape == (64,)
    assert PackedStream.from_paths([(str(weighted_corpus), None)], 64, 0).weighted
    with pytest.raises(DetourError, match="for every source"):
        PackedStream.from_paths([(str(small_corpus / "synthetic-clinical-en"), 0.5),
                                 (str(small_corpus / "synthetic-clinical-fr"), None)], 64, 0)
    corpus = open_prepared(small_corpus)[0][0]
    corpus.manifest = {**corpus.manifest, "tokenizer_fingerprint": "other"}
    with pytest.raises(DetourError, match="different tokenizers"):
        PackedStream([(corpus, None), open_prepared(small_corpus)[1]], 64, 0)


def test_collate_pads_only_shorter_sequences():
    a = PackedSequence(np.array([101, 5, 102, 101]), np.array([0, 0, 0, 1]), np.array([0, 1, 2, 0]))
    b = PackedSequence(np.array([7, 102]), np.array([0, 0]), np.array([0, 1]))
    batch = collate([a, b], pad_id=0)
    assert batch["input_ids"].tolist() == [[101, 5, 102, 101], [7, 102, 0, 0]]
    assert batch["doc_ids"].tolist() == [[0, 0, 0, 1], [0, 0, -1, -1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert all(t.dtype.is_floating_point is False and t.dtype.itemsize == 8 for t in batch.values())
    assert collate([a, a], pad_id=0)["attention_mask"].all()


def test_validate_seq_len():
    validate_seq_len(512, 512)
    for bad in (513, 1, 0, 8.5, "512"):
        with pytest.raises(DetourError, match="seq_len"):
            validate_seq_len(bad, 512)
