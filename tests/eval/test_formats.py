"""Readers on small slices of the real task files: CRLF, headers or none, -DOCSTART-, HoC's label
lines, FRACCO's note lines, space-separated E3C, BRAT flat entities, a saved HF dataset."""

import shutil

import pytest

from detour.errors import DetourError
from detour.eval.formats import read_brat_doc_codes, read_brat_entities, read_hf, read_hoc, read_iob, read_tsv
from detour.eval.tasks import TaskSpec


def spec(**kw):
    base = dict(name="t", type="classification", format="tsv", data={"train": "x", "test": "y"})
    base.update(kw)
    return TaskSpec(**base)


def head_lines(src, dst, n):
    with open(src, "rb") as fh:
        dst.write_bytes(b"".join(fh.readline() for _ in range(n)))
    return dst


def test_iob_skips_docstart_and_groups_documents(shared_data, tmp_path):
    f = head_lines(shared_data / "tasks/en/jnlpba/devel.tsv", tmp_path / "j.tsv", 400)
    exs = read_iob(f, spec(type="ner", format="iob"))
    assert all("-DOCSTART-" not in ex["tokens"] for ex in exs)
    assert exs[0]["tokens"][:3] == ["Disruption", "of", "the"]
    assert exs[0]["tags"][3:6] == ["B-DNA", "I-DNA", "I-DNA"]
    assert len({ex["doc"] for ex in exs}) >= 2  # -DOCSTART- starts a new document
    assert all(len(ex["tokens"]) == len(ex["tags"]) for ex in exs)


def test_iob_space_separated_and_crlf(shared_data, tmp_path):
    f = head_lines(shared_data / "tasks/fr/e3c-layer1/train.txt", tmp_path / "e.txt", 200)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(f.read_bytes().replace(b"\n", b"\r\n"))
    a, b = read_iob(f, spec(type="ner", format="iob")), read_iob(crlf, spec(type="ner", format="iob"))
    assert a == b and a[0]["tokens"][:3] == ["Nous", "rapportons", "l'"]
    assert {t for ex in a for t in ex["tags"]} <= {"O", "B-ety", "I-ety"}
    assert [ex["doc"] for ex in a] == list(range(len(a)))  # no markers: each sentence is a unit


def test_iob_bad_tag_names_line(tmp_path):
    f = tmp_path / "bad.tsv"
    f.write_text("a\tO\nb\tDisease\n")
    with pytest.raises(DetourError, match=r"bad.tsv:2"):
        read_iob(f, spec(type="ner", format="iob"))


def test_tsv_header_detection_gad(shared_data, tmp_path):
    train = read_tsv(head_lines(shared_data / "tasks/en/gad/train.tsv", tmp_path / "tr.tsv", 5), spec())
    test = read_tsv(head_lines(shared_data / "tasks/en/gad/test.tsv", tmp_path / "te.tsv", 5), spec())
    assert len(train) == 5 and train[0]["label"] == "1" and train[0]["text"].startswith("this study proposes")
    assert len(test) == 4 and test[0]["text"].startswith("These results suggest")  # header row dropped
    assert test[0]["label"] == "1"


def test_tsv_crlf_header_chemprot(shared_data, tmp_path):
    exs = read_tsv(head_lines(shared_data / "tasks/en/chemprot/test.tsv", tmp_path / "c.tsv", 4), spec(type="relation"))
    assert [ex["label"] for ex in exs] == ["False", "CPR:9", "CPR:9"]
    assert "BC6ENTG" in exs[0]["text"] and not exs[0]["text"].endswith("\r")


def test_hoc_label_lines(shared_data, tmp_path):
    for sub in ("text", "labels"):
        (tmp_path / sub).mkdir()
        shutil.copy(shared_data / "tasks/en/hoc" / sub / "11724768.txt", tmp_path / sub)
    exs = read_hoc(tmp_path, spec(type="multilabel", format="hoc"))
    assert len(exs) == 6 and {ex["doc"] for ex in exs} == {"11724768"}
    # the label line is "< < < <A--x ANDA--y--z< < ": sentence 4 has two subclasses of one hallmark
    assert [ex["labels"] for ex in exs] == [["none"]] * 3 + [["Sustaining proliferative signaling"]] + [["none"]] * 2
    assert all(lab != "NULL" for ex in exs for lab in ex["labels"])


def test_hoc_and_without_space_splits_labels(tmp_path):
    (tmp_path / "text").mkdir(), (tmp_path / "labels").mkdir()
    (tmp_path / "text/1.txt").write_text("s1\ns2\n")
    (tmp_path / "labels/1.txt").write_text("<A--x ANDB--y<NULL")
    exs = read_hoc(tmp_path, spec(type="multilabel", format="hoc"))
    assert [ex["labels"] for ex in exs] == [["A", "B"], ["none"]]


def test_fracco_note_lines_and_document_without_ann(shared_data, tmp_path):
    src = shared_data / "tasks/fr/fracco/brat"
    for name in ("cc_onco1.txt", "cc_onco1.ann", "cc_onco853.txt"):
        shutil.copy(src / name, tmp_path)
    exs = read_brat_doc_codes(tmp_path, spec(type="multilabel", format="brat_doc_codes"))
    assert [ex["doc"] for ex in exs] == ["cc_onco1"]  # cc_onco853 has no .ann: no label, dropped
    labels = exs[0]["labels"]
    # T2 expression_CIM carries "C77.1 8000/1"; T3 (topographie, "C77.1") is not an expression_CIM
    assert "C77.1 8000/1" in labels and "C77.1" not in labels
    top1 = read_brat_doc_codes(tmp_path, spec(type="multilabel", format="brat_doc_codes", options={"top_k": 1}))
    assert len(top1[0]["labels"]) == 1


def test_fracco_multi_expression_note(tmp_path):
    (tmp_path / "d.txt").write_text("abc def")
    (tmp_path / "d.ann").write_text("T1\texpression_CIM 0 3\tabc\n#1\tICD-O T1\tC47.9 8000/1;C49.9  8000/1\r\n")
    exs = read_brat_doc_codes(tmp_path, spec(type="multilabel", format="brat_doc_codes"))
    assert exs[0]["labels"] == ["C47.9 8000/1", "C49.9 8000/1"]


def test_brat_flat_entities(tmp_path):
    (tmp_path / "a.txt").write_text("Smokes two packs daily.\nNo alcohol.")
    (tmp_path / "a.ann").write_text("T1\tTobacco 0 6\tSmokes\nT2\tAmount 7 16\ttwo packs\nT3\tAlcohol 27 34\talcohol\n"
                                    "T4\tAmount 7 10\ttwo\n")
    exs = read_brat_entities(tmp_path, spec(type="ner", format="brat_entities"))
    assert exs[0]["tokens"] == ["Smokes", "two", "packs", "daily", "."]
    assert exs[0]["tags"] == ["B-Tobacco", "B-Amount", "I-Amount", "O", "O"]  # longest overlapping span wins
    assert exs[1]["tags"] == ["O", "B-Alcohol", "O"]


def test_hf_saved_dataset_with_classlabels(tmp_path):
    import datasets

    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}, features=feats)})
    ds.save_to_disk(str(tmp_path / "ds"))
    exs = read_hf(tmp_path / "ds", spec(format="hf"), split="train")
    assert [(e["text"], e["label"]) for e in exs] == [("a", "neg"), ("b", "pos")]


def test_jsonl_text_multilabel_and_tokens(tmp_path):
    from detour.eval.formats import read_jsonl

    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "a", "label": "x", "doc": "p1"}\r\n\r\n{"text": "b", "label": ["x", "y"]}\n'
                 '{"tokens": ["c", "d"], "tags": ["B-T", "O"]}\n')
    a, b, c = read_jsonl(f, spec(format="jsonl"))
    assert a == {"text": "a", "label": "x", "doc": "p1"} and b["labels"] == ["x", "y"]
    assert c["tokens"] == ["c", "d"] and c["tags"] == ["B-T", "O"]
    f.write_text('{"text": "a"}\n')
    with pytest.raises(DetourError, match=r"d.jsonl:1: missing field"):
        read_jsonl(f, spec(format="jsonl"))


def test_csv_quoted_fields_and_declared_columns(tmp_path):
    from detour.eval.formats import read_csv

    f = tmp_path / "d.csv"
    f.write_text('42,"fever, cough",infection\r\n43,"arm ""broken""",trauma\r\n')
    exs = read_csv(f, spec(format="csv", options={"header": False, "text_column": 1, "label_column": 2, "doc_column": 0}))
    assert [(e["text"], e["label"], e["doc"]) for e in exs] == [("fever, cough", "infection", "42"), ('arm "broken"', "trauma", "43")]


def test_iob_orphan_inside_tags_are_read_as_openers_with_a_count(tmp_path, capsys):
    f = tmp_path / "orphans.iob"
    # line 2: I-Drug after O; line 5: I-Dose after B-Drug (another type); line 8: first tag of a sentence
    f.write_text("took\tO\naspirin\tI-Drug\nand\tO\nheparin\tB-Drug\n5mg\tI-Dose\n.\tO\n\nwarfarin\tI-Drug\n"
                 "sodium\tI-Drug\n")
    exs = read_iob(f, spec(type="ner", format="iob"), split="train")
    assert exs[0]["tags"] == ["O", "B-Drug", "O", "B-Drug", "B-Dose", "O"]
    assert exs[1]["tags"] == ["B-Drug", "I-Drug"]  # the I- after the repaired opener continues it
    err = capsys.readouterr().err
    assert f"WARNING: task t, train: 3 orphan I-/E- tag(s)" in err and f"first at {f}:2;" in err
    with pytest.raises(DetourError, match=r"orphans.iob:2: orphan tag 'I-Drug'"):
        read_iob(f, spec(type="ner", format="iob", options={"strict_tags": True}))


def test_iobes_orphan_end_becomes_single_and_scores_are_unchanged(tmp_path):
    from detour.eval.formats import repair_orphans
    from detour.eval.metrics import spans_from_tags

    tags = ["E-X", "O", "B-X", "E-X", "I-X", "S-Y", "E-Y"]
    fixed, repaired = repair_orphans(tags)
    assert fixed == ["S-X", "O", "B-X", "E-X", "B-X", "S-Y", "S-Y"] and repaired == [0, 4, 6]
    assert spans_from_tags(fixed) == spans_from_tags(tags)  # the scorer already read them so


def test_iob_line_with_more_columns_than_the_spec_names_the_line(tmp_path):
    f = tmp_path / "conll.txt"
    f.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    with pytest.raises(DetourError, match=r"conll.txt:3: 4 column\(s\), the spec reads 2 \(options.columns"):
        read_iob(f, spec(type="ner", format="iob"))
    exs = read_iob(f, spec(type="ner", format="iob", options={"columns": 4}))
    assert exs == [{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"], "doc": 1}]  # token first, tag last
    f.write_text("EU\tB-ORG\t \nrejects\tO\tO\n")  # trailing blanks are not a column, a third field is
    with pytest.raises(DetourError, match=r"conll.txt:2: 3 column\(s\)"):
        read_iob(f, spec(type="ner", format="iob"))
    with pytest.raises(DetourError, match=r"options.columns must be an integer >= 2"):
        read_iob(f, spec(type="ner", format="iob", options={"columns": "3"}))


def test_table_row_with_a_stray_column_names_the_line(tmp_path):
    f = tmp_path / "d.tsv"
    f.write_text("sentence\tlabel\nfine row\t1\nrow with a\tstray tab\t0\n")
    with pytest.raises(DetourError, match=r"d.tsv:3: expected 2 columns, got 3"):
        read_tsv(f, spec())


def test_jsonl_token_records_are_checked_like_iob(tmp_path, capsys):
    from detour.eval.formats import read_jsonl

    f = tmp_path / "t.jsonl"
    f.write_text('{"tokens": ["a", "b"], "tags": ["O", "I-X"]}\n')
    assert read_jsonl(f, spec(type="ner", format="jsonl"), split="test")[0]["tags"] == ["O", "B-X"]
    assert f"1 orphan I-/E- tag(s) (no B- or I- of the same type just before) read as B-/S-, first at {f}:1 (token 1)" \
        in capsys.readouterr().err
    f.write_text('{"tokens": ["a", "b"], "tags": ["O"]}\n')
    with pytest.raises(DetourError, match=r"t.jsonl:1: 2 tokens but 1 tags"):
        read_jsonl(f, spec(type="ner", format="jsonl"))
    f.write_text('{"tokens": ["a"], "tags": ["Disease"]}\n')
    with pytest.raises(DetourError, match=r"t.jsonl:1: tag 'Disease' is not O"):
        read_jsonl(f, spec(type="ner", format="jsonl"))


def test_brat_flat_entities_reports_the_gold_entities_it_drops(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("Smokes two packs daily.\nNo alcohol, a nonsmoker.")
    (tmp_path / "a.ann").write_text("T1\tTobacco 0 6\tSmokes\nT2\tAmount 7 16\ttwo packs\nT3\tAlcohol 27 34\talcohol\n"
                                    "T4\tAmount 7 10\ttwo\nT5\tStatus 38 41\tnon\nT6\tAmount 7 16\ttwo packs\n")
    read_brat_entities(tmp_path, spec(type="ner", format="brat_entities"), split="train")
    err = capsys.readouterr().err
    # 5 distinct entities (T6 repeats T2): T4 is inside T2, T5 ends inside "nonsmoker"
    assert ("WARNING: task t, train: brat_entities keeps 3 of 5 gold entities; 2 (40.0%) are not in its flat tags: "
            "1 overlap a longer or earlier entity, 1 have a boundary inside a word or cross a line. Format brat_nested") in err
    (tmp_path / "a.ann").write_text("T1\tTobacco 0 6\tSmokes\n")
    read_brat_entities(tmp_path, spec(type="ner", format="brat_entities"), split="test")
    assert "WARNING" not in capsys.readouterr().err  # nothing dropped, nothing said


def test_brat_flat_entities_crlf_offsets_count_the_carriage_return(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"No fever.\r\nSmokes daily.\r\n")
    (tmp_path / "a.ann").write_bytes(b"T1\tTobacco 11 17\tSmokes\r\n")  # BRAT counts the \r before "Smokes"
    exs = read_brat_entities(tmp_path, spec(type="ner", format="brat_entities"))
    assert exs[1]["tokens"] == ["Smokes", "daily", "."] and exs[1]["tags"] == ["B-Tobacco", "O", "O"]
