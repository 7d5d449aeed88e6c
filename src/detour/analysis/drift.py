"""`detour analyze drift`: relative weight change ||W_A - W_B|| / ||W_B|| per layer and component.

    detour analyze drift runs/twins/detour/model minilm-l6 --out runs/drift-detour
    detour analyze drift runs/twins/baseline/model minilm-l6 --out runs/drift-baseline
    detour analyze drift minilm-l6 minilm-l6 --out runs/drift-self

Typically A is a trained arm and B the base model it started from. Both are loaded as their bare
encoder (`AutoModel`, fp32; the MLM head is not compared, since a base model may ship none). For
every parameter tensor present in both checkpoints with the same shape (matrices, biases and norm
weights alike), rel = ||W_A - W_B||_F / ||W_B||_F in float64. A group G of parameters (one
component of one layer, a whole layer, a layer group) gets
sqrt(sum_G ||W_A - W_B||^2) / sqrt(sum_G ||W_B||^2), so large matrices weigh by their size; a group
whose B weights are all zero gets null. Rows: embeddings, layers 0..L-1 (parameter indices, as in
freeze and transplant), then the final norm and anything else outside the layers; columns:
attention, mlp, norm, embeddings. Also per-layer totals and low/mid/late group totals. Writes
OUT/drift.png (heat map) and OUT/drift.json (atomically) and prints a table.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from detour.analysis.models import check_same_depth
from detour.model.load import load_config, load_encoder, weights_hash
from detour.errors import DetourError
from detour.eval.results import display_name
from detour.analysis.outputs import save_figure, write_result
from detour.model.freeze import _LAYER_PARTS, _is_norm, describe_groups, layer_group_ranges
from detour.model.load import SUPPORTED_MODEL_TYPES

SCHEMA = "detour.drift/1"
HELP = "relative weight change ||W_A - W_B|| / ||W_B|| per layer and component (A against its base B)"

COLUMNS = ("attention", "mlp", "norm", "embeddings", "other")
FINAL_NORM, OTHER = "final norm", "other"
# Elements per float64 chunk: an embedding matrix of a large model would otherwise need several
# float64 copies of itself at once.
_CHUNK = 1 << 22


# ---- which layer and component a parameter of the bare encoder belongs to ----

def _layers_prefix(model_type: str) -> str:
    # Names of a bare AutoModel carry no MaskedLM prefix: "layers.0..." (ModernBertModel),
    # "encoder.layer.0..." (BertModel, RobertaModel and its relatives).
    return "layers." if model_type == "modernbert" else "encoder.layer."


def parameter_classes(model) -> dict[str, tuple[int | None, str]]:
    """name -> (layer index or None, component) for each parameter of a bare encoder body."""
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DetourError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    prefix = _layers_prefix(model_type)
    classes = {}
    for name, _ in model.named_parameters():
        module = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if name.startswith(prefix):
            index, _, rest = name[len(prefix):].partition(".")
            component = "norm" if _is_norm(module) else _LAYER_PARTS.get(rest.partition(".")[0], "other")
            classes[name] = (int(index), component)
        elif name.startswith("embeddings."):
            classes[name] = (None, "embeddings")  # the embedding norm included, as in freeze
        else:
            classes[name] = (None, "norm" if _is_norm(module) else "other")
    return classes


def _row_name(layer: int | None, component: str) -> str:
    if layer is not None:
        return f"layer {layer}"
    if component == "embeddings":
        return "embeddings"
    return FINAL_NORM if component == "norm" else OTHER


# ---- loading ----

def load_weights(path: str, ref: str):
    """(bare encoder in fp32, names of the parameters its checkpoint actually holds).

    A parameter the checkpoint lacks is freshly initialised by transformers (BertModel's pooler,
    loaded from a BertForMaskedLM checkpoint): comparing it would measure random noise.
    """
    model, info = load_encoder(path, name=ref)
    missing = set(info.get("missing_keys", ()))
    return model.eval().requires_grad_(False), {n for n, _ in model.named_parameters() if n not in missing}


# ---- the comparison ----

def squared_norms(a, b) -> tuple[float, float]:
    """(||a - b||^2, ||b||^2) in float64."""
    import torch

    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    diff2 = norm2 = 0.0
    for start in range(0, b.numel(), _CHUNK):
        ca = a[start:start + _CHUNK].to(torch.float64)
        cb = b[start:start + _CHUNK].to(torch.float64)
        diff2 += float(torch.sum((ca - cb) ** 2))
        norm2 += float(torch.sum(cb * cb))
    return diff2, norm2


def _ratio(diff2: float, norm2: float) -> float | None:
    return math.sqrt(diff2) / math.sqrt(norm2) if norm2 > 0 else None


def _aggregate(entries: list[dict]) -> dict:
    diff2 = sum(e["diff"] ** 2 for e in entries)
    norm2 = sum(e["norm_b"] ** 2 for e in entries)
    return {"rel": _ratio(diff2, norm2), "diff": math.sqrt(diff2), "norm_b": math.sqrt(norm2)}


def compare(params_a: dict, params_b: dict, classes: dict[str, tuple[int | None, str]], num_layers: int,
            refs: dict[str, str] | None = None) -> dict:
    """Per-matrix, per-(row, component), per-layer and per-group relative change of A against B.

    params_a, params_b: name -> tensor; classes: name -> (layer or None, component), for B's names.
    """
    refs = refs or {"model_a": "A", "model_b": "B"}
    only_a = sorted(set(params_a) - set(params_b))
    only_b = sorted(set(params_b) - set(params_a))
    mismatch, matrices = [], []
    for name in (n for n in params_b if n in params_a):  # B's (module) order
        a, b = params_a[name], params_b[name]
        if tuple(a.shape) != tuple(b.shape):
            mismatch.append({"name": name, "shape_a": list(a.shape), "shape_b": list(b.shape)})
            continue
        layer, component = classes[name]
        diff2, norm2 = squared_norms(a, b)
        matrices.append({"name": name, "layer": layer, "component": component, "shape": list(b.shape),
                         "norm_b": math.sqrt(norm2), "diff": math.sqrt(diff2), "rel": _ratio(diff2, norm2)})
    if not matrices:
        raise DetourError(f"model_a {refs['model_a']} and model_b {refs['model_b']} have no parameter in common "
                          f"with the same name and shape ({len(only_a)} only in A, {len(only_b)} only in B, "
                          f"{len(mismatch)} with different shapes)")

    rows = ["embeddings"] + [f"layer {i}" for i in range(num_layers)] + [FINAL_NORM, OTHER]
    by_row = {row: [] for row in rows}
    for m in matrices:
        by_row[_row_name(m["layer"], m["component"])].append(m)
    present = {m["component"] for m in matrices}
    columns = [c for c in COLUMNS if c in present]
    layers = []
    for row in rows:
        entries = by_row[row]
        if not entries and row in (FINAL_NORM, OTHER, "embeddings"):
            continue
        total = _aggregate(entries)
        layers.append({
            "name": row,
            "layer": int(row.split()[1]) if row.startswith("layer ") else None,
            # only components with parameters in this row appear; null: B's weights there are all zero
            "rel": {c: _aggregate([e for e in entries if e["component"] == c])["rel"]
                    for c in columns if any(e["component"] == c for e in entries)},
            "total": total["rel"], "diff": total["diff"], "norm_b": total["norm_b"],
        })
    groups = []
    if num_layers >= 3:
        for group, span in layer_group_ranges(num_layers).items():
            total = _aggregate([m for m in matrices if m["layer"] in span])
            groups.append({"name": group, "layers": [span.start, span.stop - 1],
                           "total": total["rel"], "diff": total["diff"], "norm_b": total["norm_b"]})
    overall = _aggregate(matrices)
    return {"columns": columns, "layers": layers, "groups": groups,
            "total": overall["rel"], "num_compared": len(matrices), "matrices": matrices,
            "only_in_a": only_a, "only_in_b": only_b, "shape_mismatch": mismatch}


def drift_analysis(model_a: str, model_b: str) -> dict:
    t0 = time.time()
    refs = {"model_a": model_a, "model_b": model_b}
    loaded = {role: load_config(ref) for role, ref in refs.items()}
    configs = {role: cfg for role, (_, cfg) in loaded.items()}
    types = {role: cfg.model_type for role, cfg in configs.items()}
    for role, model_type in types.items():
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise DetourError(f"{role} {refs[role]}: model_type {model_type!r} is not supported; "
                              f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if types["model_a"] != types["model_b"]:
        raise DetourError(f"model types differ (model_a {model_a} is {types['model_a']}, model_b {model_b} is "
                          f"{types['model_b']}): weights are compared name by name within one architecture")
    depth = check_same_depth(refs, configs)
    hidden = {role: getattr(cfg, "hidden_size", None) for role, cfg in configs.items()}
    if hidden["model_a"] != hidden["model_b"]:
        raise DetourError(f"hidden sizes differ (model_a {model_a} has {hidden['model_a']}, model_b {model_b} has "
                          f"{hidden['model_b']}): no weight matrix of one has the shape of the other's")

    model_a_, names_a = load_weights(loaded["model_a"][0], model_a)
    model_b_, names_b = load_weights(loaded["model_b"][0], model_b)
    params_a = {n: p for n, p in model_a_.named_parameters() if n in names_a}
    params_b = {n: p for n, p in model_b_.named_parameters() if n in names_b}
    # B's classes cover the common names; a name only in A needs none.
    result = compare(params_a, params_b, parameter_classes(model_b_), depth, refs)
    return {
        "schema": SCHEMA,
        "config": {
            "model_a": model_a, "model_b": model_b,
            "weights_hash_a": weights_hash(model_a), "weights_hash_b": weights_hash(model_b),
            "model_type": types["model_a"], "num_layers": depth,
            "groups": describe_groups(depth) if depth >= 3 else None,
            "dtype": "float64",
            "weights": "bare encoder (AutoModel, fp32): the MLM head is not compared; parameters a checkpoint "
                       "lacks (initialised at load time) count as absent from that model",
            "rel": "||W_A - W_B||_F / ||W_B||_F; for a group, sqrt(sum ||W_A - W_B||^2) / sqrt(sum ||W_B||^2); "
                   "null when B's weights are all zero",
        },
        **result,
        "seconds": round(time.time() - t0, 2),
    }


# ---- outputs ----

def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    # Changes below 1e-3 are common (embeddings of a short run): fixed decimals would show 0.
    return f"{value:.4f}" if value >= 1e-3 else f"{value:.2e}"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows, columns = result["layers"], result["columns"]
    grid = np.full((len(rows), len(columns)), np.nan)
    for i, row in enumerate(rows):
        for j, c in enumerate(columns):
            if row["rel"].get(c) is not None:
                grid[i, j] = row["rel"][c]
    finite = grid[np.isfinite(grid)]
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(1.3 * len(columns) + 3, 0.32 * len(rows) + 2))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")  # grey: no parameter there
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=0.0, vmax=vmax)
    fig.colorbar(image, ax=ax, label="||W_A - W_B|| / ||W_B||")
    if len(rows) <= 32 and len(columns) <= 6:
        for i in range(len(rows)):
            for j in range(len(columns)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, _fmt(float(grid[i, j])), ha="center", va="center", fontsize=7,
                            color="black" if grid[i, j] > 0.6 * vmax else "white")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), [row["name"] for row in rows])
    ax.set_xlabel("component")
    ax.set_ylabel("parameters (layer 0 = first transformer layer)")
    ax.set_title(f"relative weight change, A = {display_name(cfg['model_a'])}\nagainst B = {display_name(cfg['model_b'])}",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_outputs(result: dict, out: Path) -> None:
    write_result(out, "drift", result, plot)


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    console = Console()
    console.print(f"A = {cfg['model_a']}\nB = {cfg['model_b']}", highlight=False)
    table = Table(title="relative weight change ||W_A - W_B|| / ||W_B|| (float64)")
    table.add_column("parameters")
    for c in result["columns"]:
        table.add_column(c, justify="right")
    table.add_column("total", justify="right")
    for row in result["layers"]:
        table.add_row(row["name"], *[_fmt(row["rel"][c]) if c in row["rel"] else "" for c in result["columns"]],
                      _fmt(row["total"]))
    console.print(table)
    if result["groups"]:
        console.print("groups: " + ", ".join(f"{g['name']} (layers {g['layers'][0]}-{g['layers'][1]}) "
                                             f"{_fmt(g['total'])}" for g in result["groups"])
                      + f"; all compared parameters {_fmt(result['total'])}", highlight=False)
    skipped = {"only in A": len(result["only_in_a"]), "only in B": len(result["only_in_b"]),
               "different shapes": len(result["shape_mismatch"])}
    if any(skipped.values()):
        console.print("not compared: " + ", ".join(f"{n} {what}" for what, n in skipped.items() if n)
                      + " (listed in drift.json)", highlight=False)


# ---- the verb ----

def add_arguments(parser) -> None:
    parser.epilog = __doc__.split("\n\n", 1)[1]  # the examples and the definitions, under --help
    parser.add_argument("model_a", help="the changed encoder (a trained arm): a folder, a hub name, or minilm-l6")
    parser.add_argument("model_b", help="the reference encoder (the base model A started from)")
    parser.add_argument("--out", type=Path, default=Path("runs/drift"), help="output folder (default runs/drift)")


def run(args) -> int:
    result = drift_analysis(args.model_a, args.model_b)
    write_outputs(result, args.out)
    print_table(result)
    print(f"wrote {args.out / 'drift.json'} and {args.out / 'drift.png'} ({result['seconds']:.1f} s)")
    return 0
