"""The docs say what the code does: documented defaults, cited tests and numbers taken from the code.

    .venv/bin/python -m pytest -q tests/test_docs_code.py

- A defaults table is a markdown table right after a line `<!-- defaults: MODULE.CLASS -->` naming
  a pydantic model; its columns are `field | default | meaning`. A field is a dotted path (`training.epochs`;
  `phases[].lr.shape` for each item of a list); a default is `required` or one YAML value in backticks
  (`` `10` ``, `` `null` ``, `` `[0.8, 0.1, 0.1]` ``). Every field of the model must have its row,
  with the model's own default.
- Every test the docs cite exists: `tests/x/test_y.py::test_name` (a `[param]` id after it is not
  checked), `::test_other` after it (the same file), `test_z.py` after it (the same folder), a bare
  `test_name`, and `tests/folder/`.
- Numbers in prose that the code decides are written as the code has them.
"""

from __future__ import annotations

import importlib
import json
import re
import typing
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt
from pydantic import BaseModel

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!--\s*defaults:\s*([\w.]+)\s*-->")
# the tables there must be: a model documented elsewhere fails until its table is listed here
TABLES = {"docs/eval.md": "detour.eval.tasks.TaskSpec", "docs/recipe.md": "detour.config.Recipe",
          "docs/study.md": "detour.study.spec.PrepareSpec"}
# fields a user never writes, with the reason
NOT_DOCUMENTED = {"detour.eval.tasks.TaskSpec": {"source": "set by the loader: the spec file",
                                                 "root": "set by the loader: the data root"}}


def _model_in(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The pydantic model inside an annotation (X, X | None, list[X]) and whether it is a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    for arg in typing.get_args(annotation):
        model, many = _model_in(arg)
        if model is not None:
            return model, many or typing.get_origin(annotation) is list
    return None, False


REQUIRED = object()


def code_defaults(model: type[BaseModel], prefix: str = "") -> tuple[dict[str, object], set[str]]:
    """(leaf field -> default or REQUIRED, the fields that hold other fields) of a pydantic model."""
    leaves, parents = {}, set()
    for name, field in model.model_fields.items():
        path = prefix + name
        default = REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
        inner, many = _model_in(field.annotation)
        if inner is None:
            leaves[path] = default
            continue
        parents.add(path)
        sub_leaves, sub_parents = code_defaults(inner, path + ("[]." if many else "."))
        leaves.update(sub_leaves)
        parents |= sub_parents
    return leaves, parents


def _parent_default(model: type[BaseModel], path: str):
    """The default of a field that holds other fields (`branch`, `phases`), from the model."""
    node, field = model, None
    for part in path.replace("[]", "").split("."):
        field = node.model_fields[part]
        node = _model_in(field.annotation)[0]
    if field.is_required():
        return REQUIRED
    default = field.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else default


def documented_tables(path: Path) -> dict[str, dict[str, object]]:
    """MODULE.CLASS -> {field: default or REQUIRED} of each marked defaults table of a markdown file."""
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))
    tables = {}
    for i, tok in enumerate(tokens):
        match = MARKER.fullmatch(tok.content.strip()) if tok.type == "html_block" else None
        if not match:
            continue
        where = f"{path}:{tok.map[0] + 1}"
        assert i + 1 < len(tokens) and tokens[i + 1].type == "table_open", f"{where}: no table right after the marker"
        rows, row, j = [], None, i + 1
        while tokens[j].type != "table_close":
            if tokens[j].type == "tr_open":
                row = []
            elif tokens[j].type == "inline":
                row.append(tokens[j].content.strip())
            elif tokens[j].type == "tr_close":
                rows.append(row)
            j += 1
        assert [c.lower() for c in rows[0]] == ["field", "default", "meaning"], f"{where}: columns {rows[0]}"
        table = {}
        for cells in rows[1:]:
            field, default = cells[0].strip("`"), cells[1]
            assert field not in table, f"{where}: {field} has two rows"
            table[field] = _documented_value(default, f"{where}: {field}")
        tables[match.group(1)] = table
    return tables


def _documented_value(cell: str, where: str):
    if cell == "required":
        return REQUIRED
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"{where}: the default {cell!r} is neither `required` nor one value in backticks"
    return yaml.safe_load(m.group(1)) if m.group(1) != "" else None


def _same(documented, default) -> bool:
    if documented is REQUIRED or default is REQUIRED:
        return documented is default
    return json.loads(json.dumps(documented)) == json.loads(json.dumps(default))


def _show(value) -> str:
    return "required" if value is REQUIRED else json.dumps(value)


def default_mismatches(model_path: str, table: dict[str, object]) -> list[str]:
    module, _, name = model_path.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    leaves, parents = code_defaults(model)
    skipped = NOT_DOCUMENTED.get(model_path, {})
    problems = [f"{f}: not in the table" for f in leaves if f not in table and f not in skipped]
    for field, documented in table.items():
        if field in leaves:
            default = leaves[field]
        elif field in parents:
            default = _parent_default(model, field)
        else:
            problems.append(f"{field}: no such field in {model_path}")
            continue
        if not _same(documented, default):
            problems.append(f"{field}: the docs say {_show(documented)}, the code {_show(default)}")
    return problems


def test_every_documented_default_is_the_codes_and_every_field_is_documented():
    found, problems = {}, []
    for path in DOCS:
        for model, table in documented_tables(path).items():
            found[str(path.relative_to(REPO))] = model
            problems += [f"{path.relative_to(REPO)} ({model}) {p}" for p in default_mismatches(model, table)]
    assert not problems, "\n".join(problems)
    assert found == TABLES


def test_a_wrong_default_or_a_missing_field_is_named(tmp_path):
    doc = tmp_path / "page.md"
    text = (REPO / "docs" / "eval.md").read_text(encoding="utf-8")
    doc.write_text(text.replace("| `training.epochs` | `10` |", "| `training.epochs` | `20` |")
                   .replace("| `stride` | `64` | sub-tokens shared by consecutive windows |\n", ""))
    (table,) = documented_tables(doc).values()
    assert default_mismatches("detour.eval.tasks.TaskSpec", table) == [
        "stride: not in the table", "training.epochs: the docs say 20, the code 10"]


# ---- tests the docs cite ----

REFERENCE = re.compile(
    r"(?P<path>tests/[\w/]+\.py)(?:::(?P<name>test_\w+))?"  # tests/x/test_y.py[::test_name]
    r"|::(?P<more>test_\w+)"                                 # ::test_name, in the last file named
    r"|(?<![\w/.])(?P<file>test_\w+\.py)"                    # test_z.py, in the last folder named
    r"|(?P<folder>tests/[\w/]*/)"                            # tests/report/
    r"|(?<![\w/.:])(?P<bare>test_\w+)(?![\w.])"              # a test function's name alone
)


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def {name}\(", path.read_text(encoding="utf-8"), re.M) is not None


def missing_tests(text: str, root: Path) -> list[str]:
    """Each test or test file that `text` cites and `root` lacks."""
    missing, last_file, last_folder = [], None, None
    every = sorted((root / "tests").rglob("test_*.py"))
    for m in REFERENCE.finditer(text):
        if m["path"]:
            last_file = root / m["path"]
            last_folder = last_file.parent
            if not last_file.is_file():
                missing.append(m["path"])
            elif m["name"] and not _defines(last_file, m["name"]):
                missing.append(m.group(0))
        elif m["more"]:
            if last_file is None or not last_file.is_file() or not _defines(last_file, m["more"]):
                missing.append(f"{last_file.relative_to(root) if last_file else '?'}::{m['more']}")
        elif m["file"]:
            near = last_folder / m["file"] if last_folder else None
            last_file = near if near and near.is_file() else next((p for p in every if p.name == m["file"]), None)
            if last_file is None:
                missing.append(m["file"])
        elif m["folder"]:
            if not (root / m["folder"]).is_dir():
                missing.append(m["folder"])
        elif not any(_defines(p, m["bare"]) for p in every):
            missing.append(m["bare"])
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_every_test_the_docs_cite_exists(doc):
    missing = missing_tests(doc.read_text(encoding="utf-8"), REPO)
    assert not missing, f"{doc.relative_to(REPO)} cites tests that do not exist: {', '.join(missing)}"


def test_a_renamed_test_is_found_in_every_form_of_citation():
    text = ("tests/study/test_study.py::test_out_must_be_a_study_folder_or_new, ::test_keys_ignore_where_it_is "
            "(tests/study/test_nope.py), test_demo.py and test_nowhere.py; `test_markers_select_bash_blocks_and_"
            "misplaced_ones_are_named` and `test_gone`; tests/report/ and tests/nothing/; test_io.py::x")
    assert missing_tests(text, REPO) == [
        "tests/study/test_study.py::test_keys_ignore_where_it_is", "tests/study/test_nope.py", "test_nowhere.py",
        "test_gone", "tests/nothing/"]


# ---- numbers in prose that the code decides ----

def _prose_numbers() -> list[tuple[str, str]]:
    """(file, phrase) pairs: each phrase holds a number as the code has it."""
    from detour.config import LoggingSpec, Recipe
    from detour.eval.finetune import SCORE_ROWS, SCORE_TOKENS_BATCHES
    from detour.eval.synthetic_ner import HELD_OUT_SHARE
    from detour.eval.tasks import Training
    from detour.study.demo import DEMO

    demo = yaml.safe_load(DEMO.read_text())
    recipe = yaml.safe_load((DEMO.parent / demo["train"]["recipe"]).read_text())
    documents = re.search(r"docs=(\d+)", demo["prepare"]["corpus"]["sources"][0]).group(1)
    held_out = demo["prepare"]["corpus"]["validation"]
    clm, decay = (p["tokens"] for p in recipe["phases"])
    rate = Recipe.model_fields["baseline_mask_rate"].default
    return [
        ("README.md", f"{HELD_OUT_SHARE:.0%} of each type's entity strings held out of training"),
        ("README.md", f"continues it on {int(documents):,} **synthetic** clinical case reports"),
        ("README.md", f"generated text; {held_out} of them held out of training"),
        ("README.md", f"with the detour ({clm} CLM tokens, then a {decay}-token MLM\ndecay)"),
        ("README.md", f"held out of training) over {demo['eval']['seeds']}\nseeds"),
        ("README.md", f"plain lines at least every {LoggingSpec().every_seconds:.0f} s"),
        ("README.md", f"(the twin's replaced phase is\nnamed for what it is, `mlm{rate * 100:.0f}`"),
        ("docs/study.md", f"else the task spec's, else the task default of {Training().epochs};"),
        ("docs/eval.md", f"{SCORE_ROWS['cpu']}x the training batch on CPU"),
        ("docs/eval.md", f"and {SCORE_ROWS['cuda']}x on a GPU, never more tokens per batch than "
                         f"{['one', 'two', 'three', 'four'][SCORE_TOKENS_BATCHES - 1]}\ntraining batches"),
    ]


@pytest.mark.parametrize("doc, phrase", _prose_numbers())
def test_numbers_in_prose_are_the_codes(doc, phrase):
    text = (REPO / doc).read_text(encoding="utf-8")
    assert " ".join(phrase.split()) in " ".join(text.split()), f"{doc} should say: {phrase!r}"
