"""Atomic writes: the file lands whole, with the permissions a plain open() would give it."""

import os
import stat

import pytest

from detour.io import atomic_write, write_json, write_text


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda value: os.umask(value)
    os.umask(saved)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_new_files_follow_the_umask_like_open(tmp_path, umask, mask, expected):
    umask(mask)
    write_json(tmp_path / "result.json", {"ok": True})
    with open(tmp_path / "plain.txt", "w") as f:
        f.write("x")
    assert _mode(tmp_path / "result.json") == _mode(tmp_path / "plain.txt") == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "result.json"]


def test_a_replaced_file_keeps_its_permissions(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "notes.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    write_text(target, "new")
    assert target.read_text() == "new" and _mode(target) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})

    def fail(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, fail)
    assert target.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
