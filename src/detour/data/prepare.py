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
end: an interrupted run leaves no folder that looks complete.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import re
import shutil
import sys
from collections import deque
from pathlib import Path

import numpy as np

from detour.data import tokenize
from detour.data.shards import CORPUS_FORMAT, ShardWriter, token_dtype, write_json
from detour.data.sources import Source, iter_texts, parse_source
from detour.errors import DetourError
from detour.io import read_yaml_mapping

BATCH_DOCS = 256

# The tokenizer a worker encodes with: set in the parent before forking (inherited for free) or
# loaded by `_init_worker` under the spawn start method.
_ENCODER = None
_SUFFIX: list[int] = []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="*", metavar="SOURCE[:WEIGHT]",
                        help="PATH (.txt/.jsonl/.parquet/saved HF folder), hf:NAME?split=S, "
                             "or synthetic:clinical?docs=N&seed=S&lang=en|fr; optional :WEIGHT (token share)")
    parser.add_argument("--tokenizer", help="Hugging Face model name or folder whose tokenizer to use")
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                        help="tokenizer processes (default: min(4, CPUs))")
    parser.add_argument("--text-field", default="text", help="JSONL/Parquet/HF field holding the text (default: text)")
    parser.add_argument("--blank-line-docs", action="store_true",
                        help=".txt sources: documents are separated by blank lines (default: one per line)")
    parser.add_argument("--spec", help="YAML data spec listing the sources (see this module's docstring)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing prepared folder")
    parser.add_argument("--batch-docs", type=int, default=BATCH_DOCS, help=argparse.SUPPRESS)


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


def _names(sources: list[tuple[Source, str | None]]) -> list[str]:
    names, seen = [], set()
    for src, explicit in sources:
        base = re.sub(r"[^A-Za-z0-9_.-]+", "-", explicit or src.default_name).strip("-.") or "source"
        name, k = base, 2
        while name in seen:
            name, k = f"{base}-{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _init_worker(tokenizer_name: str, suffix: list[int]) -> None:
    global _ENCODER, _SUFFIX
    if _ENCODER is None:
        _ENCODER = _make_encoder(tokenize.load_tokenizer(tokenizer_name))
    _SUFFIX = suffix


def _make_encoder(tokenizer):
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (pure Python) tokenizer
        return lambda texts: tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    # Some tokenizer.json files carry a truncation setting: it must never cut a document.
    backend.no_truncation()
    backend.no_padding()
    return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=True)]


def _encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = _ENCODER(texts)
    if _SUFFIX:
        encoded = [ids + _SUFFIX for ids in encoded]
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    return np.concatenate([np.asarray(ids, dtype=np.uint32) for ids in encoded]), lengths


def _batches(source: Source, batch_docs: int, counts: dict):
    """Stripped non-empty texts in batches; counts skipped documents as it goes."""
    batch = []
    for text in iter_texts(source):
        text = text.strip() if text is not None else ""
        if not text:
            counts["skipped"] += 1
            continue
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


def _write_source(source: Source, writer: ShardWriter, pool, batch_docs: int, progress, max_in_flight: int) -> int:
    counts = {"skipped": 0}
    total = source.options["docs"] if source.synthetic else None
    task = progress.add_task(writer.folder.name, total=total, tokens=0)

    def consume(result) -> None:
        flat, lengths = result
        writer.add(flat, lengths)
        progress.update(task, advance=len(lengths), tokens=writer.num_tokens)

    pending: deque = deque()
    for batch in _batches(source, batch_docs, counts):
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


def _check_out(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if overwrite or not any(out.iterdir()):
        return
    if (out / "manifest.json").exists():
        raise DetourError(f"--out {out}: already holds a prepared corpus (use --overwrite to replace it)")
    raise DetourError(f"--out {out}: exists and is not empty (use --overwrite to replace it)")


def prepare(sources: list[tuple[Source, str | None]], tokenizer_name: str, out: Path, workers: int = 1,
            overwrite: bool = False, batch_docs: int = BATCH_DOCS) -> dict:
    """Tokenize `sources` into `out`; returns the manifest written."""
    global _ENCODER, _SUFFIX
    if workers < 1:
        raise DetourError(f"--workers must be >= 1, got {workers}")
    out = Path(out)
    _check_out(out, overwrite)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker: N workers = N cores
    tokenizer = tokenize.load_tokenizer(tokenizer_name)
    policy = tokenize.separator_policy(tokenizer)
    suffix = policy["suffix_ids"] if policy["append_eos"] else []
    dtype = token_dtype(tokenize.vocab_size(tokenizer))
    fingerprint = tokenize.tokenizer_fingerprint(tokenizer)
    for src, _ in sources:
        if src.synthetic:
            print(f"note: {src.spec} is SYNTHETIC clinical text (generated, not real data)", file=sys.stderr)

    _remove_stale_temporaries(out)
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pool = None
    try:
        _ENCODER, _SUFFIX = _make_encoder(tokenizer), suffix
        if workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_name, suffix))
        entries = []
        with _progress() as progress:
            for (src, _), name in zip(sources, _names(sources)):
                writer = ShardWriter(tmp / name, dtype)
                skipped = _write_source(src, writer, pool, batch_docs, progress, 2 * workers + 1)
                if writer.num_documents == 0:
                    raise DetourError(f"{src.spec}: no documents (empty corpus; {skipped} empty document(s) skipped)")
                info = {"name": name, "input": src.spec, "kind": src.kind, "synthetic": src.synthetic,
                        "weight": src.weight, "skipped_documents": skipped}
                manifest = writer.close({**info, "tokenizer": str(tokenizer_name), "tokenizer_fingerprint": fingerprint})
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
        write_json(tmp / "manifest.json", top)
        _commit(tmp, out)
        return top
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _ENCODER, _SUFFIX = None, []


def _remove_stale_temporaries(out: Path) -> None:
    """Delete DIR.tmp-<pid> folders left by killed runs (their process is gone)."""
    import psutil

    for tmp in out.parent.glob(f"{glob.escape(out.name)}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished folder into place; an old one (emptied or --overwrite) is removed after."""
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
    manifest = prepare(sources, tokenizer_name, Path(args.out), args.workers, args.overwrite, args.batch_docs)
    for s in manifest["sources"]:
        tag = "  [SYNTHETIC]" if s["synthetic"] else ""
        weight = "" if s["weight"] is None else f"  weight {s['weight']:g}"
        print(f"  {s['name']}: {s['documents']:,} documents, {s['tokens']:,} tokens, "
              f"{s['skipped_documents']:,} skipped{weight}{tag}")
    print(f"prepared {manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
          f"({manifest['skipped_documents']:,} empty skipped, {manifest['dtype']}) -> {args.out}")
    return 0
