"""Task specs (YAML) and the two registries that make `detour eval` extensible.

    detour eval <model folder> --tasks ncbi-disease,gad --seeds 1 --epochs 1 --max-train 64

A task is a small YAML spec (see `src/detour/eval/tasks/*.yaml`): name, `type` (what head and
metrics), `format` (which reader), the split files or a seeded split rule, labels, headline
metric, max length and training settings. Two registries map names to code:

- `FORMATS`: format name -> reader `read(path, spec) -> list[dict]` (one dict per example).
- `TASK_TYPES`: type name -> a `TaskType` object (encode examples, build the head, decode, score).

Plugins register with one line (`@register_format("brat_nested", options=(...))`,
`register_task_type(...)`) in their own module, listed in `PLUGIN_MODULES`; this module imports
none of them at import time, so any plugin can import it without a cycle. A format that declares
its `options` (and a task type its `spec_options`) gets misspelt option keys reported instead of
silently ignored (see detour.eval.validate).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from detour.errors import DetourError
from detour.io import read_yaml_mapping

# Modules whose import registers formats and task types. Add a plugin by adding its module here.
PLUGIN_MODULES: list[str] = [
    "detour.eval.formats",
    "detour.eval.tasktypes",
    "detour.eval.brat",
    "detour.eval.nested",
]

FORMATS: dict[str, Callable[..., list[dict]]] = {}
FORMAT_OPTIONS: dict[str, frozenset[str]] = {}  # format -> the `options` keys its reader reads
TASK_TYPES: dict[str, Any] = {}

SPEC_DIR = Path(__file__).with_name("tasks")


def register_format(name: str, options: tuple[str, ...] | None = None):
    """Decorator: `@register_format("iob", options=("columns",))` on
    `def read(path: Path, spec: TaskSpec, split: str = "") -> list[dict]`. `options` lists the
    spec.options keys the reader reads; None (not declared) leaves option keys unchecked."""

    def deco(fn):
        FORMATS[name] = fn
        if options is not None:
            FORMAT_OPTIONS[name] = frozenset(options)
        else:
            FORMAT_OPTIONS.pop(name, None)
        return fn

    return deco


def register_task_type(task_type) -> Any:
    """Register an object with `.name` and the `TaskType` methods (see detour.eval.tasktypes)."""
    TASK_TYPES[task_type.name] = task_type
    return task_type


def _load_plugins() -> None:
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside the plugin
                raise


def get_format(name: str):
    _load_plugins()
    if name not in FORMATS:
        raise DetourError(f"unknown task format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]


def get_task_type(name: str):
    _load_plugins()
    if name not in TASK_TYPES:
        raise DetourError(f"unknown task type {name!r}; known: {', '.join(sorted(TASK_TYPES))}")
    return TASK_TYPES[name]


class Training(BaseModel):
    """Fine-tuning settings; the shipped specs carry the paper's per-task defaults."""

    model_config = ConfigDict(extra="forbid")
    epochs: int = Field(10, ge=1, description="passes over train; the best epoch is kept")
    lr: float = Field(5e-5, gt=0, description="peak learning rate (AdamW, linear decay)")
    head_lr: float | None = Field(None, gt=0, description="learning rate of the head (default: lr)")
    batch_size: int = Field(16, ge=1)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="share of steps with linear warmup")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout before the head")
    group_by_length: bool = Field(True, description="train on batches of inputs of about the same length "
                                                    "(seeded shuffle, then sorted within chunks of 50 batches)")


class SplitRule(BaseModel):
    """How to make missing splits: by document (never cutting a document), seeded."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, description="split seed, the same for every model and run seed")
    validation_from_train: float = Field(0.1, gt=0, lt=1, description="share of train documents")
    ratios: tuple[float, float, float] = Field((0.8, 0.1, 0.1), description="train/validation/test, when there is one file")


class TaskSpec(BaseModel):
    """One downstream task. Paths are relative to the data root unless absolute."""

    model_config = ConfigDict(extra="forbid")
    name: str
    type: str = Field(description="task type: ner, classification, relation, multilabel, ...")
    format: str = Field(description="reader: iob, tsv, csv, jsonl, hoc, brat_doc_codes, brat_entities, hf, ...")
    description: str = ""
    data: dict[str, str] = Field(description="split -> path: train/validation/test, or all")
    split: SplitRule = Field(default_factory=SplitRule)
    labels: list[str] | None = Field(None, description="label set; default: the labels seen in train")
    headline: str = "macro_f1"
    max_length: int = Field(256, ge=8)
    long_inputs: Literal["truncate", "window"] = "truncate"
    stride: int = Field(64, ge=0, description="tokens shared by consecutive windows")
    pooling: Literal["cls", "mean"] = "cls"
    training: Training = Field(default_factory=Training)
    options: dict[str, Any] = Field(default_factory=dict, description="reader options (columns, header, ...)")
    source: str = Field("", description="where the spec came from (set by the loader)")
    root: str = Field("", description="data root the paths resolve against (set by the loader)")

    @model_validator(mode="after")
    def _check_data(self):
        keys = set(self.data)
        if not keys or not keys <= {"train", "validation", "test", "all"}:
            raise ValueError(f"data must map train/validation/test (or all) to paths, got {sorted(keys)}")
        if "all" in keys and len(keys) > 1:
            raise ValueError("data: give either `all` or train/validation/test, not both")
        if "all" not in keys and "train" not in keys:
            raise ValueError("data: a `train` path is needed (or `all` for a seeded split)")
        if "all" not in keys and "test" not in keys:
            raise ValueError("data: a `test` path is needed (or `all` for a seeded split)")
        return self

    def path(self, split: str) -> Path | str:
        """Resolved path of a split; HF dataset names that are not files are returned as given."""
        raw = self.data[split]
        if self.format == "hf" and not _looks_local(raw, self.root):
            return raw
        p = Path(os.path.expanduser(raw))
        return p if p.is_absolute() else Path(self.root) / p


def _looks_local(raw: str, root: str) -> bool:
    p = Path(os.path.expanduser(raw))
    return p.is_absolute() or (Path(root) / p).exists() or raw.startswith(".")


def default_data_root(explicit: str | None = None) -> Path:
    """--data-root, else $DETOUR_DATA_ROOT, else ../shared/data relative to the working directory."""
    return Path(explicit or os.environ.get("DETOUR_DATA_ROOT") or Path.cwd().parent / "shared" / "data")


def shipped_tasks() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def load_spec(name_or_path: str | Path, data_root: str | Path | None = None) -> TaskSpec:
    """A shipped task by name, or a spec file by path; errors name the file and the field."""
    path = Path(name_or_path)
    if not path.suffix and (SPEC_DIR / f"{name_or_path}.yaml").exists():
        path = SPEC_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise DetourError(
            f"no task {str(name_or_path)!r}: not a spec file and not a shipped task ({', '.join(shipped_tasks())})"
        )
    raw = read_yaml_mapping(path, "task spec")
    raw.setdefault("source", str(path))
    raw["root"] = str(default_data_root(str(data_root) if data_root else None))
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        lines = [_field_error(e) for e in exc.errors()]
        raise DetourError(f"{path}: invalid task spec:\n  " + "\n  ".join(lines)) from None
    check_spec(spec)  # type, format, option keys, headline: before any data is read
    return spec


# ---- checks of a spec without its data (the registries above are all they need) ----

def _where(spec: TaskSpec) -> str:
    return spec.source or f"task {spec.name}"


def check_spec(spec: TaskSpec) -> None:
    """What can be checked without data: type, format, option keys, headline (per-type names aside)."""
    try:
        task_type = get_task_type(spec.type)
        get_format(spec.format)
    except DetourError as exc:  # a spec with a typo in `type:` or `format:` names its own file
        field = "type" if str(exc).startswith("unknown task type") else "format"
        raise DetourError(f"{_where(spec)}: {field}: {exc}") from None
    problems = []
    format_options = FORMAT_OPTIONS.get(spec.format)
    type_options = getattr(task_type, "spec_options", None)
    if format_options is not None and type_options is not None:  # both declared: every key is accounted for
        known = set(format_options) | set(type_options)
        unknown = sorted(set(spec.options) - known)
        if unknown:
            problems.append(
                f"{_where(spec)}: options: unknown key(s) {', '.join(unknown)} for format {spec.format!r} and "
                f"type {spec.type!r}; known: {', '.join(sorted(known)) or 'none'}"
            )
    names = _metric_names(task_type, None)
    if names is not None:
        per_type = getattr(task_type, "per_type_f1", False)
        if spec.headline not in names and not (per_type and spec.headline.startswith("f1/") and len(spec.headline) > 3):
            problems.append(_headline_error(spec, names + (["f1/<type>"] if per_type else [])))
    if spec.labels is not None and len(set(spec.labels)) != len(spec.labels):
        dupes = sorted({x for x in spec.labels if spec.labels.count(x) > 1})
        problems.append(f"{_where(spec)}: labels: {dupes} listed more than once")
    if problems:
        raise DetourError("\n".join(problems))


def _metric_names(task_type, labels) -> list[str] | None:
    fn = getattr(task_type, "metric_names", None)
    return fn(labels) if fn is not None else None


def _headline_error(spec: TaskSpec, valid: list[str]) -> str:
    return (f"{_where(spec)}: headline: {spec.headline!r} is not a metric of task type {spec.type!r}; "
            f"valid: {', '.join(valid)}")



# The models whose fields a spec key can belong to, by where the key sits.
_SECTIONS = {(): TaskSpec, ("training",): Training, ("split",): SplitRule}


def _field_error(err: dict) -> str:
    """One pydantic error as `field: message`; an unknown key also lists the known ones."""
    loc = tuple(str(x) for x in err["loc"])
    line = f"{'.'.join(loc) or '(spec)'}: {err['msg']}"
    model = _SECTIONS.get(loc[:-1])
    if err["type"] == "extra_forbidden" and model is not None:
        known = [k for k in model.model_fields if k not in ("source", "root")]
        line += f" (unknown key; known: {', '.join(known)})"
    return line


def load_specs(tasks: list[str], spec_files: list[str], data_root: str | Path | None = None) -> list[TaskSpec]:
    """The specs of `detour eval --tasks a,b --task-spec FILE ...`, each task once.

    A `--tasks` entry is a shipped task name, a spec file, or the `name:` of one of the
    `--task-spec` files (then it means that file, so `--task-spec specs/x.yaml --tasks x` runs x
    once). Order: the `--tasks` entries, then the `--task-spec` files no entry named.
    """
    if not tasks and not spec_files:
        raise DetourError("no task: give --tasks a,b,c and/or --task-spec FILE (see --list-tasks)")
    problems: list[str] = []

    def load(name_or_path):  # every spec's problems are reported together, not the first one only
        try:
            return load_spec(name_or_path, data_root)
        except DetourError as exc:
            problems.append(str(exc))
            return None

    from_files = [s for s in map(load, spec_files) if s is not None]
    picked: list[TaskSpec] = []
    used: set[int] = set()
    for entry in tasks:
        match = next((i for i, s in enumerate(from_files) if entry == s.name or _same_file(entry, s.source)), None)
        if match is None:
            if problems and not Path(entry).exists() and entry not in shipped_tasks():
                continue  # most likely the name of a spec file that failed to load: already reported
            spec = load(entry)
            if spec is not None:
                picked.append(spec)
        elif match in used:
            raise DetourError(f"task {entry!r} given twice in --tasks")
        else:
            used.add(match)
            picked.append(from_files[match])
    if problems:
        raise DetourError("\n".join(problems))
    picked += [s for i, s in enumerate(from_files) if i not in used]
    seen: dict[str, str] = {}
    for s in picked:
        if s.name in seen:
            raise DetourError(f"task {s.name!r} given twice ({seen[s.name]} and {s.source}); "
                              "each task name may appear once (rename one spec's `name:`)")
        seen[s.name] = s.source
    return picked


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).exists() and Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False
