r"""Transplant parameter blocks of the detour model A into the baseline B and probe how much of the gap each recovers.

    detour analyze transplant --src runs/twins/detour/model --dst runs/twins/baseline/model \
        --tasks ncbi-disease,gad,hoc --seeds 3 --out runs/transplant
    detour analyze transplant --src minilm-l6 --dst minilm-l6 --tasks gad --blocks low late:attention all none \
        --seeds 2 --epochs 1 --max-train 64 --max-eval 64 --max-length 64 --lr 1e-3 --out runs/transplant-smoke

A block is a layer group (`low`, `mid`, `late`, scaled to the depth as in freezing, or layers such
as `0-2` or `0-3,8`), a component (`attention`, `mlp`, `norm`, `embeddings`), both (`low:attention`),
`all` (every parameter of the encoder body) or `none` (nothing). Parameters are selected with the
same per-architecture table that freezing uses (`detour.model.freeze.parameter_table`); the MLM head
is never transplanted and the probe never reads it. For each block, B's weights with the block's
parameters copied from A are written to OUT/models/<block>/; A, B and every transplant are scored by
linear probing (frozen encoder, trained linear head, `detour.eval.finetune`) on each task with probe
seeds 0..N-1. Recovery = (F1_transplant - F1_B) / (F1_A - F1_B), per seed with seeds paired, then
mean and std. Writes OUT/transplant.png, then OUT/transplant.json, and prints a table.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path

from detour.errors import DetourError
from detour.quiet import quiet_transformers
from detour.analysis.blocks import BLOCK_COMPONENTS, block_names, encoder_parameter_names, parse_block, transplant
from detour.analysis.outputs import save_figure, select_device, write_result
from detour.analysis.recovery import DEFAULT_MIN_GAP, average_over_tasks, gap_noise, recovery, stats

SCHEMA = "detour.transplant/1"
HELP = "copy parameter blocks of the detour model into the baseline and probe the recovered gap"

DEFAULT_BLOCKS = ("low", "mid", "late", "attention", "mlp")
# Config fields that never change what the encoder body computes: bookkeeping, the head's labels,
# and special-token ids other than padding (the tokenizer check covers which tokens they are; the
# loader sets them from the tokenizer). pad_token_id stays compared: RoBERTa's positions depend on it.
_CONFIG_IGNORED = {
    "_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "_commit_hash",
    "_attn_implementation_autoset", "id2label", "label2id", "problem_type", "finetuning_task",
    "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "mask_token_id", "unk_token_id",
}
# Written into each model folder this analysis creates, so a rerun may replace it and nothing else.
MARKER = "transplant_block.json"
# Texts the tokenizer check encodes: enough variety to catch a different normalisation.
_TOKENIZER_PROBE = 16


# ---- inputs: checked before any model is built or probed ----

def _check_architecture(refs: dict[str, str], configs: dict) -> None:
    (ra, ca), (rb, cb) = ((refs[r], configs[r]) for r in ("src", "dst"))
    if ca.model_type != cb.model_type:
        raise DetourError(f"architectures differ: src {ra} is {ca.model_type}, dst {rb} is {cb.model_type}; "
                          "a transplant copies parameters between two models of one architecture")


def _compare_configs(refs: dict[str, str], configs: dict) -> None:
    (ra, ca), (rb, cb) = ((refs[r], configs[r]) for r in ("src", "dst"))
    da = {k: v for k, v in ca.to_dict().items() if k not in _CONFIG_IGNORED}
    db = {k: v for k, v in cb.to_dict().items() if k not in _CONFIG_IGNORED}
    differ = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    if differ:
        listed = ", ".join(f"{k}: {da.get(k)!r} vs {db.get(k)!r}" for k in differ[:5])
        raise DetourError(f"configs of src {ra} and dst {rb} differ ({listed}); a transplant runs A's parameters "
                          "inside B's architecture, so the two must agree on every field that shapes the encoder")


def _check_blocks(blocks: list[str], n_layers: int) -> list[str]:
    if not blocks:
        raise DetourError("--blocks: give at least one block")
    cleaned = [b.replace(" ", "") for b in blocks]
    for block in cleaned:
        if block not in ("all", "none"):
            parse_block(block, n_layers)
    twice = sorted({b for b in cleaned if cleaned.count(b) > 1})
    if twice:
        raise DetourError(f"--blocks: {', '.join(twice)} given twice")
    return cleaned


def folder_name(block: str) -> str:
    """A block's folder under OUT/models: `low:attention` -> low_attention, `0-3,8` -> 0-3+8."""
    return block.replace(":", "_").replace(",", "+")


def _check_model_folders(models_dir: Path, names: list[str]) -> None:
    for name in names:
        path = models_dir / name
        if path.exists() and not (path / MARKER).is_file():
            raise DetourError(f"{path} exists and was not written by detour analyze transplant; "
                              "move it or choose another --out")


def _load_tasks(tasks: list[str], data_root: str | None, src_path: str, budget) -> list:
    from detour.eval.finetune import prepare_task
    from detour.eval.splits import load_splits
    from detour.eval.tasks import load_spec

    if not tasks:
        raise DetourError("no task: give --tasks a,b and/or --task-spec FILE (shipped: detour eval --list-tasks)")
    specs = [load_spec(t, data_root) for t in tasks]
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DetourError(f"task {', '.join(twice)} given twice")
    # Both models share one tokenizer and architecture (checked), so one tokenization serves every model.
    return [prepare_task(spec, src_path, budget, load_splits(spec)) for spec in specs]


def _load_mlm(path: str):
    from detour.model.load import load_mlm_model

    # A checkpoint without an MLM head gets a fresh one; it is never transplanted nor read by the
    # probe, so the loader's notice about it would only mislead here.
    logger = logging.getLogger("detour.model.load")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        model, _ = load_mlm_model(path, seed=0)
    finally:
        logger.setLevel(level)
    return model.eval().requires_grad_(False)


def _save_encoder(model, tokenizer, path: Path, info: dict) -> None:
    """The encoder body (no MLM head) and the tokenizer, as the probe loads them (AutoModel)."""
    if path.exists():
        shutil.rmtree(path)  # ours (checked by its marker before the run started)
    with quiet_transformers():
        model.base_model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    (path / MARKER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _probe_arms(models: dict, tokenizers: dict, names: dict[str, set[str]], preps: list, seeds: int,
                models_dir: Path, folders: dict[str, str], refs: dict[str, str], keep_models: bool, device: str,
                log) -> tuple[list[dict], dict]:
    """Write each model (A, B, then one per block) to its folder, probe it on every task and seed.

    A and B are written and read back exactly as the transplants are, so the arms differ in weights
    only (not, say, in a BERT pooler that one checkpoint has and a masked-LM export lacks).
    """
    from detour.model.load import weights_hash
    from detour.eval import finetune as ft
    from detour.model.freeze import parameter_table

    src, dst = models["src"], models["dst"]
    table = parameter_table(dst)
    sizes = {name: param.numel() for name, param in dst.named_parameters()}
    total = sum(sizes[n] for n in encoder_parameter_names(dst))
    block_rows, scores = [], {}
    for arm in ["A", "B", *names]:
        if arm == "A":
            model, tokenizer, info = src, tokenizers["src"], {"model": "A", "source": refs["src"]}
        elif arm == "B":
            model, tokenizer, info = dst, tokenizers["dst"], {"model": "B", "source": refs["dst"]}
        else:
            model, tokenizer = transplant(src, dst, names[arm]), tokenizers["dst"]
            info = {"block": arm, "src": refs["src"], "dst": refs["dst"], "tensors": len(names[arm])}
        folder = models_dir / folders[arm]
        _save_encoder(model, tokenizer, folder, info)
        del model
        if arm in names:
            chosen = names[arm]
            count = sum(sizes[n] for n in chosen)
            block_rows.append({
                "block": arm, "folder": str(folder) if keep_models else None,
                "tensors": len(chosen), "parameters": count, "share_of_encoder": count / total,
                "layers": sorted({table[n][0] for n in chosen if table[n][0] is not None}),
                "components": sorted({table[n][1] for n in chosen}),
                "weights_hash": weights_hash(str(folder)),
            })
        scores[arm] = {}
        for prep in preps:
            scores[arm][prep.spec.name] = []
            for seed in range(seeds):
                started = time.time()
                with quiet_transformers():
                    result = ft.finetune(str(folder), prep, seed, linear_probe=True, device=device)
                f1 = float(result["metrics"][prep.spec.headline])
                scores[arm][prep.spec.name].append(f1)
                log(f"{arm} {prep.spec.name} seed {seed}: {prep.spec.headline} = {f1:.4f} "
                    f"(epoch {result['selected_epoch']}, {time.time() - started:.1f} s)")
        if not keep_models:
            shutil.rmtree(folder)
    if not keep_models and models_dir.is_dir() and not any(models_dir.iterdir()):
        models_dir.rmdir()
    return block_rows, scores


def _task_result(prep, f1: dict[str, list[float]], blocks: list[str], min_gap: float) -> dict:
    """One task's entry: its probe budget, F1 of A, B and each block per seed, the gap and the recoveries."""
    row = {
        "task": prep.spec.name, "metric": prep.spec.headline, "spec": prep.spec.source,
        "budget": {"epochs": prep.epochs, "train_examples": len(prep.examples["train"]),
                   "validation_examples": len(prep.examples["validation"]),
                   "test_examples": len(prep.examples["test"]), "max_length": prep.max_length,
                   "lr": prep.lr, "batch_size": prep.batch_size, "labels": len(prep.labels)},
        **gap_noise(f1["A"], f1["B"], min_gap),
    }
    for role, arm in (("src", "A"), ("dst", "B")):
        mean, std = stats(f1[arm])
        row[role] = {"f1_mean": mean, "f1_std": std, "f1_per_seed": f1[arm]}
    row["blocks"] = {}
    for block in blocks:
        mean, std = stats(f1[block])
        row["blocks"][block] = {"f1_mean": mean, "f1_std": std, "f1_per_seed": f1[block],
                                **recovery(f1["A"], f1["B"], f1[block])}
    return row


# ---- the analysis ----

def _check_options(seeds: int, min_gap: float, budget) -> None:
    """The probe's options, checked before any model loads; errors name the flag."""
    if seeds < 1:
        raise DetourError(f"--seeds must be at least 1, got {seeds}")
    if not min_gap >= 0:
        raise DetourError(f"--min-gap must be >= 0 (an F1 difference on the 0-1 scale), got {min_gap}")
    for option in ("epochs", "max_train", "max_eval", "max_length", "batch_size"):
        value = getattr(budget, option)
        if value is not None and value < 1:
            raise DetourError(f"--{option.replace('_', '-')} must be at least 1, got {value}")
    if budget.lr is not None and not budget.lr > 0:
        raise DetourError(f"--lr must be > 0, got {budget.lr}")


def _check_transplantable(models: dict, src: str, dst: str) -> int:
    """The number of encoder parameters; DetourError unless src and dst have the same names and shapes."""
    encoder_names = encoder_parameter_names(models["dst"])
    if encoder_parameter_names(models["src"]) != encoder_names:
        only = sorted(encoder_names ^ encoder_parameter_names(models["src"]))[:3]
        raise DetourError(f"src {src} and dst {dst} have different parameters ({only}); cannot transplant")
    src_params, dst_params = dict(models["src"].named_parameters()), dict(models["dst"].named_parameters())
    shapes = sorted(n for n in encoder_names if src_params[n].shape != dst_params[n].shape)
    if shapes:
        raise DetourError(f"src {src} and dst {dst} differ in the shapes of {shapes[:3]}; cannot transplant")
    return sum(dst_params[n].numel() for n in encoder_names)


def transplant_analysis(src: str, dst: str, tasks: list[str], out: Path, blocks: list[str] = DEFAULT_BLOCKS,
                        seeds: int = 3, budget=None, data_root: str | None = None, device: str | None = None,
                        min_gap: float = DEFAULT_MIN_GAP, keep_models: bool = False, log=print) -> dict:
    """Score A, B and each transplant by linear probing on every task and seed; returns the JSON result."""
    from detour.data.tokenize import load_tokenizer

    from detour.analysis.models import check_same_depth, check_same_tokenizer
    from detour.model.load import load_config, weights_hash
    from detour.analysis.texts import sample_texts
    from detour.eval import finetune as ft
    from detour.model.freeze import describe_groups

    budget = budget or ft.Budget()
    _check_options(seeds, min_gap, budget)
    dev = select_device(device)
    t0 = time.time()

    refs = {"src": src, "dst": dst}
    loaded = {role: load_config(ref) for role, ref in refs.items()}
    paths = {role: path for role, (path, _) in loaded.items()}
    configs = {role: cfg for role, (_, cfg) in loaded.items()}
    depth = check_same_depth(refs, configs)
    _check_architecture(refs, configs)
    tokenizers = {role: load_tokenizer(path) for role, path in paths.items()}
    check_same_tokenizer(refs, tokenizers, sample_texts("synthetic", _TOKENIZER_PROBE, 0), 128)
    _compare_configs(refs, configs)
    blocks = _check_blocks(list(blocks), depth)
    models_dir = Path(out) / "models"
    arms = ["A", "B", *blocks]
    folders = {"A": "A", "B": "B", **{b: folder_name(b) for b in blocks}}
    _check_model_folders(models_dir, list(folders.values()))
    preps = _load_tasks(tasks, data_root, paths["src"], budget)
    hashes = {role: weights_hash(path) for role, path in paths.items()}

    models = {role: _load_mlm(path) for role, path in paths.items()}
    n_encoder = _check_transplantable(models, src, dst)
    names = {b: block_names(models["dst"], b) for b in blocks}  # DetourError for a block that selects nothing

    block_rows, scores = _probe_arms(models, tokenizers, names, preps, seeds, models_dir, folders, refs,
                                     keep_models, str(dev), log)

    task_rows = [_task_result(prep, {arm: scores[arm][prep.spec.name] for arm in arms}, blocks, min_gap)
                 for prep in preps]
    noisy = [t["task"] for t in task_rows if t["gap_within_noise"]]
    average = {"blocks": {b: average_over_tasks(task_rows, b) for b in blocks},
               "gap_within_noise": bool(noisy), "tasks_within_noise": noisy}

    return {
        "schema": SCHEMA,
        "config": {
            "src": {"model": src, "path": paths["src"], "weights_hash": hashes["src"]},
            "dst": {"model": dst, "path": paths["dst"], "weights_hash": hashes["dst"]},
            "blocks": blocks, "layer_groups": describe_groups(depth),
            "tasks": [p.spec.name for p in preps], "task_specs": [p.spec.source for p in preps],
            "data_root": preps[0].spec.root, "seeds": list(range(seeds)),
            "probe": {"linear_probe": True, "epochs": budget.epochs, "max_train": budget.max_train,
                      "max_eval": budget.max_eval, "max_length": budget.max_length, "lr": budget.lr,
                      "batch_size": budget.batch_size, "device": str(dev)},
            "min_gap": min_gap, "keep_models": keep_models,
            "recovery": "(F1_block - F1_B) / (F1_A - F1_B) per probe seed, seeds paired; mean and sample std "
                        "over seeds; null at a seed where F1_A == F1_B",
            "noise_rule": "gap_within_noise when |mean F1_A - mean F1_B| < max(min_gap, 2 x pooled std), "
                          "pooled std = sqrt((std_A^2 + std_B^2) / 2), sample std over probe seeds",
            "f1_scale": "0-1, the task's headline metric",
        },
        "num_layers": depth,
        "encoder_parameters": n_encoder,
        "blocks": block_rows,
        "tasks": task_rows,
        "average": average,
        "seconds": round(time.time() - t0, 2),
    }


# ---- outputs ----

def _short(ref: str) -> str:
    # Two path parts: run folders often end in the same name (runs/twins/detour/model, .../baseline/model).
    return "/".join(Path(ref).parts[-2:])


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    blocks = cfg["blocks"]
    series = [(t["task"], t["blocks"]) for t in result["tasks"]]
    if len(series) > 1:
        series.append(("average over tasks", result["average"]["blocks"]))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(blocks) + 2), 4.2))
    for i, (label, rows) in enumerate(series):
        x = [j + (i - (len(series) - 1) / 2) * width for j in range(len(blocks))]
        means = [rows[b]["recovery_mean"] for b in blocks]
        stds = [rows[b]["recovery_std"] for b in blocks]
        ax.bar(x, [math.nan if m is None else m for m in means], width,
               yerr=[0.0 if s is None else s for s in stds], capsize=3, label=label)
    ax.axhline(0.0, color="black", lw=0.8, label="0 = B (baseline)")
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="1 = A (detour)")
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_xlabel("block copied from A into B")
    ax.set_ylabel("recovery of the A-B gap")
    title = (f"A = {_short(cfg['src']['model'])}, B = {_short(cfg['dst']['model'])}; "
             f"linear probe, mean ± std over {len(cfg['seeds'])} seeds")
    if result["average"]["gap_within_noise"]:
        title += f"\nWARNING: A-B gap within noise on {', '.join(result['average']['tasks_within_noise'])}"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_outputs(result: dict, out: Path) -> None:
    write_result(out, "transplant", result, plot)


def _pm(mean, std, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if mean is None else f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def warnings(result: dict) -> list[str]:
    return [f"WARNING: task {t['task']}: |F1_A - F1_B| = {abs(t['gap']):.4f} is within noise (threshold "
            f"{t['threshold']:.4f} = max(--min-gap {result['config']['min_gap']}, 2 x the pooled seed std "
            f"{t['pooled_std']:.4f})): recovery is then a ratio of noise and meaningless"
            for t in result["tasks"] if t["gap_within_noise"]]


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    console = Console()
    console.print(f"A (src) = {cfg['src']['model']}\nB (dst) = {cfg['dst']['model']}\n"
                  f"layer groups: {cfg['layer_groups']}", highlight=False)
    # One row per (task, model): the table stays narrow however many tasks there are.
    table = Table(title=f"linear probe: F1 x100 and recovery of the A-B gap, mean ± std over {len(cfg['seeds'])} seeds")
    if any(t["gap_within_noise"] for t in result["tasks"]):
        table.caption = "* A-B gap within noise: its recoveries are meaningless"
    for name in ("task", "model", "params", "F1 x100", "recovery"):
        table.add_column(name, justify="left" if name in ("task", "model") else "right")
    sizes = {b["block"]: b["parameters"] for b in result["blocks"]}
    for t in result["tasks"]:
        label = t["task"] + (" *" if t["gap_within_noise"] else "")
        for arm in ["A", "B", *cfg["blocks"]]:
            row = t["src"] if arm == "A" else t["dst"] if arm == "B" else t["blocks"][arm]
            recovered = ("1 (A)" if arm == "A" else "0 (B)" if arm == "B"
                         else _pm(row["recovery_mean"], row["recovery_std"], digits=2))
            table.add_row(label if arm == "A" else "", arm, f"{sizes[arm]:,}" if arm in sizes else "-",
                          _pm(row["f1_mean"], row["f1_std"], 100), recovered)
        table.add_section()
    if len(result["tasks"]) > 1:
        for i, block in enumerate(cfg["blocks"]):
            avg = result["average"]["blocks"][block]
            table.add_row("average over tasks" if i == 0 else "", block, f"{sizes[block]:,}", "",
                          _pm(avg["recovery_mean"], avg["recovery_std"], digits=2))
    console.print(table)


# ---- the verb ----

def add_arguments(p) -> None:
    from detour.eval.run import add_budget_arguments
    from detour.flags import positive_int

    p.add_argument("--src", required=True, metavar="A",
                   help="the model blocks are copied from (the detour): a folder, a hub name, or minilm-l6")
    p.add_argument("--dst", required=True, metavar="B", help="the model blocks are copied into (the MLM baseline)")
    p.add_argument("--blocks", nargs="+", default=list(DEFAULT_BLOCKS), metavar="BLOCK",
                   help="blocks to transplant, each its own model: low, mid, late, layers such as 0-2 or 0-3,8, "
                        f"a component ({', '.join(BLOCK_COMPONENTS)}), both as low:attention, all, none "
                        f"(default: {' '.join(DEFAULT_BLOCKS)})")
    p.add_argument("--tasks", default="", help="comma-separated shipped task names or spec files")
    p.add_argument("--task-spec", action="append", default=[], metavar="FILE", help="a task spec YAML (repeatable)")
    p.add_argument("--data-root", default=None,
                   help="where task paths resolve (default $DETOUR_DATA_ROOT or ../shared/data)")
    p.add_argument("--seeds", type=positive_int, default=3, help="probe seeds 0..N-1 for every model (default 3)")
    add_budget_arguments(p, lr_help="override the spec's learning rate (a linear head on a small budget wants about 1e-3)")
    p.add_argument("--min-gap", type=float, default=DEFAULT_MIN_GAP,
                   help="smallest |F1_A - F1_B| (0-1 scale) for recovery to mean anything (default 0.005, "
                        "half an F1 point); see also the 2 x seed-std rule")
    p.add_argument("--keep-models", action="store_true",
                   help="keep the written models under OUT/models/ (default: each is removed once probed)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--out", type=Path, default=Path("runs/transplant"), help="output folder (default runs/transplant)")


def run(args) -> int:
    import os

    from detour.eval.finetune import Budget

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] + list(args.task_spec)
    budget = Budget(args.epochs, args.max_train, args.max_eval, args.max_length, args.lr, args.batch_size)
    result = transplant_analysis(args.src, args.dst, tasks, args.out, args.blocks, args.seeds, budget,
                                 args.data_root, args.device, args.min_gap, args.keep_models)
    write_outputs(result, args.out)
    print_table(result)
    for line in warnings(result):
        print(line)
    print(f"wrote {args.out / 'transplant.json'} and {args.out / 'transplant.png'} ({result['seconds']:.1f} s)")
    return 0
