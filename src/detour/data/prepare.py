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
from detour.data.outfolder import check_out, commit, remove_stale_temporaries
from detour.data.shards import CORPUS_FORMAT, ShardWriter, token_dtype, write_json
from detour.data.sources import Source, document_location, iter_documents, parse_source
from detour.errors import DetourError, NoSpaceError
from detour.flags import positive_int
from detour.io import ensure_output_dir, is_disk_full, no_space, read_yaml_mapping
from detour.stop import die_with_parent

BATCH_DOCS = 256

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
    check_out(out, overwrite, protected)
    ensure_output_dir(out.parent, "--out (its parent folder)")
    remove_stale_temporaries(out, protected)
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
        check_out(out, overwrite, protected)
        commit(tmp, out)
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
