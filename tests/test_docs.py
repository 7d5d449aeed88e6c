"""Runnable docs: the shell blocks marked `<!-- runnable -->` in README.md and docs/*.md run as written.

    .venv/bin/python -m pytest -q tests/test_docs.py

Mark a block by putting the line `<!-- runnable -->` directly before its ```bash fence (GitHub does
not show HTML comments). Each marked block runs with `bash -euo pipefail` in a fresh folder laid out
like a checkout: links to the repository's recipes/, studies/, bench/, scripts/, src/ and .venv/, and
`../shared` beside it when the shared data is there; PATH starts with the virtualenv's bin and the
Hugging Face libraries are offline. What a block writes lands in that folder's runs/. A block that
mentions `../shared` is skipped when the shared data is absent (unless DETOUR_REQUIRE_SHARED=1).
Docs with no marked block, or no bash block at all, fail these tests rather than skip them.
Mark only blocks that finish in seconds on tiny settings (this file stays under ~90 s on 2 loaded
cores); heavier ones stay unmarked. Every `detour ...` command in any bash block, marked or not, must
also parse with the CLI's own options, so a renamed flag in the docs fails here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from detour import cli
from tests.conftest import REPO, SHARED_DATA

MARKER = "<!-- runnable -->"
LINKED = ("recipes", "studies", "bench", "scripts", "src", ".venv")
BLOCK_TIMEOUT_S = 120
COMMAND_PREFIXES = {"time", "nohup", "exec", "env", "command"}  # words that run the command after them


@dataclass
class Block:
    where: str  # FILE:LINE of the opening fence, FILE relative to the repository
    lang: str
    text: str
    runnable: bool


def doc_files(root: Path) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def scan(root: Path) -> tuple[list[Block], list[str]]:
    """Every fenced block of the docs under `root`, and each marker that does not sit right before a bash fence."""
    blocks, problems = [], []
    for path in doc_files(root):
        tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(root)
        for i, tok in enumerate(tokens):
            if tok.type == "fence":
                marked = i > 0 and _is_marker(tokens[i - 1]) and tokens[i - 1].map[1] == tok.map[0]
                lang = tok.info.split()[0] if tok.info.strip() else ""
                blocks.append(Block(f"{rel}:{tok.map[0] + 1}", lang, tok.content, marked))
                if marked and lang != "bash":
                    problems.append(f"{rel}:{tok.map[0]}: {MARKER} is before a ```{lang} block; only ```bash blocks run")
            elif _is_marker(tok):
                nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                if nxt is None or nxt.type != "fence" or nxt.map[0] != tok.map[1]:
                    problems.append(f"{rel}:{tok.map[0] + 1}: {MARKER} is not directly before a ```bash block")
    return blocks, problems


def _is_marker(tok) -> bool:
    return tok.type == "html_block" and tok.content.strip() == MARKER


def logical_lines(script: str) -> list[tuple[int, str]]:
    """(1-based line, text) of each shell line, backslash continuations joined."""
    out, start, parts = [], None, []
    for n, line in enumerate(script.splitlines(), 1):
        start = n if start is None else start
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        out.append((start, " ".join([*parts, line])))
        start, parts = None, []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command on a shell line (split at ; & | ( ), comments dropped)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    commands, words = [], []
    for tok in lex:
        if tok and set(tok) <= set(";&|()"):
            commands.append(words)
            words = []
        else:
            words.append(tok)
    commands.append(words)
    return [c for c in commands if c]


def detour_argvs(script: str) -> list[tuple[int, list[str]]]:
    """(line, argv after `detour`) of every detour command of a script: `detour ...`, `.venv/bin/detour ...`,
    `python -m detour.cli ...`, `torchrun ... -m detour.cli ...`."""
    found = []
    for n, line in logical_lines(script):
        for words in simple_commands(line):
            while words and ("=" in words[0] and not words[0].startswith("-") or words[0] in COMMAND_PREFIXES):
                words = words[1:]  # VAR=value and `time` before the command itself
            if not words:
                continue
            if Path(words[0]).name == "detour":
                found.append((n, words[1:]))
            elif "-m" in words[:-1] and words[words.index("-m") + 1] == "detour.cli":
                found.append((n, words[words.index("-m") + 2:]))
    return found


def unknown_verbs(script: str) -> list[str]:
    known = {v for v, (module, _) in cli.VERBS.items() if cli._is_built(module)}
    return [f"line {n}: detour {argv[0]}" for n, argv in detour_argvs(script)
            if argv and not argv[0].startswith("-") and argv[0] not in known]


def parse_errors(script: str) -> list[str]:
    """Each detour command of the script that the CLI's own parser rejects, with argparse's message."""
    errors = []
    for n, argv in detour_argvs(script):
        if not argv or argv[0].startswith("-") or argv[0] not in cli.VERBS:
            continue  # `detour --help`; unknown verbs are reported by unknown_verbs
        module = cli._load_verb(argv[0])
        parser = argparse.ArgumentParser(prog=f"detour {argv[0]}")
        module.add_arguments(parser)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code:
                errors.append(f"line {n}: detour {' '.join(argv)}\n    {err.getvalue().strip().splitlines()[-1]}")
    return errors


def needs_shared(block: Block) -> bool:
    return "../shared" in block.text


def checkout_like(base: Path, shared: Path | None) -> Path:
    """base/checkout with links to the repository's folders, and base/shared when the shared data exists."""
    work = base / "checkout"
    work.mkdir(parents=True)
    for name in LINKED:
        target = Path(sys.prefix) if name == ".venv" and sys.prefix != sys.base_prefix else REPO / name
        if target.exists():
            (work / name).symlink_to(target, target_is_directory=True)
    if shared is not None and shared.is_dir():
        (base / "shared").symlink_to(shared, target_is_directory=True)
    return work


def run_block(block: Block, base: Path, shared: Path | None) -> subprocess.CompletedProcess:
    work = checkout_like(base, shared)
    script = base / "block.sh"
    script.write_text(block.text, encoding="utf-8")
    bindir = Path(sys.prefix) / "bin" if sys.prefix != sys.base_prefix else Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    return subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)


def _failure(block: Block, proc: subprocess.CompletedProcess) -> str:
    return (f"{block.where}: the runnable block exited {proc.returncode}\n--- block ---\n{block.text}"
            f"--- stdout (tail) ---\n{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}")


BLOCKS, PROBLEMS = scan(REPO)
RUNNABLE = [b for b in BLOCKS if b.runnable and b.lang == "bash"]
BASH = [b for b in BLOCKS if b.lang == "bash"]


def _params(blocks: list[Block]) -> list:
    return [pytest.param(b, id=b.where) for b in blocks] or [pytest.param(None, id="no-block")]


def _found(block: Block | None, what: str) -> Block:
    """The block; a docs tree that lost every such block fails, since a skip would go unseen."""
    if block is None:
        pytest.fail(f"no {what} in README.md or docs/*.md: nothing of this kind is checked")
    return block


# ---- the repository's docs ----

def test_every_marker_sits_directly_before_a_bash_block():
    assert not PROBLEMS, "\n".join(PROBLEMS)


@pytest.mark.parametrize("block", _params(RUNNABLE))
def test_runnable_blocks_name_only_verbs_the_cli_knows(block):
    block = _found(block, "block marked runnable")
    assert not unknown_verbs(block.text), f"{block.where}: " + "; ".join(unknown_verbs(block.text))


@pytest.mark.parametrize("block", _params(BASH))
def test_documented_detour_commands_parse(block):
    block = _found(block, "bash block")
    errors = unknown_verbs(block.text) + parse_errors(block.text)
    assert not errors, f"{block.where}:\n" + "\n".join(errors)


@pytest.mark.parametrize("block", _params(RUNNABLE))
def test_runnable_block_runs(block, tmp_path):
    block = _found(block, "block marked runnable")
    shared = SHARED_DATA.parent
    if needs_shared(block) and not shared.is_dir():
        if os.environ.get("DETOUR_REQUIRE_SHARED") == "1":
            pytest.fail(f"{block.where} needs ../shared, which is missing at {shared} (DETOUR_REQUIRE_SHARED=1)")
        pytest.skip(f"{block.where} reads ../shared, not found at {shared} (clone it beside the repo)")
    try:
        proc = run_block(block, tmp_path, shared)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S} s; only blocks of seconds are marked runnable")
    assert proc.returncode == 0, _failure(block, proc)


# ---- the machinery, on docs written here ----

def _docs(root: Path, readme: str, page: str = "") -> Path:
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(readme, encoding="utf-8")
    (root / "docs" / "page.md").write_text(page, encoding="utf-8")
    return root


def test_markers_select_bash_blocks_and_misplaced_ones_are_named(tmp_path):
    root = _docs(tmp_path, "# t\n\n" + MARKER + "\n```bash\necho one\n```\n\n```bash\necho unmarked\n```\n",
                 "intro\n" + MARKER + "\n```yaml\na: 1\n```\n\n" + MARKER + "\n\n```bash\necho gap\n```\n\n"
                 "- a list\n\n  " + MARKER + "\n  ```bash\n  echo indented\n  ```\n\n" + MARKER + "\n")
    blocks, problems = scan(root)
    assert [(b.where, b.runnable, b.text) for b in blocks if b.runnable] == [
        ("README.md:4", True, "echo one\n"), ("docs/page.md:3", True, "a: 1\n"), ("docs/page.md:16", True, "echo indented\n")]
    assert [b.where for b in blocks if not b.runnable] == ["README.md:8", "docs/page.md:9"]
    assert problems == [f"docs/page.md:2: {MARKER} is before a ```yaml block; only ```bash blocks run",
                        f"docs/page.md:7: {MARKER} is not directly before a ```bash block",
                        f"docs/page.md:20: {MARKER} is not directly before a ```bash block"]


def test_detour_verbs_are_read_where_a_command_starts():
    script = ("detour study studies/tiny.yaml --out runs/s --dry-run   # the detour and its twin\n"
              "M=$(.venv/bin/python -c \"print('detour frobnicate')\") && .venv/bin/detour eval --list-tasks\n"
              "detour analyze trajectory runs/twins/detour runs/twins/baseline \\\n    --out runs/t\n"
              "X=1 time detour prepare a.txt --tokenizer minilm-l6 --out runs/d; detour --help | cat\n"
              "torchrun --nproc-per-node 2 -m detour.cli train r.yaml --out runs/ddp\n"
              "echo detour frobnicate\n# detour frobnicate\n")
    assert [(n, argv[0]) for n, argv in detour_argvs(script)] == [
        (1, "study"), (2, "eval"), (3, "analyze"), (5, "prepare"), (5, "--help"), (6, "train")]
    assert unknown_verbs(script) == []
    assert unknown_verbs("ls\ndetour frobnicate --out runs/x\n") == ["line 2: detour frobnicate"]


def test_a_documented_flag_the_cli_does_not_have_is_an_error():
    assert parse_errors("detour eval --list-tasks\ndetour study studies/tiny.yaml --out runs/s --dry-run\n") == []
    errors = parse_errors("detour eval --list-tasks\n.venv/bin/detour study studies/tiny.yaml --dry-rn\n")
    assert len(errors) == 1 and errors[0].startswith("line 2: detour study") and "--dry-rn" in errors[0]


def test_a_block_runs_in_a_fresh_checkout_like_folder_with_strict_bash(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the block gets it whatever the caller's environment
    shared = tmp_path / "fake-shared"
    (shared / "data").mkdir(parents=True)
    ok = Block("README.md:1", "bash",
               "ls recipes/tiny-modernbert.yaml studies/tiny.yaml scripts src/detour/cli.py bench .venv/bin >/dev/null\n"
               "test -d ../shared/data\n"  # not `a && b`: bash -e does not stop at a failing `a` there
               "test \"$HF_HUB_OFFLINE\" = 1\n"
               "detour --help | grep -q study\n"
               "python -c 'import sys; print(sys.prefix)'\n"
               "mkdir -p runs/out && echo written > runs/out/file.txt\n", True)
    proc = run_block(ok, tmp_path / "ok", shared)
    assert proc.returncode == 0, _failure(ok, proc)
    assert proc.stdout.strip() == sys.prefix  # the virtualenv's python comes first on PATH
    assert (tmp_path / "ok" / "checkout" / "runs" / "out" / "file.txt").read_text() == "written\n"
    assert not (REPO / "runs" / "out" / "file.txt").exists()
    for i, bad in enumerate(["false | cat\necho after\n", "echo $NOT_SET_ANYWHERE\n", "false\necho after\n"]):
        proc = run_block(Block("README.md:1", "bash", bad, True), tmp_path / f"bad{i}", None)
        assert proc.returncode != 0 and "after" not in proc.stdout, bad  # -e, -u and pipefail hold
    assert not (tmp_path / "bad0" / "shared").exists()


def test_docs_without_blocks_fail_rather_than_skip(tmp_path):
    blocks, _ = scan(_docs(tmp_path, "# t\n\nno code here\n"))
    (param,) = _params([b for b in blocks if b.runnable])
    assert param.id == "no-block" and not param.marks
    with pytest.raises(pytest.fail.Exception, match="no block marked runnable in README.md"):
        _found(param.values[0], "block marked runnable")


def test_blocks_that_read_shared_data_are_known():
    assert needs_shared(Block("README.md:1", "bash", "detour prepare ../shared/data/x.txt --out runs/d\n", True))
    assert not needs_shared(Block("README.md:1", "bash", "detour study studies/tiny.yaml --dry-run\n", True))
