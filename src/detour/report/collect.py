"""Read a study or twins folder into one typed structure: arms, data, evaluation, analyses.

    python -c "from detour.report.collect import collect; s = collect('runs/study'); print(s.layout, list(s.arms), s.missing)"

Two layouts are recognised:

- a study folder (`detour study`): `study.json`, the arms' run folders under `arms/<arm>/`, and
  `twins.json` beside `study.json` (or inside `arms/`);
- a twins folder (`detour twins --out DIR`): `twins.json` and `DIR/<arm>/`; roles come from the
  names (`detour`, `baseline`, any other name is an extra arm).

Both may hold `eval/<task>/results.json` (or `eval/results.json`), `analysis/cka/cka.json`,
`analysis/cka-<arm>/cka.json`, `analysis/trajectory/trajectory.json`,
`analysis/transplant/transplant.json`, `analysis/drift-<arm>/drift.json` and
`needle/<arm>/needle.json`. Every file found is checked for its schema; a malformed one is an
error naming it. What is absent is recorded in `missing`, one entry a section.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from detour.errors import DetourError
from detour.analysis.layers import read_cka_layers
from detour.io import read_json_mapping
from detour.runs import TWINS_FILE, RunFolder, read_records

ROLES = ("detour", "baseline", "arm")


@dataclass
class Arm:
    name: str
    role: str  # detour | baseline | arm
    description: str | None
    folder: Path
    recipe: dict | None = None  # recipe.json
    summary: dict | None = None  # summary.json (or the arm's entry in twins.json)
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl: the training steps' records
    validation: list[dict] = field(default_factory=list)  # metrics.jsonl: the held-out records ("kind": "validation")
    model_config: dict | None = None  # model/config.json
    against: str | None = None  # the arm this one is compared with (study.json); None: the baseline


@dataclass
class Source:
    """One data source of the arms' recipes: the prepared folder and its manifest.json."""
    path: str  # as the recipe gives it
    weight: float | None
    manifest: dict | None
    manifest_path: Path | None
    problem: str | None = None  # why no manifest was read


@dataclass
class Study:
    root: Path
    layout: str  # "study" | "twins"
    name: str
    description: str | None
    meta: dict  # study.json, or {} for a twins folder
    arms: dict[str, Arm]
    twins: dict | None
    twins_path: Path | None
    sources: list[Source]
    eval_files: list[Path]
    eval_runs: list[dict]  # the runs of every results file, each with "arm" added
    cka: dict[str, dict]  # folder name (cka, cka-<arm>) -> cka.json
    trajectory: dict | None
    transplant: dict | None
    drift: dict[str, dict]  # arm -> drift.json
    needle: dict[str, dict]  # arm -> needle.json
    missing: list[str]  # sections not run, in words

    def role(self, role: str) -> str | None:
        return next((a.name for a in self.arms.values() if a.role == role), None)

    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)


def arm_of(label: str, arms) -> str:
    """The arm a model path names ('arms/detour/model' -> 'detour'), else its short display name."""
    from detour.eval.results import display_name

    parts = Path(str(label).rstrip("/")).parts
    for part in reversed(parts):
        if part in arms:
            return part
    return display_name(str(label).rstrip("/"))


def _read_arm(name: str, role: str, description: str | None, folder: Path, twins: dict | None) -> Arm:
    arm = Arm(name, role, description, folder)
    run = RunFolder(folder)
    if run.recipe.is_file():
        arm.recipe = read_json_mapping(run.recipe)
    if run.summary.is_file():
        arm.summary = read_json_mapping(run.summary)
    elif twins and name in (twins.get("arms") or {}):
        arm.summary = twins["arms"][name]
    if run.metrics.is_file():
        try:
            records = read_records(run.metrics)
        except json.JSONDecodeError as exc:
            raise DetourError(f"{run.metrics}: a line is not valid JSON ({exc})") from None
        arm.metrics = [r for r in records if "kind" not in r]
        arm.validation = [r for r in records if r.get("kind") == "validation"]
    if (run.model / "config.json").is_file():
        arm.model_config = read_json_mapping(run.model / "config.json")
    return arm


def _layout(root: Path) -> tuple[str, dict, Path | None]:
    if not root.is_dir():
        raise DetourError(f"{root}: no such folder (expected a study folder with study.json, "
                          "or a `detour twins` folder with twins.json)")
    if (root / "study.json").is_file():
        twins = next((p for p in (root / TWINS_FILE, root / "arms" / TWINS_FILE) if p.is_file()), None)
        return "study", read_json_mapping(root / "study.json"), twins
    if (root / TWINS_FILE).is_file():
        return "twins", {}, root / TWINS_FILE
    raise DetourError(f"{root}: neither a study folder (no study.json, written by `detour study`) nor a twins "
                      f"folder (no twins.json, written by `detour twins --out {root}`)")


def _arms(root: Path, layout: str, meta: dict, twins: dict | None) -> dict[str, Arm]:
    if layout == "study":
        declared = meta.get("arms")
        if not isinstance(declared, dict) or not declared:
            raise DetourError(f"{root / 'study.json'}: field 'arms' must map each arm's name to its role and description")
        out = {}
        for name, info in declared.items():
            info = info if isinstance(info, dict) else {}
            role = info.get("role", "arm")
            if role not in ROLES:
                raise DetourError(f"{root / 'study.json'}: arm {name!r} has role {role!r}; expected one of {', '.join(ROLES)}")
            out[name] = _read_arm(name, role, info.get("description"), root / "arms" / name, twins)
            out[name].against = info.get("against")
        return out
    names = list((twins or {}).get("arms") or {})
    if not names:
        raise DetourError(f"{root / TWINS_FILE}: no 'arms' in it (written by `detour twins`?)")
    return {n: _read_arm(n, n if n in ("detour", "baseline") else "arm", None, root / n, twins) for n in names}


def _resolve_source(path: str, root: Path) -> Path | None:
    """A recipe's data path is relative to where training ran: try there, then the folder's ancestors."""
    p = Path(path)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, *[a / p for a in (root, *root.resolve().parents)]]
    return next((c for c in candidates if (c / "manifest.json").is_file()), None)


def _sources(arms: dict[str, Arm], root: Path) -> list[Source]:
    recipe = next((a.recipe for a in arms.values() if a.role == "detour" and a.recipe), None) \
        or next((a.recipe for a in arms.values() if a.recipe), None)
    if recipe is None:
        return []
    out = []
    for entry in (recipe.get("data") or {}).get("sources") or []:
        path, weight = (entry.get("path"), entry.get("weight")) if isinstance(entry, dict) else (str(entry), None)
        folder = _resolve_source(str(path), root)
        if folder is None:
            out.append(Source(str(path), weight, None, None, "manifest.json not found (looked beside the "
                                                               "working folder and the run folder's parents)"))
        else:
            out.append(Source(str(path), weight, read_json_mapping(folder / "manifest.json"), folder / "manifest.json"))
    return out


def _eval(root: Path, arms) -> tuple[list[Path], list[dict]]:
    files = sorted({*root.glob("eval/results.json"), *root.glob("eval/*/results.json")})
    if not files:
        return [], []
    from detour.eval.pairing import load_runs

    runs = load_runs(files)
    for r in runs:
        r["arm"] = arm_of(r["model"], arms)
    return files, runs


def _by_name(root: Path, pattern: str, prefix: str, schema: str, arms) -> dict[str, dict]:
    """`analysis/drift-<arm>/drift.json` -> {arm: json}; `needle/<arm>/needle.json` likewise; in arm order."""
    found = {path.parent.name[len(prefix):]: path for path in sorted(root.glob(pattern))}
    order = [a for a in arms if a in found] + [a for a in found if a not in arms]
    return {a: read_json_mapping(found[a], schema) for a in order}


def collect(run_dir: str | Path) -> Study:
    root = Path(run_dir)
    layout, meta, twins_path = _layout(root)
    twins = read_json_mapping(twins_path) if twins_path else None
    arms = _arms(root, layout, meta, twins)
    files, runs = _eval(root, arms)
    cka = {p.parent.name: read_json_mapping(p, ("detour.cka/2", "detour.cka/1"))
           for p in sorted(root.glob("analysis/cka*/cka.json")) if p.parent.name == "cka" or p.parent.name.startswith("cka-")}
    for data in cka.values():
        data["layers"] = read_cka_layers(data)  # one layer numbering in the report, whatever the file's schema
    single = {}
    for name, schema in (("trajectory", "detour.trajectory/1"), ("transplant", "detour.transplant/1")):
        path = root / "analysis" / name / f"{name}.json"
        single[name] = read_json_mapping(path, schema) if path.is_file() else None
    study = Study(
        root=root, layout=layout, name=meta.get("name") or root.resolve().name,
        description=meta.get("description"), meta=meta, arms=arms, twins=twins, twins_path=twins_path,
        sources=_sources(arms, root), eval_files=files, eval_runs=runs, cka=cka,
        trajectory=single["trajectory"], transplant=single["transplant"],
        drift=_by_name(root, "analysis/drift-*/drift.json", "drift-", "detour.drift/1", arms),
        needle=_by_name(root, "needle/*/needle.json", "", "detour.needle/1", arms),
        missing=[],
    )
    study.missing = _missing(study)
    return study


def _missing(s: Study) -> list[str]:
    """What was not run, one phrase each, naming the file that would have held it."""
    out = []
    if s.twins is None:
        out.append("stream checks (no twins.json)")
    if not any(a.metrics for a in s.arms.values()):
        out.append("training curves (no arm has metrics.jsonl)")
    untrained = [a.name for a in s.arms.values() if a.summary is None]
    if untrained:
        out.append(f"training of {', '.join(untrained)} (no summary.json)")
    if not s.eval_runs:
        out.append("downstream evaluation (no eval/<task>/results.json)")
    else:
        planned = (s.meta.get("eval") or {}).get("tasks") or []
        done = {r["task"] for r in s.eval_runs}
        absent = [t for t in planned if t not in done and not (s.root / "eval" / str(t) / "results.json").is_file()]
        if absent:
            out.append(f"evaluation of {', '.join(absent)} (planned in study.json, no results)")
    if "cka" not in s.cka:
        out.append("CKA detour vs baseline (no analysis/cka/cka.json)")
    if s.trajectory is None:
        out.append("trajectory (no analysis/trajectory/trajectory.json)")
    if s.transplant is None:
        out.append("transplants (no analysis/transplant/transplant.json)")
    if not s.drift:
        out.append("weight drift (no analysis/drift-<arm>/drift.json)")
    if not s.needle:
        out.append("needle probe (no needle/<arm>/needle.json)")
    return out


def synthetic_reasons(s: Study) -> list[str]:
    """Every piece of data in the study that is SYNTHETIC, in words (empty when none is)."""
    out = []
    if s.meta.get("synthetic_data"):
        out.append("study.json: synthetic_data")
    if s.twins and s.twins.get("synthetic_data"):
        out.append("pretraining corpus (twins.json: synthetic_data)")
    for src in s.sources:
        man = src.manifest or {}
        for entry in man.get("sources") or []:
            if entry.get("synthetic"):
                out.append(f"pretraining source {entry.get('name')} ({entry.get('input')})")
    flagged = sorted({a.name for a in s.arms.values() if (a.summary or {}).get("synthetic_data")})
    if flagged and not any("pretraining" in r for r in out):
        out.append(f"pretraining data of {', '.join(flagged)} (summary.json)")
    tasks = sorted({r["task"] for r in s.eval_runs if _synthetic_task(r)})
    if tasks:
        out.append(f"evaluation task(s) {', '.join(tasks)}")
    for name, data in s.cka.items():
        if (data.get("config") or {}).get("synthetic_texts"):
            out.append(f"held-out texts of analysis/{name}")
    if s.trajectory and (s.trajectory.get("config") or {}).get("synthetic_texts"):
        out.append("held-out texts of the trajectory")
    needles = [a for a, d in s.needle.items() if (d.get("config") or {}).get("haystack") == "synthetic"]
    if needles:
        out.append(f"needle haystacks of {', '.join(needles)}")
    return out


def _synthetic_task(run: dict) -> bool:
    """A task flagged synthetic, or whose spec says so (detour.eval.synthetic_ner writes 'SYNTHETIC ...')."""
    spec = run.get("spec") if isinstance(run.get("spec"), dict) else {}
    return bool(run.get("synthetic") or spec.get("synthetic") or "SYNTHETIC" in str(spec.get("description", ""))
                or "synthetic" in str(run.get("task", "")).lower())
