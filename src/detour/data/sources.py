"""Corpus sources for `detour prepare`: parse a source argument, then stream its documents.

    python -m detour.data.sources ../shared/data/corpora/en-biomed/pubmed-abstracts-1mb.txt

Source syntax (each may end in `:WEIGHT`, a positive number, for mixtures):
  PATH.txt                      one document per line (`--blank-line-docs`: blank-line separated)
  PATH.jsonl                    one JSON object a line; the text is in field `text` (`--text-field`)
  PATH.parquet                  a column `text` (`--text-field`), read in record batches
  DIR                           a Hugging Face `save_to_disk` folder (split `train` of a DatasetDict)
  hf:NAME_OR_DIR?split=S&config=C     `datasets.load_dataset` (streamed) or a saved folder
  synthetic:clinical?docs=N&seed=S&lang=en|fr    the SYNTHETIC clinical generator
A weight is split off only if what follows the last ':' is a number and the whole argument is not an
existing file, so `PATH:WEIGHT` stays unambiguous. Readers stream: memory does not grow with the
corpus. They yield one text per document (None for a null field) with where it starts (a line
number in a text or JSONL file, a row index otherwise; `document_location` turns that into
`path:line` or `path: row N`); `prepare` skips and counts the ones that are empty after stripping.
Bad input raises DetourError naming the file and line.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

from detour.errors import DetourError
from detour.io import jsonl_objects, text_lines, why_missing

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


@dataclass
class Source:
    kind: str            # text | jsonl | parquet | hf-disk | hf-hub | synthetic
    location: str        # a path, a hub name, or "clinical" for the synthetic generator
    weight: float | None = None
    options: dict = field(default_factory=dict)
    spec: str = ""       # the argument as the user wrote it

    @property
    def default_name(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic-{self.location}-{self.options.get('lang', 'en')}"
        return Path(self.location.rstrip("/")).name.split(".")[0] or "source"

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"


def _split_weight(arg: str) -> tuple[str, float | None]:
    head, sep, tail = arg.rpartition(":")
    if not sep or Path(arg).exists():
        return arg, None
    try:
        weight = float(tail)
    except ValueError:
        return arg, None
    if not math.isfinite(weight) or weight <= 0:
        raise DetourError(f"source {arg!r}: weight must be a positive number, got {tail!r}")
    return head, weight


def _query(rest: str) -> tuple[str, dict]:
    location, _, query = rest.partition("?")
    options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    return location, options


def parse_source(arg: str, text_field: str = "text", blank_line_docs: bool = False,
                 weight: float | None = None) -> Source:
    """Turn a command-line source argument into a Source (nothing is read yet)."""
    location, parsed_weight = _split_weight(arg.strip())
    if weight is not None and parsed_weight is not None:
        raise DetourError(f"source {arg!r}: weight given twice")
    weight = parsed_weight if weight is None else float(weight)
    opts = {"text_field": text_field}
    if location.startswith("synthetic:"):
        generator, options = _query(location[len("synthetic:"):])
        if generator != "clinical":
            raise DetourError(f"source {arg!r}: unknown synthetic generator {generator!r} (available: clinical)")
        unknown = set(options) - {"docs", "seed", "lang"}
        if unknown:
            raise DetourError(f"source {arg!r}: unknown option(s) {sorted(unknown)} (use docs, seed, lang)")
        try:
            docs, seed = int(options.get("docs", 3000)), int(options.get("seed", 0))
        except ValueError:
            raise DetourError(f"source {arg!r}: docs and seed must be integers") from None
        return Source("synthetic", generator, weight, {"docs": docs, "seed": seed, "lang": options.get("lang", "en")}, arg)
    if location.startswith("hf:"):
        name, options = _query(location[len("hf:"):])
        unknown = set(options) - {"split", "config", "revision", "field"}
        if unknown:
            raise DetourError(f"source {arg!r}: unknown option(s) {sorted(unknown)} (use split, config, revision, field)")
        opts.update(split=options.get("split", "train"), config=options.get("config"), revision=options.get("revision"))
        opts["text_field"] = options.get("field", text_field)
        kind = "hf-disk" if _is_saved_dataset(Path(name)) else "hf-hub"
        return Source(kind, name, weight, opts, arg)
    path = Path(location)
    if not path.exists():
        raise DetourError(f"source {location}: {why_missing(path)}")
    if path.is_dir():
        if not _is_saved_dataset(path):
            raise DetourError(f"source {location}: a folder must be a Hugging Face `save_to_disk` dataset "
                              "(dataset_info.json / dataset_dict.json not found)")
        return Source("hf-disk", location, weight, {**opts, "split": "train"}, arg)
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return Source("text", location, weight, {"blank_line_docs": blank_line_docs}, arg)
    if suffix in JSONL_SUFFIXES:
        return Source("jsonl", location, weight, opts, arg)
    if suffix in PARQUET_SUFFIXES:
        return Source("parquet", location, weight, opts, arg)
    raise DetourError(f"source {location}: unsupported file type {suffix!r} "
                      "(use .txt, .jsonl, .parquet, a saved HF dataset folder, hf:NAME or synthetic:clinical)")


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json"))


def iter_documents(source: Source) -> Iterator[tuple[int, str | None]]:
    """Stream (where it starts, text) for each document of a source, in order."""
    readers = {"text": _read_text, "jsonl": _read_jsonl, "parquet": _read_parquet,
               "hf-disk": _read_hf_disk, "hf-hub": _read_hf_hub, "synthetic": _read_synthetic}
    return readers[source.kind](source)


def iter_texts(source: Source) -> Iterator[str | None]:
    """Stream the documents of a source, in order."""
    return (text for _, text in iter_documents(source))


def document_location(source: Source, number: int) -> str:
    """`path:line` for text and JSONL files (lines count from 1), `source: row N` otherwise (from 0)."""
    if source.kind in ("text", "jsonl"):
        return f"{source.location}:{number}"
    if source.kind == "synthetic":
        return f"{source.spec}: document {number}"
    return f"{source.location}: row {number}"


def _read_text(source: Source) -> Iterator[tuple[int, str]]:
    if not source.options.get("blank_line_docs"):
        yield from text_lines(source.location)
        return
    block: list[str] = []
    first = 0
    for number, line in text_lines(source.location):
        if line.strip():
            if not block:
                first = number
            block.append(line)
        elif block:
            yield first, "\n".join(block)
            block = []
    if block:
        yield first, "\n".join(block)


def _check_text(value, where: str, field_name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DetourError(f"{where}: field {field_name!r} is {type(value).__name__}, expected a string")


def _read_jsonl(source: Source) -> Iterator[tuple[int, str | None]]:
    field_name = source.options["text_field"]
    for number, record in jsonl_objects(source.location):
        where = f"{source.location}:{number}"
        if field_name not in record:
            raise DetourError(f"{where}: no field {field_name!r} (fields: {', '.join(sorted(record))}; "
                              "choose one with --text-field)")
        yield number, _check_text(record[field_name], where, field_name)


def _read_parquet(source: Source) -> Iterator[tuple[int, str | None]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    field_name = source.options["text_field"]
    try:
        pf = pq.ParquetFile(source.location)
    except (pa.ArrowException, OSError) as exc:
        raise DetourError(f"{source.location}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if field_name not in names:
        raise DetourError(f"{source.location}: no column {field_name!r} (columns: {', '.join(names)}; "
                          "choose one with --text-field)")
    kind = pf.schema_arrow.field(field_name).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DetourError(f"{source.location}: column {field_name!r} is {kind}, expected strings")
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=[field_name]):
        for text in batch.column(0).to_pylist():
            yield row, text
            row += 1


def _rows(dataset, where: str, field_name: str, columns) -> Iterator[tuple[int, str | None]]:
    if columns is not None and field_name not in columns:
        raise DetourError(f"{where}: no column {field_name!r} (columns: {', '.join(columns)}; "
                          "choose one with --text-field or ?field=)")
    for row, record in enumerate(dataset):
        if field_name not in record:
            raise DetourError(f"{where}: row {row} has no field {field_name!r}")
        yield row, _check_text(record[field_name], f"{where}: row {row}", field_name)


def _read_hf_disk(source: Source) -> Iterator[tuple[int, str | None]]:
    import datasets

    try:
        dataset = datasets.load_from_disk(source.location)
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError... for a broken folder
        raise DetourError(f"{source.location}: cannot load saved dataset ({type(exc).__name__}: {exc})") from None
    split = source.options.get("split", "train")
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise DetourError(f"{source.location}: no split {split!r} (splits: {', '.join(dataset)}; "
                              "choose one with hf:DIR?split=NAME)")
        dataset = dataset[split]
    field_name = source.options["text_field"]
    if field_name in dataset.column_names:
        dataset = dataset.select_columns([field_name])  # read only the text column from the Arrow files
    yield from _rows(dataset, source.location, field_name, dataset.column_names)


def _read_hf_hub(source: Source) -> Iterator[tuple[int, str | None]]:
    import datasets

    opts = source.options
    try:
        # streaming: documents arrive as they download, nothing is held in memory or cached whole
        dataset = datasets.load_dataset(source.location, opts.get("config"), split=opts.get("split", "train"),
                                        revision=opts.get("revision"), streaming=True)
    except Exception as exc:  # offline, unknown name, bad split... all user-fixable
        raise DetourError(f"hf:{source.location}: cannot load dataset ({type(exc).__name__}: {exc})") from None
    columns = list(dataset.column_names) if dataset.column_names else None
    yield from _rows(dataset, f"hf:{source.location}", opts["text_field"], columns)


def _read_synthetic(source: Source) -> Iterator[tuple[int, str]]:
    from detour.data.synthetic import generate_documents

    o = source.options
    yield from enumerate(generate_documents(o["docs"], o["seed"], o["lang"]))


if __name__ == "__main__":
    src = parse_source(sys.argv[1])
    n = sum(1 for _ in iter_texts(src))
    print(f"{src.kind} source {src.default_name}: {n} documents (weight {src.weight})")
