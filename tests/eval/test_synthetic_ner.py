import json
import re

import pytest

from detour.eval import synthetic_ner as sn
from detour.errors import DetourError
from detour.eval.formats import read_iob
from detour.eval.metrics import spans_from_tags
from detour.eval.tasks import load_spec
from detour.eval.validate import validate_tasks

SIZES = (120, 60, 100)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return sn.write_task(tmp_path_factory.mktemp("synthetic-ner") / "task", SIZES)


def _sentences(path):
    spec = load_spec(path)
    return {split: [(ex["tokens"], ex["tags"]) for ex in read_iob(spec.path(split), spec)]
            for split in ("train", "validation", "test")}


def _entries(lang):
    """Space-joined, case-folded token string of an entry -> its type."""
    return {" ".join(sn.tokenize(s)).casefold(): kind for kind, strings in sn.lexicon(lang).items() for s in strings}


def _check_tags(rows, lang):
    entries = _entries(lang)
    for tokens, tags in rows:
        spans = spans_from_tags(tags)
        for start, end, kind in spans:  # every tag is right: its text is an entry of its type
            text = " ".join(tokens[start:end]).casefold()
            assert entries.get(text) == kind, (text, kind, tokens)
        # every mention is tagged: each occurrence of any entry lies inside a tagged span
        line = " ".join(tokens).casefold()
        starts = [m.start() for m in re.finditer(r"\S+", line)]
        for text in entries:
            for m in re.finditer(rf"(?<!\S){re.escape(text)}(?!\S)", line):
                first, n = starts.index(m.start()), len(text.split())
                assert any(s <= first and first + n <= e for s, e, _ in spans), (text, tokens, tags)


def test_same_seed_gives_identical_files_and_another_seed_other_ones(tmp_path):
    a = sn.write_task(tmp_path / "a", (30, 10, 10), seed=7).parent
    b = sn.write_task(tmp_path / "b", (30, 10, 10), seed=7).parent
    c = sn.write_task(tmp_path / "c", (30, 10, 10), seed=8).parent
    for name in ("train.tsv", "devel.tsv", "test.tsv", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "train.tsv").read_bytes() != (c / "train.tsv").read_bytes()
    # a split depends on its own size only: a longer train starts with the shorter one
    longer = sn.build_splits((45, 5, 5), seed=7)[0]["train"]
    assert longer[:30] == sn.build_splits((30, 10, 10), seed=7)[0]["train"]


def test_every_tag_is_a_lexicon_entry_and_every_mention_is_tagged(task):
    rows = _sentences(task)
    for split in rows.values():
        _check_tags(split, "en")
    tagged = [t for split in rows.values() for _, tags in split for t in tags if t.startswith("B-")]
    assert {t[2:] for t in tagged} == set(sn.ENTITY_TYPES)
    # the generator lowercases some names ("Brain mri ... was also performed"): matched all the same
    assert any(tok == "mri" and tag == "I-PROCEDURE" for split in rows.values() for tokens, tags in split
               for tok, tag in zip(tokens, tags))


def test_french_sentences_are_tagged_with_the_french_lexicon():
    rows = sn.build_splits((60, 20, 20), lang="fr")[0]
    _check_tags([r for split in rows.values() for r in split], "fr")
    text = " ".join(tok for tokens, _ in rows["test"] for tok in tokens)
    assert "diagnostic" in text
    assert sum(tag != "O" for split in rows.values() for _, tags in split for tag in tags) > 100


def test_held_out_entries_never_in_train_but_in_test(task):
    rows = _sentences(task)
    held = sn.held_out()
    assert all(len(v) == round(0.3 * len(sn.lexicon()[k])) for k, v in held.items())
    for tokens, _ in rows["train"]:
        assert not any(sn.contains(tokens, e) for entries in held.values() for e in entries), tokens
    test_spans = {(" ".join(tokens[s:e]).casefold(), kind) for tokens, tags in rows["test"]
                  for s, e, kind in spans_from_tags(tags)}
    for kind, entries in held.items():  # every type has entity strings in test that train never shows
        assert any((" ".join(sn.tokenize(x)).casefold(), kind) in test_spans for x in entries), kind
    manifest = json.loads((task.parent / "manifest.json").read_text())
    assert manifest["synthetic"] is True and manifest["seed"] == sn.DEFAULT_SEED != 0
    assert manifest["held_out"] == held
    assert sum(manifest["splits"]["train"]["held_out_mentions"].values()) == 0
    assert sum(manifest["splits"]["test"]["held_out_mentions"].values()) > 20
    for split, size in zip(("train", "validation", "test"), SIZES):
        counts = manifest["splits"][split]
        assert counts["sentences"] == size == len(rows[split])
        assert counts["sentences_without_entities"] < 0.35 * size  # a minority
        assert sum(counts["entities"].values()) == sum(len(spans_from_tags(t)) for _, t in rows[split])


def test_spec_loads_from_any_working_directory_and_passes_the_validator(task, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("DETOUR_DATA_ROOT", str(tmp_path / "no-data-here"))
    spec = load_spec(str(task))
    assert spec.description.startswith("SYNTHETIC") and spec.type == "ner" and spec.format == "iob"
    assert spec.headline == "macro_f1" and spec.max_length <= 128
    splits = validate_tasks([spec])[spec.name]
    assert [len(splits[s]) for s in ("train", "validation", "test")] == list(SIZES)


def test_refuses_a_foreign_folder_and_rewrites_only_its_own_files(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DetourError, match="not empty"):
        sn.write_task(foreign, (10, 5, 5))
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    (foreign / "manifest.json").write_text('{"written_by": "someone else"}')
    with pytest.raises(DetourError, match="not empty"):
        sn.write_task(foreign, (10, 5, 5))
    assert (foreign / "manifest.json").read_text() == '{"written_by": "someone else"}'

    ours = tmp_path / "ours"
    sn.write_task(ours, (10, 5, 5))
    (ours / "notes.txt").write_text("mine")
    spec = sn.write_task(ours, (20, 5, 5))  # an earlier output: rewritten, the user's file kept
    assert (ours / "notes.txt").read_text() == "mine"
    assert len(load_spec(spec).data) == 3 and json.loads((ours / "manifest.json").read_text())["splits"]["train"]["sentences"] == 20
    assert sorted(p.name for p in ours.iterdir()) == ["devel.tsv", "manifest.json", "notes.txt", "task.yaml", "test.tsv", "train.tsv"]


@pytest.mark.parametrize("kwargs, match", [
    ({"sentences_per_split": (0, 5, 5)}, "integers >= 1"),
    ({"sentences_per_split": (5, 5)}, "three integers"),
    ({"lang": "de"}, "unknown lang"),
])
def test_bad_input_is_a_user_error_and_writes_nothing(tmp_path, kwargs, match):
    with pytest.raises(DetourError, match=match):
        sn.write_task(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_module_cli_prints_counts_and_the_spec_path(tmp_path, capsys):
    assert sn.main(["--out", str(tmp_path / "t"), "--train", "20", "--validation", "8", "--test", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert f"spec: {tmp_path / 't' / 'task.yaml'}" in out and re.search(r"^train\s+20\s", out, re.M)
    assert sn.main(["--out", str(tmp_path / "u"), "--train", "0"]) == 2
    assert "integers >= 1" in capsys.readouterr().err


def test_detour_eval_fine_tunes_and_scores_the_task(task, minilm, tmp_path):
    from detour.cli import main

    out = tmp_path / "eval"
    assert main(["eval", str(minilm), "--task-spec", str(task), "--seeds", "1", "--epochs", "1",
                 "--max-train", "48", "--max-eval", "48", "--out", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["task"] == "synthetic-clinical-ner"
    assert 0.0 <= runs[0]["metrics"]["macro_f1"] <= 1.0 and runs[0]["headline"] == "macro_f1"
