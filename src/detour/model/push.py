"""`detour export`: push one of a run's Hugging Face exports, with its model card, to the Hub.

    detour export runs/minilm-twins/detour --push-to-hub me/minilm-detour --dry-run
    detour export runs/minilm-twins/baseline --push-to-hub me/minilm-mlm-baseline --private
    detour export runs/minilm-twins/detour --folder export/clm --push-to-hub me/minilm-detour-after-clm
    detour export runs/minilm-twins/detour --out bundle/minilm-detour     # the files a push uploads, to copy

RUN is a run folder (`detour train --out RUN`, or one arm of `detour twins`, e.g. OUT/detour);
--folder picks the export inside it: `model` (the final one, the default), `export/<phase>` or
`export/<phase>/<tokens>`. Only the export's own files go up (never the exports taken during a
phase, which live in subfolders of `export/<phase>/`), in one commit, into a repository created
if missing (`--private` applies to a new repository only; an existing one keeps its visibility).

`--dry-run` prints the repository, the folder, each file with its size and the card's front
matter, and uploads nothing. An export whose card says SYNTHETIC (trained on detour's generated
text) is refused unless --allow-synthetic. The token comes from HF_TOKEN or `hf auth login`
(`huggingface-cli login`); without one the push stops before anything is uploaded. HF_ENDPOINT
points it at another Hub. `--out DIR` writes exactly the files a push uploads into a new (or
empty) folder, for a node that cannot reach the Hub: copy DIR and `hf upload` it from elsewhere.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from detour.errors import DetourError
from detour.io import check_output_location
from detour.lock import folder_lock
from detour.runs import RunFolder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run folder (detour train --out RUN, or an arm of twins such as OUT/detour)")
    parser.add_argument("--push-to-hub", metavar="REPO",
                        help="Hub repository id, e.g. me/tiny-detour (created if missing)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="also (or instead) write exactly the files a push uploads into DIR, a new or empty "
                             "folder: to copy to a machine that can reach the Hub")
    parser.add_argument("--folder", default="model",
                        help="the export inside RUN: model (default), export/<phase> or export/<phase>/<tokens>")
    parser.add_argument("--private", action="store_true",
                        help="create the repository as private (an existing one keeps its visibility)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the repository, the files with their sizes and the card's front matter; upload nothing")
    parser.add_argument("--allow-synthetic", action="store_true",
                        help="push an export trained on SYNTHETIC text (refused by default)")
    parser.add_argument("--commit-message", default=None, help="default: 'detour export: <the card's title>'")


def run_exports(run: Path) -> list[str]:
    """The exports inside a run folder, as --folder names them."""
    folder = RunFolder(run)
    found = [folder.model] + sorted(folder.export_dir.glob("*")) + sorted(folder.export_dir.glob("*/[0-9]*"))
    return [p.relative_to(run).as_posix() for p in found if (p / "config.json").is_file()]


def find_export(run: Path, folder: str) -> Path:
    if not run.is_dir():
        raise DetourError(f"{run}: no such run folder (give the folder `detour train --out` wrote)")
    rel = Path(folder)
    if rel.is_absolute() or ".." in rel.parts:
        raise DetourError(f"--folder {folder}: give a folder inside {run}, such as model or export/clm")
    target = run / rel
    if not (target / "config.json").is_file():
        known = run_exports(run)
        raise DetourError(f"--folder {folder}: {target} is not a Hugging Face export (no config.json); "
                          + (f"the exports of {run}: {', '.join(known)}" if known else
                             f"{run} holds no export yet (is it a run folder, and has a phase finished?)"))
    if not (target / "README.md").is_file():
        raise DetourError(f"{target}: no README.md model card; export it again with this version of detour")
    return target


def export_files(folder: Path) -> list[tuple[str, int]]:
    """(name, bytes) of the files that go up: the export's own, not its subfolders' (sub-exports)."""
    return [(p.name, p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file()]


def is_synthetic(card) -> bool:
    return "synthetic-data" in (card.data.tags or []) or "SYNTHETIC" in card.text


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def run(args: argparse.Namespace) -> int:
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if args.push_to_hub is None and args.out is None:
        raise DetourError("give --push-to-hub REPO (upload) and/or --out DIR (write the files a push uploads)")
    folder = find_export(Path(args.run), args.folder)
    if args.push_to_hub is not None:
        try:
            validate_repo_id(args.push_to_hub)
        except HFValidationError as exc:
            raise DetourError(f"--push-to-hub {args.push_to_hub!r}: not a Hub repository id ({exc}); "
                              "e.g. me/tiny-detour or my-org/tiny-detour") from None
    if args.out is not None:
        _check_out(args.out, folder)
    try:
        card = ModelCard.load(folder / "README.md")
    except ValueError as exc:  # front matter that is not a mapping
        raise DetourError(f"{folder / 'README.md'}: not a readable model card ({exc})") from None
    files = export_files(folder)
    title = next((line[2:].strip() for line in card.text.splitlines() if line.startswith("# ")), folder.name)

    if args.push_to_hub is not None:
        print(f"repository: {args.push_to_hub} ({'private' if args.private else 'public'} if created)")
    print(f"folder:     {folder}  ({title})")
    print(f"files:      {len(files)}, {_size(sum(size for _, size in files))}")
    for name, size in files:
        print(f"  {name:32s} {_size(size):>12s}")
    print("model card front matter:")
    print("\n".join(f"  {line}" for line in card.data.to_yaml().splitlines()))

    if args.out is not None:
        if args.dry_run:
            print(f"dry run: would write these files into {args.out}")
        else:
            with folder_lock(Path(args.run)):  # a training resumed into RUN would replace the export mid-copy
                _write_bundle(folder, [name for name, _ in files], args.out)
            print(f"wrote {len(files)} files into {args.out}")
        if args.push_to_hub is None:
            return 0
    from huggingface_hub import get_token

    token = get_token()
    refusals = []  # what a real push would stop at, in the order it checks
    if is_synthetic(card) and not args.allow_synthetic:
        refusals.append("its model card says it was trained on SYNTHETIC text (an engine test, not a model to "
                        "publish); pass --allow-synthetic to push it anyway")
    if not token:
        refusals.append("no Hugging Face token: set HF_TOKEN, or log in with `hf auth login`")
    if args.dry_run:
        print(f"token: {'found' if token else 'none'}")
        for reason in refusals:
            print(f"a real push would refuse: {reason}")
        print("dry run: nothing uploaded" + ("" if refusals else "; a real push would upload these files"))
        return 0
    if is_synthetic(card) and not args.allow_synthetic:
        raise DetourError(f"{folder}: its model card says it was trained on SYNTHETIC text (an engine test, not a "
                          "model to publish); nothing was uploaded. Pass --allow-synthetic to push it anyway")
    if not token:
        raise DetourError("no Hugging Face token: set HF_TOKEN, or log in with `hf auth login` "
                          "(`huggingface-cli login` in older versions); nothing was uploaded")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if constants.is_offline_mode():
        raise DetourError("HF_HUB_OFFLINE is set: unset it to push; nothing was uploaded")
    api = HfApi(token=token)
    try:
        # The run's lock: a training resumed into RUN meanwhile would replace the export mid-upload.
        with folder_lock(Path(args.run)):
            repo = api.create_repo(args.push_to_hub, private=args.private, exist_ok=True)
            # "*/*" keeps the exports taken during a phase (export/<phase>/<tokens>/) out of this one's repository
            commit = api.upload_folder(repo_id=repo.repo_id, folder_path=folder, ignore_patterns=["*/*"],
                                       commit_message=args.commit_message or f"detour export: {title}")
    except Exception as exc:
        # The Hub's answers (HfHubHTTPError; ValueError when it refuses the card's metadata) and the
        # HTTP library's own errors (no connection) are the user's to fix: one line, no traceback.
        if not (isinstance(exc, (HfHubHTTPError, ValueError)) or type(exc).__module__.startswith(("httpx", "requests"))):
            raise
        if _is_unreachable(exc):
            raise DetourError(f"push to {args.push_to_hub}: cannot reach the Hub at {constants.ENDPOINT} "
                              f"({str(exc).splitlines()[0]}): no network from this machine, or a wrong HF_ENDPOINT? "
                              "Nothing was uploaded; push from a machine with access, or copy the folder "
                              f"{folder} there") from None
        raise DetourError(f"push to {args.push_to_hub} ({constants.ENDPOINT}): {str(exc).splitlines()[0]}") from None
    print(f"pushed {len(files)} files to {repo} ({commit.commit_url})")
    return 0


def _is_unreachable(exc: BaseException) -> bool:
    """A connection that never happened (DNS, refused, timed out), as opposed to an answer from the Hub."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        if name in ("ConnectError", "ConnectTimeout", "ConnectionError", "NameResolutionError") or \
                isinstance(exc, (ConnectionError, TimeoutError)) or (isinstance(exc, OSError) and exc.errno in (-2, -3)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _check_out(out: Path, folder: Path) -> None:
    """--out must be a new folder or an empty one, outside the export; before anything is written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DetourError(f"--out {out}: exists and is not an empty folder; give a new folder (nothing is "
                          "overwritten)")
    if out.resolve() == folder.resolve() or folder.resolve() in out.resolve().parents:
        raise DetourError(f"--out {out}: inside the export {folder}; give a folder elsewhere")
    check_output_location(out, "--out")


def _write_bundle(folder: Path, names: list[str], out: Path) -> None:
    """The export's own files into `out`, through a temporary sibling renamed into place: a reader
    never sees half a bundle, and a failed copy leaves no `out` behind."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        for name in names:
            shutil.copy2(folder / name, tmp / name)
        if out.exists():
            out.rmdir()  # empty, checked before: the rename needs the name free
        tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # ours: made above
        raise DetourError(f"--out {out}: cannot write the files there ({exc.strerror or exc})") from None

