"""The suite's two workers: a test file runs on one of them, so its session-built studies are built once.

    bash scripts/test.sh tests/test_workers.py
"""

from __future__ import annotations

import pytest

from tests.conftest import xdist_group_of


def test_this_file_carries_its_worker_group(request):
    # pytest-xdist schedules by the group suffix of each test's node id; when the suffix is missing
    # (a pytest that ignores the rename, or marks added after xdist read them) nothing fails, the
    # tests of a file spread over both workers and the suite runs its slowest fixtures twice
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not run under pytest-xdist workers (DETOUR_TEST_WORKERS=0 or plain pytest)")
    if not getattr(request.config.option, "loadgroup", False):  # set on each worker for --dist loadgroup
        pytest.skip("not run with --dist loadgroup, as scripts/test.sh runs it")
    assert request.node.nodeid.endswith("@" + xdist_group_of(request.node.path)), request.node.nodeid


def test_the_longest_groups_are_handed_out_first_and_a_group_not_yet_timed_before_them(tmp_path):
    from types import SimpleNamespace

    from tests.conftest import REPO, slowest_groups_first

    def item(path, name):
        return SimpleNamespace(path=REPO / path, name=name)

    items = [item("tests/test_io.py", "a"), item("tests/study/test_sizes.py", "b"), item("tests/test_io.py", "c"),
             item("tests/report/test_capacity.py", "d"), item("tests/report/test_browser.py", "e"),
             item("tests/test_new.py", "f")]
    durations = {"tests/test_io.py": 3.0, "tests/study/test_sizes.py": 250.0, "tests/report": 40.0}
    ordered = [i.name for i in slowest_groups_first(items, durations)]
    # never timed first, then 250 s, 40 s (the report tests are one group), 3 s; each group's tests in order
    assert ordered == ["f", "b", "d", "e", "a", "c"]


def test_the_committed_durations_name_groups_of_this_suite():
    # a file renamed or a group merged leaves a stale entry, harmless; but timings of nothing at all
    # would hand the groups out in collection order again
    from tests.conftest import REPO, group_durations, xdist_group_of

    durations = group_durations()
    groups = {xdist_group_of(p) for p in (REPO / "tests").rglob("test_*.py")}
    assert durations and len(set(durations) & groups) >= 0.9 * len(groups)
