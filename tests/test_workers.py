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
