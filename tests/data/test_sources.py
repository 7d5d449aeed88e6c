"""Source syntax and the readers' handling of bad input: a DetourError naming the file and line."""

import pytest

from detour.cli import main
from detour.data.sources import document_location, iter_documents, iter_texts, parse_source
from detour.errors import DetourError


def test_weights_synthetic_options_and_ambiguous_paths(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text('{"text": "x"}\n')
    assert parse_source(str(f)).weight is None
    assert parse_source(f"{f}:0.25").weight == 0.25
    src = parse_source("synthetic:clinical?docs=7&seed=3&lang=fr:2")
    assert (src.kind, src.weight, src.options) == ("synthetic", 2.0, {"docs": 7, "seed": 3, "lang": "fr"})
    assert parse_source("synthetic:clinical").options == {"docs": 3000, "seed": 0, "lang": "en"}
    odd = tmp_path / "notes.txt:3"  # an existing file whose name ends like a weight is the file itself
    odd.write_text("hello\n")
    with pytest.raises(DetourError, match=r"unsupported file type '\.txt:3'"):
        parse_source(str(odd))
    for bad, match in [(f"{f}:0", "positive"), (f"{f}:-1", "positive"),
                       ("synthetic:clinical?docs=x", "integers"), ("synthetic:poems", "unknown synthetic"),
                       ("synthetic:clinical?pages=3", "unknown option")]:
        with pytest.raises(DetourError, match=match):
            parse_source(bad)


def test_text_one_per_line_and_blank_line_documents(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("first doc\nsecond doc\n\n  \nthird\r\nlast, no newline", encoding="utf-8")
    assert list(iter_texts(parse_source(str(f)))) == ["first doc", "second doc", "", "  ", "third", "last, no newline"]
    assert list(iter_texts(parse_source(str(f), blank_line_docs=True))) == [
        "first doc\nsecond doc", "third\nlast, no newline"]


def test_jsonl_text_field_and_null(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"body": "é café"}\n\n{"body": null}\n', encoding="utf-8")
    assert list(iter_texts(parse_source(str(f), text_field="body"))) == ["é café", None]


def test_each_document_says_where_it_starts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    txt = tmp_path / "c.txt"
    txt.write_text("a\n\nb one\nb two\n\n\nc\n", encoding="utf-8")
    lines = parse_source(str(txt))
    assert [n for n, _ in iter_documents(lines)] == [1, 2, 3, 4, 5, 6, 7]
    assert document_location(lines, 7) == f"{txt}:7"
    blocks = parse_source(str(txt), blank_line_docs=True)
    assert [(document_location(blocks, n), t) for n, t in iter_documents(blocks)] == [
        (f"{txt}:1", "a"), (f"{txt}:3", "b one\nb two"), (f"{txt}:7", "c")]
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"text": "x"}\n\n{"text": "y"}\n', encoding="utf-8")
    assert [n for n, _ in iter_documents(parse_source(str(jl)))] == [1, 3]  # blank lines are not records
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["p", "q", "r"]}), pqf)
    src = parse_source(str(pqf))
    assert [(document_location(src, n), t) for n, t in iter_documents(src)][2] == (f"{pqf}: row 2", "r")


@pytest.mark.parametrize("content, match", [
    (b'{"text": "ok"}\n{"text": "broken"\n', r"bad\.jsonl:2: malformed JSON"),
    (b'{"text": "ok"}\n{"text": "ok"}\n{"body": "no text"}\n', r"bad\.jsonl:3: no field 'text' \(fields: body"),
    (b'{"text": "ok"}\n[1, 2]\n', r"bad\.jsonl:2: expected a JSON object"),
    (b'{"text": 12}\n', r"bad\.jsonl:1: field 'text' is int"),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r"bad\.jsonl:2: not valid UTF-8 \(byte 0xe9"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    with pytest.raises(DetourError, match=match):
        list(iter_texts(parse_source(str(f))))


def test_non_utf8_text_file_names_the_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("ligne un\nligne deux\nfi\u00e8vre\n".encode("latin-1"))
    with pytest.raises(DetourError, match=r"latin1\.txt:3: not valid UTF-8"):
        list(iter_texts(parse_source(str(f))))


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(DetourError, match=r"nope\.jsonl: no such file"):
        parse_source(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DetourError, match="unsupported file type '.csv'"):
        parse_source(str(tmp_path / "x.csv"))
    with pytest.raises(DetourError, match="save_to_disk"):
        parse_source(str(tmp_path))


def test_parquet_missing_or_wrong_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["a", "b"], "n": [1, 2]}), f)
    with pytest.raises(DetourError, match=r"t\.parquet: no column 'text' \(columns: body, n"):
        list(iter_texts(parse_source(str(f))))
    with pytest.raises(DetourError, match="column 'n' is int64"):
        list(iter_texts(parse_source(str(f), text_field="n")))
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(DetourError, match="not a readable Parquet file"):
        list(iter_texts(parse_source(str(tmp_path / "fake.parquet"))))


@pytest.mark.parametrize("content, message", [
    (b'{"text": "a"}\n{"text": "b",}\n', "bad.jsonl:2: malformed JSON"),
    (b'{"text": "a"}\n{"txt": "b"}\n', "bad.jsonl:2: no field 'text'"),
    (b'{"text": "a\xff"}\n', "bad.jsonl:1: not valid UTF-8"),
    (b'\n{"text": "  "}\n{"text": ""}\n', "no documents (empty corpus; 2 empty document(s) skipped)"),
])
def test_cli_reports_bad_input_without_traceback(tmp_path, capsys, minilm, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    out = tmp_path / "out"
    assert main(["prepare", str(f), "--tokenizer", str(minilm), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))  # nothing half-written is left


def test_cli_missing_file_and_missing_tokenizer(tmp_path, capsys, minilm):
    assert main(["prepare", str(tmp_path / "gone.txt"), "--tokenizer", str(minilm), "--out", str(tmp_path / "o")]) == 2
    assert "gone.txt: no such file" in capsys.readouterr().err
    f = tmp_path / "ok.txt"
    f.write_text("one doc\n")
    assert main(["prepare", str(f), "--tokenizer", str(tmp_path / "no-model"), "--out", str(tmp_path / "o")]) == 2
    assert "cannot load tokenizer" in capsys.readouterr().err


def test_a_symlink_loop_or_a_dangling_link_is_not_called_missing(tmp_path):
    loop = tmp_path / "corpus.txt"
    loop.symlink_to(loop)
    with pytest.raises(DetourError, match=r"corpus.txt: is a symbolic link loop"):
        parse_source(str(loop))
    dangling = tmp_path / "gone.txt"
    dangling.symlink_to(tmp_path / "moved.txt")
    with pytest.raises(DetourError, match=r"gone.txt: is a symbolic link to .*moved.txt, which does not exist"):
        parse_source(str(dangling))
    with pytest.raises(DetourError, match="no such file or folder"):
        parse_source(str(tmp_path / "absent.txt"))
