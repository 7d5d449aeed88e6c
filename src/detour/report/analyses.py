"""The report's analysis sections: per-layer CKA with its noise floor, trajectory, transplants, drift, needle.

    python -c "from detour.report.collect import collect; from detour.report.page import Page; \
from detour.report.analyses import cka; p = Page(); cka(p, collect('runs/study'), ''); print(p.markdown())"

Each reads one analysis's JSON (schemas in docs/analysis.md and detour.analysis.needle) and prints
its numbers as they are, with the measurement's size (texts, seeds, examples) in the caption.
"""

from __future__ import annotations

from detour.report import figures
from detour.report.collect import Study, arm_of
from detour.report.page import Page, num, pm, tokens


def _texts(cfg: dict) -> str:
    texts = "SYNTHETIC texts (embedded generator)" if cfg.get("synthetic_texts") else f"texts from {cfg.get('texts')}"
    seeds = cfg.get("seeds") or []
    return f"{cfg.get('n')} {texts} per seed x {len(seeds)} text seed{'s' if len(seeds) != 1 else ''}, " \
           f"at most {cfg.get('max_length')} tokens each"


def cka(page: Page, s: Study, scale: str) -> None:
    if not s.cka:
        return
    page.heading(2, "5. Per-layer CKA")
    for name, data in s.cka.items():
        cfg = data.get("config") or {}
        a, b = arm_of(cfg.get("model_a", "?"), s.arms), arm_of(cfg.get("model_b", "?"), s.arms)
        floor = cfg.get("noise_floor")
        page.heading(3, f"{a} vs {b} (analysis/{name}/cka.json)")
        rows = [[r["name"], num(r["divergence"]), num(r.get("cka_std")), num(r.get("noise_divergence")),
                 num(r.get("seed_noise_ratio"), 2)] for r in data["layers"]]
        page.para(f"Divergence d = 1 - linear CKA of mean-pooled hidden states, {_texts(cfg)}; "
                  + (f"noise floor d({arm_of(floor, s.arms)}, {b}), and r = d({a}, {b}) / d({arm_of(floor, s.arms)}, {b}) "
                     f"(r about 1: within seed noise)." if floor else "no noise floor was measured, so no r."))
        page.table(["layer", f"d({a}, {b})", "std over text seeds", "noise floor d", "r"], rows)
    caption = "; ".join(f"{arm_of((d.get('config') or {}).get('model_a', '?'), s.arms)} vs "
                        f"{arm_of((d.get('config') or {}).get('model_b', '?'), s.arms)}: {_texts(d.get('config') or {})}"
                        for d in s.cka.values())
    page.figure("cka", figures.cka(s), f"per-layer divergence 1 - linear CKA with the seed-noise floor dashed (left) "
                                       f"and the ratio r (right), from cka.json ({caption}). Scale: {scale}.")


def trajectory(page: Page, s: Study, scale: str) -> None:
    data = s.trajectory
    if not data:
        return
    cfg = data.get("config") or {}
    page.heading(2, "6. Trajectory through the decay")
    groups = [g for g in ("low", "mid", "late", "all") if all(g in p["groups"] for p in data["points"])]
    noise = all("noise_divergence" in p["groups"][g] for p in data["points"] for g in groups)
    rows = []
    for p in data["points"]:
        row = [tokens(p["tokens"]), p.get("where", "")]
        for g in groups:
            cell = p["groups"][g]
            row.append(num(cell["divergence"]) + (f" / {num(cell.get('noise_divergence'))} / r {num(cell.get('seed_noise_ratio'), 2)}"
                                                  if noise else ""))
        rows.append(row)
    runs = cfg.get("runs") or {}
    who = " vs ".join(arm_of((runs.get(k) or {}).get("run", "?"), s.arms) for k in ("model_a", "model_b"))
    page.para(f"Divergence {who} at exports through the {cfg.get('phase')} phase ({tokens(cfg.get('phase_tokens'))} tokens), "
              f"per layer group ({cfg.get('groups_described', '')}), {_texts(cfg)}"
              + (f"; each cell is d(A, B) / noise floor d(C, B) / r, C = "
                 f"{arm_of(cfg.get('noise_floor') or '?', s.arms)}" if noise else "") + ". From analysis/trajectory/trajectory.json.")
    page.table(["tokens into phase", "point", *groups], rows)
    page.figure("trajectory", figures.trajectory(s),
                f"divergence per layer group against tokens into the {cfg.get('phase')} phase "
                f"({len(data['points'])} points), noise floor dashed; {_texts(cfg)}. Scale: {scale}.")


def transplant(page: Page, s: Study, scale: str) -> None:
    data = s.transplant
    if not data:
        return
    cfg = data["config"]
    page.heading(2, "7. Transplants")
    src, dst = arm_of(cfg["src"]["model"], s.arms), arm_of(cfg["dst"]["model"], s.arms)
    blocks = cfg["blocks"]
    for t in data["tasks"]:
        b = t.get("budget") or {}
        page.para(f"**{t['task']}** ({t['metric']} x 100, linear probe, {len(cfg['seeds'])} probe seeds, "
                  f"{b.get('train_examples', '?')} train / {b.get('test_examples', '?')} test examples): "
                  f"{src} {pm(t['src']['f1_mean'], t['src']['f1_std'], 2, 100)}, {dst} "
                  f"{pm(t['dst']['f1_mean'], t['dst']['f1_std'], 2, 100)}, gap {100 * t['gap']:+.2f}"
                  + (f"; **the gap is within noise** (|gap| < {100 * t['threshold']:.2f}), so every recovery below is a "
                     "ratio of noise and means nothing" if t.get("gap_within_noise") else "") + ".")
        rows = [[blk, pm(t["blocks"][blk]["f1_mean"], t["blocks"][blk]["f1_std"], 2, 100),
                 pm(t["blocks"][blk].get("recovery_mean"), t["blocks"][blk].get("recovery_std"), 3),
                 num(t["blocks"][blk].get("recovery_of_means"), 3)] for blk in blocks]
        page.table(["block", "F1 x 100", "recovery (mean ± std over seeds)", "recovery of the means"], rows)
    if len(data["tasks"]) > 1:
        avg = data["average"]["blocks"]
        page.table(["block", "recovery averaged over tasks"],
                   [[blk, pm(avg[blk].get("recovery_mean"), avg[blk].get("recovery_std"), 3)] for blk in blocks])
    page.para(f"Recovery = (F1_transplant - F1_{dst}) / (F1_{src} - F1_{dst}) per probe seed; blocks copied from {src} "
              f"into {dst} ({cfg.get('layer_groups', '')}). From analysis/transplant/transplant.json.")
    page.figure("transplant", figures.transplant(s), f"recovery of the {src}-{dst} gap per transplanted block, mean ± std "
                                                     f"over {len(cfg['seeds'])} probe seeds. Scale: {scale}.")


def drift(page: Page, s: Study, scale: str) -> None:
    if not s.drift:
        return
    page.heading(2, "8. Weight drift")
    groups = list(dict.fromkeys(g["name"] for d in s.drift.values() for g in d.get("groups") or []))
    rows = []
    for name, data in s.drift.items():
        cfg = data.get("config") or {}
        totals = {g["name"]: g["total"] for g in data.get("groups") or []}
        rows.append([f"{name}: {arm_of(cfg.get('model_a', '?'), s.arms)} vs {arm_of(cfg.get('model_b', '?'), s.arms)}",
                     *(num(totals.get(g)) for g in groups), num(data.get("total")), data.get("num_compared", "–")])
    page.para("Relative weight change ||W_A - W_B|| / ||W_B|| of the encoder body (MLM head excluded), per layer group "
              "and over every compared tensor, from analysis/drift-<arm>/drift.json.")
    page.table(["comparison", *groups, "total", "tensors compared"], rows)
    page.figure("drift", figures.drift(s), f"relative weight change per layer group. Scale: {scale}.")


def _acc(cell: dict | None) -> str:
    if not cell or cell.get("accuracy") is None:
        return "–"
    ci = figures.ci_of(cell)
    return f"{cell['accuracy']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") + f" (n {cell.get('n', '?')})"


def needle(page: Page, s: Study, scale: str) -> None:
    if not s.needle:
        return
    page.heading(2, "9. Needle in a haystack")
    lengths = sorted({int(n) for d in s.needle.values() for n in d["test"]["per_length"]})
    positions = list(dict.fromkeys(p for d in s.needle.values() for p in d["test"]["per_position"]))
    rows = []
    for arm, data in s.needle.items():
        test = data["test"]
        rows.append([arm, _acc(test["overall"]), *(_acc(test["per_length"].get(str(n))) for n in lengths),
                     *(_acc(test["per_position"].get(p)) for p in positions)])
    first = next(iter(s.needle.values()))["config"]
    haystack = "SYNTHETIC haystacks (embedded generator)" if first.get("haystack") == "synthetic" else \
        f"haystacks from {first.get('haystack')}"
    has_ci = any(figures.ci_of(c) for d in s.needle.values() for c in d["test"]["per_length"].values())
    probe = {"mlp": "2-layer MLP", "linear": "linear"}.get(first.get("probe"), str(first.get("probe")))
    page.para(f"Test accuracy of a {probe} probe on the frozen encoder's CLS vector (0.5 = chance), "
              f"{first.get('pairs')} query/haystack pairs over lengths {', '.join(map(str, lengths))} x positions "
              f"{', '.join(positions)}, split {first.get('split')}, {first.get('epochs')} probe epochs; {haystack}. "
              + ("95% intervals in brackets. " if has_ci else "No confidence intervals in needle.json: with n test pairs "
                 "per cell, a cell's accuracy is uncertain by about ±1/sqrt(n). ") + "From needle/<arm>/needle.json.")
    page.table(["arm", "overall", *(f"{n} tokens" for n in lengths), *positions], rows)
    for arm, data in s.needle.items():
        grid = data["test"]["per_length_position"]
        page.para(f"{arm}, by length x position:")
        page.table(["length", *positions], [[n, *(_acc(grid[n].get(p)) for p in positions)] for n in grid])
    page.figure("needle", figures.needle(s), f"needle probe test accuracy by input length and by needle position "
                                             f"({first.get('pairs')} pairs, {haystack}). Scale: {scale}.")
