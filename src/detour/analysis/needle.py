"""`detour needle`: can a frozen encoder tell whether a fact sits somewhere in a long document?

    detour needle <model folder> --preset small --lang en --out runs/needle
    detour needle <model folder> --preset paper --haystack ../shared/data/corpora/en-biomed/e3c-en-layer3.jsonl

The paper's probe. A fact sentence (the needle, see `needle_templates`) is inserted at the start,
middle or end of a haystack cut to a target length in tokens; the query is the same fact (positive)
or the same template with other slot values (negative), balanced within every length x position
cell. The model reads `query [SEP] haystack` at the target length (the haystack is cut at a token
boundary, never the needle; retokenising at the seams may leave it a token short; a middle needle
goes at the sentence or word start nearest the middle). Pairs are
split 70/15/15 (seeded); a 2-layer MLP probe (dropout, linear, GELU, dropout, linear; `--linear`: one
linear layer) on the frozen encoder's CLS vector is trained on train, its epoch chosen by validation
accuracy, and scored on test: overall, per length, per position, per length x position.

Every accuracy comes with its count and a 95% Wilson interval (`needle_stats`): `{"accuracy", "n",
"ci": [low, high]}`. `chance` is 1 / the number of answer classes (present, absent: 0.5). When the
validation accuracy's lower bound is not above chance, the probe did not learn the task and its test
numbers describe noise: `beats_chance_on_validation` is false, a WARNING line is printed and the
figure says so. The validation accuracy is the selected epoch's, the best of all epochs, so it is
optimistic: the check can pass a probe that did not learn, never the other way round.

The encoder is frozen and in eval mode (no dropout), so its CLS vectors are computed once and
cached: training the probe on them is exactly training it on top of the frozen encoder, only
faster. Both presets do this. The paper's probe setting (3 epochs, lr 2e-5, batch 4) is the `paper`
preset; the `small` preset (150 pairs, lengths 128-512, for CPUs) trains the probe longer and with a
higher learning rate (30 epochs, lr 1e-3, batch 8), because 105 training pairs x 3 epochs at 2e-5
barely move a freshly initialised probe. Haystacks: a corpus file (`.jsonl` with a "text" field, or
plain text with one document a line) or `synthetic` (the embedded SYNTHETIC corpus,
`detour.data.synthetic`; say so when reporting). Writes OUT/needle.json and OUT/needle.png.
"""

from __future__ import annotations

import inspect
import json
import random
import time
from importlib import resources
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from detour.errors import DetourError
from detour.flags import positive_float, positive_int
from detour.io import atomic_write, ensure_output_dir
from detour.analysis.needle_haystack import Haystacks, Pair, make_pairs, read_haystack
from detour.analysis.needle_stats import accuracy_cell, beats_chance, chance_level, fmt
from detour.analysis.needle_templates import TEMPLATES

POSITIONS = ("start", "middle", "end")
N_CLASSES = 2  # the query fact is in the haystack, or it is not


class Preset(BaseModel):
    """A needle preset (src/detour/eval/presets/needle-*.yaml); CLI flags override its fields."""

    model_config = ConfigDict(extra="forbid")
    lengths: list[int]
    pairs: int
    positions: list[str] = list(POSITIONS)
    split: tuple[float, float, float] = (0.7, 0.15, 0.15)
    epochs: int
    lr: float
    batch_size: int
    dropout: float = 0.1
    encode_batch: int = 8
    synthetic_docs: int = 300


def load_preset(name_or_path: str) -> Preset:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise DetourError(f"--preset {path}: no such file")
        text = path.read_text(encoding="utf-8")
    else:
        res = resources.files("detour.analysis") / "presets" / f"needle-{name_or_path}.yaml"
        if not res.is_file():
            raise DetourError(f"--preset {name_or_path!r}: no shipped preset of that name (small, paper) and not a .yaml file")
        path, text = Path(str(res)), res.read_text(encoding="utf-8")
    try:
        return Preset(**(yaml.safe_load(text) or {}))
    except ValidationError as exc:
        raise DetourError(f"{path}: {exc}") from exc


# ---- frozen features and the probe ----

def cls_features(model, pairs: list[Pair], batch_size: int, device) -> np.ndarray:
    """CLS vectors of the frozen encoder (last hidden state, position 0), padded per batch."""
    import torch

    pad_id = model.config.pad_token_id or 0
    feats = np.zeros((len(pairs), model.config.hidden_size), dtype=np.float32)
    order = sorted(range(len(pairs)), key=lambda k: len(pairs[k].input_ids))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    with torch.inference_mode(), autocast:
        for b in range(0, len(order), batch_size):
            idx = order[b: b + batch_size]
            width = max(len(pairs[k].input_ids) for k in idx)
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            types = torch.zeros((len(idx), width), dtype=torch.long)
            for r, k in enumerate(idx):
                n = len(pairs[k].input_ids)
                ids[r, :n] = torch.tensor(pairs[k].input_ids)
                mask[r, :n] = 1
                if pairs[k].token_type_ids is not None:
                    types[r, :n] = torch.tensor(pairs[k].token_type_ids)
            kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
            if pairs[0].token_type_ids is not None and "token_type_ids" in inspect.signature(model.forward).parameters:
                kwargs["token_type_ids"] = types.to(device)
            out = model(**kwargs)
            feats[idx] = out.last_hidden_state[:, 0].float().cpu().numpy()
    return feats


def make_probe(hidden: int, dropout: float, linear: bool):
    from torch import nn

    if linear:
        return nn.Linear(hidden, 2)
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, 2))


def train_probe(x: np.ndarray, y: np.ndarray, splits: dict, preset: Preset, linear: bool, seed: int):
    """Train on the train split; keep the epoch with the best validation accuracy; predict every pair."""
    import torch

    torch.manual_seed(seed)
    probe = make_probe(x.shape[1], preset.dropout, linear)
    opt = torch.optim.AdamW(probe.parameters(), lr=preset.lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    gen = torch.Generator().manual_seed(seed)
    train, val = torch.tensor(splits["train"]), torch.tensor(splits["val"])
    best = (-1.0, 0, None)
    history = []
    for epoch in range(1, preset.epochs + 1):
        probe.train()
        for b in train[torch.randperm(len(train), generator=gen)].split(preset.batch_size):
            loss = torch.nn.functional.cross_entropy(probe(xt[b]), yt[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        probe.eval()
        with torch.no_grad():
            val_acc = float((probe(xt[val]).argmax(-1) == yt[val]).float().mean()) if len(val) else 0.0
        history.append(val_acc)
        if val_acc > best[0]:
            best = (val_acc, epoch, {k: v.clone() for k, v in probe.state_dict().items()})
    probe.load_state_dict(best[2])
    probe.eval()
    with torch.no_grad():
        pred = probe(xt).argmax(-1).numpy()
    return pred, best[1], best[0], history


def split_indices(n: int, fractions, seed: int) -> dict[str, list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_train, n_val = round(fractions[0] * n), round(fractions[1] * n)
    return {"train": order[:n_train], "val": order[n_train: n_train + n_val], "test": order[n_train + n_val:]}


def accuracy_table(pairs: list[Pair], pred: np.ndarray, idx: list[int]) -> dict:
    """Accuracy overall, per length, per position and per length x position, with counts and 95% intervals."""
    def acc(sel):
        return accuracy_cell([pred[k] == pairs[k].fact.label for k in sel])

    lengths = sorted({p.length for p in pairs})
    positions = [p for p in POSITIONS if any(q.position == p for q in pairs)]
    return {
        "overall": acc(idx),
        "per_length": {str(n): acc([k for k in idx if pairs[k].length == n]) for n in lengths},
        "per_position": {p: acc([k for k in idx if pairs[k].position == p]) for p in positions},
        "per_length_position": {str(n): {p: acc([k for k in idx if pairs[k].length == n and pairs[k].position == p])
                                         for p in positions} for n in lengths},
    }


# ---- outputs ----

def _series(ax, xs: list[float], cells: list[dict], **style) -> None:
    """Accuracies with their 95% intervals as error bars (an empty cell is a gap)."""
    ys = np.array([np.nan if c["accuracy"] is None else c["accuracy"] for c in cells])
    lo = np.array([np.nan if c.get("ci") is None else c["ci"][0] for c in cells])
    hi = np.array([np.nan if c.get("ci") is None else c["ci"][1] for c in cells])
    ax.errorbar(xs, ys, yerr=np.clip(np.nan_to_num(np.vstack([ys - lo, hi - ys])), 0, None), capsize=3, **style)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    test = result["test"]
    lengths = [int(n) for n in test["per_length"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    positions = list(test["per_position"])
    for i, pos in enumerate(positions):
        # positions side by side around each length, so their error bars do not hide each other
        shift = 2 ** (0.05 * (i - (len(positions) - 1) / 2))
        _series(ax, [n * shift for n in lengths], [test["per_length_position"][str(n)][pos] for n in lengths],
                marker="o", lw=1, label=pos)
    _series(ax, lengths, [test["per_length"][str(n)] for n in lengths], color="k", ls="--", marker="s", label="all")
    ax.axhline(result["chance"], color="grey", lw=1, ls=":", label=f"chance ({result['chance']:g})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_ylim(0, 1)
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("test accuracy (95% Wilson intervals)")
    from detour.eval.results import display_name

    ax.set_title(f"needle probe: {display_name(str(result['config']['model']).rstrip('/'))} ({result['config']['lang']}), "
                 f"overall {fmt(test['overall'])}", fontsize=9)
    if not result["beats_chance_on_validation"]:
        fig.suptitle("WARNING: the probe did not beat chance on validation", color="red", fontsize=9, weight="bold")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def needle(model_path: str, preset: Preset, lang: str, haystack: str, out: Path, seed: int = 0,
           linear: bool = False, device: str | None = None) -> dict:
    if lang not in TEMPLATES:
        raise DetourError(f"--lang {lang!r}: choose from {', '.join(TEMPLATES)}")
    bad = [p for p in preset.positions if p not in POSITIONS]
    if bad or not preset.lengths or preset.pairs < 2 * len(preset.lengths) * len(preset.positions):
        raise DetourError(f"preset: positions must be among {POSITIONS} and pairs at least 2 per length x position cell")
    out = ensure_output_dir(out)  # a file or read-only --out fails now, not after the encoder ran
    import torch

    from detour.data.tokenize import load_tokenizer
    from detour.model.load import load_encoder

    t0 = time.time()
    tokenizer = load_tokenizer(model_path)
    model, _ = load_encoder(model_path)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and max(preset.lengths) > max_pos:
        raise DetourError(f"--lengths: {max(preset.lengths)} exceeds the model's max_position_embeddings ({max_pos})")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev).eval().requires_grad_(False)

    docs = read_haystack(haystack, lang, preset.synthetic_docs, seed)
    pairs = make_pairs(preset.pairs, preset.lengths, preset.positions, lang, Haystacks(docs, tokenizer), seed)
    t_pairs = time.time()
    print(f"{len(pairs)} query/haystack pairs built ({t_pairs - t0:.1f} s); encoding them with the frozen encoder", flush=True)
    feats, encode_s = None, {}
    for n in sorted(set(preset.lengths)):  # one length at a time, so a long run shows its progress
        idx = [k for k, p in enumerate(pairs) if p.length == n]
        t = time.time()
        part = cls_features(model, [pairs[k] for k in idx], preset.encode_batch, dev)
        feats = np.zeros((len(pairs), part.shape[1]), dtype=np.float32) if feats is None else feats
        feats[idx] = part
        encode_s[str(n)] = round(time.time() - t, 2)
        print(f"length {n}: {len(idx)} pairs encoded ({encode_s[str(n)]:.1f} s)", flush=True)
    t_feats = time.time()
    labels = np.array([p.fact.label for p in pairs])
    splits = split_indices(len(pairs), preset.split, seed)
    pred, epoch, val_acc, history = train_probe(feats, labels, splits, preset, linear, seed)
    validation = accuracy_cell([pred[k] == labels[k] for k in splits["val"]])
    chance = chance_level(N_CLASSES)
    result = {
        "schema": "detour.needle/1",
        "config": {"model": str(model_path), "lang": lang, "haystack": haystack, "seed": seed,
                   "probe": "linear" if linear else "mlp", **preset.model_dump(), "device": str(dev),
                   "features": "frozen CLS vectors (eval mode) computed once and cached"},
        "counts": {k: len(v) for k, v in splits.items()},
        "pairs_per_length": {str(n): sum(p.length == n for p in pairs) for n in sorted(set(preset.lengths))},
        "n_classes": N_CLASSES, "chance": chance,
        "selected_epoch": epoch, "val_accuracy": val_acc, "val_history": history,
        "validation": validation,
        "beats_chance_on_validation": beats_chance(validation, chance),
        "test": accuracy_table(pairs, pred, splits["test"]),
        "train": {"overall": accuracy_table(pairs, pred, splits["train"])["overall"]},
        "timings": {"pairs_s": round(t_pairs - t0, 2), "encode_s": round(t_feats - t_pairs, 2),
                    "encode_s_per_length": encode_s, "probe_s": round(time.time() - t_feats, 2)},
    }
    plot(result, out / "needle.png")
    atomic_write(out / "needle.json", lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2), encoding="utf-8"))
    return result


def add_arguments(parser) -> None:
    parser.add_argument("model", help="encoder folder or Hugging Face name (tokenizer and model)")
    parser.add_argument("--preset", default="small", help="small (CPU), paper (GPU), or a preset .yaml file")
    parser.add_argument("--lang", default="en", choices=sorted(TEMPLATES), help="language of the facts")
    parser.add_argument("--lengths", help="comma-separated input lengths in tokens (overrides the preset)")
    parser.add_argument("--pairs", type=positive_int, help="number of query/haystack pairs (overrides the preset)")
    parser.add_argument("--haystack", default="synthetic",
                        help="corpus file (.jsonl with 'text', or one document a line) or 'synthetic' (default)")
    parser.add_argument("--out", type=Path, default=Path("runs/needle"), help="output folder (default runs/needle)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--linear", action="store_true", help="linear probe instead of the 2-layer MLP")
    parser.add_argument("--epochs", type=positive_int, help="probe epochs (overrides the preset)")
    parser.add_argument("--lr", type=positive_float, help="probe learning rate (overrides the preset)")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")


def run(args) -> int:
    preset = load_preset(args.preset)
    overrides = {"pairs": args.pairs, "epochs": args.epochs, "lr": args.lr}
    if args.lengths:
        try:
            overrides["lengths"] = [int(x) for x in args.lengths.split(",") if x.strip()]
        except ValueError as exc:
            raise DetourError(f"--lengths {args.lengths!r}: expected comma-separated integers") from exc
    preset = preset.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    from detour.paths import resolve_model_ref

    result = needle(resolve_model_ref(args.model), preset, args.lang, args.haystack, args.out, args.seed, args.linear, args.device)
    test = result["test"]
    print(f"needle probe ({result['config']['probe']}, {args.lang}, haystack {args.haystack}): "
          f"test accuracy {fmt(test['overall'])} on {test['overall']['n']} pairs; validation {fmt(result['validation'])} "
          f"on {result['validation']['n']} (epoch {result['selected_epoch']}); chance {result['chance']:g}; 95% Wilson intervals",
          flush=True)
    for n, row in test["per_length"].items():
        cells = "  ".join(f"{p} {v['accuracy']:.2f}" if v["accuracy"] is not None else f"{p} -"
                          for p, v in test["per_length_position"][n].items())
        print(f"length {n}: {result['pairs_per_length'][n]} pairs, test accuracy {fmt(row)} on {row['n']} ({cells}) "
              f"(encoded in {result['timings']['encode_s_per_length'].get(n, 0):.1f} s)", flush=True)
    if not result["beats_chance_on_validation"]:
        val = result["validation"]
        low = "none" if val["ci"] is None else f"{val['ci'][0]:.3f}"
        print(f"WARNING: the probe did not beat chance on validation (accuracy {fmt(val)} on {val['n']} pairs, "
              f"lower bound {low} <= chance {result['chance']:g}): its test accuracies are no evidence that the encoder "
              "finds the needle (more --pairs narrow the intervals; more --epochs train the probe longer)", flush=True)
    print(f"wrote {args.out / 'needle.json'} and {args.out / 'needle.png'}")
    return 0
