"""BRAT standoff with nested, overlapping and discontinuous entities, and their notes.

    python -m detour.eval.brat ../shared/data/tasks/fr/quaero-emea/train

`read_document(txt)` reads one `.txt` and its `.ann`: text-bound annotations
(`T1<TAB>DISO 285 293;305 315<TAB>douleurs chroniques`, possibly discontinuous) and annotator notes
(`#1<TAB>AnnotatorNotes T1<TAB>C0150055`) attached to their entity. Events, attributes, relations,
normalisations and equivalences (E, A, R, N, M, * lines) are not entities: they are counted and
skipped. Offsets are characters of the `.txt` read as is (CRLF files keep their `\\r`, as BRAT
counts them).

Rule for a discontinuous entity: it becomes its FULL EXTENT, from its first fragment's start to its
last fragment's end (`douleurs ... chroniques` above is 285-315). Two entities may then share an
extent and a type; they count once (spans are compared as sets).

The `brat_nested` task format (for the `nested_ner` task type, `detour.eval.nested`) cuts each
document into its lines; a line is one example with its words (`\\w+` runs and single punctuation
marks, as in the flat BRAT reader) and the entities inside it, nested and overlapping ones kept.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from detour.errors import DetourError
from detour.eval.tasks import TaskSpec, register_format
from detour.notices import warn

WORD = re.compile(r"\w+|[^\w\s]")
SKIPPED_KINDS = {"E": "event", "A": "attribute", "R": "relation", "N": "normalization", "M": "attribute", "*": "equivalence"}


@dataclass
class Entity:
    id: str
    type: str
    fragments: list[tuple[int, int]]
    text: str  # as written in the .ann
    notes: list[str] = field(default_factory=list)

    @property
    def start(self) -> int:
        return self.fragments[0][0]

    @property
    def end(self) -> int:  # full extent: the discontinuous-entity rule
        return self.fragments[-1][1]

    @property
    def discontinuous(self) -> bool:
        return len(self.fragments) > 1


@dataclass
class Document:
    id: str
    text: str
    entities: list[Entity]
    skipped: Counter  # line kind -> count of ignored annotation lines


def _read_text(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as fh:  # newline="" keeps \r: BRAT offsets count it
        return fh.read()


def read_ann(ann: Path, text: str) -> tuple[list[Entity], Counter]:
    """Entities (with notes) of one .ann file, checked against the length of its text."""
    entities: dict[str, Entity] = {}
    notes: list[tuple[int, str, str]] = []
    mismatched: list[tuple[int, str, str]] = []  # (line, text in the .ann, text at the offsets)
    skipped: Counter = Counter()
    for n, raw in enumerate(_read_text(ann).split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        kind = line[0]
        if kind == "T":
            parts = line.split("\t")
            if len(parts) < 2 or " " not in parts[1]:
                raise DetourError(f"{ann}:{n}: a text-bound line is 'T<id><TAB><type> <start> <end>[;<start> <end>...]<TAB><text>', got {line!r}")
            etype, _, offsets = parts[1].partition(" ")
            try:
                frags = [(int(a), int(b)) for a, b in (f.split() for f in offsets.split(";"))]
            except ValueError:
                raise DetourError(f"{ann}:{n}: bad offsets {offsets!r} (expected '<start> <end>' pairs joined by ';')") from None
            for a, b in frags:
                if not 0 <= a < b <= len(text):
                    raise DetourError(f"{ann}:{n}: fragment {a}-{b} is empty or outside the text ({len(text)} characters)")
            frags.sort()
            written = parts[2] if len(parts) > 2 else ""
            found = " ".join(text[a:b] for a, b in frags)  # BRAT joins the fragments with a space
            if len(parts) > 2 and written != found:
                mismatched.append((n, written, found))
            entities[parts[0]] = Entity(parts[0], etype, frags, written)
        elif kind == "#":
            parts = line.split("\t")
            if len(parts) < 2:
                raise DetourError(f"{ann}:{n}: a note line is '#<id><TAB>AnnotatorNotes <target><TAB><note>', got {line!r}")
            notes.append((n, parts[1].split(" ")[-1], parts[2] if len(parts) > 2 else ""))
        elif kind in SKIPPED_KINDS:
            skipped[SKIPPED_KINDS[kind]] += 1
        else:
            raise DetourError(f"{ann}:{n}: unknown BRAT annotation line {line!r} (expected T, #, E, A, R, N, M or *)")
    if mismatched:
        # The offsets are what the tokens are labelled from; a differing text means the .txt or the
        # .ann was edited after annotation, and the user should know which spans may be off.
        n, written, found = mismatched[0]
        more = f" (and {len(mismatched) - 1} more in this file)" if len(mismatched) > 1 else ""
        warn(f"{ann}:{n}: the span text {written!r} differs from the text at its offsets, {found!r}{more}; "
             "the offsets are used")
    for n, target, note in notes:
        if target in entities:
            entities[target].notes.append(note)
        else:
            skipped["note on a non-entity"] += 1  # notes may annotate events or relations
    return list(entities.values()), skipped


def read_document(txt: Path) -> Document:
    """One BRAT document; a .txt without .ann has no entities."""
    txt = Path(txt)
    text = _read_text(txt)
    ann = txt.with_suffix(".ann")
    entities, skipped = read_ann(ann, text) if ann.exists() else ([], Counter())
    return Document(txt.stem, text, entities, skipped)


def read_folder(folder: Path) -> list[Document]:
    folder = Path(folder)
    if not folder.is_dir():
        raise DetourError(f"{folder}: not a folder of BRAT .txt/.ann files")
    docs = [read_document(t) for t in sorted(folder.glob("*.txt"))]
    if not docs:
        raise DetourError(f"{folder}: no .txt files in it")
    # BRAT keeps its configuration and caches beside the documents (annotation.conf, visual.conf,
    # tools.conf, .stats_cache): not data, so not read, and said once rather than passed over silently.
    other = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix not in (".txt", ".ann"))
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        warn(f"{folder}: {len(other)} file(s) that are not .txt/.ann documents were not read ({shown}); BRAT "
             "configuration and caches such as annotation.conf and .stats_cache are expected there")
    return docs


def line_examples(doc: Document, keep_types: set[str] | None = None) -> tuple[list[dict], Counter]:
    """The document's non-empty lines as examples: words with char spans and the entities inside.

    Offsets in an example are relative to its line. Returns the examples and counts of entities
    that could not be kept (crossing a line break, or with a boundary inside a word).
    """
    out, lost = [], Counter()
    ents = {(e.start, e.end, e.type) for e in doc.entities if not keep_types or e.type in keep_types}
    start = 0
    for line in doc.text.split("\n"):
        end = start + len(line)
        body = line.rstrip("\r")
        words = [(m.start(), m.end()) for m in WORD.finditer(body)]
        inside = sorted((s - start, e - start, t) for s, e, t in ents if start <= s and e <= start + len(body))
        if words:
            starts, ends = {s for s, _ in words}, {e for _, e in words}
            lost["boundary inside a word"] += sum(1 for s, e, _ in inside if s not in starts or e not in ends)
            out.append({"text": body, "tokens": [body[s:e] for s, e in words], "word_spans": words,
                        "entities": inside, "doc": doc.id, "offset": start})
        start = end + 1
    kept = sum(len(x["entities"]) for x in out)
    lost["crossing a line break"] = len(ents) - kept
    return out, lost


@register_format("brat_nested", options=("entity_types",))
def read_brat_nested(path: Path, spec: TaskSpec, split: str = "") -> list[dict]:
    """BRAT folder -> one example per non-empty line, nested / overlapping entities kept
    (discontinuous ones as their full extent); options.entity_types keeps only some types.
    An entity crossing a line break is in no example, so it leaves the gold set; one with a
    boundary inside a word stays in gold (no candidate span can find it: a miss). Both are
    counted in a warning per split."""
    keep = set(spec.options.get("entity_types") or [])
    out, lost, total = [], Counter(), 0
    for doc in read_folder(Path(path)):
        examples, doc_lost = line_examples(doc, keep)
        out.extend(examples)
        lost.update(doc_lost)
        total += len({(e.start, e.end, e.type) for e in doc.entities if not keep or e.type in keep})
    parts = []
    if lost["crossing a line break"]:
        n = lost["crossing a line break"]
        parts.append(f"{n} ({n / total:.1%}) cross a line break and are left out of gold")
    if lost["boundary inside a word"]:
        n = lost["boundary inside a word"]
        parts.append(f"{n} ({n / total:.1%}) have a boundary inside a word and stay in gold as misses "
                     "(no candidate span can find them)")
    if parts:
        warn(f"task {spec.name}, {split or path}: of {total} gold entities, " + "; ".join(parts))
    return out


def describe(folder: Path) -> str:
    docs = read_folder(folder)
    ents = [e for d in docs for e in d.entities]
    lost, skipped = Counter(), Counter()
    for d in docs:
        lost.update(line_examples(d)[1])
        skipped.update(d.skipped)
    spans = [(d.id, e.start, e.end) for d in docs for e in d.entities]
    nested = sum(1 for d in docs for a in d.entities for b in d.entities
                 if a is not b and a.start <= b.start and b.end <= a.end and (a.start, a.end) != (b.start, b.end))
    return "\n".join([
        f"{folder}: {len(docs)} documents, {len(ents)} entities ({len(set(spans))} distinct extents), "
        f"{sum(e.discontinuous for e in ents)} discontinuous, {nested} nested in another, "
        f"{sum(len(e.notes) for e in ents)} notes",
        "types: " + ", ".join(f"{t} {n}" for t, n in Counter(e.type for e in ents).most_common()),
        "skipped lines: " + (", ".join(f"{k} {n}" for k, n in skipped.items()) or "none"),
        "entities not representable as word spans of one line: " + ", ".join(f"{k} {n}" for k, n in lost.items()),
    ])


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["."]:
        print(describe(Path(arg)))
