"""The capacity comparison: what the paper says scales with model size, per size of a study.

    detour report runs/capacity     # a folder written by `detour study` of a study file with `sizes:`

For each size (OUT/sizes/NAME/, an ordinary study folder) it reads what that study's own report
reads, and puts side by side: the parameters (all, and without the token embeddings), the base's
held-out MLM loss at the end of its pretraining, its curve and how flat it had become (the slope
over the last third of its constant-rate phase), the detour's and the twin's held-out MLM loss at
the end of the decay, their downstream average, the pooled paired difference with its
95% bootstrap interval and sign-flip p (detour.report.tables, as `detour compare` counts them), the
CKA seed-noise ratio r per layer group (low / mid / late, scaled with depth as the freeze groups
are: detour.model.freeze.layer_group_ranges), and the freeze arms' differences against the twin.

r of a group is the ratio of the group's mean divergences, d(detour, twin) / d(second-seed twin,
twin) averaged over the group's layers first: a per-layer ratio of two small divergences is noisy,
and the group's ratio weighs each layer's divergence as the paper's per-layer plot does.

Writes OUT/capacity.json, OUT/report-figures/capacity*.png, OUT/report.md and OUT/report.html
(atomically, report.html last).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from detour.errors import DetourError
from detour.io import read_json_mapping, write_json
from detour.runs import RunFolder, read_records

SCHEMA = "detour.capacity/1"
SIZES_SCHEMA = "detour.study-sizes/1"  # the study.json of a folder of sizes (detour.study.sizes writes it)
FREEZE_ARMS = {"freeze_low": "freeze-low", "freeze_mid": "freeze-mid"}  # arm-name prefixes


@dataclass
class SizeRow:
    size: str
    folder: str
    layers: int | None = None
    hidden: int | None = None
    parameters: int | None = None
    non_embedding_parameters: int | None = None
    base_tokens: int | None = None
    base_mlm_loss: float | None = None  # held-out, at the end of the base's pretraining
    base_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, held-out MLM loss)
    base_slope: float | None = None  # held-out MLM loss change per 1M tokens, last third of the first phase
    detour_mlm_loss: float | None = None  # held-out, end of the decay
    twin_mlm_loss: float | None = None
    detour_score: float | None = None  # downstream average over tasks (0-1)
    twin_score: float | None = None
    delta: float | None = None  # detour - twin, pooled over tasks x seeds
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    tasks: int = 0
    seeds: int = 0
    cka_r: dict[str, float | None] = field(default_factory=dict)  # group -> r
    cka_divergence: dict[str, float | None] = field(default_factory=dict)  # group -> mean d(detour, twin)
    freeze: dict[str, dict] = field(default_factory=dict)  # freeze_low / freeze_mid -> {arm, delta, ci, p}
    missing: list[str] = field(default_factory=list)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _parameters(model_dir: Path) -> tuple[int, int, int, int] | None:
    """(all parameters, token embeddings, layers, hidden) of an exported model, built on the meta
    device from its config alone (no weights read)."""
    if not (model_dir / "config.json").is_file():
        return None
    import torch
    from transformers import AutoModelForMaskedLM

    from detour.model.load import load_config

    _, config = load_config(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForMaskedLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    return params, config.vocab_size * config.hidden_size, int(config.num_hidden_layers), int(config.hidden_size)


def base_slope(points: list[dict]) -> float | None:
    """How flat the base had become: the least-squares slope of its held-out MLM loss per 1M tokens over
    the last third of its first (constant-rate) phase, where an anneal cannot be mistaken for
    convergence. None with fewer than two points there."""
    first = next((r.get("phase") for r in points if "mlm_loss" in r), None)
    xs_ys = [(float(r["run_tokens"]), float(r["mlm_loss"])) for r in points
             if "mlm_loss" in r and r.get("phase") == first]
    if not xs_ys:
        return None
    start = xs_ys[0][0] + 2 * (xs_ys[-1][0] - xs_ys[0][0]) / 3
    tail = [(x, y) for x, y in xs_ys if x >= start]  # never empty: the last point is in it
    mx, my = sum(x for x, _ in tail) / len(tail), sum(y for _, y in tail) / len(tail)
    sxx = sum((x - mx) ** 2 for x, _ in tail)
    return 1e6 * sum((x - mx) * (y - my) for x, y in tail) / sxx if sxx else None


def _validation(folder: Path) -> list[dict]:
    path = RunFolder(folder).metrics
    return [r for r in read_records(path) if r.get("kind") == "validation"] if path.is_file() else []


def size_row(size: str, folder: Path) -> SizeRow:
    from detour.model.freeze import layer_group_ranges
    from detour.analysis.layers import read_cka_layers
    from detour.report.collect import collect
    from detour.report.sections import validation_points
    from detour.report.tables import results_table, significance_rows

    row = SizeRow(size, str(folder))
    counted = _parameters(folder / "base" / "model")
    if counted is None:
        row.missing.append("the base model")
    else:
        row.parameters, embeddings, row.layers, row.hidden = counted
        row.non_embedding_parameters = row.parameters - embeddings
    base_points = _validation(folder / "base")
    row.base_curve = [(int(r["run_tokens"]), float(r["mlm_loss"])) for r in base_points if "mlm_loss" in r]
    if row.base_curve:
        row.base_tokens, row.base_mlm_loss = row.base_curve[-1]
        row.base_slope = base_slope(base_points)
    else:
        row.missing.append("the base's held-out loss")
    if not (folder / "study.json").is_file():
        row.missing.append("the study")
        return row
    s = collect(folder)
    for name, target in (("detour", "detour_mlm_loss"), ("baseline", "twin_mlm_loss")):
        arm = s.arms.get(name)
        points = validation_points(arm) if arm is not None else []
        if points:
            setattr(row, target, float(points[-1][1]["mlm_loss"]))
    table = results_table(s)
    if table is None:
        row.missing.append("the evaluation")
    else:
        row.detour_score, row.twin_score = table.average.get("detour"), table.average.get("baseline")
        for sig in significance_rows(s, table):
            if sig.against != "baseline":
                continue
            if sig.arm == "detour":
                row.delta, row.ci, row.p_value = sig.delta, sig.ci, sig.p_value
                row.tasks, row.seeds = len(sig.tasks), max(sig.seeds.values(), default=0)
            for key, prefix in FREEZE_ARMS.items():
                if sig.arm.startswith(prefix):
                    row.freeze[key] = {"arm": sig.arm, "delta": sig.delta, "ci": sig.ci, "p": sig.p_value}
    cka = s.cka.get("cka")
    if cka is None or row.layers is None:
        row.missing.append("CKA")
    else:
        layers = {r["layer"]: r for r in read_cka_layers(cka) if isinstance(r.get("layer"), int)}
        for group, members in layer_group_ranges(row.layers).items():
            d = _mean([layers[i].get("divergence") for i in members if i in layers])
            floor = _mean([layers[i].get("noise_divergence") for i in members if i in layers])
            row.cka_divergence[group] = d
            row.cka_r[group] = d / floor if d is not None and floor else None
    return row


def capacity_rows(out: Path) -> list[SizeRow]:
    meta = read_json_mapping(Path(out) / "study.json")
    sizes = meta.get("sizes")
    if not isinstance(sizes, dict) or not sizes:
        raise DetourError(f"{Path(out) / 'study.json'}: no 'sizes' in it (written by `detour study` of a study "
                          "file with sizes:)")
    rows = [size_row(size, Path(out) / rel) for size, rel in sizes.items()]
    return sorted(rows, key=lambda r: (r.non_embedding_parameters is None, r.non_embedding_parameters or 0))


# ---- the page ----

def _m(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:.2f}M"


def _f(value, digits=3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pts(value) -> str:
    return "–" if value is None else f"{100 * value:+.2f}"


def _ci(ci) -> str:
    return "–" if not ci else f"[{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"


def _p(p) -> str:
    return "–" if p is None else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")


def _freeze(cell: dict | None) -> str:
    if not cell or cell.get("delta") is None:
        return "–"
    return f"{_pts(cell['delta'])} (p {_p(cell.get('p'))})"


def table_rows(rows: list[SizeRow]) -> tuple[list[str], list[list[str]]]:
    header = ["size", "layers x hidden", "parameters (non-embedding)", "base held-out MLM loss",
              "base loss change per 1M tokens, end of constant rate",
              "detour / twin held-out MLM loss, decay end", "downstream detour / twin", "delta [95% CI]", "p",
              "CKA r low / mid / late", "freeze-low delta", "freeze-mid delta"]
    body = []
    for r in rows:
        score = "–" if r.detour_score is None else f"{100 * r.detour_score:.2f} / {100 * (r.twin_score or 0):.2f}"
        body.append([r.size, f"{r.layers} x {r.hidden}" if r.layers else "–",
                     f"{_m(r.parameters)} ({_m(r.non_embedding_parameters)})", _f(r.base_mlm_loss),
                     "–" if r.base_slope is None else f"{r.base_slope:+.3f}",
                     f"{_f(r.detour_mlm_loss)} / {_f(r.twin_mlm_loss)}", score, f"{_pts(r.delta)} {_ci(r.ci)}",
                     _p(r.p_value), " / ".join(_f(r.cka_r.get(g), 2) for g in ("low", "mid", "late")),
                     _freeze(r.freeze.get("freeze_low")), _freeze(r.freeze.get("freeze_mid"))])
    return header, body


def figure(rows: list[SizeRow]):
    """Four panels against non-embedding parameters: downstream delta with its CI, CKA r per group,
    the held-out MLM loss gap at the decay's end, the freeze arms' deltas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.non_embedding_parameters]
    if not rows:
        return None
    x = [r.non_embedding_parameters for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ax = axes[0]
    have = [(xi, r) for xi, r in zip(x, rows) if r.delta is not None]
    if have:
        ys = [100 * r.delta for _, r in have]
        lo = [100 * (r.delta - r.ci[0]) if r.ci else 0 for _, r in have]
        hi = [100 * (r.ci[1] - r.delta) if r.ci else 0 for _, r in have]
        ax.errorbar([xi for xi, _ in have], ys, yerr=[lo, hi], marker="o", capsize=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_title("downstream: detour − twin (points, 95% CI)")
    ax = axes[1]
    for group, style in (("low", "o-"), ("mid", "s-"), ("late", "^-")):
        pts = [(xi, r.cka_r.get(group)) for xi, r in zip(x, rows) if r.cka_r.get(group) is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=group)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_title("CKA r = d(detour, twin) / d(seed-2 twin, twin)")
    ax.legend()
    ax = axes[2]
    gap = [(xi, r.detour_mlm_loss - r.twin_mlm_loss) for xi, r in zip(x, rows)
           if r.detour_mlm_loss is not None and r.twin_mlm_loss is not None]
    if gap:
        ax.plot(*zip(*gap), "o-")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_title("held-out MLM loss, decay end: detour − twin")
    ax = axes[3]
    for key, style in (("freeze_low", "o-"), ("freeze_mid", "s-")):
        pts = [(xi, 100 * r.freeze[key]["delta"]) for xi, r in zip(x, rows)
               if r.freeze.get(key) and r.freeze[key].get("delta") is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=key.replace("_", "-") + " − twin")
    if have:
        ax.plot([xi for xi, _ in have], [100 * r.delta for _, r in have], "k--", lw=1, label="detour − twin")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_title("freeze arms: downstream − twin (points)")
    ax.legend()
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters")
    fig.tight_layout()
    return fig


def base_curves(rows: list[SizeRow]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.base_curve]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        ax.plot(*zip(*r.base_curve), marker=".", label=f"{r.size} ({_m(r.non_embedding_parameters)})")
    ax.set_xlabel("pretraining tokens")
    ax.set_ylabel("held-out MLM loss")
    ax.set_title("the bases: held-out MLM loss through pretraining")
    ax.legend()
    fig.tight_layout()
    return fig


def build_page(out: Path, rows: list[SizeRow]):
    from detour.report.page import Page

    meta = read_json_mapping(Path(out) / "study.json")
    page = Page()
    page.para(f"Capacity comparison of the study `{meta.get('name')}` in `{out}`"
              + (f": {str(meta.get('description') or '').strip().rstrip('.')}" if meta.get("description") else "")
              + ".")
    page.para("Each size is a whole study of its own, with its own report: "
              + ", ".join(f"[{r.size}]({Path(r.folder).relative_to(out)}/report.md)" for r in rows) + ".")
    header, body = table_rows(rows)
    page.heading(2, "What scales with capacity")
    page.table(header, body)
    page.para("Parameters: all of the masked LM's, and without the token embeddings (the head's decoder is "
              "tied to them). Held-out MLM loss: the fixed-mask score of each run's held-out documents (the base "
              "on its pretraining text's held-out split, the arms on theirs), at the end of the base's "
              "pretraining and of the arms' decay. Base loss change per 1M tokens: the least-squares slope of the "
              "base's held-out MLM loss over the last third of its constant-rate phase (before any anneal); a "
              "base that has flattened shows about zero. Downstream: the average over tasks of the mean over seeds of "
              "each task's headline metric (x 100); delta: detour − twin, pooled over tasks x seeds, with the "
              "paired bootstrap's 95% interval and the sign-flip p of each size's own report. CKA r: mean "
              "divergence d(detour, twin) over the group's layers over the same for the second-seed twin (the "
              "noise floor); 1 is noise. Freeze deltas: that arm − twin (points), as in each size's freeze table.")
    page.figure("capacity", figure(rows), "against non-embedding parameters (log scale): the downstream delta "
                "with its 95% interval, the CKA ratio per layer group, the held-out MLM loss gap at the decay's "
                "end, and the freeze arms' deltas beside the detour's.")
    page.figure("capacity-base", base_curves(rows), "each size's base: held-out MLM loss through its "
                "pretraining from scratch.")
    gaps = [f"{r.size}: {', '.join(r.missing)}" for r in rows if r.missing]
    page.para("Not there yet: " + ("; ".join(gaps) if gaps else "nothing (every size finished)") + ".")
    return f"detour capacity report: {meta.get('name')}", page


def write_capacity_report(out: str | Path) -> dict:
    from detour.io import atomic_write, write_text
    from detour.report.page import FIGURES_DIR
    from detour.report.render import _png, html_text, markdown_text

    out = Path(out)
    rows = capacity_rows(out)
    write_json(out / "capacity.json", {"schema": SCHEMA, "sizes": [asdict(r) for r in rows]})
    title, page = build_page(out, rows)
    images = {name: _png(fig) for name, fig in page.figures.items()}
    for name, data in images.items():
        atomic_write(out / FIGURES_DIR / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
    synthetic = [r.size for r in rows if _synthetic(Path(r.folder))]
    warning = (f"SYNTHETIC DATA in the studies of {', '.join(synthetic)}: generated text exercises the pipeline; no "
               "number of those sizes is evidence about real text.") if synthetic else None
    write_text(out / "report.md", markdown_text(title, page, warning))
    write_text(out / "report.html", html_text(title, page, warning, images))
    return {"markdown": out / "report.md", "html": out / "report.html", "json": out / "capacity.json"}


def _synthetic(folder: Path) -> bool:
    path = folder / "study.json"
    return path.is_file() and bool(json.loads(path.read_text()).get("synthetic_data"))


def is_sizes_folder(folder: str | Path) -> bool:
    path = Path(folder) / "study.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("schema") == SIZES_SCHEMA
    except (OSError, ValueError):
        return False
