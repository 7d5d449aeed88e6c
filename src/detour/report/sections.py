"""The report's first sections: design (arms, phases, data, stream checks), training curves, results, freeze arms.

    python -c "from detour.report.collect import collect; from detour.report.page import Page; \
from detour.report.sections import design; p = Page(); design(p, collect('runs/study')); print(p.markdown())"

Every number is read from the study's files (recipe.json, summary.json, metrics.jsonl, the data
sources' manifest.json, twins.json, eval results) and every section names the file it came from.
"""

from __future__ import annotations

from detour.report import figures
from detour.report.collect import Study
from detour.report.page import Page, count, num, p_value, pm, tokens
from detour.report.tables import ALPHA, ResultsTable, Significance, comparison_pairs, freeze_arms, frozen_layers, low_divergence, low_layers

IGNORED_KEYS = ("name", "branch", "checkpoint", "logging", "card", "distributed")  # bookkeeping, not the arm's treatment


def model_line(s: Study) -> str:
    arm = next((a for a in s.arms.values() if a.role == "detour" and a.recipe), None) \
        or next((a for a in s.arms.values() if a.recipe), None)
    if arm is None:
        return "model: unknown (no recipe.json)"
    model = arm.recipe.get("model") or {}
    cfg = arm.model_config or model.get("config") or {}
    shape = ", ".join(x for x in (cfg.get("model_type"), cfg.get("num_hidden_layers") and f"{cfg['num_hidden_layers']} layers",
                                  cfg.get("hidden_size") and f"hidden {cfg['hidden_size']}") if x)
    if model.get("source"):
        return f"{model['source']} ({shape})" if shape else model["source"]
    return f"built from model.config with random initial weights ({shape})" if shape else "built from model.config"


def phases_line(s: Study) -> str:
    arm = s.arms.get(s.role("detour") or "") or next(iter(s.arms.values()))
    phases = (arm.recipe or {}).get("phases") or []
    trained = (arm.summary or {}).get("phases") or {}
    parts = [f"{p['name']} {tokens((trained.get(p['name']) or {}).get('tokens', p.get('tokens')))} tokens" for p in phases]
    return ", ".join(parts) if parts else "unknown phases"


def scale_line(s: Study) -> str:
    """What was run, at what size: the phrase every caption ends with."""
    return f"model {model_line(s)}; {phases_line(s)} per arm; one training run per arm"


def _lr(lr: dict, peak: float | None) -> str:
    shape = lr.get("shape", "?")
    if lr.get("warmup_tokens"):
        shape += f", warmup {tokens(lr['warmup_tokens'])} tokens"
    elif lr.get("warmup_fraction"):
        shape += f", warmup {100 * lr['warmup_fraction']:.0f}%"
    if lr.get("shape") != "constant" and lr.get("final_lr_fraction") is not None:
        shape += f", to {100 * lr['final_lr_fraction']:.0f}% of peak"
    return f"{shape} (peak {lr.get('peak') or peak:g})" if (lr.get("peak") or peak) else shape


def _exact(n) -> str:
    return "–" if n is None else f"{n:,}"


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            if not prefix and k in IGNORED_KEYS:
                continue
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(tree, list) and tree and all(isinstance(x, dict) for x in tree):
        out = {}
        for i, v in enumerate(tree):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): tree}


def describe(s: Study, name: str) -> str:
    """The arm's description: study.json's, else how its recipe differs from the detour's or the baseline's."""
    arm = s.arms[name]
    if arm.description:
        return arm.description
    if arm.role == "detour":
        return "the CLM detour: the recipe as written"
    if arm.role == "baseline":
        return "the matched MLM twin: every CLM phase replaced by MLM, all else equal"
    if arm.recipe is None:
        return "–"
    mine, diffs = _flat(arm.recipe), {}
    for ref in (s.role("detour"), s.role("baseline")):
        if ref and s.arms[ref].recipe:
            theirs = _flat(s.arms[ref].recipe)
            diffs[ref] = [f"{k} = {mine.get(k)}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    if not diffs:
        return "–"
    ref = min(diffs, key=lambda r: len(diffs[r]))
    return f"the {ref} with {'; '.join(diffs[ref])}" if diffs[ref] else f"the same recipe as the {ref}"


def frozen(s: Study, name: str) -> str:
    """'low = layers 0-1 during clm' for each frozen phase of the arm, or '–'."""
    from detour.eval.results import seed_ranges

    parts = []
    for phase, what, layers in frozen_layers(s, name):
        named = layers is not None and not what.replace("-", "").replace(",", "").isdigit()
        parts.append(f"{what} = layers {seed_ranges(layers)} during {phase}" if named else f"{what} during {phase}")
    return "; ".join(parts) or "–"


def _training(recipe: dict) -> str:
    """Optimizer, batch and data order, as the detour's recipe.json gives them."""
    opt, batch, data = recipe.get("optimizer") or {}, recipe.get("batch") or {}, recipe.get("data") or {}
    parts = []
    if opt.get("lr") is not None:
        extra = ", ".join(f"{k.replace('_', ' ')} {opt[k]}" for k in ("betas", "eps", "weight_decay") if opt.get(k) is not None)
        parts.append(f"Optimizer: AdamW, peak LR {opt['lr']:g}" + (f", {extra}" if extra else "")
                     + " (weight decay decoupled, scaled by lr_t / peak)")
    if batch.get("global_sequences"):
        parts.append(f"Batch: {batch['global_sequences']} sequences of {data.get('seq_len', '?')} tokens a step")
    elif batch.get("global_tokens"):
        parts.append(f"Batch: {tokens(batch['global_tokens'])} tokens a step, sequences of {data.get('seq_len', '?')}")
    if data.get("shuffle_seed") is not None:
        parts.append(f"Data shuffle seed {data['shuffle_seed']}")
    return ". ".join(parts) + "." if parts else ""


def design(page: Page, s: Study) -> None:
    page.heading(2, "1. Design")
    recipe = next((a.recipe for a in s.arms.values() if a.role == "detour" and a.recipe), None) or {}
    page.para(f"Model: {model_line(s)}. Budget per arm: {phases_line(s)}; one training run per arm. {_training(recipe)}")
    rows = []
    for a in s.arms.values():
        rows.append([a.name, a.role, describe(s, a.name), (a.recipe or {}).get("seed", "–"), frozen(s, a.name),
                     tokens((a.summary or {}).get("global_tokens")) if a.summary else "not trained"])
    page.para(f"**Arms** (from {'study.json and ' if s.layout == 'study' else ''}each arm's recipe.json and summary.json):")
    page.table(["arm", "role", "what it is", "seed", "frozen", "tokens trained"], rows)
    rows = []
    for a in s.arms.values():
        trained = (a.summary or {}).get("phases") or {}
        peak = ((a.recipe or {}).get("optimizer") or {}).get("lr")
        for p in (a.recipe or {}).get("phases") or []:
            t = trained.get(p["name"]) or {}
            objective = p.get("objective", "?").upper()
            masking = f"{100 * p['mask_rate']:.0f}%" if objective == "MLM" and p.get("mask_rate") is not None \
                else "none: next-token loss at every position" if objective == "CLM" else "–"
            rows.append([a.name, p["name"], objective, masking,
                         f"{_exact(t.get('tokens'))} / {_exact(p.get('tokens'))}", _lr(p.get("lr") or {}, peak),
                         num(t.get("final_loss"))])
    if rows:
        page.para("**Phases** (tokens trained / budget; final loss: mean of the phase's last 10 step losses, "
                  "summary.json `final_loss`):")
        page.table(["arm", "phase", "objective", "masking", "tokens", "LR shape", "final loss"], rows)
    _compute(page, s)
    _data(page, s)
    _streams(page, s)


def _compute(page: Page, s: Study) -> None:
    """What each arm computed on, from each start and resume its summary.json records (`sessions`)."""
    from detour.compute import same_compute

    rows = []
    for a in s.arms.values():
        sessions = (a.summary or {}).get("sessions")
        if not sessions:
            continue

        def each(key):
            return ", ".join(dict.fromkeys(str(x.get(key, "?")) for x in sessions))

        rows.append([a.name, ", ".join(str(x.get("from_step")) for x in sessions), each("threads"), each("world_size"),
                     each("device"), each("torch"),
                     "yes" if same_compute(sessions) else "**no**: equal to one uninterrupted run to rounding only"])
    if rows:
        page.para("**Compute** (summary.json `sessions`: each start and resume of an arm's run; another thread "
                  "count, process count, device or version sums floats in another order):")
        page.table(["arm", "from step", "threads", "processes", "device", "torch", "alike throughout"], rows)


def _data(page: Page, s: Study) -> None:
    if not s.sources:
        page.para("**Data:** no data sources recorded (no recipe.json).")
        return
    rows = []
    for src in s.sources:
        if src.manifest is None:
            rows.append([src.path, "–", "–", "–", "–", src.problem])
            continue
        for e in src.manifest.get("sources") or []:
            rows.append([f"{src.path} / {e.get('name')}", e.get("input", "–"), f"{e.get('documents', 0):,}",
                         f"{e.get('tokens', 0):,}", "–" if e.get("weight") is None else e["weight"],
                         "**SYNTHETIC**" if e.get("synthetic") else "real"])
    tokenizers = sorted({str(src.manifest.get("tokenizer")) for src in s.sources if src.manifest})
    page.para(f"**Data** (each source's manifest.json, written by `detour prepare`; tokenizer {', '.join(tokenizers) or '?'}):")
    page.table(["source", "input", "documents", "tokens", "weight", "kind"], rows)


def _streams(page: Page, s: Study) -> None:
    if not s.twins:
        return
    from detour.train.twins import read_checks

    verdict = ", ".join(f"{k} {'**not compared**' if v is None else 'yes' if v else '**NO**'}"
                        for k, v in read_checks(s.twins).items())
    page.para(f"**Stream checks** ({s.rel(s.twins_path)}): {verdict}."
              + (f" Layer groups: {s.twins['layer_groups']}." if s.twins.get("layer_groups") else ""))
    per_arm = s.twins.get("stream_vs_detour") or {}
    phases = list(dict.fromkeys(p for rows in per_arm.values() for p in rows))
    if per_arm:
        page.table(["arm vs detour", *phases], [[a, *(rows.get(p, "–") for p in phases)] for a, rows in per_arm.items()])


def curves(page: Page, s: Study) -> None:
    fig = figures.curves(s)
    if fig is None:
        return
    page.heading(2, "2. Training curves")
    steps = ", ".join(f"{a.name} {count(len(a.metrics), 'step')}" for a in s.arms.values() if a.metrics)
    page.figure("curves", fig, f"training loss and learning rate per optimizer step from each arm's metrics.jsonl "
                               f"({steps}); phases shaded. The CLM loss (next token, every position) and the MLM loss "
                               f"(masked tokens only) are different quantities. Scale: {scale_line(s)}.")
    end = dict((s.twins or {}).get("end_of_decay_mlm_loss") or {})
    phase = end.pop("phase", None)
    if end:
        page.para(f"MLM loss at the end of the {phase} phase (twins.json), the one loss all arms share: "
                  + ", ".join(f"{a} {num(v)}" for a, v in end.items()) + ".")


def validation_points(arm) -> list[tuple[str, dict]]:
    """An arm's held-out records at the run's start and at each phase end, in order:
    [("start", r), (PHASE, r), ...].

    A phase end is that phase's last record (the engine always scores there); the start is the
    record of global step 0, where every arm has the same weights.
    """
    start, ends = None, {}
    for r in arm.validation:
        if r.get("global_step") == 0:
            start = r
        else:
            ends[r["phase"]] = r  # later records of a phase replace earlier ones: the last is its end
    return ([("start", start)] if start else []) + list(ends.items())


def validation(page: Page, s: Study) -> None:
    """The held-out MLM loss through the training (records "kind": "validation" of metrics.jsonl)."""
    fig = figures.validation(s)
    if fig is None:
        return
    arms = [a for a in s.arms.values() if a.validation]
    page.heading(3, "Held-out MLM loss")
    first = arms[0].validation[0]
    check = ((s.twins or {}).get("checks") or {}).get("validation_equal")
    same = {True: "twins.json checks that every arm scored the identical sequences and masks: yes",
            False: "twins.json says the arms did NOT score the same held-out sequences and masks: the "
                   "values below are not comparable",
            None: "twins.json did not compare the arms' held-out sets"}[check]
    page.figure("validation", fig, f"MLM loss at {first.get('sequences', '?')} held-out sequences "
                                   f"({count(first.get('masked_tokens', 0), 'masked token')}) with fixed masks, and "
                                   f"the masked-token accuracy, at each evaluation point of each arm; phases shaded "
                                   f"as above. Unlike the training loss, it is one quantity for every arm and "
                                   f"every phase (a CLM phase is scored as MLM too). {same}.")
    # Columns by position: the arms' first phases differ in name (clm, mlm30) but end at the same tokens.
    points = {a.name: validation_points(a) for a in arms}
    width = max(len(p) for p in points.values())
    labels = [" / ".join(dict.fromkeys(p[i][0] for p in points.values() if i < len(p))) for i in range(width)]
    rows = [[name, *(f"{num(p[i][1]['mlm_loss'])} ({100 * p[i][1]['mlm_accuracy']:.1f}%)" if i < len(p) else "–"
                     for i in range(width))] for name, p in points.items()]
    detour = s.role("detour")
    pairs = [(x, y) for x, y in comparison_pairs(s, list(points)) if x == detour or s.arms[x].against]
    for x, y in pairs:  # the detour and every explicitly paired arm, minus its twin
        a, b = points[x], points[y]
        rows.append([f"{x} − {y}", *(num(a[i][1]["mlm_loss"] - b[i][1]["mlm_loss"])
                                     if i < min(len(a), len(b)) else "–" for i in range(width))])
    page.table(["arm", *(k if k == "start" else f"end of {k}" for k in labels)], rows)
    page.para("Held-out MLM loss (masked-token accuracy) at the run's start and at the end of each phase "
              "(metrics.jsonl, records of kind \"validation\"); lower is better.")


def _budget(table: ResultsTable, task: str) -> str:
    b = table.budget.get(task) or {}
    parts = [f"{b['train_examples']} train" if "train_examples" in b else None,
             f"{b['eval_examples']} test examples" if "eval_examples" in b else None,
             f"{b['epochs']} epoch{'s' if b.get('epochs') != 1 else ''}" if "epochs" in b else None,
             "linear probe (frozen encoder)" if table.linear_probe.get(task) else "full fine-tuning"]
    return ", ".join(p for p in parts if p)


def results(page: Page, s: Study, table: ResultsTable | None, sig: list[Significance]) -> None:
    if table is None:
        return
    page.heading(2, "3. Downstream results")
    seeds = {t: sorted({c.n for (a, tt), c in table.cells.items() if tt == t}) for t in table.tasks}
    header = ["arm"] + [f"{t} ({table.headline[t]}, {'/'.join(map(str, seeds[t]))} seeds)" for t in table.tasks] + ["average"]
    rows = []
    for arm in table.arms:
        row = [arm]
        for t in table.tasks:
            cell = table.cells.get((arm, t))
            text = pm(cell.mean, cell.std if cell and cell.n > 1 else None, 2, 100) if cell else "–"
            row.append(f"**{text}**" if cell and cell.mean == table.best(t) else text)
        avg = table.average.get(arm)
        text = num(None if avg is None else 100 * avg, 2)
        row.append(f"**{text}**" if avg is not None and avg == table.best("Average") else text)
        rows.append(row)
    files = ", ".join(s.rel(f) for f in s.eval_files)
    page.para(f"Headline metric x 100, mean ± sample std over fine-tuning seeds (no ± with one seed); the best of "
              f"each column in bold; the average is the mean of the task means. From {files}.")
    page.table(header, rows)
    _collapsed(page, s, table)
    budgets = "; ".join(f"{t}: {_budget(table, t)}" for t in table.tasks)
    page.figure("results", figures.results(s, table), f"headline metric x 100 per task, mean ± std over fine-tuning "
                                                        f"seeds ({budgets}). Scale: {scale_line(s)}.")
    if sig:
        _significance(page, sig)


def _collapsed(page: Page, s: Study, table: ResultsTable) -> None:
    from detour.eval.metrics import collapsed_seeds

    found = collapsed_seeds(s.eval_runs, lambda r: (r["task"], r["arm"]))
    if not found:
        return
    n = {(t, a): table.cells[a, t].n for a, t in table.cells}
    parts = [f"{task}: " + ", ".join(f"{arm} {len(seeds)} of {n.get((task, arm), len(seeds))}"
                                     for (t, arm), seeds in found.items() if t == task)
             for task in dict.fromkeys(t for t, _ in found)]
    page.para("**Fine-tunes that answered alike for every test example** (one label, or one label set, for all; or "
              "no entity tagged), by arm, seeds of seeds run: " + "; ".join(parts) + ". Their score is the floor of "
              "that one answer, not a reading of the encoder: where every arm collapses, the task says nothing "
              "about the arms at this budget.")


def _significance(page: Page, sig: list[Significance]) -> None:
    one = len({r.against for r in sig}) == 1
    whom = f"the {sig[0].against}" if one else "the arm it is paired with (study.json `against`; else the baseline)"
    page.para(f"**Each arm against {whom}** (`detour.eval.significance.compare`: p from the paired "
              f"sign-flip test over tasks x seeds, two-sided, the p of record; 95% CI the percentile interval of the "
              f"paired bootstrap, small-sample correction on; delta = mean over tasks of the mean paired difference, "
              f"x 100; per task, the sign-flip p over its seeds with Holm's correction across the tasks):")
    rows, notes = [], []
    for r in sig:
        design = ", ".join(f"{t} {n}" for t, n in r.seeds.items()) or "–"
        label = r.arm if one else f"{r.arm} vs {r.against}"
        if r.refused:
            rows.append([label, design, "–", "–", "not computed", "refused (below)"])
            notes.append(f"{r.arm} vs {r.against}: no p-value: {r.refused}")
            continue
        if r.significant:
            verdict = f"significant at {ALPHA} ({'higher' if r.delta > 0 else 'lower'} than the {r.against})"
        else:
            verdict = f"**not significant** (p >= {ALPHA}): the difference may be seed noise"
        rows.append([label, design, f"{100 * r.delta:+.2f}", f"[{100 * r.ci[0]:+.2f}, {100 * r.ci[1]:+.2f}]",
                     p_value(r.p_value), verdict])
        notes.append(f"{r.arm}: {r.test}")
        if r.resamples < 10_000:
            notes.append(f"{r.arm}: the interval rests on {r.resamples} bootstrap resamples, all the distinct ones "
                         f"this design allows (product over tasks of C(2n-1, n))")
        notes.append(f"{r.arm}: {r.holm}. Per task (p, Holm p): "
                     + "; ".join(f"{t} {p_value(p)}, {p_value(h)}" for t, (p, h) in r.task_p.items()))
        notes += [f"{r.arm}: {n}" for n in r.notes]
    page.table(["arm" if one else "arm vs its twin", "paired seeds per task", "delta x 100", "95% CI", "p (sign-flip)", "verdict"], rows)
    if notes:
        page.bullets([n.replace("\n", " ") for n in notes])


def freeze(page: Page, s: Study, table: ResultsTable | None, sig: list[Significance]) -> None:
    arms = freeze_arms(s)
    if not arms:
        return
    page.heading(2, "4. Freeze interventions")
    detour, baseline = s.role("detour"), s.role("baseline")
    low = low_layers(s)
    by_arm = {r.arm: r for r in sig}
    cka_of = {}
    if "cka" in s.cka and detour:
        cka_of[detour] = s.cka["cka"]
    for arm in arms:
        if f"cka-{arm}" in s.cka:
            cka_of[arm] = s.cka[f"cka-{arm}"]
    rows = []
    for arm in [a for a in (baseline, detour) if a] + arms:
        avg = table.average.get(arm) if table else None
        r = by_arm.get(arm)
        vs_base = "–" if r is None else ("refused" if r.refused else f"{100 * r.delta:+.2f} (p {p_value(r.p_value)})")
        vs_detour = "–" if table is None or avg is None or detour not in table.average or arm == detour \
            else f"{100 * (avg - table.average[detour]):+.2f}"
        d = low_divergence(cka_of[arm], low) if arm in cka_of and low else None
        rows.append([arm, frozen(s, arm), num(None if avg is None else 100 * avg, 2), vs_base, vs_detour,
                     "–" if d is None else num(d[0]), "–" if d is None or d[1] is None else num(d[1])])
    low_text = f"layers {', '.join(map(str, low))}, counted from 0" if low else "?"
    page.para(f"Freeze arms (named freeze-*, or a recipe phase with `freeze`) next to the baseline and the detour: "
              f"the average headline metric x 100 over tasks, its difference to the {baseline} (sign-flip p) "
              f"and to the {detour}, and the mean low-layer divergence 1 - CKA ({low_text}) of each arm against the "
              f"{baseline} with its seed-noise floor, from analysis/cka/cka.json (detour) and "
              f"analysis/cka-<arm>/cka.json. Scale: {scale_line(s)}.")
    page.table(["arm", "frozen", "average x 100", f"vs {baseline}", f"vs {detour}", "low-layer d vs baseline",
                "noise floor d"], rows)
