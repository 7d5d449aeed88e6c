"""The CLI lists every built pipeline verb, hides the others and refuses them clearly."""

import subprocess
import sys

from detour.cli import VERBS, main

import importlib.util

EXPECTED = ["prepare", "train", "twins", "eval", "compare", "needle", "analyze", "report", "study", "demo", "doctor"]


def test_help_lists_every_built_verb_and_hides_the_others():
    out = subprocess.run([sys.executable, "-m", "detour.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    listed = out.stdout.split("positional arguments:")[1]
    for verb in EXPECTED:
        assert verb in VERBS
        module = VERBS[verb][0]
        built = importlib.util.find_spec(module.rpartition(".")[0]) is not None and \
            importlib.util.find_spec(module) is not None
        assert (f"    {verb} " in listed) == built, verb
    assert "    train " in listed and "    analyze " in listed


def test_unbuilt_verb_exits_nonzero(monkeypatch, capsys):
    monkeypatch.setitem(VERBS, "study", ("detour.no_such_module_yet", "x"))
    assert main(["study"]) == 2
    assert "not built yet" in capsys.readouterr().err


def test_unknown_verb_fails():
    out = subprocess.run([sys.executable, "-m", "detour.cli", "frobnicate"], capture_output=True, text=True)
    assert out.returncode != 0


def test_no_verb_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "detour.cli"], capture_output=True, text=True)
    assert out.returncode == 2  # argparse's code for a missing argument
    assert out.stderr.startswith("usage: detour") and "give a verb" in out.stderr and out.stdout == ""

