"""`detour prepare` end to end on real files with the real MiniLM tokenizer."""

import json
import shutil

import numpy as np
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
    assert "token ids stored as uint16" in captured.out and "<u2" not in captured.out  # words, not a numpy code


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


# ---- what prepare may replace or remove ----

def _tree(folder) -> dict:
    """Every file under `folder` with its bytes: equal before and after means untouched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_never_replaces_a_folder_detour_did_not_write(minilm, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("Fever.\nCough.\n")
    base = ["prepare", str(notes), "--tokenizer", str(minilm)]
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "thesis.tex").write_text("\\section{Results}\n")
    (mine / "sub" / "data.csv").write_text("a,b\n1,2\n")
    mine_before = _tree(mine)
    for extra in (["--overwrite"], []):
        assert main(base + ["--out", str(mine), *extra]) == 2
        err = capsys.readouterr().err
        assert f"--out {mine}: exists, is not empty and is not the output of `detour prepare`" in err
        assert "--overwrite" not in err  # no advice to destroy the folder
        assert _tree(mine) == mine_before
    # a real earlier output with a file of the user's added to it is not replaced either
    out = tmp_path / "out"
    assert main(base + ["--out", str(out)]) == 0
    (out / "README.md").write_text("how I made this corpus\n")
    before = _tree(out)
    assert main(base + ["--out", str(out), "--overwrite"]) == 2
    assert f"holds {out / 'README.md'}, which `detour prepare` did not write" in capsys.readouterr().err
    assert _tree(out) == before
    # nor a symbolic link (prepare would replace the link itself)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert main(base + ["--out", str(link), "--overwrite"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert link.is_symlink() and _tree(mine) == mine_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "mine", "notes.txt", "out"]


def test_overwrite_never_replaces_the_folder_holding_an_input(minilm, tmp_path, capsys, monkeypatch):
    from transformers import AutoTokenizer

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "notes.txt").write_text("Fever.\nCough.\n")
    spec = corpus / "data.yaml"
    spec.write_text("sources:\n  - 'synthetic:clinical?docs=3'\n")
    tok = tmp_path / "tok"
    AutoTokenizer.from_pretrained(minilm).save_pretrained(tok)
    before = {"corpus": _tree(corpus), "tok": _tree(tok)}
    cases = [
        (["prepare", str(corpus / "notes.txt"), "--tokenizer", str(minilm), "--out", str(corpus)], corpus / "notes.txt"),
        (["prepare", "--spec", str(spec), "--tokenizer", str(minilm), "--out", str(corpus)], spec),
        (["prepare", "synthetic:clinical?docs=3", "--tokenizer", str(tok), "--out", str(tok)], tok),
    ]
    for args, held in cases:
        assert main(args + ["--overwrite"]) == 2
        assert f"contains {held.resolve()}, an input of this command" in capsys.readouterr().err
    monkeypatch.chdir(corpus)  # the same with relative paths, --out being the current folder
    assert main(["prepare", "notes.txt", "--tokenizer", str(minilm), "--out", ".", "--overwrite"]) == 2
    assert "an input of this command" in capsys.readouterr().err
    assert {"corpus": _tree(corpus), "tok": _tree(tok)} == before
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")  # nor the (empty) current folder, which would be renamed away
    assert main(["prepare", str(corpus / "notes.txt"), "--tokenizer", str(minilm), "--out", "."]) == 2
    assert "is the current folder or holds it" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "empty", "tok"]
    assert not any((tmp_path / "empty").iterdir())


def test_out_that_is_a_file_or_inside_one_fails_before_the_tokenizer_is_loaded(tmp_path, capsys):
    import os
    from pathlib import Path

    # the tokenizer does not exist: reaching its loading would report that instead
    taken = tmp_path / "data.bin"
    taken.write_bytes(b"\x00user data")
    cases = [(taken, f"--out {taken}: exists and is not a folder"),
             (taken / "corpus", f"--out (its parent folder) {taken}: exists and is not a folder")]
    if os.path.ismount("/proc"):  # a mount point cannot be renamed away: say so now, not at the end
        cases.append((Path("/proc"), "--out /proc: is a mount point"))
    for out, message in cases:
        assert main(["prepare", "synthetic:clinical?docs=3", "--tokenizer", str(tmp_path / "no-tokenizer"),
                     "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert message in err and "cannot load tokenizer" not in err
    assert taken.read_bytes() == b"\x00user data" and [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_only_detours_own_leftovers_of_dead_runs_are_removed(minilm, tmp_path, capsys):
    import os
    import subprocess
    import sys

    def finished_pid() -> int:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        return proc.pid

    def leftover(name: str, extra: str | None = None, manifest: bool = False):
        folder = tmp_path / name
        (folder / "src").mkdir(parents=True)
        for f in ("offsets.bin", "tokens-00000.bin") + (("manifest.json",) if manifest else ()):
            (folder / "src" / f).write_bytes(b"\x00" * 8)
        if manifest:
            (folder / "manifest.json").write_text('{"format": "detour-prepared/1"}')
        if extra:
            (folder / extra).write_text("the user's\n")
        return folder

    dead, dead2 = finished_pid(), finished_pid()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        removed = [leftover(f"out.tmp-{dead}"), leftover(f"out.old-{dead}", manifest=True),
                   leftover(f"out.old-{running.pid}")]
        os.utime(removed[-1], (1e9, 1e9))  # older than the running process: its pid was reused
        kept = [leftover(f"out.tmp-{running.pid}"),               # its run is still going
                leftover(f"out.tmp-{dead2}", extra="notes.txt"),  # holds a file prepare does not write
                leftover(f"out.tmp-{dead2}x"), leftover("out.tmp-backup"), leftover(f"data.tmp-{dead}")]
        prepare_sources(["synthetic:clinical?docs=3"], minilm, tmp_path / "out")
    finally:
        running.kill()
        running.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out"] + [k.name for k in kept])
    err = capsys.readouterr().err
    assert f"removed {removed[0]}, left by an interrupted `detour prepare` (process {dead} is gone)" in err
    assert f"left {kept[1]} in place" in err


# ---- very long documents ----

def _pubmed_document(shared_data, chars: int) -> str:
    """Real abstracts joined with single spaces into one document of about `chars` characters."""
    lines = (shared_data / "corpora" / "en-biomed" / "pubmed-abstracts-1mb.txt").read_text().splitlines()
    text = " ".join(lines)
    return (text * (chars // len(text) + 1))[:chars].strip()


# Prepares a small file (imports done, tokenizer loaded), then the long one; prints by how many MB
# the peak resident memory grew during the second.
_PEAK_GROWTH = """
import resource, sys
from pathlib import Path
from detour.data.prepare import prepare
from detour.data.sources import parse_source
folder, tokenizer = Path(sys.argv[1]), sys.argv[2]
prepare([(parse_source(str(folder / "small.txt")), None)], tokenizer, folder / "small")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prepare([(parse_source(str(folder / "long.txt")), None)], tokenizer, folder / "out")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_long_document_is_tokenized_in_pieces_with_exactly_the_ids_of_the_whole(minilm, shared_data, tmp_path):
    import subprocess
    import sys

    from detour.data.prepare import CUT_CHARS, _Encoder
    from detour.data.tokenize import separator_policy

    doc = _pubmed_document(shared_data, 2_000_000)
    (tmp_path / "small.txt").write_text("A short note.\n")
    (tmp_path / "long.txt").write_text(f"Short note.\n{doc}\nAnother short note.\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", _PEAK_GROWTH, str(tmp_path), str(minilm)],
                         capture_output=True, text=True, check=True)
    # in one piece the tokenizer takes about 140 bytes a character: 311 MB measured here, 46 MB in pieces
    assert int(run.stdout.split()[-1]) < 150 and "warning" not in run.stderr
    tok = load_tokenizer(str(minilm))
    pieces, why = _Encoder(tok, separator_policy(tok)).cut(doc)
    assert why is None and len(pieces) == 8 and max(map(len, pieces)) < CUT_CHARS and "".join(pieces) == doc
    corpus = open_prepared(tmp_path / "out")[0][0]
    assert corpus.num_documents == 3
    assert corpus.document(1).tolist() == tok(doc, verbose=False)["input_ids"]
    assert corpus.document(2).tolist() == tok("Another short note.")["input_ids"]


def _trained_tokenizer(folder, kind: str, texts: list[str]):
    """A small real tokenizer of another family than MiniLM's WordPiece, trained on `texts`."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<pad>", "<unk>"]
    if kind == "unigram":  # SentencePiece style: NFKC, lower case, Metaspace, EOS appended by prepare
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=800, special_tokens=specials, unk_token="<unk>"))
    else:  # RoBERTa / ModernBERT style byte-level BPE
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=800, special_tokens=specials))
        tok.post_processor = processors.RobertaProcessing(("</s>", 1), ("<s>", 0))
        tok.add_tokens([AddedToken("blood pressure")])  # an added token with a space inside: never cut there
        if kind == "strip":  # strips each text: a cut before a space would lose it, so nothing is cut
            tok.normalizer = normalizers.Strip()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind, cut", [("bytelevel", True), ("unigram", True), ("strip", False)])
def test_cuts_keep_the_ids_of_other_tokenizer_families(shared_data, tmp_path, monkeypatch, capsys, kind, cut):
    import detour.data.encoder as encoder_module
    import detour.data.prepare as prepare_module
    from detour.data.tokenize import separator_policy

    monkeypatch.setattr(encoder_module, "CUT_CHARS", 4_000)  # many cuts in a small document
    monkeypatch.setattr(encoder_module, "PIECE_CHARS", 1_500)
    doc = " ".join([_pubmed_document(shared_data, 40_000), "Tension: blood pressure 120/80,  fièvre ΑΣ ﬁn."] * 2)
    tok_dir = _trained_tokenizer(tmp_path / "tok", kind, doc.split(". "))
    f = tmp_path / "doc.txt"
    f.write_text(doc + "\n", encoding="utf-8")
    manifest = prepare_sources([str(f)], tok_dir, tmp_path / "out", workers=2)
    tok = load_tokenizer(str(tok_dir))
    policy = separator_policy(tok)
    pieces, _ = prepare_module._Encoder(tok, policy).cut(doc)
    assert (len(pieces) > 20) is cut
    whole = tok(doc)["input_ids"] + (policy["suffix_ids"] if policy["append_eos"] else [])
    assert open_prepared(tmp_path / "out")[0][0].document(0).tolist() == whole
    assert manifest["tokens"] == len(whole)
    assert ("tokenized in one piece" in capsys.readouterr().err) is not cut


def test_a_document_that_cannot_be_cut_is_announced_with_its_line(minilm, tmp_path, capsys):
    f = tmp_path / "blob.txt"
    f.write_text("A short note.\n" + "x" * 1_100_000 + "\nThe end.\n")
    assert main(["prepare", str(f), "--tokenizer", str(minilm), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {f}:2: a document of 1,100,000 characters is tokenized in one piece" in err
    assert "0.1 GiB of memory" in err
    tok = load_tokenizer(str(minilm))
    assert open_prepared(tmp_path / "out")[0][0].document(1).tolist() == [tok.cls_token_id, tok.unk_token_id,
                                                                            tok.sep_token_id]


def test_prepare_into_a_full_filesystem_says_no_space_and_the_rerun_succeeds(shared_data, minilm, small_filesystem_of,
                                                                              capsys):
    disk = small_filesystem_of("128k")  # the PubMed sample's ~200k token ids (uint16) do not fit
    out = disk / "data"
    argv = ["prepare", str(shared_data / "corpora" / "en-biomed" / "pubmed-abstracts-1mb.txt"), "--tokenizer",
            str(minilm), "--out", str(out), "--workers", "1"]
    assert main(argv) == 2  # a DetourError: one message, no traceback
    said = capsys.readouterr().err.strip().splitlines()[-1]
    print(said)
    assert "No space left on device" in said and "are free there" in said
    assert list(disk.iterdir()) == []  # nothing half-written that a rerun would trust
    disk.grow("8m")
    assert main(argv) == 0
    assert sum(corpus.num_tokens for corpus, _ in open_prepared(out)) > 100_000


# -- the held-out split (--validation) --------------------------------------------------------------


def _documents(folder) -> list[bytes]:
    return [c.document(i).astype("<i8").tobytes() for c, _ in open_prepared(folder) for i in range(len(c))]


def test_validation_split_is_document_disjoint_seeded_and_never_in_the_training_stream(minilm, tmp_path, capsys):
    from detour.data.packing import PackedStream

    sources = ["synthetic:clinical?docs=60&seed=1", "synthetic:clinical?docs=30&seed=2&lang=fr"]
    whole = tmp_path / "whole"
    assert main(["prepare", *sources, "--tokenizer", str(minilm), "--out", str(whole), "--workers", "1"]) == 0
    split = tmp_path / "split"
    assert main(["prepare", *sources, "--tokenizer", str(minilm), "--out", str(split), "--workers", "1",
                 "--validation", "0.1"]) == 0
    assert "held out 9 documents" in capsys.readouterr().out
    manifest = json.loads((split / "manifest.json").read_text())
    held = manifest["validation"]
    assert (held["documents"], held["path"], held["requested"], held["seed"]) == (9, "validation", 0.1, 0)
    assert [s["documents"] for s in manifest["sources"]] == [54, 27]  # round(0.1 x 60), round(0.1 x 30) held out
    trained, kept = _documents(split), _documents(split / "validation")
    assert len(kept) == 9 and held["tokens"] == sum(len(d) // 8 for d in kept)
    assert not set(trained) & set(kept)  # no held-out document is a training document
    assert sorted(trained + kept) == sorted(_documents(whole))  # and together they are the whole corpus
    # The training stream reads the training sources only: an epoch of it holds exactly their tokens.
    stream = PackedStream.from_paths([(str(split), None)], seq_len=64, seed=42)
    assert stream.total_tokens == manifest["tokens"] == sum(len(d) // 8 for d in trained)
    epoch = np.concatenate([stream.next_sequence().input_ids for _ in range(manifest["tokens"] // 64)])
    on_disk = np.bincount(np.frombuffer(b"".join(trained), "<i8"), minlength=30522)
    assert (np.bincount(epoch, minlength=30522) <= on_disk).all()  # every token taken from a training document
    # the validation folder is a prepared folder of its own, with the same sources and tokenizer
    assert [c.name for c, _ in open_prepared(split / "validation")] == [s["name"] for s in manifest["sources"]]
    assert prepared_fingerprint(split / "validation") == prepared_fingerprint(split)
    # seeded: the same command draws the same documents, another seed others; a count is per source
    again = tmp_path / "again"
    main(["prepare", *sources, "--tokenizer", str(minilm), "--out", str(again), "--workers", "1", "--validation", "0.1"])
    assert json.loads((again / "manifest.json").read_text())["validation"]["hash"] == held["hash"]
    other = tmp_path / "other"
    main(["prepare", *sources, "--tokenizer", str(minilm), "--out", str(other), "--workers", "1",
          "--validation", "5", "--validation-seed", "3"])
    counted = json.loads((other / "manifest.json").read_text())
    assert counted["validation"]["documents"] == 10 and counted["validation"]["hash"] != held["hash"]
    # --overwrite replaces a prepared folder that holds a split: all of it is prepare's own
    assert main(["prepare", *sources, "--tokenizer", str(minilm), "--out", str(other), "--workers", "1",
                 "--overwrite"]) == 0
    assert not (other / "validation").exists() and "validation" not in json.loads((other / "manifest.json").read_text())


@pytest.mark.parametrize("value", ["0", "1.5", "-3", "1.0", "two"])
def test_validation_amount_that_is_no_fraction_or_count_exits_2(minilm, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["prepare", "synthetic:clinical?docs=10&seed=0", "--tokenizer", str(minilm), "--out", str(tmp_path / "d"),
              "--validation", value])
    assert exc.value.code == 2 and "--validation" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_validation_that_leaves_no_training_document_is_refused(minilm, tmp_path, capsys):
    assert main(["prepare", "synthetic:clinical?docs=10&seed=0", "--tokenizer", str(minilm),
                 "--out", str(tmp_path / "d"), "--validation", "10"]) != 0
    assert "at least one must stay for training" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob("d.tmp-*"))


def _files(folder):
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_prepared_corpus_is_linked_into_another_folder_whole_and_never_over_a_users_folder(minilm, tmp_path,
                                                                                              monkeypatch):
    from detour.data.outfolder import link_prepared

    source = tmp_path / "a" / "data" / "corpus"
    assert main(["prepare", "synthetic:clinical?docs=40&seed=5", "--tokenizer", str(minilm), "--out", str(source),
                 "--validation", "4"]) == 0
    out = tmp_path / "b" / "data" / "corpus"
    link_prepared(source, out)
    theirs, mine = _files(source), _files(out)
    assert list(mine) == list(theirs) and "validation/manifest.json" in mine
    # the same files, not copies: nothing tokenized or stored twice
    assert all(mine[name].stat().st_ino == theirs[name].stat().st_ino for name in mine)
    assert [c.manifest for c, _ in open_prepared(out)] == [c.manifest for c, _ in open_prepared(source)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["corpus"]  # no staging folder left

    # a filesystem that cannot link: copied, the same bytes
    copied = tmp_path / "c" / "corpus"

    def no_links(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("detour.data.outfolder.os.link", no_links)
    link_prepared(source, copied)
    assert {n: p.read_bytes() for n, p in _files(copied).items()} == {n: p.read_bytes() for n, p in theirs.items()}
    assert all(_files(copied)[n].stat().st_ino != theirs[n].stat().st_ino for n in theirs)

    # a stop half-way leaves no staging folder and the earlier corpus at `out` in place
    calls = []

    def fails_on_the_third(src, dst):
        calls.append(src)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return shutil.copy2(src, dst)

    before = {n: p.read_bytes() for n, p in _files(copied).items()}
    monkeypatch.setattr("detour.data.outfolder.shutil.copy2", fails_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        link_prepared(source, copied)
    monkeypatch.undo()
    assert sorted(p.name for p in copied.parent.iterdir()) == ["corpus"]
    assert {n: p.read_bytes() for n, p in _files(copied).items()} == before

    # a folder of the user's at `out` is never replaced, and a folder that is no prepared corpus is not linked
    users = tmp_path / "d" / "corpus"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine\n")
    linked = []
    monkeypatch.setattr("detour.data.outfolder.os.link", lambda *a: linked.append(a))
    with pytest.raises(DetourError, match="is not the output of `detour prepare`"):
        link_prepared(source, users)
    assert [p.name for p in users.iterdir()] == ["notes.txt"] and linked == []  # refused before any file moved
    monkeypatch.undo()
    with pytest.raises(DetourError, match="not a prepared corpus"):
        link_prepared(users, tmp_path / "e" / "corpus")
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())
