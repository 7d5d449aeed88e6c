"""`detour analyze`: the dispatch of the analyses between encoders (cka, trajectory, transplant, drift).

    detour analyze cka minilm-l6 minilm-l6 --n 40 --seeds 2 --max-length 64 --out runs/cka-self
    detour analyze trajectory --help

Each analysis lives in its own module (`detour.analysis.cka`, `.trajectory`, `.transplant`,
`.drift`) with its computation, its JSON and its figure; this module only builds the parser and
calls the one asked for.
"""

from __future__ import annotations

from argparse import RawDescriptionHelpFormatter
from pathlib import Path

from detour.analysis import cka
from detour.analysis.outputs import add_text_arguments


# ---- the verb ----

# Analyses other than CKA live in their own modules, each with HELP, add_arguments(parser) and run(args).
OTHER_ANALYSES = {
    "trajectory": "detour.analysis.trajectory",
    "transplant": "detour.analysis.transplant",
    "drift": "detour.analysis.drift",
}


def _other_modules() -> dict:
    import importlib

    found = {}
    for name, module_name in OTHER_ANALYSES.items():
        try:
            found[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
    return found


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    p = sub.add_parser("cka", help="per-layer linear CKA between two encoders, with a seed-noise floor",
                       description="Per-layer linear CKA between two encoders that share a tokenizer and depth.")
    for name, module in _other_modules().items():
        summary, _, rest = module.__doc__.partition("\n\n")
        q = sub.add_parser(name, help=module.HELP, description=summary, formatter_class=RawDescriptionHelpFormatter)
        module.add_arguments(q)
        if q.epilog is None:  # the examples and the definitions, under --help
            q.epilog = rest
    p.add_argument("model_a", help="first encoder (the detour): a folder, a hub name, or the alias minilm-l6")
    p.add_argument("model_b", help="second encoder (the MLM baseline)")
    p.add_argument("--noise-floor", metavar="MODEL_C",
                   help="an MLM twin of MODEL_B trained with another seed: adds d(C, B) and r = d(A, B) / d(C, B)")
    add_text_arguments(p)
    p.add_argument("--out", type=Path, default=Path("runs/cka"), help="output folder (default runs/cka)")


def run(args) -> int:
    from detour.io import check_output_location

    check_output_location(args.out)  # before any model loads: a long analysis must not fail at its end
    if args.analysis != "cka":
        return _other_modules()[args.analysis].run(args)
    result = cka.cka_analysis(args.model_a, args.model_b, args.noise_floor, args.texts, args.n, args.seeds,
                              args.max_length, args.batch_size, args.lang, args.text_field, args.device)
    cka.write_outputs(result, args.out)
    cka.print_table(result)
    if result["config"]["synthetic_texts"]:
        print("texts: SYNTHETIC clinical reports (a smoke test, not a result; pass --texts FILE for real text)")
    print(f"wrote {args.out / 'cka.json'} and {args.out / 'cka.png'} ({result['seconds']:.1f} s)")
    return 0
