"""Seeded splits by document: never cut a document, same seed same split, sizes as asked."""

from detour.eval.splits import load_splits, split_by_document, subsample
from detour.eval.tasks import load_spec


def examples(n_docs=50, per_doc=3):
    return [{"text": f"{d}-{k}", "doc": f"d{d}"} for d in range(n_docs) for k in range(per_doc)]


def test_split_by_document_keeps_documents_whole_and_is_seeded():
    exs = examples()
    parts = split_by_document(exs, [0.8, 0.1, 0.1], seed=3)
    docs = [{ex["doc"] for ex in p} for p in parts]
    assert [len(d) for d in docs] == [40, 5, 5]
    assert not (docs[0] & docs[1]) and not (docs[0] & docs[2]) and not (docs[1] & docs[2])
    assert sum(map(len, parts)) == len(exs)
    assert parts == split_by_document(exs, [0.8, 0.1, 0.1], seed=3)
    assert parts != split_by_document(exs, [0.8, 0.1, 0.1], seed=4)


def test_subsample_is_seeded_and_ordered():
    exs = examples(10, 1)
    a = subsample(exs, 4)
    assert a == subsample(exs, 4) and len(a) == 4
    assert [exs.index(x) for x in a] == sorted(exs.index(x) for x in a)
    assert subsample(exs, None) is exs


def test_jnlpba_validation_cut_from_devel_by_docstart_document(shared_data):
    s = load_splits(load_spec("jnlpba", shared_data))
    train_docs = {ex["doc"] for ex in s["train"]}
    val_docs = {ex["doc"] for ex in s["validation"]}
    assert not train_docs & val_docs
    assert len(val_docs) == 20  # 10% of devel's 200 -DOCSTART- documents
    assert len(s["train"]) + len(s["validation"]) == 1939 - 200


def test_hoc_split_by_abstract(shared_data):
    s = load_splits(load_spec("hoc", shared_data))
    docs = {k: {ex["doc"] for ex in v} for k, v in s.items()}
    assert not docs["train"] & docs["test"] and not docs["validation"] & docs["test"]
    assert sum(len(d) for d in docs.values()) == 1852
