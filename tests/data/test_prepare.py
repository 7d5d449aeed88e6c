"""`detour prepare` end to end on real files with the real MiniLM tokenizer."""

import json

import pytest

from detour.cli import main
from detour.data.shards import PreparedCorpus, open_prepared, prepared_fingerprint
from detour.data.tokenize import load_tokenizer, tokenizer_fingerprint
from detour.errors import DetourError

from .conftest import prepare_sources


def _ids_on_disk(corpus: PreparedCorpus) -> int:
    return sum((corpus.path / s["file"]).stat().st_size for s in corpus.manifest["shards"]) // corpus.dtype.itemsize


def test_english_biomedical_corpus_prepares_exactly(shared_data, minilm, tmp_path):
    en = shared_data / "corpora" / "en-biomed"
    out = tmp_path / "en"
    manifest = prepare_sources([str(en / "e3c-en-layer3.jsonl"), str(en / "pubmed-abstracts-1mb.txt")],
                               minilm, out, workers=2)
    assert manifest["documents"] == 10_504 and manifest["skipped_documents"] == 0
    assert [(s["name"], s["documents"]) for s in manifest["sources"]] == [
        ("e3c-en-layer3", 9_779), ("pubmed-abstracts-1mb", 725)]
    corpora = [c for c, _ in open_prepared(out)]
    written = sum(_ids_on_disk(c) for c in corpora)
    assert manifest["tokens"] == written == sum(int(c.doc_lengths().sum()) for c in corpora)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["dtype"] == "<u2" and manifest["separator_policy"]["template"] == "[CLS] ... [SEP]"
    tok = load_tokenizer(str(minilm))
    assert prepared_fingerprint(out) == tokenizer_fingerprint(tok)
    # documents are on disk exactly as the tokenizer encodes them, in input order
    first = json.loads((en / "e3c-en-layer3.jsonl").open().readline())["text"].strip()
    assert corpora[0].document(0).tolist() == tok(first)["input_ids"]
    last = (en / "pubmed-abstracts-1mb.txt").read_text().splitlines()[-1].strip()
    assert corpora[1].document(724).tolist() == tok(last)["input_ids"]


def test_french_corpus(shared_data, minilm, tmp_path):
    lines = (shared_data / "corpora" / "fr-biomed" / "e3c-fr-layer3-sample.jsonl").read_text().splitlines()[:80]
    sample = tmp_path / "fr.jsonl"
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    manifest = prepare_sources([str(sample)], minilm, tmp_path / "fr")
    texts = [json.loads(x)["text"].strip() for x in lines]
    assert manifest["documents"] == sum(bool(t) for t in texts) == 80
    corpus = open_prepared(tmp_path / "fr")[0][0]
    tok = load_tokenizer(str(minilm))
    for i in (0, 41, 79):
        assert corpus.document(i).tolist() == tok(texts[i])["input_ids"]


def test_synthetic_source_is_marked_synthetic(minilm, tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(["prepare", "synthetic:clinical?docs=40&seed=5", "--tokenizer", str(minilm), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["synthetic"] is True and manifest["sources"][0]["synthetic"] is True
    assert manifest["documents"] == 40 and manifest["sources"][0]["name"] == "synthetic-clinical-en"
    captured = capsys.readouterr()
    assert "SYNTHETIC" in captured.err and "SYNTHETIC" in captured.out


def test_parquet_with_empty_and_null_rows(minilm, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "notes.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "text": ["Fever and cough.", "  ", None, "Chest pain."]}), f)
    manifest = prepare_sources([str(f)], minilm, tmp_path / "pq")
    assert (manifest["documents"], manifest["skipped_documents"]) == (2, 2)
    corpus = open_prepared(tmp_path / "pq")[0][0]
    assert corpus.document(1).tolist() == load_tokenizer(str(minilm))("Chest pain.")["input_ids"]


def test_saved_hf_dataset_folders_and_the_load_dataset_path(minilm, tmp_path):
    import datasets

    texts = [f"Patient {i} presented with fever." for i in range(30)]
    datasets.Dataset.from_dict({"text": texts, "label": list(range(30))}).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": texts[:5]}),
                          "validation": datasets.Dataset.from_dict({"body": texts[5:12]})}
                         ).save_to_disk(str(tmp_path / "dd"))
    data_dir = tmp_path / "raw"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:9]))
    manifest = prepare_sources([str(tmp_path / "ds"), f"hf:{tmp_path / 'dd'}?split=validation&field=body",
                                f"hf:{data_dir}?split=train"], minilm, tmp_path / "out")
    assert [(s["kind"], s["documents"]) for s in manifest["sources"]] == [("hf-disk", 30), ("hf-disk", 7), ("hf-hub", 9)]
    corpora = [c for c, _ in open_prepared(tmp_path / "out")]
    tok = load_tokenizer(str(minilm))
    assert corpora[1].document(0).tolist() == tok(texts[5])["input_ids"]
    assert corpora[2].document(8).tolist() == tok(texts[8])["input_ids"]
    with pytest.raises(DetourError, match="no split 'test'"):
        prepare_sources([f"hf:{tmp_path / 'dd'}?split=test&field=body"], minilm, tmp_path / "out2")


def test_output_does_not_depend_on_workers_or_batching(minilm, tmp_path):
    from detour.data.prepare import prepare
    from detour.data.sources import parse_source

    src = [(parse_source("synthetic:clinical?docs=120&seed=9"), None)]
    one = prepare(src, str(minilm), tmp_path / "w1", workers=1, batch_docs=64)
    two = prepare(src, str(minilm), tmp_path / "w2", workers=2, batch_docs=7)
    assert one == two
    name = one["sources"][0]["name"]
    for file in ("tokens-00000.bin", "offsets.bin", "manifest.json"):
        assert (tmp_path / "w1" / name / file).read_bytes() == (tmp_path / "w2" / name / file).read_bytes()


def test_existing_output_overwrite_and_atomic_failure(minilm, tmp_path, capsys):
    good, bad = tmp_path / "good.txt", tmp_path / "bad.jsonl"
    good.write_text("first\n\nsecond\n")
    bad.write_text('{"text": "fine"}\n{oops}\n')
    out = tmp_path / "out"
    args = ["prepare", str(good), "--tokenizer", str(minilm), "--out", str(out)]
    assert main(args) == 0
    assert json.loads((out / "manifest.json").read_text())["skipped_documents"] == 1
    assert main(args) == 2 and "already holds a prepared corpus" in capsys.readouterr().err
    # a failure in the second source leaves the old output untouched and no temporary folder
    assert main(["prepare", str(good), str(bad), "--tokenizer", str(minilm), "--out", str(out), "--overwrite"]) == 2
    assert "bad.jsonl:2: malformed JSON" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["documents"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.txt", "out"]
    assert main(["prepare", "synthetic:clinical?docs=3", "--tokenizer", str(minilm), "--out", str(out),
                 "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["documents"] == 3


def test_yaml_spec_with_weights(minilm, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("Day one.\nStill febrile.\n\nDischarged home.\n")
    spec = tmp_path / "data.yaml"
    spec.write_text(f"tokenizer: {minilm}\nsources:\n"
                    f"  - {{source: '{notes}', weight: 0.25, blank_line_docs: true, name: ward}}\n"
                    f"  - source: 'synthetic:clinical?docs=10'\n    weight: 0.75\n")
    out = tmp_path / "mix"
    assert main(["prepare", "--spec", str(spec), "--out", str(out)]) == 0
    sources = open_prepared(out)
    assert [(c.name, c.num_documents, w) for c, w in sources] == [("ward", 2, 0.25), ("synthetic-clinical-en", 10, 0.75)]
    spec.write_text("sources:\n  - {source: 'synthetic:clinical?docs=2', weight: 1}\n  - 'synthetic:clinical?docs=2'\n")
    assert main(["prepare", "--spec", str(spec), "--tokenizer", str(minilm), "--out", str(tmp_path / "x")]) == 2
    assert "weight to every source or to none" in capsys.readouterr().err
    spec.write_text("sources:\n  - {source: 'synthetic:clinical', wieght: 1}\n")
    assert main(["prepare", "--spec", str(spec), "--tokenizer", str(minilm), "--out", str(tmp_path / "x")]) == 2
    assert "sources[0]: unknown key(s) ['wieght']" in capsys.readouterr().err


def test_killed_run_leaves_nothing_that_looks_complete(minilm, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "detour.cli", "prepare", "synthetic:clinical?docs=200000",
                             "--tokenizer", str(minilm), "--out", str(out), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not list(tmp_path.glob("out.tmp-*/*/tokens-00000.bin")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (stale,) = tmp_path.glob("out.tmp-*")
    assert not out.exists() and not (stale / "manifest.json").exists()
    with pytest.raises(DetourError, match="no manifest.json"):
        PreparedCorpus(next(stale.iterdir()))
    prepare_sources(["synthetic:clinical?docs=3"], minilm, out)  # the next run cleans up after the dead one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _word_tokenizer(folder, with_template: bool):
    """A real word-level tokenizer whose vocabulary exceeds uint16: the text's words get ids > 65535."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from detour.data.synthetic import generate_documents

    words = sorted({w for d in generate_documents(20, seed=0) for w in d.split()})
    tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"filler{i}" for i in range(70_000)] + words
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if with_template:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("with_template, template", [(True, "<s> ... </s>"), (False, "... </s>")])
def test_roberta_style_and_eos_less_tokenizers_with_a_large_vocabulary(tmp_path, with_template, template):
    from detour.data.synthetic import generate_documents

    tok_dir = _word_tokenizer(tmp_path / "tok", with_template)
    manifest = prepare_sources(["synthetic:clinical?docs=20&seed=0"], tok_dir, tmp_path / "out")
    assert manifest["dtype"] == "<u4" and manifest["separator_policy"]["template"] == template
    assert manifest["separator_policy"]["append_eos"] is (not with_template)
    corpus = open_prepared(tmp_path / "out")[0][0]
    doc = corpus.document(3).tolist()
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    words = list(generate_documents(20, seed=0))[3].split()
    assert doc == ([2] if with_template else []) + [vocab[w] for w in words] + [3]
    assert min(doc[1:-1]) > 65_535
