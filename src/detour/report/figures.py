"""The report's figures, drawn with matplotlib (Agg, no pyplot state) from the study's own numbers.

    python -c "from detour.report.collect import collect; from detour.report.figures import curves; \
curves(collect('runs/study')).savefig('curves.png')"

Each function returns a Figure, or None when the study has nothing for it. The captions live in
the markdown (detour.report.sections): a figure's title says what is plotted, not what it means.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from detour.report.collect import Study, arm_of
from detour.report.tables import ResultsTable

ROLE_COLOURS = {"detour": "C3", "baseline": "C0"}


def arm_colours(s: Study) -> dict[str, str]:
    """The detour red and the baseline blue in every figure; other arms take the remaining colours."""
    free = iter(c for c in (f"C{i}" for i in range(10)) if c not in ROLE_COLOURS.values())
    out = {}
    for arm in s.arms.values():
        out[arm.name] = ROLE_COLOURS.get(arm.role) if arm.role in ROLE_COLOURS and arm.name == s.role(arm.role) \
            else next(free, "grey")
    return out


def _short(tokens: float) -> str:
    for size, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(tokens) >= size:
            return f"{tokens / size:.3g}{suffix}"
    return f"{tokens:.0f}"


def _phase_spans(metrics: list[dict]) -> list[tuple[str, str, float, float]]:
    """(phase, objective, start, end) along one token axis, each phase starting where the last ended."""
    spans, offset, seen = [], 0.0, {}
    for r in metrics:
        seen.setdefault(r["phase"], []).append(r)
    for name, rows in seen.items():
        end = offset + rows[-1]["tokens"]
        spans.append((name, rows[0].get("objective", "?"), offset, end))
        offset = end
    return spans


def _arm_style(arm, colours: dict[str, str], **extra) -> dict:
    # Extra arms dashed and beneath: an arm that tracks the detour must not hide it.
    return {"color": colours[arm.name], "ls": "-" if arm.role in ROLE_COLOURS else "--",
            "zorder": 3 if arm.role in ROLE_COLOURS else 2, **extra}


def _shade_phases(reference, top, *below, boundaries: bool = False) -> None:
    """The reference arm's phases shaded on every axis (alternating greys), named on the top one."""
    for i, (name, objective, start, end) in enumerate(_phase_spans(reference.metrics)):
        for ax in (top, *below):
            ax.axvspan(start, end, color="grey", alpha=0.08 if i % 2 == 0 else 0.18, lw=0)
            if boundaries:  # points at a phase end sit on this line
                ax.axvline(end, color="grey", lw=0.6, ls=":")
        top.annotate(f"{name} ({reference.name}: {objective})", (start, 1), xycoords=("data", "axes fraction"),
                     xytext=(4, -12), textcoords="offset points", fontsize=8, color="dimgrey")


def curves(s: Study) -> Figure | None:
    """Loss (top) and learning rate (bottom) per step against tokens, every arm, phases shaded."""
    arms = [a for a in s.arms.values() if a.metrics]
    if not arms:
        return None
    colours = arm_colours(s)
    fig = Figure(figsize=(9, 6))
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    for arm in arms:
        starts = {name: start for name, _, start, _ in _phase_spans(arm.metrics)}
        x = [starts[r["phase"]] + r["tokens"] for r in arm.metrics]
        style = _arm_style(arm, colours)
        loss_ax.plot(x, [r["loss"] for r in arm.metrics], lw=1.1, label=arm.name, **style)
        lr_ax.plot(x, [r.get("lr", math.nan) for r in arm.metrics], lw=1.0, **style)
    _shade_phases(next((a for a in arms if a.role == "detour"), arms[0]), loss_ax, lr_ax)
    loss_ax.set_ylabel("training loss")
    loss_ax.legend(fontsize=8, loc="lower left")
    loss_ax.set_title("loss and learning rate per optimizer step (CLM and MLM losses are not on one scale)", fontsize=9)
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("tokens (phases one after another)")
    lr_ax.xaxis.set_major_formatter(lambda v, _: _short(v) if v >= 0 else "")
    fig.tight_layout()
    return fig


def validation(s: Study) -> Figure | None:
    """Held-out MLM loss (top) and masked-token accuracy (bottom) at each evaluation point, every arm,
    against the run's tokens, the detour's phases shaded as in the training curves."""
    arms = [a for a in s.arms.values() if a.validation]
    if not arms:
        return None
    colours = arm_colours(s)
    fig = Figure(figsize=(9, 5))
    loss_ax, acc_ax = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    for arm in arms:
        x = [r["run_tokens"] for r in arm.validation]
        style = _arm_style(arm, colours, marker="o", ms=3)
        loss_ax.plot(x, [r["mlm_loss"] for r in arm.validation], lw=1.1, label=arm.name, **style)
        acc_ax.plot(x, [r["mlm_accuracy"] for r in arm.validation], lw=1.0, **style)
    reference = next((a for a in arms if a.role == "detour" and a.metrics), None) or next((a for a in arms if a.metrics), None)
    if reference is not None:
        _shade_phases(reference, loss_ax, acc_ax, boundaries=True)
    loss_ax.set_ylabel("held-out MLM loss")
    loss_ax.legend(fontsize=8, loc="lower left")
    loss_ax.set_title("held-out MLM loss through the training (the same sequences and masks at every point)",
                      fontsize=9)
    acc_ax.set_ylabel("masked-token accuracy")
    acc_ax.set_xlabel("tokens of the run (phases one after another)")
    acc_ax.xaxis.set_major_formatter(lambda v, _: _short(v) if v >= 0 else "")
    fig.tight_layout()
    return fig


def results(s: Study, table: ResultsTable | None) -> Figure | None:
    """Headline metric x 100 per task (and the average), one bar per arm, error bars one std over seeds."""
    if table is None:
        return None
    colours = arm_colours(s)
    columns = table.tasks + (["average"] if table.average and len(table.tasks) > 1 else [])
    width = 0.8 / len(table.arms)
    fig = Figure(figsize=(max(6.0, 1.5 * len(columns) + 2.5), 4.2))
    ax = fig.subplots()
    for i, arm in enumerate(table.arms):
        x = [j + (i - (len(table.arms) - 1) / 2) * width for j in range(len(columns))]
        means, stds = [], []
        for c in columns:
            cell = table.cells.get((arm, c))
            means.append(100 * (cell.mean if cell else table.average.get(arm, math.nan) if c == "average" else math.nan))
            stds.append(100 * cell.std if cell else 0.0)
        ax.bar(x, means, width, yerr=stds, capsize=3, color=colours.get(arm, "grey"), label=arm)
    ax.set_xticks(range(len(columns)), [f"{c}\n({table.headline[c]})" if c in table.headline else c for c in columns])
    ax.set_ylabel("headline metric x 100")
    ax.set_title("downstream results: mean ± std over fine-tuning seeds", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _pair_label(s: Study, config: dict, a: str = "model_a", b: str = "model_b") -> str:
    return f"{arm_of(config.get(a, '?'), s.arms)} vs {arm_of(config.get(b, '?'), s.arms)}"


def cka(s: Study) -> Figure | None:
    """Per layer: divergence 1 - CKA for each comparison with its noise floor (left), the ratio r (right)."""
    if not s.cka:
        return None
    fig = Figure(figsize=(10, 4.2))
    d_ax, r_ax = fig.subplots(1, 2)
    names, all_ratios, floors = [], [], set()
    for i, (name, data) in enumerate(s.cka.items()):
        rows, cfg = data["layers"], data.get("config") or {}
        x = [r["hidden_state"] for r in rows]
        names = [str(r["layer"]) for r in rows]
        label = _pair_label(s, cfg)
        d_ax.errorbar(x, [r["divergence"] for r in rows], yerr=[r.get("cka_std", 0.0) for r in rows],
                      color=f"C{i}", marker="o", capsize=3, label=f"d({label})")
        if any("noise_divergence" in r for r in rows):
            floor = _pair_label(s, cfg, "noise_floor", "model_b")
            if floor not in floors:  # comparisons against one baseline share its floor: draw it once
                floors.add(floor)
                d_ax.plot(x, [r.get("noise_divergence", math.nan) for r in rows], color="grey", ls="--", marker="o",
                          mfc="none", label=f"noise floor d({floor})")
            ratios = [r.get("seed_noise_ratio") for r in rows]
            all_ratios += [v for v in ratios if v is not None]
            r_ax.plot(x, [math.nan if v is None else v for v in ratios], color=f"C{i}", marker="o", label=label)
    r_ax.axhline(1.0, color="black", lw=0.8, ls=":")
    d_ax.set_ylabel("divergence 1 - linear CKA")
    r_ax.set_ylabel("r = d(A, B) / d(noise floor, B)")
    if all_ratios and min(all_ratios) > 0:  # ratios span orders of magnitude in the paper (5 to 44)
        r_ax.set_yscale("log")
        r_ax.yaxis.set_major_formatter(ScalarFormatter())
        r_ax.yaxis.set_minor_formatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else "")
    for ax in (d_ax, r_ax):
        ax.set_xticks(range(len(names)), names)
        ax.set_xlabel("layer (emb = embeddings; l = output of transformer layer l, from 0)")
        ax.legend(fontsize=7)
    d_ax.set_title("per-layer divergence, mean ± std over text seeds", fontsize=9)
    r_ax.set_title("seed-noise ratio r per layer (1 = within seed noise)", fontsize=9)
    fig.tight_layout()
    return fig


def trajectory(s: Study) -> Figure | None:
    """Divergence per layer group against tokens into the phase; the noise floor dashed grey."""
    data = s.trajectory
    if not data:
        return None
    points = data["points"]
    x = [p["tokens"] for p in points]
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    for i, group in enumerate(("low", "mid", "late", "all")):
        rows = [p["groups"].get(group) for p in points]
        if not all(rows):
            continue
        ax.errorbar(x, [r["divergence"] for r in rows], yerr=[r.get("divergence_std", 0.0) for r in rows],
                    color=f"C{i}", marker="o", capsize=3, label=f"{group}: detour vs baseline" if i == 0 else group)
        if all("noise_divergence" in r for r in rows):
            ax.plot(x, [r["noise_divergence"] for r in rows], color="grey", ls="--", marker="o", mfc="none",
                    label="noise floor (second-seed baseline vs baseline)" if i == 0 else None)
    ax.set_xlabel(f"tokens into the {data['config'].get('phase', '?')} phase")
    ax.xaxis.set_major_formatter(lambda v, _: _short(v) if v >= 0 else "")
    ax.set_ylabel("divergence 1 - linear CKA (group mean)")
    ax.set_title("divergence through the phase, mean ± std over text seeds", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: the lines are flat
    fig.tight_layout()
    return fig


def transplant(s: Study) -> Figure | None:
    """Recovery of the A-B gap per transplanted block, per task (and averaged), error bars std over seeds."""
    data = s.transplant
    if not data:
        return None
    blocks = data["config"]["blocks"]
    series = [(t["task"] + (" (gap within noise)" if t.get("gap_within_noise") else ""), t["blocks"]) for t in data["tasks"]]
    if len(series) > 1:
        series.append(("average over tasks", data["average"]["blocks"]))
    width = 0.8 / len(series)
    fig = Figure(figsize=(max(6.0, 1.0 * len(blocks) + 2), 4.2))
    ax = fig.subplots()
    for i, (label, rows) in enumerate(series):
        x = [j + (i - (len(series) - 1) / 2) * width for j in range(len(blocks))]
        means = [rows[b].get("recovery_mean") for b in blocks]
        stds = [rows[b].get("recovery_std") for b in blocks]
        ax.bar(x, [math.nan if m is None else m for m in means], width,
               yerr=[0.0 if v is None else v for v in stds], capsize=3, label=label, color=f"C{i}")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_xlabel("block copied from the detour into the baseline")
    ax.set_ylabel("recovery (0 = baseline, 1 = detour)")
    ax.set_title("transplants scored by linear probing: mean ± std over probe seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def drift(s: Study) -> Figure | None:
    """Relative weight change per layer group and overall, one bar per drift comparison."""
    if not s.drift:
        return None
    groups = list(dict.fromkeys(g["name"] for d in s.drift.values() for g in d.get("groups") or [])) + ["total"]
    width = 0.8 / len(s.drift)
    fig = Figure(figsize=(max(6.0, 1.3 * len(groups) + 2), 4.0))
    ax = fig.subplots()
    colours = arm_colours(s)
    for i, (name, data) in enumerate(s.drift.items()):
        totals = {g["name"]: g["total"] for g in data.get("groups") or []}
        totals["total"] = data.get("total")
        x = [j + (i - (len(s.drift) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(x, [math.nan if totals.get(g) is None else totals[g] for g in groups], width,
               color=colours.get(name, f"C{i}"), label=_pair_label(s, data.get("config") or {}))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("||W_A - W_B|| / ||W_B||")
    ax.set_title("relative weight change per layer group (A vs B)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def ci_of(cell: dict) -> tuple[float, float] | None:
    """A confidence interval of a needle cell, when the JSON carries one."""
    if isinstance(cell.get("ci"), (list, tuple)) and len(cell["ci"]) == 2:
        return float(cell["ci"][0]), float(cell["ci"][1])
    if cell.get("ci_low") is not None and cell.get("ci_high") is not None:
        return float(cell["ci_low"]), float(cell["ci_high"])
    return None


def needle(s: Study) -> Figure | None:
    """Test accuracy by input length (left) and by needle position (right), one series per arm."""
    if not s.needle:
        return None
    colours = arm_colours(s)
    fig = Figure(figsize=(10, 4.0))
    len_ax, pos_ax = fig.subplots(1, 2)
    positions = list(dict.fromkeys(p for d in s.needle.values() for p in d["test"]["per_position"]))
    width = 0.8 / len(s.needle)
    for i, (arm, data) in enumerate(s.needle.items()):
        test = data["test"]
        lengths = [int(n) for n in test["per_length"]]
        cells = [test["per_length"][str(n)] for n in lengths]
        y = [math.nan if c["accuracy"] is None else c["accuracy"] for c in cells]
        cis = [ci_of(c) for c in cells]
        err = None if not all(cis) else np.array([[yy - lo, hi - yy] for yy, (lo, hi) in zip(y, cis)]).T
        len_ax.errorbar(lengths, y, yerr=err, marker="o", capsize=3, color=colours.get(arm, f"C{i}"), label=arm)
        x = [j + (i - (len(s.needle) - 1) / 2) * width for j in range(len(positions))]
        pcells = [test["per_position"].get(p) or {"accuracy": None} for p in positions]
        py = [math.nan if c["accuracy"] is None else c["accuracy"] for c in pcells]
        pcis = [ci_of(c) for c in pcells]
        perr = None if not all(pcis) else np.array([[yy - lo, hi - yy] for yy, (lo, hi) in zip(py, pcis)]).T
        pos_ax.bar(x, py, width, yerr=perr, capsize=3, color=colours.get(arm, f"C{i}"), label=arm)
    for ax in (len_ax, pos_ax):
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_ylim(0, 1)
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=8)
    len_ax.set_xscale("log", base=2)
    all_lengths = sorted({int(n) for d in s.needle.values() for n in d["test"]["per_length"]})
    len_ax.set_xticks(all_lengths, [str(n) for n in all_lengths])
    len_ax.set_xlabel("input length (tokens)")
    len_ax.set_title("needle probe accuracy by length (0.5 = chance)", fontsize=9)
    pos_ax.set_xticks(range(len(positions)), positions)
    pos_ax.set_xlabel("needle position")
    pos_ax.set_title("by position", fontsize=9)
    fig.tight_layout()
    return fig


ALL = {"curves": curves, "cka": cka, "trajectory": trajectory, "transplant": transplant, "drift": drift, "needle": needle}
