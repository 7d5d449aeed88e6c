"""`detour analyze`: every analysis refuses an unusable --out before it loads a model."""

from __future__ import annotations

from detour.cli import main


def test_every_analysis_checks_its_out_folder_before_loading_anything(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    commands = [["cka", "minilm-l6", "minilm-l6"], ["drift", "minilm-l6", "minilm-l6"],
                ["trajectory", str(tmp_path), str(tmp_path)], ["transplant", "--src", "minilm-l6", "--dst", "minilm-l6"]]
    for command in commands:
        for out, message in ((blocker, "exists and is not a folder"), (blocker / "sub", "is a file, so the folder")):
            assert main(["analyze", *command, "--out", str(out)]) == 2, command
            assert message in capsys.readouterr().err, command
    assert blocker.read_text() == "mine"
