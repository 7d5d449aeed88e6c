"""SYNTHETIC clinical NER task: IOB2 files and a task spec made from the embedded case generator.

    python -m detour.eval.synthetic_ner --out data/synthetic-ner --train 300 --validation 100 --test 200
    detour eval minilm-l6 --task-spec data/synthetic-ner/task.yaml --seeds 2 --epochs 1 --out runs/eval-synth

Sentences of `detour.data.synthetic` case reports, tagged with five entity types that the
generator inserts verbatim from its lexicons: DIAGNOSIS (diagnoses and comorbidities), DRUG, LAB,
PROCEDURE and SYMPTOM. Tags come from matching every lexicon entry in the tokenized sentence
(case-insensitive, whole tokens, leftmost-longest), so a lexicon string is tagged wherever it
occurs and nothing else is.

The task measures generalisation, not lexicon memorisation:
- documents come from generator seed 1000 by default, not the seed 0 that the demo pretrains on;
- a seeded 30% of each type's entries is held out: no train sentence contains one (anywhere, not
  even inside a longer entity), while validation and test keep every sentence, so both hold
  entity strings never seen in train (manifest.json lists them and counts their mentions).

Documents i % 5 in {0, 1, 2} feed train, 3 validation, 4 test; each split takes its sentences in
document order, so a split depends only on (seed, lang, its own size). Most sentences without an
entity (vital signs, outcome) are dropped, seeded, so that they stay a minority.

`task.yaml` names its data files by absolute path, so it loads from any working directory; a
moved folder needs `write_task` again. The text is synthetic: never a stand-in for a real task
in a claimed result.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

from detour.data import lexicons as lex
from detour.data.synthetic import LANGS, generate_document
from detour.errors import DetourError
from detour.io import ensure_output_dir, write_json, write_text

ENTITY_TYPES = ("DIAGNOSIS", "DRUG", "LAB", "PROCEDURE", "SYMPTOM")
DEFAULT_SEED = 1000  # the demo and the README pretrain on seed 0: a different document stream
DEFAULT_SIZES = (300, 100, 200)  # MiniLM-L6, 3 epochs: test macro F1 about 0.8, about 90 s on one busy CPU core
HELD_OUT_SHARE = 0.3
# sized for CPU: few steps, so a higher learning rate than the usual 5e-5
TRAINING = {"epochs": 3, "lr": 3.0e-4, "batch_size": 16, "weight_decay": 0.01}
KEEP_EMPTY = 0.3  # share of entity-free sentences kept (about a third of all sentences have none)
SPLITS = ("train", "validation", "test")
FILES = {"train": "train.tsv", "validation": "devel.tsv", "test": "test.tsv"}
SPEC_FILE, MANIFEST_FILE = "task.yaml", "manifest.json"
WRITTEN_BY = "detour.eval.synthetic_ner"
# the module's earlier name: a task folder it wrote is ours too
_WRITTEN_BY_BEFORE = ("detour.data.synthetic_ner",)

# Words with inner hyphens, apostrophes, points or commas (C-reactive, d'asthme, 15.2, 38,5) stay
# whole; any other non-space character is a token of its own.
TOKEN = re.compile(r"\w+(?:[-'.,]\w+)*|[^\w\s]")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text)


def sentences(document: str) -> list[str]:
    """A generated document's sentences: paragraphs (a title is one), cut after . ! or ? and a space."""
    return [s for para in document.split("\n\n") for s in SENTENCE_END.split(para.strip()) if s]


def lexicon(lang: str = "en") -> dict[str, list[str]]:
    """Entity type -> the sorted strings the generator writes for it in `lang`."""
    fr = lang == "fr"
    by_type = {
        "DIAGNOSIS": [v["fr"] if fr else k for k, v in lex.DIAGNOSES.items()]
        + [v if fr else k for k, v in lex.COMORBIDITIES.items()],
        "DRUG": [v["fr"] if fr else k for k, v in lex.DRUGS.items()],
        "LAB": [v["fr"] if fr else k for k, v in lex.LAB_TESTS.items()],
        "PROCEDURE": [v if fr else k for k, v in lex.PROCEDURES.items()],
        "SYMPTOM": [v if fr else k for k, v in lex.SYMPTOMS.items()],
    }
    return {t: sorted(set(v)) for t, v in by_type.items()}


def held_out(seed: int = DEFAULT_SEED, lang: str = "en") -> dict[str, list[str]]:
    """Entity type -> the entries kept out of train: a seeded HELD_OUT_SHARE of each type's."""
    out = {}
    for kind, entries in lexicon(lang).items():
        rng = random.Random(f"detour-synthetic-ner-held-out:{lang}:{seed}:{kind}")
        out[kind] = sorted(rng.sample(entries, round(HELD_OUT_SHARE * len(entries))))
    return out


def _key(text: str) -> tuple[str, ...]:
    return tuple(t.casefold() for t in tokenize(text))


class Tagger:
    """IOB2 tags of lexicon mentions: at each token the longest entry that starts there, case-insensitive."""

    def __init__(self, entries: dict[str, list[str]]):
        self.types: dict[tuple[str, ...], str] = {}
        for kind, strings in entries.items():
            for s in strings:
                key = _key(s)
                if self.types.get(key, kind) != kind:  # one string, two types: its tags would be a coin toss
                    raise DetourError(f"lexicon entry {s!r} is both {self.types[key]} and {kind}")
                self.types[key] = kind
        self.longest = max(map(len, self.types), default=0)

    def spans(self, tokens: list[str]) -> list[tuple[int, int, str]]:
        low = [t.casefold() for t in tokens]
        out, i = [], 0
        while i < len(low):
            for n in range(min(self.longest, len(low) - i), 0, -1):
                kind = self.types.get(tuple(low[i : i + n]))
                if kind:
                    out.append((i, i + n, kind))
                    i += n
                    break
            else:
                i += 1
        return out

    def tag(self, tokens: list[str]) -> list[str]:
        tags = ["O"] * len(tokens)
        for start, end, kind in self.spans(tokens):
            tags[start : end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        return tags


def contains(tokens: list[str], entry: str) -> bool:
    """Whether `entry` occurs in `tokens` as whole tokens, case-insensitive (nested ones count)."""
    low, key = [t.casefold() for t in tokens], _key(entry)
    return any(tuple(low[i : i + len(key)]) == key for i in range(len(low) - len(key) + 1))


def _split_of(doc: int) -> str:
    return ("train", "train", "train", "validation", "test")[doc % 5]


def build_splits(sizes=DEFAULT_SIZES, seed: int = DEFAULT_SEED, lang: str = "en") -> tuple[dict, dict]:
    """split -> [(tokens, tags)], and split -> the generator documents used."""
    _check_args(sizes, seed, lang)
    want = dict(zip(SPLITS, sizes))
    tagger = Tagger(lexicon(lang))
    hidden = [s for strings in held_out(seed, lang).values() for s in strings]
    out: dict[str, list] = {s: [] for s in SPLITS}
    docs: dict[str, list[int]] = {s: [] for s in SPLITS}
    limit = 10 * sum(sizes) + 100  # a generated document has about 15-20 sentences
    doc = 0
    while any(len(out[s]) < want[s] for s in SPLITS):
        if doc > limit:
            raise DetourError(f"synthetic NER: {limit} documents gave too few sentences for {want}; please report this")
        split = _split_of(doc)
        if len(out[split]) < want[split]:
            docs[split].append(doc)
            rng = random.Random(f"detour-synthetic-ner:{lang}:{seed}:{doc}")
            for sentence in sentences(generate_document(doc, seed, lang)):
                tokens = tokenize(sentence)
                tagged = tagger.tag(tokens)
                keep_empty = rng.random() < KEEP_EMPTY  # drawn for every sentence: the stream never shifts
                if all(t == "O" for t in tagged) and not keep_empty:
                    continue
                if split == "train" and any(contains(tokens, h) for h in hidden):
                    continue
                if len(out[split]) < want[split]:
                    out[split].append((tokens, tagged))
        doc += 1
    return out, docs


def _check_args(sizes, seed, lang) -> None:
    if lang not in LANGS:
        raise DetourError(f"synthetic NER: unknown lang {lang!r} (choose from {', '.join(LANGS)})")
    if len(sizes) != 3 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise DetourError(f"synthetic NER: sentences per split must be three integers >= 1 "
                          f"(train, validation, test), got {tuple(sizes)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DetourError(f"synthetic NER: seed must be an integer, got {seed!r}")


def _iob(rows: list[tuple[list[str], list[str]]]) -> str:
    return "".join("".join(f"{tok}\t{tag}\n" for tok, tag in zip(tokens, tags)) + "\n" for tokens, tags in rows)


def _stats(rows, hidden: dict[str, set], tagger: Tagger) -> dict:
    entities, unseen, unseen_strings = Counter(), Counter(), {}
    for tokens, tags in rows:
        for start, end, kind in tagger.spans(tokens):
            entities[kind] += 1
            text = " ".join(tokens[start:end]).casefold()
            if text in hidden[kind]:
                unseen[kind] += 1
                unseen_strings.setdefault(kind, set()).add(text)
    return {
        "sentences": len(rows), "tokens": sum(len(t) for t, _ in rows),
        "sentences_without_entities": sum(all(x == "O" for x in tags) for _, tags in rows),
        "entities": {k: entities[k] for k in ENTITY_TYPES},
        "held_out_mentions": {k: unseen[k] for k in ENTITY_TYPES},
        "held_out_entries_present": {k: len(unseen_strings.get(k, ())) for k in ENTITY_TYPES},
    }


def _is_ours(out: Path) -> bool:
    try:
        return json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8")).get("written_by") in (WRITTEN_BY, *_WRITTEN_BY_BEFORE)
    except (OSError, ValueError, AttributeError):
        return False


def _spec(out: Path, seed: int, lang: str, labels: list[str]) -> dict:
    return {
        "name": "synthetic-clinical-ner" + ("" if lang == "en" else f"-{lang}"),
        "description": (f"SYNTHETIC clinical NER ({', '.join(ENTITY_TYPES)}), IOB2, from detour's case generator "
                        f"(seed {seed}, {lang}); {HELD_OUT_SHARE:.0%} of each type's lexicon held out of train, "
                        "so validation and test hold entity strings never seen in train"),
        "type": "ner", "format": "iob",
        "data": {split: str(out / FILES[split]) for split in SPLITS},
        "labels": labels, "headline": "macro_f1", "max_length": 128, "long_inputs": "window",
        "training": dict(TRAINING),
    }


def write_task(out_dir: str | Path, sentences_per_split=DEFAULT_SIZES, seed: int = DEFAULT_SEED,
               lang: str = "en") -> Path:
    """Write train/devel/test.tsv, task.yaml and manifest.json into `out_dir`; returns the spec's path.

    A folder that is not empty must be an earlier output of this function (its manifest says so);
    then only this function's files are replaced, each atomically.
    """
    import yaml

    from detour.eval.tasks import TaskSpec

    sizes = tuple(sentences_per_split)
    _check_args(sizes, seed, lang)
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not _is_ours(out):
        raise DetourError(f"--out {out}: the folder is not empty and holds no {MANIFEST_FILE} written by {WRITTEN_BY}; "
                          "give a new or empty folder (nothing was written)")
    rows, docs = build_splits(sizes, seed, lang)
    tagger = Tagger(lexicon(lang))
    hidden_entries = held_out(seed, lang)
    hidden = {k: {" ".join(_key(s)) for s in v} for k, v in hidden_entries.items()}
    labels = ["O", *(f"{p}-{k}" for k in ENTITY_TYPES for p in "BI")]
    spec = _spec(out, seed, lang, labels)
    TaskSpec.model_validate(spec)  # a spec that would not load is a bug here, not the user's: fail before writing
    train_text = {tuple(t) for t, _ in rows["train"]}
    manifest = {
        "written_by": WRITTEN_BY, "synthetic": True, "generator": "detour.data.synthetic",
        "seed": seed, "lang": lang, "entity_types": list(ENTITY_TYPES),
        "sentences_per_split": dict(zip(SPLITS, sizes)),
        "documents": {s: {"count": len(docs[s]), "first": docs[s][0], "last": docs[s][-1]} for s in SPLITS},
        "document_rule": "document i: train if i % 5 < 3, validation if i % 5 == 3, test if i % 5 == 4",
        "held_out_share": HELD_OUT_SHARE, "held_out": hidden_entries,
        "held_out_rule": "no train sentence contains a held-out entry; validation and test keep every sentence",
        "splits": {s: {"file": FILES[s], **_stats(rows[s], hidden, tagger)} for s in SPLITS},
        "test_sentences_also_in_train": sum(tuple(t) in train_text for t, _ in rows["test"]),
        "spec": SPEC_FILE,
    }
    ensure_output_dir(out, "--out")
    # The spec goes first and comes back last: a reader never finds a spec over half-replaced files.
    (out / SPEC_FILE).unlink(missing_ok=True)
    write_json(out / MANIFEST_FILE, manifest)  # first: an interrupted write leaves a folder known to be ours
    for split in SPLITS:
        write_text(out / FILES[split], _iob(rows[split]))
    header = (f"# SYNTHETIC task written by {WRITTEN_BY} (seed {seed}, lang {lang}); counts in {MANIFEST_FILE}.\n"
              f"# Rewrite it with: python -m {WRITTEN_BY} --out {out} --train {sizes[0]} "
              f"--validation {sizes[1]} --test {sizes[2]} --seed {seed} --lang {lang}\n")
    write_text(out / SPEC_FILE, header + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=1000))
    return out / SPEC_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {WRITTEN_BY}",
                                     description="Write a SYNTHETIC clinical NER task (IOB2 files and a task spec).")
    parser.add_argument("--out", required=True, help="output folder (new, empty, or an earlier output)")
    parser.add_argument("--train", type=int, default=DEFAULT_SIZES[0], help="train sentences")
    parser.add_argument("--validation", type=int, default=DEFAULT_SIZES[1], help="validation sentences")
    parser.add_argument("--test", type=int, default=DEFAULT_SIZES[2], help="test sentences")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"generator seed (default {DEFAULT_SEED})")
    parser.add_argument("--lang", default="en", choices=LANGS)
    args = parser.parse_args(argv)
    try:
        spec = write_task(args.out, (args.train, args.validation, args.test), args.seed, args.lang)
    except DetourError as exc:
        print(f"{WRITTEN_BY}: error: {exc}", file=sys.stderr)
        return 2
    manifest = json.loads((spec.parent / MANIFEST_FILE).read_text(encoding="utf-8"))
    print(f"SYNTHETIC clinical NER, seed {args.seed}, lang {args.lang}")
    print(f"{'split':<11}{'sentences':>10}{'no entity':>10}" + "".join(f"{k:>11}" for k in ENTITY_TYPES) + f"{'held out':>10}")
    for split, s in manifest["splits"].items():
        print(f"{split:<11}{s['sentences']:>10}{s['sentences_without_entities']:>10}"
              + "".join(f"{s['entities'][k]:>11}" for k in ENTITY_TYPES) + f"{sum(s['held_out_mentions'].values()):>10}")
    print(f"held out of train: {', '.join(f'{k} {len(v)}' for k, v in manifest['held_out'].items())} entries")
    print(f"spec: {spec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
