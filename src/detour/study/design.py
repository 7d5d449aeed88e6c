"""OUT/study.json: the study's design as the report reads it (its arms, base, tasks, analyses and
steps), and the resolved recipe of every training step under OUT/.study/recipes/.

    python -c "from detour.study.spec import load_study; from detour.study.design import describe_arm; \
s = load_study('studies/tiny.yaml'); print(s.name)"
"""

from __future__ import annotations

import json
from pathlib import Path

from detour.io import write_json, write_text
from detour.study.graph import BASE, SYNTHETIC_TASK, Step
from detour.study.spec import StudySpec

DESIGN_SCHEMA = "detour.study/1"


def describe_arm(spec: StudySpec, name: str, recipe) -> dict:
    phases = ", then ".join(f"{p.name} {p.objective.upper()}" + (f" {p.mask_rate:.0%}" if p.mask_rate else "")
                            + f" {p.tokens:,} tokens" + (f" (layers {p.freeze.layers} frozen)" if p.freeze and p.freeze.layers else "")
                            for p in recipe.phases)
    if name == "detour":
        role, text = "detour", f"the recipe as written: {phases}"
    elif name == "baseline":
        role, text = "baseline", f"the matched MLM twin (every CLM phase replaced by MLM at {recipe.baseline_mask_rate:.0%}): {phases}"
    else:
        arm = spec.arms[name]
        role = "arm"
        text = arm.description or f"the {arm.base} with " + ", ".join(
            ([f"freeze {arm.freeze}"] if arm.freeze else []) + arm.set) + f": {phases}"
    out = {"role": role, "description": text, "seed": recipe.seed}
    if name in spec.arms and spec.arms[name].against:
        out["against"] = spec.arms[name].against  # the report compares this arm with that one
    if recipe.branch is not None:
        out["branched_from"] = {"arm": Path(recipe.branch.run).name, "after_phase": recipe.branch.after_phase}
    return out


def describe_base(recipe) -> dict:
    """The study's own base encoder, as the report and the capacity comparison describe it."""
    model = recipe.model
    start = f"a {model.config.get('model_type')} built from model.config (random initial weights)" \
        if model.config is not None else f"`{model.source}`"
    phases = ", then ".join(f"{p.name} MLM {p.mask_rate:.0%} {p.tokens:,} tokens" for p in recipe.phases)
    return {"description": f"pretrained by the study from {start}: {phases}", "config": model.config,
            "tokens": sum(p.tokens for p in recipe.phases), "seed": recipe.seed}


def is_synthetic(spec: StudySpec, recipes: dict) -> bool:
    """Synthetic pretraining text or a synthetic task anywhere in the study."""
    sources = [s for p in spec.prepare.values() for s in p.sources]
    if any(s.startswith("synthetic:") for s in sources) or (spec.eval and spec.eval.synthetic_ner):
        return True
    for recipe in recipes.values():
        for source in recipe.data.sources:
            manifest = Path(source.path) / "manifest.json"
            if manifest.is_file() and json.loads(manifest.read_text()).get("synthetic"):
                return True
    return False


def write_design(spec: StudySpec, out: Path, steps: list[Step]) -> None:
    recipes = {s.name.split(":", 1)[1]: s.recipe for s in steps if s.kind == "train"}
    design = {
        "schema": DESIGN_SCHEMA,
        "name": spec.name,
        "description": spec.description,
        "synthetic_data": is_synthetic(spec, recipes),
        "arms": {name: describe_arm(spec, name, r) for name, r in recipes.items()},
        "eval": None if spec.eval is None else {
            "tasks": ([SYNTHETIC_TASK] if spec.eval.synthetic_ner else []) + [Path(t).stem for t in spec.eval.tasks],
            "seeds": spec.eval.seeds,
            "arms": spec.eval.arms or list(recipes),
            "options": spec.eval.model_dump(exclude={"tasks", "arms", "seeds"}, exclude_none=True),
        },
        "analyses": spec.analyses.model_dump(exclude_none=True),
        "steps": [s.name for s in steps],
    }
    base = next((s for s in steps if s.kind == "base"), None)
    if base is not None:  # its recipe is written beside the arms' (the design lists arms only)
        design["base"] = describe_base(base.recipe)
        recipes = {BASE: base.recipe, **recipes}
    write_json(out / "study.json", design)
    for name, recipe in recipes.items():
        from detour.config import recipe_to_dict

        path = out / ".study" / "recipes" / f"{name}.json"
        text = json.dumps(recipe_to_dict(recipe), indent=2) + "\n"
        if not path.is_file() or path.read_text() != text:
            write_text(path, text)
