"""CI (`bash .ci/run`) sets every DETOUR_REQUIRE_* flag that a test reads, so CI fails where a checkout skips.

    .venv/bin/python -m pytest -q tests/test_ci.py
"""

from __future__ import annotations

import re

from tests.conftest import REPO

FLAG = re.compile(r"\bDETOUR_REQUIRE_[A-Z]+\b")


def test_ci_sets_every_require_flag_the_tests_read():
    read = {flag for path in (REPO / "tests").rglob("*.py") for flag in FLAG.findall(path.read_text(encoding="utf-8"))}
    exports = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
               if line.startswith("export ")]
    set_by_ci = {m.group(1) for line in exports for m in re.finditer(r"\b(DETOUR_REQUIRE_[A-Z]+)=1\b", line)}
    assert {"DETOUR_REQUIRE_SHARED", "DETOUR_REQUIRE_BROWSER", "DETOUR_REQUIRE_MINILM"} <= read
    assert read <= set_by_ci, f".ci/run does not set {sorted(read - set_by_ci)}: CI would skip what they guard"


def test_the_suite_runs_on_two_workers_keeping_each_file_and_the_report_tests_together():
    from tests.conftest import xdist_group_of

    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert re.search(r'-n "\$\{DETOUR_TEST_WORKERS:-2\}" --dist loadgroup --no-loadscope-reorder', script)
    report = {xdist_group_of(p) for p in (REPO / "tests" / "report").glob("test_*.py")}
    assert len(report) == 1  # one session-built study, one worker
    others = [p for p in (REPO / "tests").rglob("test_*.py") if "report" not in p.parts]
    assert len({xdist_group_of(p) for p in others}) == len(others)  # a file per group: its module fixtures once
