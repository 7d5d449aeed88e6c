"""A study as a graph of steps: each step is one detour command (or a small in-process action).

    detour study studies/tiny.yaml --out runs/study-tiny --dry-run    # prints this graph

Layout of the study folder OUT (what `detour report` reads):

    OUT/study.json                   the design: arms, roles, tasks, seeds, whether data are synthetic
    OUT/data/<name>/                 `detour prepare` outputs (manifest.json with per-source counts)
    OUT/data/tasks/synthetic-ner/    the generated SYNTHETIC NER task, when the study asks for it
    OUT/arms/<arm>/                  `detour train` runs (recipe.json, metrics.jsonl, summary.json, model/)
    OUT/twins.json                   the stream checks over every arm (as `detour twins` writes them)
    OUT/eval/<task>/arms/<arm>/      `detour eval` of one arm on one task
    OUT/eval/<task>/results.json     every evaluated arm's runs on that task, gathered
    OUT/analysis/<analysis>/         `detour analyze ...` outputs (JSON + PNG)
    OUT/needle/<arm>/                `detour needle` outputs
    OUT/report.md, OUT/report.html   `detour report OUT`
    OUT/.study/                      the steps' state, their logs and the arms' resolved recipes

A step's key hashes what determines its output: its command (paths relative to OUT), the content
of the files it reads (recipe, task specs, corpora: sha256, see detour.study.hashes), the output
hashes of the steps it depends on (model weights, results files) and detour's version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from detour.config import Recipe, apply_overrides, load_recipe, recipe_from_dict, recipe_to_dict
from detour.errors import DetourError
from detour.study.hashes import ContentHashes
from detour.study.spec import StudySpec, option_flags
from detour.runs import TWINS_FILE, RunFolder

SYNTHETIC_TASK = "synthetic-ner"


@dataclass
class Step:
    name: str
    kind: str  # prepare, task, train, streams, eval, analysis, needle, report
    argv: list[str] | None = None  # a detour command line, run in its own process
    action: Callable[[], None] | None = None  # or an in-process action
    deps: list[str] = field(default_factory=list)
    spec: dict = field(default_factory=dict)  # what else determines the output
    inputs: list[Path] = field(default_factory=list)  # files whose content goes into the key
    outputs: list[Path] = field(default_factory=list)  # must exist for the step to count as done
    hash_of: Path | None = None  # the output whose hash downstream keys use (a model folder or a file)
    tokens: int = 0  # training tokens this step runs (for the estimate)
    recipe: Recipe | None = None
    # the recipe as it can be checked before the study's base exists: its model section is the base's
    # (config and tokenizer), so the depth, freezes and estimates are known without the weights
    stand_in: Recipe | None = None


def source_argument(spec: StudySpec, source: str) -> str:
    """A prepare source with a local path resolved against the study file's folder."""
    if source.split(":", 1)[0] in ("synthetic", "hf"):
        return source
    path, sep, weight = source.rpartition(":")
    try:
        float(weight)
    except ValueError:
        path, sep, weight = source, "", ""
    return str(spec.path(path)) + (f":{weight}" if sep else "")


PATH_OPTIONS = ("texts", "haystack", "task_spec", "data_root", "preset")


def _flags(spec: StudySpec, options: dict) -> list[str]:
    """An analysis's option flags, with file options resolved against the study file's folder."""
    resolved = {}
    for key, value in options.items():
        if key in PATH_OPTIONS and isinstance(value, str) and spec.path(value).exists():
            value = str(spec.path(value))
        resolved[key] = value
    return option_flags(resolved)


def _local_inputs(arguments: list[str]) -> list[Path]:
    out = []
    for a in arguments:
        path = Path(a.rpartition(":")[0] if ":" in a and not Path(a).exists() else a)
        if path.exists():
            out.append(path)
    return out


BASE = "base"  # the step, and the folder OUT/base/, of the encoder a study pretrains itself


def _data_override(out: Path, names: list[str] | None) -> list[str]:
    if not names:
        return []
    return ["data.sources=" + json.dumps([{"path": str((out / "data" / name).resolve())} for name in names])]


def build_base(spec: StudySpec, out: Path) -> Recipe | None:
    """The recipe of the study's own base encoder (every phase MLM), or None when the arms start from
    the recipe's model."""
    if spec.base is None:
        return None
    recipe = load_recipe(spec.path(spec.base.recipe), [*spec.base.set, *_data_override(out, spec.base.data)])
    recipe.grad_accumulation()
    for i, phase in enumerate(recipe.phases):
        if phase.objective != "mlm":
            raise DetourError(f"base.recipe: phases.{i} ({phase.name}) is {phase.objective.upper()}: a study's base "
                              "encoder is pretrained with MLM in every phase, so that every arm starts from a masked "
                              "LM with its own head")
    return recipe


def base_model_dir(out: Path) -> Path:
    return RunFolder(Path(out).resolve() / BASE).model


def build_arms(spec: StudySpec, out: Path, base: Recipe | None = None) -> dict[str, Recipe]:
    """Arm name -> its resolved recipe (data from the study's prepared folders, branch points set; with a
    study base, every arm starts from its export, OUT/base/model)."""
    from detour.train import twins

    overrides = list(spec.train.set) + _data_override(out, spec.train.data)
    if base is not None:
        # the base's export carries its tokenizer; naming the base recipe's keeps the arms' tokenizer
        # checkable before the base exists
        overrides += [f"model.source={base_model_dir(out)}", "model.config=null",
                      "model.tokenizer=" + json.dumps(base.model.tokenizer or base.model.source)]
    recipe = load_recipe(spec.path(spec.train.recipe), overrides)
    recipe.grad_accumulation()
    freezes = [a.freeze for a in spec.arms.values() if a.freeze and not a.set]
    arms = twins.build_arms(recipe, freezes=freezes)
    # freeze-only arms are named by build_arms (freeze-low-clm); a named arm with a freeze and
    # overrides is an ordinary override arm
    for name, arm in spec.arms.items():
        if arm.freeze and not arm.set:
            generated = f"freeze-{arm.freeze.replace('@', '-')}"
            arms[name] = arms.pop(generated)
            continue
        sets = list(arm.set)
        if arm.freeze:
            layers, _, phase = arm.freeze.partition("@")
            names = [p.name for p in recipe.phases]
            if phase not in names:
                raise DetourError(f"arms.{name}.freeze: no phase {phase!r} in the recipe (its phases: {names})")
            sets.append(f"phases.{names.index(phase)}.freeze.layers={layers}")
        tree = apply_overrides(recipe_to_dict(arms[arm.base]), sets)
        tree["name"] = f"{recipe.name}-{name}"
        arms[name] = recipe_from_dict(tree, f"(study arm {name})")
    resolved: dict[str, Recipe] = {}
    for name, arm in arms.items():
        resolved[name] = twins._branch_point(name, arm, resolved, (out / "arms").resolve())
    return resolved


def _train_tokens(recipe: Recipe) -> int:
    phases = [p.name for p in recipe.phases]
    start = phases.index(recipe.branch.after_phase) + 1 if recipe.branch else 0
    return sum(p.tokens for p in recipe.phases[start:])


def build_steps(spec: StudySpec, out: Path) -> list[Step]:
    """The study's steps in the order they run: prepare, train every arm, the stream check, the
    analyses, the evaluations (the long part of a study on CPU, so last but the report), the report."""
    out = Path(out).resolve()  # keys see paths inside it as $STUDY/...
    steps = _prepare_steps(spec, out)
    base = build_base(spec, out)
    arms = build_arms(spec, out, base)
    _check_validation_split(spec, arms)
    if base is not None:
        steps.append(_base_step(out, base, prepared=[f"prepare:{n}" for n in (spec.base.data or [])]))
    steps += _train_steps(out, arms, prepared=[f"prepare:{n}" for n in (spec.train.data or [])], base=base)
    steps.append(Step("streams", "streams", deps=[f"train:{n}" for n in arms], outputs=[out / TWINS_FILE],
                      hash_of=out / TWINS_FILE))
    evaluations = _eval_steps(spec, out, arms) if spec.eval is not None else []
    steps += _analysis_steps(spec, out, arms)
    reportable = ["streams", *(s.name for s in evaluations if s.kind == "gather"),
                  *(s.name for s in steps if s.kind in ("analysis", "needle"))]
    steps += evaluations
    if spec.report:
        steps.append(Step("report", "report", deps=reportable,
                          outputs=[out / "report.md", out / "report.html"], hash_of=out / "report.md"))
    return steps


def _check_validation_split(spec: StudySpec, arms: dict[str, Recipe]) -> None:
    """An arm scoring held-out documents from its training data's split needs that split prepared:
    said now, not after the prepare step has run."""
    if not spec.train.data:
        return  # the recipe's own data.sources: `detour train` checks them
    first = spec.train.data[0]
    if spec.prepare[first].validation is not None:
        return
    for name, recipe in arms.items():
        if recipe.validation is not None and recipe.validation.source is None:
            raise DetourError(f"prepare.{first}.validation: arm {name} scores held-out documents (`validation` in "
                              f"its recipe) from the split of its first data entry, {first!r}, which holds none; "
                              f"set prepare.{first}.validation (e.g. 0.02, or a count of documents) or "
                              "validation.source")


def _model_dir(out: Path, arm: str) -> str:
    return str(RunFolder(out / "arms" / arm).model)


def _prepare_steps(spec: StudySpec, out: Path) -> list[Step]:
    steps = []
    for name, prep in spec.prepare.items():
        sources = [source_argument(spec, s) for s in prep.sources]
        argv = ["prepare", *sources, "--tokenizer", prep.tokenizer, "--out", str(out / "data" / name), "--overwrite"]
        if prep.text_field:
            argv += ["--text-field", prep.text_field]
        if prep.blank_line_docs:
            argv.append("--blank-line-docs")
        if prep.workers:
            argv += ["--workers", str(prep.workers)]
        if prep.validation is not None:
            argv += ["--validation", str(prep.validation), "--validation-seed", str(prep.validation_seed or 0)]
        steps.append(Step(f"prepare:{name}", "prepare", argv=argv, inputs=_local_inputs(sources),
                          outputs=[out / "data" / name / "manifest.json"],
                          hash_of=out / "data" / name / "manifest.json"))
    return steps


def _base_step(out: Path, base: Recipe, prepared: list[str]) -> Step:
    run = RunFolder(out / BASE)
    return Step(BASE, "base", argv=["train", str(out / ".study" / "recipes" / f"{BASE}.json"), "--out", str(run.root),
                                    "--resume"],
                deps=list(prepared), spec={"recipe": recipe_to_dict(base)}, outputs=[run.summary, run.model],
                hash_of=run.model, tokens=_train_tokens(base), recipe=base)


def stand_in(recipe: Recipe, base: Recipe) -> Recipe:
    """`recipe` with the base's model section: what can be checked of an arm before its base is trained."""
    tree = recipe_to_dict(recipe)
    tree["model"] = {**recipe_to_dict(base)["model"], "attn_implementation": recipe.model.attn_implementation}
    return recipe_from_dict(tree, "(an arm checked against the study's base recipe)")


def _train_steps(out: Path, arms: dict, prepared: list[str], base: Recipe | None = None) -> list[Step]:
    steps = []
    recipes_dir = out / ".study" / "recipes"
    for name, recipe in arms.items():
        run = RunFolder(out / "arms" / name)
        deps = list(prepared) + ([BASE] if base is not None else [])
        if recipe.branch is not None:
            deps.append(f"train:{Path(recipe.branch.run).name}")
        steps.append(Step(f"train:{name}", "train",
                          argv=["train", str(recipes_dir / f"{name}.json"), "--out", str(run.root), "--resume"],
                          deps=deps, spec={"recipe": recipe_to_dict(recipe)},
                          outputs=[run.summary, run.model], hash_of=run.model,
                          tokens=_train_tokens(recipe), recipe=recipe,
                          stand_in=stand_in(recipe, base) if base is not None else None))
    return steps


def _eval_steps(spec: StudySpec, out: Path, arms: dict) -> list[Step]:
    """The synthetic task's generation (when asked for); per task, one `detour eval` step per evaluated arm
    (eval:TASK:ARM, into OUT/eval/TASK/arms/ARM/, after that arm's training only) and the gather step
    eval:TASK, which writes their runs into OUT/eval/TASK/results.json as one multi-arm call would
    (detour.study.gather)."""
    ev = spec.eval
    evaluated = ev.arms or list(arms)
    options = []
    for key in ("epochs", "max_train", "max_eval", "max_length", "lr", "batch_size"):
        value = getattr(ev, key)
        if value is not None:
            options += ["--" + key.replace("_", "-"), str(value)]
    if ev.linear_probe:
        options.append("--linear-probe")
    if ev.data_root:
        options += ["--data-root", str(spec.path(ev.data_root))]
    steps: list[Step] = []
    tasks: list[tuple[str, list[str], list[Path], list[str]]] = []
    if ev.synthetic_ner is not None:
        folder = out / "data" / "tasks" / SYNTHETIC_TASK
        steps.append(Step(f"task:{SYNTHETIC_TASK}", "task", spec=ev.synthetic_ner.model_dump(),
                          outputs=[folder / "task.yaml"], hash_of=folder))
        tasks.append((SYNTHETIC_TASK, ["--task-spec", str(folder / "task.yaml")], [], [f"task:{SYNTHETIC_TASK}"]))
    for task in ev.tasks:
        local = spec.path(task)
        if task.endswith((".yaml", ".yml")) or local.is_file():
            if not local.is_file():
                raise DetourError(f"eval.tasks: task spec file {local} not found")
            tasks.append((local.stem, ["--task-spec", str(local)], [local], []))
        else:
            from detour.eval.tasks import SPEC_DIR, shipped_tasks

            if task not in shipped_tasks():
                raise DetourError(f"eval.tasks: {task!r} is neither a shipped task ({', '.join(shipped_tasks())}) "
                                  "nor a task spec file")
            tasks.append((task, ["--tasks", task], [SPEC_DIR / f"{task}.yaml"], []))
    for task, selector, inputs, deps in tasks:
        folder = out / "eval" / task
        gathered = folder / "results.json"
        per_arm = []
        for arm in evaluated:
            own = folder / "arms" / arm
            # --reuse-from: a study folder from before the per-arm steps holds every arm's runs in
            # the gathered file; detour eval takes those whose key is unchanged instead of
            # fine-tuning again (and after a gather, the file holds this arm's own runs)
            per_arm.append(Step(f"eval:{task}:{arm}", "eval",
                                argv=["eval", _model_dir(out, arm), *selector, "--seeds", str(ev.seeds), *options,
                                      "--out", str(own), "--reuse-from", str(gathered)],
                                deps=[f"train:{arm}"] + deps, inputs=inputs,
                                outputs=[own / "results.json"], hash_of=own / "results.json"))
        steps += per_arm
        steps.append(Step(f"eval:{task}", "gather", deps=[s.name for s in per_arm],
                          spec={"results": [str(s.hash_of) for s in per_arm]},
                          outputs=[gathered, folder / "results.md"], hash_of=gathered))
    return steps


def _analysis_steps(spec: StudySpec, out: Path, arms: dict) -> list[Step]:
    """CKA (the detour and each listed arm against the baseline, or the arm it names in `against`), trajectory, transplant, drift, needle."""
    steps = []
    a = spec.analyses

    def model(arm: str) -> str:
        return _model_dir(out, arm)

    if a.cka is not None:
        flags = _flags(spec, a.cka.options)
        for arm in ["detour", *a.cka.arms]:
            folder = out / "analysis" / ("cka" if arm == "detour" else f"cka-{arm}")
            extra = spec.arms.get(arm)
            against = (extra.against if extra else None) or "baseline"
            floor = (extra.noise_floor if extra else None) or a.cka.noise_floor
            argv = ["analyze", "cka", model(arm), model(against)]
            deps = [f"train:{arm}", f"train:{against}"]
            if floor:
                argv += ["--noise-floor", model(floor)]
                deps.append(f"train:{floor}")
            steps.append(_analysis(f"cka:{arm}" if arm != "detour" else "cka", argv + flags, folder, "cka.json", deps))
    if a.trajectory is not None:
        t = a.trajectory
        argv = ["analyze", "trajectory", str(out / "arms" / t.a), str(out / "arms" / t.b)]
        deps = [f"train:{t.a}", f"train:{t.b}"]
        if t.noise_floor:
            argv += ["--noise-floor", str(out / "arms" / t.noise_floor)]
            deps.append(f"train:{t.noise_floor}")
        steps.append(_analysis("trajectory", argv + _flags(spec, t.options), out / "analysis" / "trajectory",
                               "trajectory.json", deps))
    if a.transplant is not None:
        t = a.transplant
        argv = ["analyze", "transplant", "--src", model(t.src), "--dst", model(t.dst), *_flags(spec, t.options)]
        steps.append(_analysis("transplant", argv, out / "analysis" / "transplant", "transplant.json",
                               [f"train:{t.src}", f"train:{t.dst}"]))
    if a.drift is not None:
        for arm in a.drift.arms:
            start = arms[arm].model.source
            if start is None:
                raise DetourError(f"analyses.drift.arms: arm {arm!r} starts from a config (random weights), "
                                  "so there is no starting model to measure its drift from")
            steps.append(_analysis(f"drift:{arm}", ["analyze", "drift", model(arm), start],
                                   out / "analysis" / f"drift-{arm}", "drift.json", [f"train:{arm}"]))
    if a.needle is not None:
        for arm in a.needle.arms:
            folder = out / "needle" / arm
            argv = ["needle", model(arm), *_flags(spec, a.needle.options), "--out", str(folder)]
            steps.append(Step(f"needle:{arm}", "needle", argv=argv, inputs=_file_arguments(argv),
                              deps=[f"train:{arm}"], outputs=[folder / "needle.json"], hash_of=folder / "needle.json"))
    return steps


def _analysis(name: str, argv: list[str], folder: Path, result: str, deps: list[str]) -> Step:
    return Step(name, "analysis", argv=argv + ["--out", str(folder)], deps=deps, inputs=_file_arguments(argv),
                outputs=[folder / result], hash_of=folder / result)


def _file_arguments(argv: list[str]) -> list[Path]:
    """The files an analysis reads besides models (texts, haystacks, task specs): their content is in the key."""
    return [Path(value) for flag, value in zip(argv, argv[1:])
            if flag.lstrip("-").replace("-", "_") in PATH_OPTIONS and Path(value).is_file()]


# ---- keys ----

def _relative(value, out: str):
    """Paths inside the study folder as $STUDY/...: moving the folder keeps every key."""
    if isinstance(value, str):
        return value.replace(out, "$STUDY")
    if isinstance(value, list):
        return [_relative(v, out) for v in value]
    if isinstance(value, dict):
        return {k: _relative(v, out) for k, v in value.items()}
    return value


def output_hash(path: Path, content: ContentHashes) -> str:
    """What downstream keys see of an output: weights for a model folder, content for a file or folder."""
    from detour.model.load import weights_hash

    if path.is_dir() and (any(path.glob("*.safetensors")) or any(path.glob("*.bin"))):
        return weights_hash(str(path))
    return content.of(path)


def step_key(step: Step, out: Path, dep_hashes: dict[str, str], content: ContentHashes | None = None) -> str:
    from detour import __version__

    content = content or ContentHashes(None)

    root = str(Path(out).resolve())
    material = {
        "step": step.name,
        "argv": _relative(step.argv or [], root),
        "spec": _relative(step.spec, root),
        "inputs": {_relative(str(p.resolve()), root): content.of(p) for p in step.inputs},
        "deps": {d: dep_hashes[d] for d in step.deps},
        "version": __version__,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
