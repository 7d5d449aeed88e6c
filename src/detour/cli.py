"""The `detour` command line: one verb per pipeline stage.

    detour --help
    detour prepare "synthetic:clinical?docs=2000&seed=0" --tokenizer minilm-l6 --out data/synthetic

Each verb lives in its own module, which exposes `add_arguments(parser)` and `run(args) -> int`.
Modules are imported only when their verb runs, so `detour --help` stays fast; `--help` lists only
the verbs whose module exists, and a verb not built yet says so and exits non-zero instead of
pretending.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from detour.errors import DetourError
from detour.quiet import quiet_transformers

# verb -> (module, one-line help). Order follows the pipeline.
VERBS: dict[str, tuple[str, str]] = {
    "prepare": ("detour.data.prepare", "tokenize corpora into memory-mapped training shards"),
    "train": ("detour.train.run", "run one training recipe (phases of CLM / MLM)"),
    "twins": ("detour.train.twins", "a recipe, its matched MLM baseline and extra arms on the same token stream"),
    "export": ("detour.model.push", "push a run's Hugging Face export, with its model card, to the Hub"),
    "doctor": ("detour.model.doctor", "check causal and document masking on a model's architecture"),
    "eval": ("detour.eval.run", "fine-tune and score encoders on downstream tasks over seeds"),
    "compare": ("detour.eval.significance", "exact sign-flip p-value (pooled and per task) and bootstrap interval between two models' results"),
    "needle": ("detour.analysis.needle", "long-context needle-in-a-haystack probe on a frozen encoder"),
    "analyze": ("detour.analysis.run", "per-layer CKA, trajectory through a phase, transplants, weight drift"),
    "report": ("detour.report.run", "tables, figures and an HTML report from results"),
    "study": ("detour.study.run", "one-command cached study: twins, eval, analyses, report"),
    "demo": ("detour.study.demo", "a small end-to-end demo on the embedded synthetic corpus"),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detour",
        description="Continued pretraining of encoders with a CLM detour, its matched MLM baseline, "
        "downstream evaluation and analyses.",
    )
    from detour import __version__

    parser.add_argument("--version", action="version", version=f"detour {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        if _is_built(module_name):  # --help lists only what runs
            sub.add_parser(verb, help=help_text, add_help=False)
    return parser


def _is_built(module_name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # its package does not exist either
        return False


def _load_verb(verb: str):
    module_name, _ = VERBS[verb]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    if not argv:  # a verb is required: usage on stderr and exit 2, as argparse does for a missing argument
        parser.print_usage(sys.stderr)
        print("detour: error: give a verb (detour --help lists them)", file=sys.stderr)
        return 2
    if argv[0] not in VERBS:
        parser.parse_args(argv)  # handles --help, --version and unknown verbs
        parser.print_help()
        return 2
    verb, rest = argv[0], argv[1:]
    module = _load_verb(verb)
    if module is None or not hasattr(module, "run"):
        print(f"detour {verb}: not built yet in this version of detour.", file=sys.stderr)
        return 2
    verb_parser = argparse.ArgumentParser(prog=f"detour {verb}", description=VERBS[verb][1])
    module.add_arguments(verb_parser)
    args = verb_parser.parse_args(rest)
    try:
        with quiet_transformers():  # detour reports progress and loads in its own words, in every verb
            return int(module.run(args) or 0)
    except DetourError as exc:
        print(f"detour {verb}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `detour doctor MODEL | head`
        return 0
    except KeyboardInterrupt:
        print(f"detour {verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
