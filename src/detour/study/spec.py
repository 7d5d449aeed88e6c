"""The study file: a matched study as data — data to prepare, a recipe, arms, tasks, analyses.

    detour study studies/tiny.yaml --out runs/study-tiny --dry-run

A study file is YAML (docs/study.md has a full example). Paths in it (the recipe, local corpora,
task spec files) resolve against the study file's folder. Every field is typed: a wrong or unknown
field is refused before anything runs, with its dotted name (`eval.seeds: ...`). Analysis options
are the flags of the analysis verb itself (`n: 200` is `--n 200`), checked by that verb's own parser
when the study is loaded.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from detour.errors import DetourError
from detour.study.resources import Resources

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # usable as a folder name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrepareSpec(_Strict):
    """One `detour prepare` run: its sources and tokenizer."""

    sources: list[str] = Field(min_length=1, description="prepare sources: files, hf:..., synthetic:..., each with optional :WEIGHT")
    tokenizer: str = Field(description="tokenizer hub name, folder or alias (minilm-l6)")
    text_field: str | None = None
    blank_line_docs: bool = False
    workers: int | None = Field(None, gt=0)
    validation: float | int | None = Field(
        None, description="hold out documents of each source into data/NAME/validation/ (`--validation`): "
                          "a fraction below 1 (0.02) or a count of documents (200)")
    validation_seed: int | None = Field(None, ge=0, description="seed of the draw of the held-out documents "
                                                                "(`--validation-seed`; default 0)")

    @field_validator("validation", mode="before")
    @classmethod
    def _amount(cls, value):
        # as `detour prepare --validation` reads it: 0.02 is a share, 200 a count; 1.0, 0, true are neither
        if value is None:
            return None
        if isinstance(value, float) and 0 < value < 1 or isinstance(value, int) and not isinstance(value, bool) \
                and value >= 1:
            return value
        raise ValueError(f"expected a fraction between 0 and 1 (0.02) or a whole count of documents (200), "
                         f"got {value!r}")

    @field_validator("validation_seed")
    @classmethod
    def _seed_needs_split(cls, value, info):
        if value is not None and info.data.get("validation") is None:
            raise ValueError("a seed of no draw: set validation (a fraction or a count of documents) too")
        return value


class TrainSpec(_Strict):
    recipe: str = Field(description="the detour's recipe file (its MLM twin is derived from it)")
    set: list[str] = Field(default_factory=list, description="recipe overrides, KEY=VALUE as with --set")
    data: list[str] | None = Field(None, description="names of `prepare` entries to train on, replacing the recipe's data.sources")


class BaseSpec(_Strict):
    """An encoder the study pretrains itself (an MLM recipe, typically from a `model.config`): exported as
    a stock masked LM with its head into OUT/base/model, it is where every arm starts."""

    recipe: str = Field(description="the base's recipe file: every phase MLM (pretraining from scratch or continued)")
    set: list[str] = Field(default_factory=list, description="recipe overrides, KEY=VALUE as with --set")
    data: list[str] | None = Field(None, description="names of `prepare` entries to pretrain on, replacing the recipe's data.sources")


class SizeSpec(_Strict):
    """One model size of a study run at several sizes: overrides of the base's recipe (its model.config)
    and of the arms' recipe; the study runs once per size, into OUT/sizes/NAME/."""

    set: list[str] = Field(default_factory=list, description="overrides of the base recipe, e.g. model.config.hidden_size=256")
    train_set: list[str] = Field(default_factory=list, description="overrides of the arms' recipe at this size (e.g. the peak lr)")
    description: str | None = None


class ArmSpec(_Strict):
    """An extra arm: the detour's (or the baseline's) recipe with overrides."""

    base: Literal["detour", "baseline"] = "detour"
    set: list[str] = Field(default_factory=list, description="recipe overrides of the base arm, KEY=VALUE")
    freeze: str | None = Field(None, description="LAYERS@PHASE: freeze these layers (low, mid, late or 0-3) during that phase")
    description: str | None = None
    against: str | None = Field(None, description="the arm this one is compared with in the report's significance "
                                                  "table, held-out losses and CKA (default: the baseline), e.g. a "
                                                  "detour decay against the twin's decay of the same length")
    noise_floor: str | None = Field(None, description="the second-seed arm that is this arm's CKA noise floor "
                                                      "(default: analyses.cka.noise_floor), e.g. a second-seed twin "
                                                      "with the same decay as the arm it is compared with")


class SyntheticTaskSpec(_Strict):
    """A SYNTHETIC NER task generated from the embedded clinical generator (never a real result)."""

    train: int = Field(300, gt=0)
    validation: int = Field(100, gt=0)
    test: int = Field(200, gt=0)
    seed: int = 1000  # documents of another generator seed than the pretraining default (0)
    lang: Literal["en", "fr"] = "en"


class EvalSpec(_Strict):
    tasks: list[str] = Field(default_factory=list, description="shipped task names or task spec files")
    synthetic_ner: SyntheticTaskSpec | None = None
    arms: list[str] | None = Field(None, description="arms to evaluate (default: every arm)")
    seeds: int = Field(3, gt=0)
    epochs: int | None = Field(None, gt=0)
    max_train: int | None = Field(None, gt=0)
    max_eval: int | None = Field(None, gt=0)
    max_length: int | None = Field(None, gt=0)
    lr: float | None = Field(None, gt=0)
    batch_size: int | None = Field(None, gt=0)
    linear_probe: bool = False
    data_root: str | None = Field(None, description="where task data paths resolve (default $DETOUR_DATA_ROOT or ../shared/data)")


class CKASpec(_Strict):
    noise_floor: str | None = Field(None, description="a second-seed baseline arm: the CKA noise floor")
    arms: list[str] = Field(default_factory=list, description="more arms compared with the baseline (e.g. freeze arms)")
    options: dict[str, Any] = Field(default_factory=dict, description="flags of `detour analyze cka`")


class TrajectorySpec(_Strict):
    a: str = "detour"
    b: str = "baseline"
    noise_floor: str | None = None
    options: dict[str, Any] = Field(default_factory=dict, description="flags of `detour analyze trajectory`")


class TransplantSpec(_Strict):
    src: str = "detour"
    dst: str = "baseline"
    options: dict[str, Any] = Field(default_factory=dict, description="flags of `detour analyze transplant`")


class DriftSpec(_Strict):
    arms: list[str] = Field(default_factory=lambda: ["detour", "baseline"],
                            description="arms whose weights are compared with the starting model")


class NeedleSpec(_Strict):
    arms: list[str] = Field(default_factory=lambda: ["detour", "baseline"])
    options: dict[str, Any] = Field(default_factory=dict, description="flags of `detour needle`")


class AnalysesSpec(_Strict):
    cka: CKASpec | None = None
    trajectory: TrajectorySpec | None = None
    transplant: TransplantSpec | None = None
    drift: DriftSpec | None = None
    needle: NeedleSpec | None = None


class StudySpec(_Strict):
    name: str
    description: str = ""
    prepare: dict[str, PrepareSpec] = Field(default_factory=dict)
    base: BaseSpec | None = Field(None, description="pretrain the encoder the arms start from (OUT/base/)")
    sizes: dict[str, SizeSpec] | None = Field(None, description="run the study at each of these model sizes, "
                                                                  "then compare them (needs base)")
    train: TrainSpec
    arms: dict[str, ArmSpec] = Field(default_factory=dict)
    eval: EvalSpec | None = None
    analyses: AnalysesSpec = Field(default_factory=AnalysesSpec)
    report: bool = True
    resources: Resources = Field(default_factory=Resources, description="what each step kind asks of the machine or "
                                 "the SLURM cluster (detour.study.resources; docs/cluster.md)")
    root: str = Field("", description="the study file's folder (set by the loader)")

    @field_validator("prepare", "arms", "sizes")
    @classmethod
    def _names(cls, value: dict | None) -> dict | None:
        if value is None:
            return value
        for name in value:
            if not NAME.match(name) or name in ("detour", "baseline"):
                raise ValueError(f"{name!r} is not usable as a name (letters, digits, . _ -; not detour or baseline)")
        return value

    def path(self, p: str) -> Path:
        """A path of the study file, resolved against its folder (absolute paths stay)."""
        q = Path(p).expanduser()
        return (q if q.is_absolute() else Path(self.root) / q).resolve()

    def arm_names(self) -> list[str]:
        return ["detour", "baseline", *self.arms]


def load_study(path: str | Path) -> StudySpec:
    from detour.io import read_yaml_mapping, why_missing

    path = Path(path)
    if not path.is_file():
        why = why_missing(path)
        raise DetourError(f"study file {path}: {why}" if why not in (None, "no such file or folder")
                          else f"study file {path}: not found")
    return study_from_dict(read_yaml_mapping(path, "study file"), path, path.resolve().parent)


def study_from_dict(raw, where: Path, root: Path) -> StudySpec:
    """A study from its parsed YAML; paths in it resolve against `root`."""
    if not isinstance(raw, dict):
        raise DetourError(f"study file {where}: expected a mapping of fields (name, train, arms, eval, analyses)")
    raw = {**raw, "root": str(root)}
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise DetourError(f"study file {where}: " + "; ".join(lines)) from None
    check_references(spec, where)
    return spec


def check_references(spec: StudySpec, where: Path) -> None:
    """Arms, data names and files the study names must exist; analysis options must parse."""
    arms = spec.arm_names()

    def need_arm(field: str, name: str | None) -> None:
        if name is not None and name not in arms:
            raise DetourError(f"study file {where}: {field}: no arm {name!r} (the arms: {', '.join(arms)})")

    for name, prep in spec.prepare.items():
        _check_held_out_count(where, name, prep)
    for field, part in (("train", spec.train), ("base", spec.base)):  # the arms' recipe and data, the base's
        if part is None:
            continue
        if not spec.path(part.recipe).is_file():
            raise DetourError(f"study file {where}: {field}.recipe: {spec.path(part.recipe)} not found")
        for i, name in enumerate(part.data or []):
            if name not in spec.prepare:
                raise DetourError(f"study file {where}: {field}.data.{i}: {name!r} is not a `prepare` entry "
                                  f"(entries: {', '.join(spec.prepare) or 'none'})")
    if spec.sizes is not None:
        if spec.base is None:
            raise DetourError(f"study file {where}: sizes: a study at several sizes pretrains each size's encoder: "
                              "give `base` (its recipe, with the sizes' model.config overrides in sizes.NAME.set)")
        if not spec.sizes:
            raise DetourError(f"study file {where}: sizes: name at least one size")
    for name, arm in spec.arms.items():
        if not arm.set and not arm.freeze:
            raise DetourError(f"study file {where}: arms.{name}: give `set` overrides or `freeze` (or it is the {arm.base})")
        if arm.freeze and arm.base != "detour":
            raise DetourError(f"study file {where}: arms.{name}.freeze: freeze arms are made from the detour")
        need_arm(f"arms.{name}.against", arm.against)
        if arm.against == name:
            raise DetourError(f"study file {where}: arms.{name}.against: an arm is not compared with itself")
        need_arm(f"arms.{name}.noise_floor", arm.noise_floor)
        if arm.noise_floor is not None and arm.noise_floor in (name, arm.against or "baseline"):
            raise DetourError(f"study file {where}: arms.{name}.noise_floor: the noise floor is a third arm, "
                              f"not {arm.noise_floor!r} (the arm itself or the one it is compared with)")
    if spec.eval is not None:
        for i, name in enumerate(spec.eval.arms or []):
            need_arm(f"eval.arms.{i}", name)
        if not spec.eval.tasks and spec.eval.synthetic_ner is None:
            raise DetourError(f"study file {where}: eval: name at least one task (eval.tasks or eval.synthetic_ner)")
    a = spec.analyses
    if a.cka is not None:
        need_arm("analyses.cka.noise_floor", a.cka.noise_floor)
        for i, name in enumerate(a.cka.arms):
            need_arm(f"analyses.cka.arms.{i}", name)
        _check_options(where, "analyses.cka.options", ["analyze", "cka"], a.cka.options, ["A", "B"])
    if a.trajectory is not None:
        for field in ("a", "b", "noise_floor"):
            need_arm(f"analyses.trajectory.{field}", getattr(a.trajectory, field))
        _check_options(where, "analyses.trajectory.options", ["analyze", "trajectory"], a.trajectory.options, ["A", "B"])
    if a.transplant is not None:
        need_arm("analyses.transplant.src", a.transplant.src)
        need_arm("analyses.transplant.dst", a.transplant.dst)
        _check_options(where, "analyses.transplant.options", ["analyze", "transplant"], a.transplant.options,
                       ["--src", "A", "--dst", "B"])
    if a.drift is not None:
        for i, name in enumerate(a.drift.arms):
            need_arm(f"analyses.drift.arms.{i}", name)
    if a.needle is not None:
        for i, name in enumerate(a.needle.arms):
            need_arm(f"analyses.needle.arms.{i}", name)
        _check_options(where, "analyses.needle.options", ["needle"], a.needle.options, ["M"])


def _check_held_out_count(where: Path, name: str, prep: PrepareSpec) -> None:
    """A count of held-out documents must leave a synthetic source (whose size the study file says) some to train on."""
    if not isinstance(prep.validation, int):
        return
    from detour.data.sources import parse_source

    for i, source in enumerate(prep.sources):
        if not source.startswith("synthetic:"):
            continue
        try:
            docs = parse_source(source).options["docs"]
        except DetourError as exc:
            raise DetourError(f"study file {where}: prepare.{name}.sources.{i}: {exc}") from None
        if prep.validation >= docs:
            raise DetourError(f"study file {where}: prepare.{name}.validation: {prep.validation} documents held out "
                              f"of {source}, which has {docs}; at least one must stay for training")


RESERVED = {"out", "noise_floor", "src", "dst"}  # set by the study itself


def option_flags(options: dict[str, Any]) -> list[str]:
    """{"max_length": 64, "linear": true} -> ["--max-length", "64", "--linear"]."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)] if key == "blocks" else [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit
        raise _Refused(message)


def _check_options(where: Path, field: str, verb: list[str], options: dict[str, Any], positional: list[str]) -> None:
    reserved = RESERVED & set(options)
    if reserved:
        raise DetourError(f"study file {where}: {field}.{sorted(reserved)[0]}: set by the study itself, not an option here")
    parser = _Parser(prog="detour " + " ".join(verb))
    if verb[0] == "analyze":
        from detour.analysis import run as analysis_run

        analysis_run.add_arguments(parser)  # its subparsers are _Parser too: errors come back here
    else:
        from detour.analysis import needle

        needle.add_arguments(parser)
    try:
        parser.parse_args(verb[1:] + positional + option_flags(options))
    except _Refused as exc:
        raise DetourError(f"study file {where}: {field}: {exc}") from None
