"""BRAT reader: nested, overlapping and discontinuous entities, notes, skipped lines, CRLF, real files."""

from __future__ import annotations

import pytest

from detour.errors import DetourError
from detour.eval.brat import line_examples, read_document, read_folder
from detour.eval.formats import read_split
from detour.eval.tasks import load_spec

TEXT = "Douleurs intenses et chroniques.\r\nPas de fievre, pas de toux.\r\n"
ANN = (
    "T1\tDISO 0 17\tDouleurs intenses\r\n"
    "T2\tDISO 0 8\tDouleurs\r\n"  # nested in T1
    "T3\tDISO 0 8;21 31\tDouleurs chroniques\r\n"  # discontinuous: full extent 0-31
    "T4\tPHYS 9 31\tintenses et chroniques\r\n"  # overlaps T1 without nesting
    "#1\tAnnotatorNotes T1\tC0278140\r\n"
    "#2\tAnnotatorNotes T3\tC0150055\r\n"
    "E1\tDISO:T1\r\n"
    "A1\tNegation E1\r\n"
    "R1\tOVERLAP Arg1:T1 Arg2:T4\r\n"
    "\r\n"
    "T5\tDISO 41 47\tfievre\r\n"
    "T6\tDISO 56 60\ttoux\r\n"
)


@pytest.fixture
def doc_folder(tmp_path):
    (tmp_path / "d1.txt").write_bytes(TEXT.encode("utf-8"))
    (tmp_path / "d1.ann").write_bytes(ANN.encode("utf-8"))
    (tmp_path / "d2.txt").write_text("No annotation file here.\n", encoding="utf-8")
    return tmp_path


def test_reads_nested_overlapping_discontinuous_and_notes(doc_folder):
    doc = read_document(doc_folder / "d1.txt")
    by_id = {e.id: e for e in doc.entities}
    assert len(doc.entities) == 6
    assert (by_id["T3"].start, by_id["T3"].end) == (0, 31) and by_id["T3"].discontinuous
    assert by_id["T3"].fragments == [(0, 8), (21, 31)]
    assert by_id["T1"].notes == ["C0278140"] and by_id["T3"].notes == ["C0150055"] and by_id["T2"].notes == []
    assert doc.skipped == {"event": 1, "attribute": 1, "relation": 1}
    for e in doc.entities:  # offsets count the \r of CRLF lines, as BRAT does
        if not e.discontinuous:
            assert doc.text[e.start:e.end] == e.text


def test_lines_become_examples_with_relative_offsets(doc_folder):
    examples, lost = line_examples(read_document(doc_folder / "d1.txt"))
    assert [ex["text"] for ex in examples] == ["Douleurs intenses et chroniques.", "Pas de fievre, pas de toux."]
    first, second = examples
    assert first["entities"] == [(0, 8, "DISO"), (0, 17, "DISO"), (0, 31, "DISO"), (9, 31, "PHYS")]
    assert second["entities"] == [(7, 13, "DISO"), (22, 26, "DISO")]
    assert second["tokens"][:3] == ["Pas", "de", "fievre"] and second["word_spans"][2] == (7, 13)
    assert second["offset"] == 34 and all(ex["doc"] == "d1" for ex in examples)
    assert lost["crossing a line break"] == 0 and lost["boundary inside a word"] == 0
    assert read_folder(doc_folder)[1].entities == []  # a .txt without .ann


def test_entities_that_no_word_span_can_hold_are_counted(tmp_path):
    (tmp_path / "a.txt").write_text("a nonsmoker\nline two\n", encoding="utf-8")
    (tmp_path / "a.ann").write_text("T1\tStatus 2 5\tnon\nT2\tX 2 16\tnonsmoker line\n", encoding="utf-8")
    examples, lost = line_examples(read_document(tmp_path / "a.txt"))
    assert lost == {"boundary inside a word": 1, "crossing a line break": 1}
    assert examples[0]["entities"] == [(2, 5, "Status")]  # kept in gold: the scorer counts it as a miss


@pytest.mark.parametrize("ann, message", [
    ("T1\tDISO 0 x\tfoo\n", "a.ann:1: bad offsets"),
    ("T1\tDISO 5 50\tfoo\n", "a.ann:1: fragment 5-50 is empty or outside the text"),
    ("T1 DISO 0 3 foo\n", "a.ann:1: a text-bound line"),
    ("T1\tDISO 0 3\tfoo\nQ1\tsomething\n", "a.ann:2: unknown BRAT annotation line"),
])
def test_malformed_lines_name_file_and_line(tmp_path, ann, message):
    (tmp_path / "a.txt").write_text("some text here\n", encoding="utf-8")
    (tmp_path / "a.ann").write_text(ann, encoding="utf-8")
    with pytest.raises(DetourError, match=message):
        read_document(tmp_path / "a.txt")


def test_real_quaero_file(shared_data):
    doc = read_document(shared_data / "tasks/fr/quaero-emea/train/318.txt")
    by_id = {e.id: e for e in doc.entities}
    assert (by_id["T14"].type, by_id["T14"].fragments) == ("DISO", [(285, 293), (305, 315)])
    assert (by_id["T14"].start, by_id["T14"].end) == (285, 315) and by_id["T14"].notes == ["C0150055"]
    assert doc.text[285:302] == "douleurs intenses"  # T12, with T13 "douleurs" nested inside
    assert all(len(e.notes) == 1 for e in doc.entities)


def test_shipped_specs_read_their_folders(shared_data):
    quaero = read_split(load_spec("quaero-emea", shared_data), "test")
    assert {t for ex in quaero for _, _, t in ex["entities"]} <= set(load_spec("quaero-emea", shared_data).labels)
    assert sum(len(ex["entities"]) for ex in quaero) == 2200  # 2,204 T lines, 4 duplicates of (span, type)
    social = read_split(load_spec("social-history", shared_data), "validation")
    assert len({ex["doc"] for ex in social}) == 73
    nested = sum(1 for ex in social for a in ex["entities"] for b in ex["entities"]
                 if a != b and a[0] <= b[0] and b[1] <= a[1])
    assert nested > 100  # overlapping spans are kept, not flattened


def test_brat_nested_warns_about_entities_it_cannot_hold(tmp_path, capsys):
    from detour.eval.brat import read_brat_nested
    from detour.eval.tasks import TaskSpec

    (tmp_path / "a.txt").write_text("a nonsmoker\nline two\n", encoding="utf-8")
    (tmp_path / "a.ann").write_text("T1\tStatus 2 5\tnon\nT2\tX 2 16\tnonsmoker line\nT3\tX 12 16\tline\n",
                                    encoding="utf-8")
    spec = TaskSpec(name="sh", type="nested_ner", format="brat_nested", data={"train": "x", "test": "y"})
    examples = read_brat_nested(tmp_path, spec, split="validation")
    assert [e for ex in examples for e in ex["entities"]] == [(2, 5, "Status"), (0, 4, "X")]
    assert ("WARNING: task sh, validation: of 3 gold entities, 1 (33.3%) cross a line break and are left out of gold; "
            "1 (33.3%) have a boundary inside a word and stay in gold as misses") in capsys.readouterr().err


def test_brat_configuration_and_caches_are_named_once_not_read(doc_folder, capsys, monkeypatch):
    from detour import notices

    monkeypatch.setattr(notices, "_warned", set())
    (doc_folder / "annotation.conf").write_text("[entities]\nDISO\n")
    (doc_folder / ".stats_cache").write_bytes(b"\x80\x04cache")
    docs = read_folder(doc_folder)
    read_folder(doc_folder)  # read again (another split, another model): said once
    err = capsys.readouterr().err
    assert err.count("WARNING:") == 1 and "2 file(s) that are not .txt/.ann documents were not read" in err
    assert ".stats_cache, annotation.conf" in err
    assert [d.id for d in docs] == [p.stem for p in sorted(doc_folder.glob("*.txt"))]


def test_a_span_whose_text_differs_from_the_text_at_its_offsets_is_named(tmp_path, capsys):
    (tmp_path / "d.txt").write_text("The patient lives in the State of Maryland.\n", encoding="utf-8")
    (tmp_path / "d.ann").write_text("T1\tLoc 25 42\tStatus of Maryland\nT2\tLoc 0 3\tThe\nT3\tLoc 4 11\tpatients\n",
                                    encoding="utf-8")
    doc = read_document(tmp_path / "d.txt")
    err = capsys.readouterr().err
    assert (f"{tmp_path / 'd.ann'}:1: the span text 'Status of Maryland' differs from the text at its offsets, "
            "'State of Maryland' (and 1 more in this file); the offsets are used") in err
    assert [(e.start, e.end) for e in doc.entities] == [(25, 42), (0, 3), (4, 11)]
