"""docs/reliability.md names a test for every row: each named test must exist.

    python -m pytest -q tests/test_reliability_doc.py

A row names tests as `tests/PATH.py::name`, `::name` (the same file as the name before it) or
`tests/PATH.py::name[param]`; a renamed or deleted test fails here until the document follows.
"""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

DOC = REPO / "docs" / "reliability.md"
NAME = re.compile(r"(tests/[\w/]+\.py)?::(\w+)(?:\[[^\]]*\])?")


def named_tests(text: str) -> list[tuple[str, str]]:
    found, current = [], None
    for line in text.splitlines():
        if not line.startswith("|") or "(file::name)" in line:
            continue
        for m in NAME.finditer(line):
            current = m.group(1) or current
            found.append((current, m.group(2)))
    return found


def test_every_test_the_reliability_doc_names_exists():
    names = named_tests(DOC.read_text(encoding="utf-8"))
    assert len(names) > 60
    missing = []
    defined: dict[str, set[str]] = {}
    for path, name in names:
        if path not in defined:
            file = REPO / path
            tree = ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else ast.Module(body=[])
            defined[path] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if name not in defined[path]:
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
