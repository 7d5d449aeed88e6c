r"""`detour analyze trajectory`: CKA divergence between two runs at the same token counts along a phase.

    detour analyze trajectory runs/twins/detour runs/twins/baseline --phase decay \
        --noise-floor runs/twins-seed2/baseline --texts synthetic --n 500 --seeds 3 --out runs/trajectory
    detour analyze trajectory runs/twins/detour runs/twins/detour --n 40 --seeds 2 --max-length 64 \
        --out runs/trajectory-self

RUN_A (the detour) and RUN_B (the MLM baseline) are run folders written by `detour train` or
`detour twins` (for twins, OUT/detour and OUT/baseline). The points of phase P are: 0 tokens, the
model at the start of P (RUN/export/<previous phase>/; for the first phase, the recipe's
model.source when it is a local folder or an alias), each export taken during P
(RUN/export/P/<tokens>/, in increasing tokens), and the end of P (RUN/export/P/). Only token counts
present in every run are compared; the others are listed as unmatched. At each point the
per-layer divergence d = 1 - CKA is that of `detour analyze cka` (mean-pooled hidden states,
float64, averaged over text seeds, the same texts at every point), summarised over the
depth-scaled layer groups low / mid / late and over all transformer layers; the embeddings row is
kept apart. With `--noise-floor RUN_C` (an MLM twin of B trained with another seed) it adds
d(C, B) and the ratio r = d(A, B) / d(C, B). Writes OUT/trajectory.png, then OUT/trajectory.json
(atomically), and prints a table.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from detour.analysis.cka import layer_features, linear_cka
from detour.analysis.layers import LAYERS_NOTE, layer_rows, seed_stats
from detour.analysis.models import check_same_depth, check_same_tokenizer, load_encoder
from detour.data.tokenize import load_tokenizer
from detour.model.load import load_config, weights_hash
from detour.analysis.texts import is_synthetic, sample_texts
from detour.errors import DetourError
from detour.analysis.outputs import (add_text_arguments, check_text_options, save_figure, select_device,
                                     write_result)
from detour.model.freeze import describe_groups, layer_group_ranges
from detour.paths import ALIASES, resolve_model_ref
from detour.runs import RunFolder

HELP = "CKA divergence between two runs at checkpoints along a phase, with a seed-noise floor"
SCHEMA = "detour.trajectory/1"

ROLES = ("model_a", "model_b", "noise_floor")
ARMS = {"model_a": "detour (A)", "model_b": "baseline (B)", "noise_floor": "noise floor (C)"}
LETTERS = {"model_a": "A", "model_b": "B", "noise_floor": "C"}
SUMMARIES = ("low", "mid", "late", "all")  # "all" = every transformer layer; the embeddings stay apart


# ---- the points of a phase ----

@dataclass(frozen=True)
class Point:
    tokens: int  # tokens of the phase consumed when the export was taken
    path: str    # the Hugging Face export (or the recipe's model.source) holding the model then
    where: str   # "start", "during" or "end"


def read_recipe(run: Path) -> dict:
    if not run.is_dir():
        raise DetourError(f"run folder {run}: no such folder")
    path = RunFolder(run).recipe
    if not path.is_file():
        raise DetourError(f"{run}: no recipe.json, so this is not a run folder written by `detour train` or "
                          "`detour twins` (for twins, pass OUT/detour and OUT/baseline)")
    try:
        recipe = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DetourError(f"{path}: cannot read the recipe ({exc})") from None
    phases = recipe.get("phases") if isinstance(recipe, dict) else None
    if not isinstance(phases, list) or not phases or not all(
            isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("tokens"), int)
            for p in phases):
        raise DetourError(f"{path}: 'phases' must be a non-empty list of {{name, tokens, ...}}")
    return recipe


def _has_export(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _first_phase_start(recipe: dict) -> tuple[str | None, str]:
    """The model a run started from, when it can be read here; else None and why not."""
    model = recipe.get("model") or {}
    source = model.get("source")
    if not source:
        return None, "the recipe builds its model from model.config, so there is no exported start"
    if source in ALIASES or Path(source).is_dir():
        return resolve_model_ref(source), ""
    return None, f"the recipe's model.source {source!r} is not a local folder or alias here (a hub name?)"


def phase_points(run: Path, phase: str | None) -> tuple[dict, list[Point], list[str]]:
    """({name, index, tokens} of the phase, its points in increasing tokens, notes on points left out).

    `phase` None means the recipe's last phase.
    """
    recipe = read_recipe(run)
    names = [p["name"] for p in recipe["phases"]]
    name = names[-1] if phase is None else phase
    if name not in names:
        raise DetourError(f"{RunFolder(run).recipe}: no phase {name!r}; its phases are {', '.join(names)}")
    index = names.index(name)
    budget = recipe["phases"][index]["tokens"]
    info = {"name": name, "index": index, "tokens": budget}
    folder = RunFolder(run).export(name)

    during = {}
    if folder.is_dir():
        for sub in folder.iterdir():
            # Only plain integer names: an export being written is a hidden or suffixed sibling.
            if not (sub.is_dir() and re.fullmatch(r"[0-9]+", sub.name) and _has_export(sub)):
                continue
            tokens = int(sub.name)
            if tokens > budget:
                raise DetourError(f"{sub}: taken after {tokens} tokens, beyond the budget of phase {name!r} "
                                  f"({budget} tokens)")
            during[tokens] = sub
    end = folder if _has_export(folder) else None
    if not during and end is None:
        raise DetourError(f"{run}: phase {name!r} has no exports yet (neither {folder}/config.json nor "
                          f"{folder}/<tokens>/; exports during a phase need checkpoint.export_every_tokens)")

    notes = []
    start = None
    if index > 0:
        previous = names[index - 1]
        branch = recipe.get("branch") or {}
        candidates = [RunFolder(run).export(previous)]
        # A branch run starts from its parent's checkpoint: its parent holds the earlier exports.
        if branch.get("run") and branch.get("after_phase") == previous:
            candidates.append(Path(branch["run"]) / "export" / previous)
        start = next((str(c) for c in candidates if _has_export(c)), None)
        if start is None:
            notes.append(f"{run}: no start point for phase {name!r}: "
                         f"{' nor '.join(str(c) for c in candidates)} holds an export")
    else:
        start, why = _first_phase_start(recipe)
        if start is None:
            notes.append(f"{run}: no start point for the first phase {name!r}: {why}")

    points = [Point(0, start, "start")] if start is not None else []
    for tokens in sorted(during):
        if tokens == budget and end is not None:
            continue  # the end export holds the same model
        if tokens == 0 and start is not None:
            continue
        points.append(Point(tokens, str(during[tokens]), "during"))
    if end is not None:
        points.append(Point(budget, str(end), "end"))
    return info, points, notes


def parse_points(spec: str) -> list[int]:
    from detour.config import parse_tokens

    chosen = []
    for part in spec.split(","):
        part = part.strip()
        try:
            chosen.append(0 if part == "0" else parse_tokens(part))
        except ValueError as exc:
            raise DetourError(f"--points {spec!r}: {exc}") from None
    return sorted(set(chosen))


def match_points(by_role: dict[str, list[Point]], chosen: list[int] | None = None) -> tuple[list[int], list[dict]]:
    """Token counts present in every run (restricted to `chosen`), and the points only some runs have."""
    sets = {role: {p.tokens for p in points} for role, points in by_role.items()}
    common = sorted(set.intersection(*sets.values()))
    unmatched = [{"run": role, "arm": ARMS[role], "tokens": p.tokens, "path": p.path}
                 for role, points in by_role.items() for p in points if p.tokens not in common]
    listed = ", ".join(map(str, common)) or "none"
    if not common:
        have = "; ".join(f"{ARMS[role]}: {', '.join(map(str, sorted(s))) or 'none'}" for role, s in sets.items())
        raise DetourError(f"the runs share no point of the phase ({have}); "
                          "they must be exported at the same token counts")
    if chosen is not None:
        missing = [t for t in chosen if t not in common]
        if missing:
            raise DetourError(f"--points {', '.join(map(str, missing))}: not a point of every run "
                              f"(points common to all: {listed})")
        common = chosen
    return common, unmatched


# ---- the analysis ----

def _group_rows(ab: list[list[float]], cb: list[list[float]] | None, groups: dict[str, range]) -> dict:
    """Per group, the mean divergence over its layers: per seed first, then mean and std over seeds."""
    out = {}
    for name, layers in groups.items():
        # Transformer layer l is hidden state l + 1 (hidden state 0 is the embeddings).
        per_seed = [statistics.fmean(1.0 - seed[l + 1] for l in layers) for seed in ab]
        mean, std = seed_stats(per_seed)
        row = {"layers": list(layers), "divergence": mean, "divergence_std": std, "divergence_per_seed": per_seed}
        if cb is not None:
            noise = [statistics.fmean(1.0 - seed[l + 1] for l in layers) for seed in cb]
            n_mean, n_std = seed_stats(noise)
            row.update(noise_divergence=n_mean, noise_divergence_std=n_std, noise_divergence_per_seed=noise,
                       seed_noise_ratio=mean / n_mean if n_mean > 0 else None)
        out[name] = row
    return out


def trajectory_analysis(run_a: str, run_b: str, noise_floor: str | None = None, phase: str | None = None,
                        points: list[int] | None = None, texts: str = "synthetic", n: int = 500, seeds: int = 3,
                        max_length: int = 256, batch_size: int = 16, lang: str = "en", text_field: str = "text",
                        device: str | None = None, progress: bool = True) -> dict:
    """Per-layer and per-group d = 1 - CKA of A with B (and C with B) at each common point of `phase`."""
    check_text_options(n, seeds, max_length, batch_size)
    t0 = time.time()
    runs = {"model_a": run_a, "model_b": run_b}
    if noise_floor is not None:
        runs["noise_floor"] = noise_floor
    # Everything that can be wrong with the folders and models is checked before any model runs.
    first, budget, at, common, unmatched, notes = _common_points(runs, phase, points)
    phase = first[0]["name"]
    dev = select_device(device)
    samples = [sample_texts(texts, n, seed, lang=lang, text_field=text_field) for seed in range(seeds)]
    depth = _check_comparable(runs, common, at, samples, max_length)
    groups = layer_group_ranges(depth)
    summaries = {**groups, "all": range(depth)}

    hashes: dict[str, str] = {}
    exports, results = [], []
    for i, tokens in enumerate(common):
        t_point = time.time()
        paths = {role: at[role][tokens].path for role in runs}
        ab, cb = _cka_at_point(paths, tokens, samples, depth, max_length, batch_size, dev, hashes)
        exports.append({"tokens": tokens, **{role: {"path": path, "weights_hash": hashes[path]}
                                             for role, path in paths.items()}})
        group_rows = _group_rows(ab, cb, summaries)
        results.append({"tokens": tokens, "where": at["model_a"][tokens].where,
                        "layers": layer_rows(ab, cb, depth), "groups": group_rows,
                        "mean": group_rows["all"]["divergence"]})
        if progress:
            print(f"point {i + 1}/{len(common)}: {tokens:,} tokens, mean d(A,B) {_d(results[-1]['mean'])} "
                  f"({time.time() - t_point:.1f} s)", file=sys.stderr, flush=True)

    return {
        "schema": SCHEMA,
        "config": {
            "runs": {role: {"run": run, "arm": ARMS[role]} for role, run in runs.items()},
            "noise_floor": noise_floor,
            "phase": phase, "phase_index": first[0]["index"], "phase_tokens": budget,
            "points_requested": points,
            "exports": exports,
            "texts": texts, "synthetic_texts": is_synthetic(texts), "lang": lang if is_synthetic(texts) else None,
            "n": n, "seeds": list(range(seeds)), "max_length": max_length, "batch_size": batch_size,
            "device": str(dev), "dtype": "float64",
            "groups": {name: list(r) for name, r in groups.items()},
            "groups_described": describe_groups(depth),
            "features": LAYERS_NOTE + "; the same texts at every point",
            "cka": "linear CKA on centred features; divergence = 1 - mean CKA over seeds; std = sample std over seeds",
            "group_divergence": "per seed the mean of 1 - CKA over the group's transformer layers, then mean and "
                                "sample std over seeds; 'all' = every transformer layer; embeddings in no group",
            "seed_noise_ratio": "d(model_a, model_b) / d(noise_floor, model_b); null when that floor is 0",
        },
        "num_layers": depth,
        "points": results,
        "unmatched": unmatched,
        "notes": notes,
        "seconds": round(time.time() - t0, 2),
    }


def _common_points(runs: dict[str, str], phase: str | None, points: list[int] | None):
    """(the first run's phase points, the phase budget, role -> tokens -> point, the common token counts,
    the unmatched ones, notes): the runs must share the phase's budget."""
    first = phase_points(Path(runs["model_a"]), phase)
    phase = first[0]["name"]
    found = {"model_a": first}
    found.update({role: phase_points(Path(run), phase) for role, run in runs.items() if role != "model_a"})
    budgets = {role: info["tokens"] for role, (info, _, _) in found.items()}
    if len(set(budgets.values())) > 1:
        listed = ", ".join(f"{runs[role]} has {tokens}" for role, tokens in budgets.items())
        raise DetourError(f"runs disagree on the budget of phase {phase!r} ({listed} tokens): a trajectory compares "
                          "the runs at the same token counts, so they must share the phase's budget")
    by_role = {role: pts for role, (_, pts, _) in found.items()}
    notes = [note for _, _, run_notes in found.values() for note in run_notes]
    common, unmatched = match_points(by_role, points)
    at = {role: {p.tokens: p for p in pts} for role, pts in by_role.items()}
    return first, budgets["model_a"], at, common, unmatched, notes


def _check_comparable(runs: dict[str, str], common: list[int], at: dict, samples: list[list[str]],
                      max_length: int) -> int:
    """The shared depth of every export compared; DetourError if depths or tokenizers differ."""
    refs, configs = {}, {}
    for tokens in common:
        for role in runs:
            key = f"{ARMS[role]} at {tokens} tokens"
            path, cfg = load_config(at[role][tokens].path)
            refs[key], configs[key] = path, cfg
    depth = check_same_depth(refs, configs)
    tokenizer_paths = {}  # one per folder: twins share their start export
    for key, path in refs.items():
        if path not in tokenizer_paths.values():
            tokenizer_paths[key] = path
    probe = [text for sample in samples for text in sample]
    check_same_tokenizer(refs, {key: load_tokenizer(path) for key, path in tokenizer_paths.items()},
                         probe, max_length)
    return depth


def _cka_at_point(paths: dict[str, str], tokens: int, samples: list[list[str]], depth: int, max_length: int,
                  batch_size: int, dev, hashes: dict[str, str]):
    """(ab, cb): per seed, the CKA of each hidden state of A with B (and of C with B) at one point."""
    import torch

    # One model in memory at a time; a folder shared by two roles is encoded once.
    feats: dict[str, list] = {}
    for role, path in paths.items():
        if path in feats:
            continue
        hashes.setdefault(path, weights_hash(path))
        model, tok = load_encoder(path, f"{ARMS[role]} at {tokens} tokens")
        feats[path] = [layer_features(model, tok, sample, max_length, batch_size, dev) for sample in samples]
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    for path, per_seed in feats.items():
        if any(len(f) != depth + 1 for f in per_seed):
            raise DetourError(f"{path}: expected {depth + 1} hidden states, got {len(per_seed[0])}")
    a, b = feats[paths["model_a"]], feats[paths["model_b"]]
    c = feats[paths["noise_floor"]] if "noise_floor" in paths else None
    try:
        ab = [[linear_cka(x, y) for x, y in zip(fa, fb)] for fa, fb in zip(a, b)]
        cb = [[linear_cka(x, y) for x, y in zip(fc, fb)] for fc, fb in zip(c, b)] if c is not None else None
    except ValueError as exc:
        raise DetourError(f"point {tokens} tokens: CKA undefined ({exc}); use more or more varied texts") from exc
    return ab, cb


# ---- outputs ----

def format_tokens(tokens: float) -> str:
    """4096 -> '4.1k', 1_500_000_000 -> '1.5B'; 0 -> '0'."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(tokens) >= size:
            return f"{tokens / size:.3g}{suffix}"
    return f"{tokens:.0f}"


def _d(value: float) -> str:
    # Divergences between nearly unchanged layers are of order 1e-5: fixed decimals would show 0.
    return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    cfg = result["config"]
    points = result["points"]
    x = [p["tokens"] for p in points]
    styles = {"low": ("tab:blue", "o"), "mid": ("tab:orange", "s"), "late": ("tab:green", "^"),
              "all": ("black", "D")}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (color, marker) in styles.items():
        rows = [p["groups"][name] for p in points]
        label = "mean, all layers" if name == "all" else f"{name} (layers {_span(cfg['groups'][name])})"
        ax.errorbar(x, [r["divergence"] for r in rows], yerr=[r["divergence_std"] for r in rows], color=color,
                    marker=marker, capsize=3, lw=2 if name == "all" else 1.5,
                    label=f"{label}: detour (A) vs baseline (B)")
        if cfg["noise_floor"] is not None:
            ax.errorbar(x, [r["noise_divergence"] for r in rows], yerr=[r["noise_divergence_std"] for r in rows],
                        color="grey", marker=marker, mfc="none", ls="--", capsize=2, lw=1,
                        label=f"{label}: noise floor (C) vs baseline (B)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_tokens(v)))
    ax.set_xlabel(f"tokens into phase '{cfg['phase']}' (of {cfg['phase_tokens']:,})")
    ax.set_ylabel("divergence 1 - linear CKA")
    ax.set_ylim(bottom=0)
    ax.set_title(f"CKA divergence along phase '{cfg['phase']}', {cfg['n']} texts x {len(cfg['seeds'])} seeds "
                 f"(bars: std over seeds)" + (" (synthetic texts)" if cfg["synthetic_texts"] else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _span(layers: list[int]) -> str:
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


def write_outputs(result: dict, out: Path) -> None:
    write_result(out, "trajectory", result, plot)


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    noise = cfg["noise_floor"] is not None
    console = Console()
    console.print("\n".join(f"{LETTERS[role]} = {info['run']} ({info['arm']})" for role, info in cfg["runs"].items()),
                  highlight=False)
    title = (f"divergence 1 - CKA along phase '{cfg['phase']}' ({cfg['phase_tokens']:,} tokens), "
             f"{cfg['n']} texts x {len(cfg['seeds'])} seeds; {cfg['groups_described']}")
    table = Table(title=title)
    table.add_column("tokens", justify="right")
    table.add_column("export")
    if noise:
        table.add_column("")
    for name in ("emb", *SUMMARIES):
        table.add_column(name, justify="right")
    for i, point in enumerate(result["points"]):
        rows = [point["layers"][0], *(point["groups"][name] for name in SUMMARIES)]
        head = [f"{point['tokens']:,}", point["where"]]
        if not noise:
            table.add_row(*head, *(_d(r["divergence"]) for r in rows))
            continue
        ratios = ["-" if r["seed_noise_ratio"] is None else f"{r['seed_noise_ratio']:.2f}" for r in rows]
        table.add_row(*head, "d(A,B)", *(_d(r["divergence"]) for r in rows))
        table.add_row("", "", "d(C,B)", *(_d(r["noise_divergence"]) for r in rows), style="dim")
        table.add_row("", "", "r", *ratios, end_section=i < len(result["points"]) - 1)
    console.print(table)
    for item in result["unmatched"]:
        console.print(f"unmatched: {item['arm']} has a point at {item['tokens']:,} tokens ({item['path']}) "
                      "that another run lacks", highlight=False)
    for note in result["notes"]:
        console.print(f"note: {note}", highlight=False)


# ---- the verb ----

def add_arguments(parser) -> None:
    parser.add_argument("run_a", help="the detour's run folder (holds recipe.json and export/)")
    parser.add_argument("run_b", help="the MLM baseline's run folder")
    parser.add_argument("--noise-floor", metavar="RUN_C",
                        help="run folder of an MLM twin of RUN_B trained with another seed: adds d(C, B) and "
                             "r = d(A, B) / d(C, B) at each point")
    parser.add_argument("--phase", help="the phase to follow (default: the last phase of RUN_A's recipe)")
    parser.add_argument("--points", metavar="T1,T2,...",
                        help="only these token counts into the phase (e.g. 0,250M,1B; default: every common point)")
    add_text_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/trajectory"),
                        help="output folder (default runs/trajectory)")


def run(args) -> int:
    points = parse_points(args.points) if args.points else None
    result = trajectory_analysis(args.run_a, args.run_b, args.noise_floor, args.phase, points, args.texts, args.n,
                                 args.seeds, args.max_length, args.batch_size, args.lang, args.text_field,
                                 args.device)
    write_outputs(result, args.out)
    print_table(result)
    if result["config"]["synthetic_texts"]:
        print("texts: SYNTHETIC clinical reports (a smoke test, not a result; pass --texts FILE for real text)")
    print(f"wrote {args.out / 'trajectory.json'} and {args.out / 'trajectory.png'} ({result['seconds']:.1f} s)")
    return 0
