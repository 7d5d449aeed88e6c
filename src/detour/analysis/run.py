"""`detour analyze`: analyses between encoders; this module holds `cka` (per-layer linear CKA) and the dispatch.

    detour analyze cka runs/twins/detour/model runs/twins/baseline/model \
        --noise-floor runs/twins-seed2/baseline/model --texts synthetic --n 500 --seeds 3 --out runs/cka
    detour analyze cka minilm-l6 minilm-l6 --n 40 --seeds 2 --max-length 64 --out runs/cka-self

For each seed s, n held-out texts are sampled (`detour.analysis.texts`), every model encodes them,
and each layer's mean-pooled features (L+1 layers, embeddings first) give CKA(A_l, B_l). Per layer
the output holds the CKA mean and standard deviation over seeds and the divergence
d = 1 - mean CKA. With `--noise-floor C` (an MLM twin of B trained with another seed) it adds
d(C_l, B_l) and the seed-noise ratio r_l = d(A_l, B_l) / d(C_l, B_l). Writes OUT/cka.json and
OUT/cka.png (atomically) and prints a table.
"""

from __future__ import annotations

import statistics
from argparse import RawDescriptionHelpFormatter
import time
from pathlib import Path


from detour.analysis.cka import layer_features, linear_cka
from detour.analysis.models import check_same_depth, check_same_tokenizer, load_encoder
from detour.model.load import load_config, weights_hash
from detour.analysis.texts import is_synthetic, sample_texts
from detour.errors import DetourError
from detour.analysis.outputs import (add_text_arguments, check_text_options, save_figure, select_device,
                                     write_result)

SCHEMA = "detour.cka/1"


# ---- the analysis ----

def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cka_analysis(model_a: str, model_b: str, noise_floor: str | None = None, texts: str = "synthetic",
                 n: int = 500, seeds: int = 3, max_length: int = 256, batch_size: int = 16, lang: str = "en",
                 text_field: str = "text", device: str | None = None) -> dict:
    """Per-layer CKA of A with B (and of C with B) averaged over `seeds` samples of n texts."""
    check_text_options(n, seeds, max_length, batch_size)
    t0 = time.time()
    refs = {"model_a": model_a, "model_b": model_b}
    if noise_floor is not None:
        refs["noise_floor"] = noise_floor
    loaded = {role: load_config(ref) for role, ref in refs.items()}
    depth = check_same_depth(refs, {role: cfg for role, (_, cfg) in loaded.items()})
    dev = select_device(device)
    samples = [sample_texts(texts, n, seed, lang=lang, text_field=text_field) for seed in range(seeds)]
    encoders = {role: load_encoder(path, refs[role]) for role, (path, _) in loaded.items()}

    per_seed = {"ab": [], "cb": []}  # per seed, a list of L+1 CKA values
    for seed, sample in enumerate(samples):
        check_same_tokenizer(refs, {role: tok for role, (_, tok) in encoders.items()}, sample, max_length)
        feats = {role: layer_features(model, tok, sample, max_length, batch_size, dev)
                 for role, (model, tok) in encoders.items()}
        if any(len(f) != depth + 1 for f in feats.values()):
            raise DetourError(f"expected {depth + 1} hidden states per model, got "
                              f"{ {role: len(f) for role, f in feats.items()} }")
        try:
            per_seed["ab"].append([linear_cka(a, b) for a, b in zip(feats["model_a"], feats["model_b"])])
            if noise_floor is not None:
                per_seed["cb"].append([linear_cka(c, b) for c, b in zip(feats["noise_floor"], feats["model_b"])])
        except ValueError as exc:
            raise DetourError(f"seed {seed}: CKA undefined ({exc}); use more or more varied texts") from exc

    layers = []
    for layer in range(depth + 1):
        values = [s[layer] for s in per_seed["ab"]]
        mean, std = _stats(values)
        row = {"layer": layer, "name": "embeddings" if layer == 0 else f"layer {layer}",
               "cka_mean": mean, "cka_std": std, "cka_per_seed": values, "divergence": 1.0 - mean}
        if noise_floor is not None:
            noise = [s[layer] for s in per_seed["cb"]]
            n_mean, n_std = _stats(noise)
            d_noise = 1.0 - n_mean
            row.update(noise_cka_mean=n_mean, noise_cka_std=n_std, noise_cka_per_seed=noise,
                       noise_divergence=d_noise,
                       seed_noise_ratio=(1.0 - mean) / d_noise if d_noise > 0 else None)
        layers.append(row)
    return {
        "schema": SCHEMA,
        "config": {
            "model_a": model_a, "model_b": model_b, "noise_floor": noise_floor,
            "weights_hash": {role: weights_hash(path) for role, (path, _) in loaded.items()},
            "texts": texts, "synthetic_texts": is_synthetic(texts), "lang": lang if is_synthetic(texts) else None,
            "n": n, "seeds": list(range(seeds)), "max_length": max_length, "batch_size": batch_size,
            "device": str(dev), "dtype": "float64",
            "features": "mean over real (attention-masked) tokens of each hidden state; layer 0 = embeddings, "
                        "layer i = output of transformer layer i (before ModernBERT's final_norm)",
            "cka": "linear CKA on centred features; divergence = 1 - mean CKA over seeds; std = sample std over seeds",
            "seed_noise_ratio": "d(model_a, model_b) / d(noise_floor, model_b); null when that floor is 0",
        },
        "num_layers": depth,
        "layers": layers,
        "seconds": round(time.time() - t0, 2),
    }


# ---- outputs ----

def display_name(model: str) -> str:
    """A legend label: the folder with its parent when the folder alone says nothing (detour/model)."""
    from detour.eval.results import display_name as label

    return label(str(model).rstrip("/"))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = result["layers"]
    x = [row["layer"] for row in layers]
    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.errorbar(x, [row["divergence"] for row in layers], yerr=[row["cka_std"] for row in layers],
                marker="o", capsize=3, label=f"d(A, B): detour (A) {display_name(cfg['model_a'])} vs baseline (B) "
                      f"{display_name(cfg['model_b'])}")
    if cfg["noise_floor"] is not None:
        ax.errorbar(x, [row["noise_divergence"] for row in layers], yerr=[row["noise_cka_std"] for row in layers],
                    marker="s", ls="--", color="grey", capsize=3,
                    label=f"noise floor d(C, B): {display_name(cfg['noise_floor'])}")
    ax.set_xticks(x, ["emb"] + [str(i) for i in x[1:]])
    ax.set_xlabel("layer (emb = embeddings)")
    ax.set_ylabel("divergence 1 - linear CKA")
    ax.set_ylim(bottom=0)
    ax.set_title(f"per-layer CKA divergence, {cfg['n']} texts x {len(cfg['seeds'])} seeds"
                 + (" (synthetic texts)" if cfg["synthetic_texts"] else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_outputs(result: dict, out: Path) -> None:
    write_result(out, "cka", result, plot)


def _d(value: float) -> str:
    # Divergences between nearly unchanged layers are of order 1e-5: fixed decimals would show 0.
    return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    noise = cfg["noise_floor"] is not None
    console = Console()
    console.print(f"A = {cfg['model_a']}\nB = {cfg['model_b']}" + (f"\nC = {cfg['noise_floor']}" if noise else ""),
                  highlight=False)
    table = Table(title=f"linear CKA per layer, {cfg['n']} texts x {len(cfg['seeds'])} seeds (mean ± std)")
    table.add_column("layer")
    table.add_column("CKA(A,B)", justify="right")
    table.add_column("d(A,B)", justify="right")
    if noise:
        table.add_column("d(C,B)", justify="right")
        table.add_column("r = d(A,B)/d(C,B)", justify="right")
    for row in result["layers"]:
        cells = [row["name"], f"{row['cka_mean']:.4f} ± {row['cka_std']:.4f}", _d(row["divergence"])]
        if noise:
            ratio = row["seed_noise_ratio"]
            cells += [_d(row["noise_divergence"]), "-" if ratio is None else f"{ratio:.2f}"]
        table.add_row(*cells)
    console.print(table)


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
    result = cka_analysis(args.model_a, args.model_b, args.noise_floor, args.texts, args.n, args.seeds,
                          args.max_length, args.batch_size, args.lang, args.text_field, args.device)
    write_outputs(result, args.out)
    print_table(result)
    if result["config"]["synthetic_texts"]:
        print("texts: SYNTHETIC clinical reports (a smoke test, not a result; pass --texts FILE for real text)")
    print(f"wrote {args.out / 'cka.json'} and {args.out / 'cka.png'} ({result['seconds']:.1f} s)")
    return 0
