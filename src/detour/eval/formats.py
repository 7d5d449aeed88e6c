"""Readers of task files: each turns one split file (or folder) into a list of example dicts.

    python -c "from detour.eval.tasks import load_spec; from detour.eval.formats import read_split; \
print(read_split(load_spec('gad'), 'train')[0])"

Example dicts, by kind:
- token tasks: {"tokens": [...], "tags": [...], "doc": id}
- text tasks: {"text": str, "label": str, "doc": id} or, multi-label, {"text": str, "labels": [...], "doc": id}

`doc` groups examples that must stay in the same split (a sentence's abstract, a document).
All readers accept CRLF files and report malformed lines with the file and line number.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from detour.errors import DetourError
from detour.io import jsonl_objects, why_missing
from detour.eval.brat import read_folder
from detour.eval.metrics import spans_from_tags
from detour.eval.tasks import TaskSpec, register_format
from detour.notices import warn

HEADER_NAMES = {"label", "labels", "sentence", "text", "index", "id", "sentence1", "tag", "tags"}


def read_split(spec: TaskSpec, split: str) -> list[dict]:
    from detour.eval.tasks import get_format

    path = spec.path(split)
    if isinstance(path, Path) and not path.exists():
        why = why_missing(path)
        if why != "no such file or folder":
            raise DetourError(f"task {spec.name}: {split} data {path}: {why}")
        raise DetourError(f"task {spec.name}: {split} data not found at {path} (see --data-root)")
    examples = get_format(spec.format)(path, spec, split=split)
    if not examples:
        raise DetourError(f"task {spec.name}: no examples read from {path}")
    return examples


# Inside `collecting_line_errors`, a reader notes a malformed line and reads on: one pass then finds
# every problem of a file, and the readers' warnings and the label checks still run on the rest.
_LINE_ERRORS: ContextVar[list[str] | None] = ContextVar("line_errors", default=None)


@contextmanager
def collecting_line_errors():
    """The malformed lines the readers meet inside the block, as messages; the caller raises them."""
    token = _LINE_ERRORS.set([])
    try:
        yield _LINE_ERRORS.get()
    finally:
        _LINE_ERRORS.reset(token)


def bad_line(message: str) -> None:
    """A malformed line: DetourError at once, or noted when the lines' errors are being collected."""
    errors = _LINE_ERRORS.get()
    if errors is None:
        raise DetourError(message)
    errors.append(message)


def _lines(path: Path):
    with open(path, encoding="utf-8", newline="") as fh:
        for n, line in enumerate(fh, 1):
            yield n, line.rstrip("\r\n")


IOB_SUFFIXES = (".tsv", ".txt", ".iob", ".iob2", ".iobes", ".conll", ".bio")
TAG = re.compile(r"^[BIES]-.+")


def repair_orphans(tags: list[str]) -> tuple[list[str], list[int]]:
    """IOB2 / IOBES tags with each orphan made an opener: an `I-T` or `E-T` whose previous tag is
    not `B-T` or `I-T` (no entity of type T is open) becomes `B-T` or `S-T`. Returns the tags
    and the positions repaired. This is the usual lenient reading (conlleval, seqeval's default
    mode) and the one the scorer applies to gold and predictions alike, so the entities scored
    do not change; only the training targets become consistent."""
    out, repaired, prev = [], [], "O"
    for i, tag in enumerate(tags):
        prefix, _, kind = tag.partition("-")
        if prefix in ("I", "E") and prev not in (f"B-{kind}", f"I-{kind}"):
            tag = ("B-" if prefix == "I" else "S-") + kind
            repaired.append(i)
        out.append(tag)
        prev = tag
    return out, repaired


def _report_orphans(spec: TaskSpec, split: str, path, where: list[str]) -> None:
    if where:
        warn(f"task {spec.name}, {split or path}: {len(where)} orphan I-/E- tag(s) (no B- or I- of the same type "
             f"just before) read as B-/S-, first at {where[0]}; set options.strict_tags: true to make this an error")


def _orphan_error(where: str, tag: str) -> DetourError:
    return DetourError(f"{where}: orphan tag {tag!r}: no B- or I- of its type just before it "
                       "(options.strict_tags is true; without it, it would be read as B-/S-)")


@register_format("iob", options=("columns", "strict_tags"))
def read_iob(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Token-per-line IOB2/IOBES files, tab- or space-separated: `options.columns` columns
    (default 2), the token first and the tag last; a line with another number of columns is an
    error. Blank lines end sentences; `-DOCSTART-` lines start a new document and are not
    sentences. An orphan I-/E- tag is read as B-/S- with a warning (an error with
    `options.strict_tags: true`). A folder reads every token file in it (sorted), each file its
    own document(s)."""
    path = Path(path)
    orphans: list[str] = []
    if path.is_dir():
        out = []
        for f in sorted(p for p in path.iterdir() if p.suffix.lower() in IOB_SUFFIXES):
            docstart = _has_docstart(f)
            out.extend({**ex, "doc": f"{f.stem}/{ex['doc']}" if docstart else f.stem} for ex in _read_iob_file(f, spec, orphans))
    else:
        out = _read_iob_file(path, spec, orphans)
    _report_orphans(spec, split, path, orphans)
    return out


def _read_iob_file(path: Path, spec: TaskSpec, orphans: list[str]) -> list[dict]:
    columns = spec.options.get("columns", 2)
    if not isinstance(columns, int) or isinstance(columns, bool) or columns < 2:
        raise DetourError(f"{spec.source or 'task ' + spec.name}: options.columns must be an integer >= 2 "
                          f"(token first, tag last), got {columns!r}")
    strict = bool(spec.options.get("strict_tags", False))
    out, tokens, tags, lines = [], [], [], []
    doc = 0
    sentence_docs = not _has_docstart(path)

    def flush():
        nonlocal tokens, tags, lines
        if tokens:
            fixed, repaired = repair_orphans(tags)
            if repaired and strict:
                raise _orphan_error(f"{path}:{lines[repaired[0]]}", tags[repaired[0]])
            orphans.extend(f"{path}:{lines[i]}" for i in repaired)
            out.append({"tokens": tokens, "tags": fixed, "doc": len(out) if sentence_docs else doc})
        tokens, tags, lines = [], [], []

    for n, line in _lines(path):
        if not line.strip():
            flush()
            continue
        line = line.rstrip()  # trailing spaces or tabs are not an extra column
        parts = line.split("\t") if "\t" in line else line.split()
        if parts[0] == "-DOCSTART-":
            flush()
            doc += 1
            continue
        if len(parts) != columns:
            bad_line(f"{path}:{n}: {len(parts)} column(s), the spec reads {columns} (options.columns; token first, "
                     f"tag last): {line!r}")
            continue
        tag = parts[-1].strip()
        if tag != "O" and not TAG.match(tag):
            bad_line(f"{path}:{n}: tag {tag!r} is not O or B-/I-/E-/S-<type>")
            continue
        tokens.append(parts[0])
        tags.append(tag)
        lines.append(n)
    flush()
    return out


def _has_docstart(path: Path) -> bool:
    return any(line.startswith("-DOCSTART-") for _, line in _lines(path))


def _column(header: list[str] | None, want, default: int, path: Path, field: str) -> int:
    if want is None:
        return default
    if isinstance(want, int):
        return want
    if header is None or want not in header:
        raise DetourError(f"{path}: options.{field} = {want!r} is not a column of the header {header}")
    return header.index(want)


def _read_table(path: Path, spec: TaskSpec, delimiter: str) -> list[dict]:
    opts = spec.options
    with open(path, encoding="utf-8", newline="") as fh:
        quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        rows = [r for r in csv.reader(fh, delimiter=delimiter, quoting=quoting)]
    header_opt = opts.get("header", "auto")
    has_header = bool(rows) and (
        header_opt is True
        or (header_opt == "auto" and any(c.strip().lower() in HEADER_NAMES for c in rows[0]))
    )
    header = [c.strip() for c in rows[0]] if has_header else None
    body = rows[1:] if has_header else rows
    width = len(header) if header else (len(body[0]) if body else 0)
    if header:
        text_default = next((header.index(c) for c in ("sentence", "text", "sentence1") if c in header), width - 2)
        label_default = next((header.index(c) for c in ("label", "labels") if c in header), width - 1)
    else:
        text_default, label_default = width - 2, width - 1
    ti = _column(header, opts.get("text_column"), text_default, path, "text_column")
    li = _column(header, opts.get("label_column"), label_default, path, "label_column")
    di = _column(header, opts.get("doc_column"), -1, path, "doc_column") if "doc_column" in opts else None
    label_sep = opts.get("label_sep")
    out = []
    first_line = 2 if has_header else 1
    for i, row in enumerate(body):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != width or len(row) <= max(ti, li, di or 0):
            # a stray tab or comma in a text shifts every later column: never guess which is which
            raise DetourError(f"{path}:{first_line + i}: expected {width} columns, got {len(row)}: {row!r}")
        ex = {"text": row[ti], "doc": row[di] if di is not None else i}
        label = row[li].strip()
        if label_sep is not None:
            ex["labels"] = [x.strip() for x in label.split(label_sep) if x.strip()]
        else:
            ex["label"] = label
        out.append(ex)
    return out


TABLE_OPTIONS = ("header", "text_column", "label_column", "doc_column", "label_sep")
RECORD_OPTIONS = ("text_field", "label_field", "tokens_field", "tags_field", "doc_field", "strict_tags")


@register_format("tsv", options=TABLE_OPTIONS)
def read_tsv(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Tab-separated text/label rows; header detected (or options.header: true/false);
    columns by options.text_column / label_column (name or index); options.label_sep for multi-label."""
    return _read_table(path, spec, "\t")


@register_format("csv", options=(*TABLE_OPTIONS, "delimiter"))
def read_csv(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Comma-separated, quoted as usual; same options as tsv."""
    return _read_table(path, spec, spec.options.get("delimiter", ","))


@register_format("jsonl", options=RECORD_OPTIONS)
def read_jsonl(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """One JSON object a line; fields by options.text_field/label_field (default text, label;
    a list label means multi-label), or tokens_field/tags_field for token tasks (tags checked
    and repaired as in iob)."""
    opts = spec.options
    out, orphans = [], []
    for n, obj in jsonl_objects(path):
        out.append(_from_record(obj, opts, f"{path}:{n}", len(out), orphans))
    _report_orphans(spec, split, path, orphans)
    return out


def _from_record(obj: dict, opts: dict, where: str, index: int, orphans: list[str]) -> dict:
    doc = obj.get(opts.get("doc_field", "doc"), index)
    if "tokens_field" in opts or "tokens" in obj:
        tf, gf = opts.get("tokens_field", "tokens"), opts.get("tags_field", "tags")
        if tf not in obj or gf not in obj:
            raise DetourError(f"{where}: missing field {tf!r} or {gf!r}")
        tokens, tags = [str(t) for t in obj[tf]], [str(t) for t in obj[gf]]
        if len(tokens) != len(tags):
            raise DetourError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        bad = next((t for t in tags if t != "O" and not TAG.match(t)), None)
        if bad is not None:
            raise DetourError(f"{where}: tag {bad!r} is not O or B-/I-/E-/S-<type>")
        fixed, repaired = repair_orphans(tags)
        if repaired:
            if opts.get("strict_tags"):
                raise _orphan_error(f"{where} (token {repaired[0]})", tags[repaired[0]])
            orphans.extend(f"{where} (token {i})" for i in repaired)
        return {"tokens": tokens, "tags": fixed, "doc": doc}
    tf, lf = opts.get("text_field", "text"), opts.get("label_field", "label")
    if tf not in obj or lf not in obj:
        raise DetourError(f"{where}: missing field {tf!r} or {lf!r}")
    label = obj[lf]
    if isinstance(label, list):
        return {"text": str(obj[tf]), "labels": [str(x) for x in label], "doc": doc}
    return {"text": str(obj[tf]), "label": str(label), "doc": doc}


@register_format("hoc", options=())
def read_hoc(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Hallmarks of Cancer: `text/PMID.txt` (a sentence a line) and `labels/PMID.txt` (one line:
    a `<` before each sentence's chunk; labels `Hallmark--subclass` joined by `AND`, no space after).
    Labels are the top-level hallmarks; a sentence with none (or `NULL`) gets "none"."""
    text_dir, label_dir = Path(path) / "text", Path(path) / "labels"
    if not text_dir.is_dir() or not label_dir.is_dir():
        raise DetourError(f"{path}: a HoC folder needs text/ and labels/ subfolders")
    out = []
    for tf in sorted(text_dir.glob("*.txt")):
        lf = label_dir / tf.name
        if not lf.exists():
            raise DetourError(f"{lf}: missing label file for {tf}")
        sentences = [s for _, s in _lines(tf)]
        chunks = lf.read_text(encoding="utf-8").rstrip("\r\n").split("<")[1:]
        if len(chunks) != len(sentences):
            raise DetourError(f"{lf}: {len(chunks)} label chunks for {len(sentences)} sentences in {tf}")
        for sentence, chunk in zip(sentences, chunks):
            labels = sorted({lab.split("--")[0].strip() for lab in chunk.split("AND") if lab.strip()} - {"NULL"})
            out.append({"text": sentence, "labels": labels or ["none"], "doc": tf.stem})
    return out


def _brat_annotations(ann: Path):
    """(text-bound annotations {id: (type, [(start, end)...])}, notes {target id: [note text]})."""
    spans, notes = {}, {}
    for n, line in _lines(ann):
        if line.startswith("T"):
            parts = line.split("\t")
            if len(parts) < 2:
                raise DetourError(f"{ann}:{n}: malformed text-bound annotation {line!r}")
            kind, _, offsets = parts[1].partition(" ")
            try:
                frags = [tuple(int(x) for x in frag.split()) for frag in offsets.split(";")]
            except ValueError:
                raise DetourError(f"{ann}:{n}: bad offsets {offsets!r}") from None
            spans[parts[0]] = (kind, frags)
        elif line.startswith("#"):
            parts = line.split("\t")
            if len(parts) >= 3:
                target = parts[1].split(" ")[-1]
                notes.setdefault(target, []).append(parts[2])
    return spans, notes


def _expressions(note: str) -> list[str]:
    # A note holds one or more ICD-O expressions separated by ';', each "topography morphology"
    # or a lone code: each whole expression (whitespace-normalised) is one label.
    return [" ".join(e.split()) for e in note.split(";") if e.strip()]


@register_format("brat_doc_codes", options=("entity_type", "top_k"))
def read_brat_doc_codes(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Document multi-label from BRAT notes (FRACCO): a document's labels are the ICD-O
    expressions in the notes of its `options.entity_type` annotations (default expression_CIM),
    kept if among the `options.top_k` most frequent over the folder (documents counted once);
    documents left with no label are dropped; a .txt without .ann has no label."""
    opts = spec.options
    entity_type, top_k = opts.get("entity_type", "expression_CIM"), opts.get("top_k")
    docs = []
    for txt in sorted(Path(path).glob("*.txt")):
        ann = txt.with_suffix(".ann")
        codes = set()
        if ann.exists():
            spans, notes = _brat_annotations(ann)
            for tid, (kind, _) in spans.items():
                if kind == entity_type:
                    for note in notes.get(tid, []):
                        codes.update(_expressions(note))
        docs.append({"text": txt.read_text(encoding="utf-8"), "codes": codes, "doc": txt.stem})
    freq = Counter(c for d in docs for c in d["codes"])
    keep = {c for c, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]} if top_k else set(freq)
    out = []
    for d in docs:
        labels = sorted(d["codes"] & keep)
        if labels:
            out.append({"text": d["text"], "labels": labels, "doc": d["doc"]})
    return out


_WORD = re.compile(r"\w+|[^\w\s]")


@register_format("brat_entities", options=("entity_types",))
def read_brat_entities(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """Flat NER from BRAT (read as in detour.eval.brat, CRLF offsets included): each line of each
    .txt becomes a sentence of word tokens, tagged IOB2 from the text-bound annotations
    (options.entity_types to keep some; discontinuous ones take their full extent). Flat tags hold
    one entity per word, so where spans overlap the longest (then the earliest) one wins and the
    others are dropped; so is an entity with a boundary inside a word, and one crossing a line is
    cut in two. How many gold entities did not survive is printed as a warning per split."""
    keep = set(spec.options.get("entity_types") or [])
    out = []
    total, overlapped, mangled = 0, 0, 0
    for doc in read_folder(Path(path)):
        # distinct (start, end, type), in file order so that ties keep the earlier annotation
        ents = list(dict.fromkeys((e.start, e.end, e.type) for e in doc.entities if not keep or e.type in keep))
        ents.sort(key=lambda e: (e[0], -(e[1] - e[0])))
        chosen, last_end = [], -1
        for s, e, kind in ents:
            if s >= last_end:
                chosen.append((s, e, kind))
                last_end = e
        recovered, offset = set(), 0
        for line in doc.text.split("\n"):
            body = line.rstrip("\r")  # BRAT offsets count the \r of a CRLF line; a word never holds it
            words = [(m.start() + offset, m.end() + offset, m.group()) for m in _WORD.finditer(body)]
            offset += len(line) + 1
            if not words:
                continue
            tags, prev = [], None
            for ws, we, _ in words:
                idx = next((i for i, c in enumerate(chosen) if c[0] <= ws and we <= c[1]), None)
                tags.append("O" if idx is None else ("I-" if idx == prev else "B-") + chosen[idx][2])
                prev = idx
            recovered |= {(words[a][0], words[b - 1][1], t) for a, b, t in spans_from_tags(tags)}
            out.append({"tokens": [w for _, _, w in words], "tags": tags, "doc": doc.id})
        lost = set(ents) - recovered
        total += len(ents)
        overlapped += len(lost - set(chosen))
        mangled += len(lost & set(chosen))
    if overlapped + mangled:
        dropped = overlapped + mangled
        warn(f"task {spec.name}, {split or path}: brat_entities keeps {total - dropped} of {total} gold entities; "
             f"{dropped} ({dropped / total:.1%}) are not in its flat tags: {overlapped} overlap a longer or earlier "
             f"entity, {mangled} have a boundary inside a word or cross a line. Format brat_nested (type "
             "nested_ner) keeps overlapping entities")
    return out


@register_format("hf", options=(*RECORD_OPTIONS, "hf_config", "hf_split"))
def read_hf(path, spec: TaskSpec, split: str = "") -> list[dict]:
    """A Hugging Face dataset: a folder from `save_to_disk` (a DatasetDict: options.hf_split
    names the split, default the split name) or a hub/script name loaded with `load_dataset`
    (offline unless cached). Fields as for jsonl; ClassLabel ids become their names."""
    import datasets

    opts = spec.options
    hf_split = (opts.get("hf_split") or {}).get(split, split)
    local = Path(str(path))
    try:
        if local.exists():
            ds = datasets.load_from_disk(str(local))
        else:
            ds = datasets.load_dataset(str(path), opts.get("hf_config"))
    except Exception as exc:  # datasets raises many kinds; the user needs the path and the reason
        raise DetourError(f"task {spec.name}: cannot load Hugging Face dataset {path}: {exc}") from None
    if isinstance(ds, datasets.DatasetDict):
        if hf_split not in ds:
            raise DetourError(f"{path}: no split {hf_split!r} (has {list(ds)})")
        ds = ds[hf_split]
    names = {}
    for field, feat in ds.features.items():
        if isinstance(feat, datasets.ClassLabel):
            names[field] = feat.names
        elif isinstance(getattr(feat, "feature", None), datasets.ClassLabel):
            names[field] = feat.feature.names
    out, orphans = [], []
    for i, row in enumerate(ds):
        row = dict(row)
        for field, labels in names.items():
            row[field] = [labels[x] for x in row[field]] if isinstance(row[field], list) else labels[row[field]]
        out.append(_from_record(row, opts, f"{path}[{hf_split}][{i}]", i, orphans))
    _report_orphans(spec, split, path, orphans)
    return out
