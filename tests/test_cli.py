"""The CLI lists every pipeline verb and refuses, clearly, the ones not built yet."""

import subprocess
import sys

from detour.cli import VERBS, main

EXPECTED = ["prepare", "train", "twins", "eval", "compare", "needle", "analyze", "report", "study", "demo", "doctor"]


def test_help_lists_every_verb():
    out = subprocess.run([sys.executable, "-m", "detour.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for verb in EXPECTED:
        assert verb in VERBS
        assert verb in out.stdout


def test_unbuilt_verb_exits_nonzero(monkeypatch, capsys):
    monkeypatch.setitem(VERBS, "study", ("detour.no_such_module_yet", "x"))
    assert main(["study"]) == 2
    assert "not built yet" in capsys.readouterr().err


def test_unknown_verb_fails():
    out = subprocess.run([sys.executable, "-m", "detour.cli", "frobnicate"], capture_output=True, text=True)
    assert out.returncode != 0
