"""`detour prepare`: tokenize corpora into memory-mapped shards with a manifest.

    detour prepare "synthetic:clinical?docs=3000&seed=0" --tokenizer <model folder> --out runs/main/data
    detour prepare corpus.jsonl:0.7 notes.txt:0.3 --tokenizer answerdotai/ModernBERT-base --out data/mix --workers 8
    detour prepare --spec data.yaml --out data/mix

Sources and their syntax are described in `detour.data.sources`. A YAML spec lists them instead:

    tokenizer: answerdotai/ModernBERT-base      # optional; --tokenizer wins
    sources:
      - source: pubmed.jsonl                    # any source argument
        weight: 0.6                             # optional; all sources or none
        text_field: abstract                    # optional, per source
      - {source: notes.txt, weight: 0.4, blank_line_docs: true, name: notes}

Paths in a spec are relative to the current directory, as on the command line.

Each document is stripped and encoded with the tokenizer's own special tokens ([CLS] ... [SEP],
<s> ... </s>); documents empty after stripping are skipped and counted. Input is streamed and
tokenized by N worker processes in ordered batches, so memory stays flat as the corpus grows and
the output does not depend on N. Everything is written into DIR.tmp-<pid> and renamed to DIR at the
end: an interrupted run leaves no folder that looks complete, and the next run into the same DIR
removes what a killed run left (DIR.tmp-<pid>, DIR.old-<pid> of a process that is gone, holding only
files prepare writes).

What prepare replaces: DIR may be new, an empty folder, or, with --overwrite, the output of an
earlier `detour prepare` (its manifest.json has "format": "detour-prepared/1" and the folder holds
nothing else than what prepare writes). Any other folder is refused, and so is a DIR that contains
an input of the command (a source, the spec, the tokenizer folder): nothing of the user's is deleted.

Held-out documents: `--validation 0.02` (a fraction of each source's documents) or
`--validation 200` (that many documents of each source) moves documents, drawn at random with a
seed (`--validation-seed`, default 0) and the source's position, into DIR/validation/, a prepared
folder of its own in the same format (same source names and weights). Those documents are in no
training source: a recipe trains on DIR and measures its held-out loss on DIR/validation
(`validation:` in a recipe, docs/recipe.md). DIR/manifest.json counts the training documents and
records the split under "validation": its documents, tokens and a hash of its token ids. The split
is made after a source is tokenized, so the source's tokens are briefly on disk twice.

    detour prepare "synthetic:clinical?docs=3000&seed=0" --tokenizer minilm-l6 --out runs/data/synthetic-minilm \
        --validation 0.02

Very long documents: the tokenizer needs about 140 bytes of memory per character it encodes at
once (a 50 MB one-line document: some 7 GB). A document over 1,000,000 characters is therefore
encoded in pieces of about 256K characters, cut only at a whitespace where the tokenizer is shown
to give the same ids (see `detour.data.encoder`), so the ids on disk are exactly those of the whole
document. Where no such cut exists (no whitespace, a tokenizer whose normalizer or pre-tokenizer
could act across a cut), prepare warns before encoding it, naming the document's file and line.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import re
import shutil
import sys
from collections import deque
from pathlib import Path

import numpy as np

from detour.data import encoder, tokenize
from detour.data.encoder import CUT_CHARS, Encoder as _Encoder  # noqa: F401  (CUT_CHARS: tests read it here)
from detour.data.holdout import VALIDATION_DIR, check_validation_amount, hold_out, split_hash, validation_amount
from detour.data.shards import CORPUS_FORMAT, ShardWriter, token_dtype, write_json
from detour.data.sources import Source, document_location, iter_documents, parse_source
from detour.errors import DetourError, NoSpaceError
from detour.flags import positive_int
from detour.io import ensure_output_dir, is_disk_full, no_space, read_yaml_mapping
from detour.stop import die_with_parent

BATCH_DOCS = 256

# What a `detour prepare` run writes inside a source folder (ShardWriter and its manifest's temporary).
_SOURCE_FILE = re.compile(r"manifest\.json(\.tmp)?|offsets\.bin|tokens-\d{5,}\.bin")

# The tokenizer a worker encodes with: set in the parent before forking (inherited for free) or
# loaded by `_init_worker` under the spawn start method.
_ENCODER = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="*", metavar="SOURCE[:WEIGHT]",
                        help="PATH (.txt/.jsonl/.parquet/saved HF folder), hf:NAME?split=S, "
                             "or synthetic:clinical?docs=N&seed=S&lang=en|fr; optional :WEIGHT (token share)")
    parser.add_argument("--tokenizer", help="Hugging Face model name or folder whose tokenizer to use")
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--workers", type=positive_int, default=min(4, os.cpu_count() or 1),
                        help="tokenizer processes (default: min(4, CPUs))")
    parser.add_argument("--text-field", default="text", help="JSONL/Parquet/HF field holding the text (default: text)")
    parser.add_argument("--blank-line-docs", action="store_true",
                        help=".txt sources: documents are separated by blank lines (default: one per line)")
    parser.add_argument("--spec", help="YAML data spec listing the sources (see this module's docstring)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the output of an earlier `detour prepare` (never any other folder)")
    parser.add_argument("--validation", type=validation_amount, metavar="DOCS_OR_FRACTION",
                        help="hold out documents of each source into OUT/validation/: a fraction below 1 "
                             "(0.02) or a count of documents (200); they are never trained on")
    parser.add_argument("--validation-seed", type=int, default=0,
                        help="seed of the draw of the held-out documents (default: 0)")
    parser.add_argument("--batch-docs", type=positive_int, default=BATCH_DOCS, help=argparse.SUPPRESS)


def _sources_from_args(args) -> tuple[list[tuple[Source, str | None]], str | None]:
    """[(source, explicit name)] from the command line and/or the YAML spec, plus the spec's tokenizer."""
    out = [(parse_source(a, args.text_field, args.blank_line_docs), None) for a in args.sources]
    spec_tokenizer = None
    if args.spec:
        spec = read_yaml_mapping(args.spec, "data spec")
        if not isinstance(spec.get("sources"), list):
            raise DetourError(f"{args.spec}: expected a mapping with a `sources:` list")
        unknown = set(spec) - {"sources", "tokenizer"}
        if unknown:
            raise DetourError(f"{args.spec}: unknown key(s) {sorted(unknown)} (allowed: sources, tokenizer)")
        spec_tokenizer = spec.get("tokenizer")
        for i, item in enumerate(spec["sources"]):
            where = f"{args.spec}: sources[{i}]"
            item = {"source": item} if isinstance(item, str) else item
            if not isinstance(item, dict) or "source" not in item:
                raise DetourError(f"{where}: expected a source string or a mapping with `source:`")
            bad = set(item) - {"source", "weight", "text_field", "blank_line_docs", "name"}
            if bad:
                raise DetourError(f"{where}: unknown key(s) {sorted(bad)} "
                                  "(allowed: source, weight, text_field, blank_line_docs, name)")
            weight = item.get("weight")
            if weight is not None and (not isinstance(weight, (int, float)) or weight <= 0):
                raise DetourError(f"{where}: weight must be a positive number, got {weight!r}")
            src = parse_source(str(item["source"]), item.get("text_field", args.text_field),
                               bool(item.get("blank_line_docs", args.blank_line_docs)), weight)
            out.append((src, item.get("name")))
    if not out:
        raise DetourError("no sources given (pass SOURCE arguments or --spec data.yaml)")
    weighted = [s.weight is not None for s, _ in out]
    if any(weighted) and not all(weighted):
        raise DetourError("give a weight to every source or to none (weights are token shares of a mixture)")
    return out, spec_tokenizer


def _names(sources: list[tuple[Source, str | None]], reserved: tuple[str, ...] = ()) -> list[str]:
    names, seen = [], set(reserved)
    for src, explicit in sources:
        base = re.sub(r"[^A-Za-z0-9_.-]+", "-", explicit or src.default_name).strip("-.") or "source"
        name, k = base, 2
        while name in seen:
            name, k = f"{base}-{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _init_worker(tokenizer_name: str, policy: dict, parent: int) -> None:
    global _ENCODER
    die_with_parent(parent)  # a worker of a killed prepare (or of a killed study's prepare) goes with it
    if _ENCODER is None:
        _ENCODER = _Encoder(tokenize.load_tokenizer(tokenizer_name), policy)


def _batches(source: Source, batch_docs: int, counts: dict, encoding: _Encoder):
    """Stripped non-empty documents in batches; counts skipped documents as it goes.

    A document over CUT_CHARS is replaced by the tuple of its pieces (`_Encoder.cut`), with a
    warning before it is encoded when a long stretch of it could not be cut.
    """
    batch = []
    for number, text in iter_documents(source):
        text = text.strip() if text is not None else ""
        if not text:
            counts["skipped"] += 1
            continue
        if len(text) > encoder.CUT_CHARS:
            pieces, why = encoding.cut(text)
            if why is not None:
                encoder.warn_long_document(document_location(source, number), len(text), max(map(len, pieces)), why)
            text = tuple(pieces) if len(pieces) > 1 else text
        batch.append(text)
        if len(batch) == batch_docs:
            yield batch
            batch = []
    if batch:
        yield batch


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed:,} docs  {task.fields[tokens]:,} tokens"),
                    TimeElapsedColumn(), console=console, disable=not console.is_terminal)


def _encode(docs: list) -> tuple[np.ndarray, np.ndarray]:
    return _ENCODER.encode(docs)


def _write_source(source: Source, writer: ShardWriter, pool, batch_docs: int, progress, max_in_flight: int) -> int:
    counts = {"skipped": 0}
    total = source.options["docs"] if source.synthetic else None
    task = progress.add_task(writer.folder.name, total=total, tokens=0)

    def consume(result) -> None:
        flat, lengths = result
        writer.add(flat, lengths)
        progress.update(task, advance=len(lengths), tokens=writer.num_tokens)

    pending: deque = deque()
    for batch in _batches(source, batch_docs, counts, _ENCODER):
        if pool is None:
            consume(_encode(batch))
            continue
        pending.append(pool.apply_async(_encode, (batch,)))
        # Bounded look-ahead keeps memory flat and the output in input order.
        while len(pending) >= max_in_flight:
            consume(pending.popleft().get())
    while pending:
        consume(pending.popleft().get())
    return counts["skipped"]


# ---- what prepare may replace or remove ----

def _input_paths(sources: list[tuple[Source, str | None]], tokenizer_name: str, extra=()) -> list[Path]:
    """The files and folders this command reads, resolved: nothing holding one may be removed."""
    from detour.paths import resolve_model_ref

    try:
        tokenizer = resolve_model_ref(str(tokenizer_name))
    except DetourError:
        tokenizer = str(tokenizer_name)
    candidates = [src.location for src, _ in sources if not src.synthetic] + [tokenizer, *extra]
    return [Path(c).resolve() for c in candidates if c and Path(c).exists()]


def _input_inside(folder: Path, inputs: list[Path]) -> Path | None:
    folder = folder.resolve()
    return next((p for p in inputs if p == folder or folder in p.parents), None)


def _foreign_entry(folder: Path, nested: bool = True) -> Path | None:
    """The first thing in `folder` that a `detour prepare` run does not write, or None.

    prepare writes manifest.json and one folder per source holding only manifest.json,
    offsets.bin and tokens-NNNNN.bin (plus manifest.json.tmp while writing a manifest), and with
    --validation a `validation` folder laid out the same way.
    """
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            return entry
        if entry.is_file() and entry.name in ("manifest.json", "manifest.json.tmp"):
            continue
        if not entry.is_dir():
            return entry
        if nested and entry.name == VALIDATION_DIR and (entry / "manifest.json").is_file():
            inner = _foreign_entry(entry, nested=False)
            if inner is not None:
                return inner
            continue
        for inner in sorted(entry.iterdir()):
            if inner.is_symlink() or not inner.is_file() or not _SOURCE_FILE.fullmatch(inner.name):
                return inner
    return None


def _is_prepared(folder: Path) -> bool:
    """Whether `folder` has the manifest.json of a `detour prepare` output (its "format" field)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == CORPUS_FORMAT


def _check_out(out: Path, overwrite: bool, inputs: list[Path]) -> None:
    """Refuse an --out that prepare may not fill or replace, before any work; deletes nothing."""
    if out.is_symlink():
        raise DetourError(f"--out {out}: is a symbolic link (to {os.path.realpath(out)}); prepare replaces "
                          "the folder itself, so give a real folder path")
    if not out.exists():
        return
    if not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if os.path.ismount(out):
        raise DetourError(f"--out {out}: is a mount point, which prepare cannot replace; give a new folder "
                          f"inside it (e.g. {out / 'data'})")
    held = _input_inside(out, inputs)
    if held is not None:
        raise DetourError(f"--out {out}: contains {held}, an input of this command; prepare never replaces "
                          "a folder holding its inputs (choose a new --out)")
    if _input_inside(out, [Path.cwd().resolve()]) is not None:
        raise DetourError(f"--out {out}: is the current folder or holds it, which prepare cannot replace; "
                          "give a new folder (e.g. --out data)")
    if not any(out.iterdir()):
        return  # an empty folder
    if not _is_prepared(out):
        raise DetourError(f"--out {out}: exists, is not empty and is not the output of `detour prepare` "
                          f"(no manifest.json with \"format\": \"{CORPUS_FORMAT}\"); prepare writes into a new "
                          "or empty folder, so choose another --out")
    if not overwrite:
        raise DetourError(f"--out {out}: already holds a prepared corpus (use --overwrite to replace it)")
    foreign = _foreign_entry(out)
    if foreign is not None:
        raise DetourError(f"--out {out}: holds {foreign}, which `detour prepare` did not write; refusing to "
                          "replace the folder (move that elsewhere first, or choose another --out)")


def prepare(sources: list[tuple[Source, str | None]], tokenizer_name: str, out: Path, workers: int = 1,
            overwrite: bool = False, batch_docs: int = BATCH_DOCS, inputs=(), validation: float | int | None = None,
            validation_seed: int = 0) -> dict:
    """Tokenize `sources` into `out`; returns the manifest written.

    `inputs`: other paths the command reads (its YAML spec), protected like the sources.
    `validation`: hold out this fraction (below 1) or count of each source's documents (module doc).
    """
    global _ENCODER
    if workers < 1:
        raise DetourError(f"--workers must be >= 1, got {workers}")
    if validation is not None:
        check_validation_amount(validation, sources)
    out = Path(out)
    protected = _input_paths(sources, tokenizer_name, inputs)
    _check_out(out, overwrite, protected)
    ensure_output_dir(out.parent, "--out (its parent folder)")
    _remove_stale_temporaries(out, protected)
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    if tmp.exists():  # left in place above: it holds something prepare did not write
        raise DetourError(f"{tmp}: exists and was not written by `detour prepare`; move it away and rerun")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker: N workers = N cores
    tokenizer = tokenize.load_tokenizer(tokenizer_name)
    policy = tokenize.separator_policy(tokenizer)
    dtype = token_dtype(tokenize.vocab_size(tokenizer))
    fingerprint = tokenize.tokenizer_fingerprint(tokenizer)
    for src, _ in sources:
        if src.synthetic:
            print(f"note: {src.spec} is SYNTHETIC clinical text (generated, not real data)", file=sys.stderr)

    tmp.mkdir()
    pool = None
    try:
        _ENCODER = _Encoder(tokenizer, policy)
        if workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_name, policy, os.getpid()))
        entries, held_out = [], []
        reserved = (VALIDATION_DIR,) if validation is not None else ()
        with _progress() as progress:
            for position, ((src, _), name) in enumerate(zip(sources, _names(sources, reserved))):
                writer = ShardWriter(tmp / name, dtype)
                skipped = _write_source(src, writer, pool, batch_docs, progress, 2 * workers + 1)
                if writer.num_documents == 0:
                    raise DetourError(f"{src.spec}: no documents (empty corpus; {skipped} empty document(s) skipped)")
                info = {"name": name, "input": src.spec, "kind": src.kind, "synthetic": src.synthetic,
                        "weight": src.weight, "skipped_documents": skipped}
                meta = {**info, "tokenizer": str(tokenizer_name), "tokenizer_fingerprint": fingerprint}
                manifest = writer.close(meta)
                if validation is not None:
                    manifest, kept = hold_out(tmp, name, src.spec, meta, validation, validation_seed, position, dtype)
                    held_out.append({**info, "path": name, "documents": kept["documents"], "tokens": kept["tokens"],
                                     "hash": kept["hash"]})
                entries.append({**info, "path": name, "documents": manifest["documents"], "tokens": manifest["tokens"]})
        top = {
            "format": CORPUS_FORMAT,
            "documents": sum(e["documents"] for e in entries),
            "tokens": sum(e["tokens"] for e in entries),
            "skipped_documents": sum(e["skipped_documents"] for e in entries),
            "sources": entries,
            "synthetic": any(e["synthetic"] for e in entries),
            "tokenizer": str(tokenizer_name),
            "tokenizer_fingerprint": fingerprint,
            "vocab_size": tokenize.vocab_size(tokenizer),
            "separator_policy": policy,
            "dtype": dtype.str,
            "seq_len_independent": True,
        }
        if validation is not None:
            split = {**top, "split": VALIDATION_DIR, "documents": sum(e["documents"] for e in held_out),
                     "tokens": sum(e["tokens"] for e in held_out), "skipped_documents": 0, "sources": held_out,
                     "hash": split_hash(held_out), "requested": validation, "seed": validation_seed}
            write_json(tmp / VALIDATION_DIR / "manifest.json", split)
            top["validation"] = {"path": VALIDATION_DIR, "documents": split["documents"], "tokens": split["tokens"],
                                 "hash": split["hash"], "requested": validation, "seed": validation_seed}
        write_json(tmp / "manifest.json", top)
        # --out was checked before the run; check again now that it is about to be replaced
        _check_out(out, overwrite, protected)
        _commit(tmp, out)
        return top
    except BaseException as exc:
        writer = None  # its open shard file would keep the removed bytes in use
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise NoSpaceError(no_space(f"the prepared corpus {out} (in {tmp})", out.parent, exc,
                                        after=f"{tmp} was removed and nothing at {out} changed; free space, then "
                                              "rerun the same command")) from None
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _ENCODER = None


def link_prepared(source: Path, out: Path, inputs=()) -> None:
    """The prepared corpus `source` (another study folder's, made by the same command) placed at
    `out` without tokenizing again: its files hard-linked, or copied where the filesystem cannot link.

    Safe to link: nothing writes into a prepared folder after it is made; prepare replaces a folder
    whole (a new one renamed into place, the old one's names removed), so the other folder's files
    never change under it. `out` is checked and replaced as `prepare --overwrite` would, through
    OUT.tmp-<pid>, so an interrupted link leaves nothing that looks complete.
    """
    source, out = Path(source), Path(out)
    if not _is_prepared(source) or _foreign_entry(source) is not None:
        raise DetourError(f"{source}: not a prepared corpus as `detour prepare` writes it; cannot link it")
    protected = [Path(p).resolve() for p in inputs]
    _check_out(out, True, protected)
    ensure_output_dir(out.parent, "--out (its parent folder)")
    _remove_stale_temporaries(out, protected)
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        raise DetourError(f"{tmp} exists and holds files prepare does not write; move it away")

    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or one without hard links
            shutil.copy2(src, dst)

    try:
        shutil.copytree(source, tmp, copy_function=link_or_copy)
        _check_out(out, True, protected)
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _owner_running(pid: int, folder: Path) -> bool:
    """Whether process `pid` is alive and could have written `folder` (it started before the folder's
    last change; a later process only reuses the number of a dead one)."""
    import psutil

    if pid == os.getpid():
        return False  # this process runs one prepare into DIR at a time: the folder is a leftover
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return started <= folder.stat().st_mtime + 2.0  # create_time is rounded: give it slack


def _remove_stale_temporaries(out: Path, inputs: list[Path]) -> None:
    """Delete DIR.tmp-<pid> and DIR.old-<pid> folders left by killed runs (their process is gone).

    Only folders named so and holding nothing but what prepare writes: anything else stays.
    """
    pattern = re.compile(re.escape(out.name) + r"\.(?:tmp|old)-(\d+)")
    for folder in sorted(out.parent.glob(f"{glob.escape(out.name)}.*-*")):
        m = pattern.fullmatch(folder.name)
        if m is None or folder.is_symlink() or not folder.is_dir() or _owner_running(int(m.group(1)), folder):
            continue
        if _input_inside(folder, inputs) is not None or _foreign_entry(folder) is not None:
            print(f"note: left {folder} in place: it looks like a leftover of an interrupted `detour prepare` "
                  "but holds files prepare does not write", file=sys.stderr)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        print(f"note: removed {folder}, left by an interrupted `detour prepare` (process {m.group(1)} is gone)",
              file=sys.stderr)


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished folder into place; an old one (empty, or a prepared corpus replaced with
    --overwrite, both checked by `_check_out`) is removed after."""
    old = None
    if out.exists():
        old = out.parent / f"{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def run(args) -> int:
    sources, spec_tokenizer = _sources_from_args(args)
    tokenizer_name = args.tokenizer or spec_tokenizer
    if not tokenizer_name:
        raise DetourError("no tokenizer given (--tokenizer NAME_OR_FOLDER, or `tokenizer:` in the spec)")
    manifest = prepare(sources, tokenizer_name, Path(args.out), args.workers, args.overwrite, args.batch_docs,
                       inputs=[args.spec] if args.spec else [], validation=args.validation,
                       validation_seed=args.validation_seed)
    for s in manifest["sources"]:
        tag = "  [SYNTHETIC]" if s["synthetic"] else ""
        weight = "" if s["weight"] is None else f"  weight {s['weight']:g}"
        print(f"  {s['name']}: {s['documents']:,} documents, {s['tokens']:,} tokens, "
              f"{s['skipped_documents']:,} skipped{weight}{tag}")
    print(f"prepared {manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
          f"({manifest['skipped_documents']:,} empty skipped; token ids stored as "
          f"{np.dtype(manifest['dtype']).name}) -> {args.out}")
    if "validation" in manifest:
        held = manifest["validation"]
        print(f"held out {held['documents']:,} documents, {held['tokens']:,} tokens (hash {held['hash'][:12]}) "
              f"-> {Path(args.out) / held['path']}")
    return 0
