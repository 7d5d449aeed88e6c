"""One study at several model sizes: each size pretrains its own base and runs the whole design.

    detour study studies/modernbert-scratch-capacity.yaml --out runs/capacity --dry-run

A study file with `sizes:` (and `base:`) is run once per size, as an ordinary study in
OUT/sizes/NAME/ (its own steps, cache, report), whose base recipe gets the size's `set` overrides
(its model.config) and whose arms get its `train_set`: one size after another, or, with `--jobs N`
or on SLURM, all at once, a driver each (detour.study.sizes_at_once). Every size's inputs are
checked before any size starts. When every size has finished, the capacity comparison across them
is written to OUT/capacity.json, OUT/report.md and OUT/report.html (detour.report.capacity;
`detour report OUT` rewrites it). One size after another, a size that stops or fails stops the
run; at once, a size that fails stops no other. Rerunning the same command keeps what finished,
as any study does. The sizes prepare the same
data: a size links the prepared folders another size has finished with the same key, rather than
tokenizing them again (link_prepared_elsewhere). Drivers of several sizes started at once tokenize
each corpus once too: the first to reach a prepare step claims it (PrepareClaim, a lock in
OUT/.study/prepare/), and the others wait for it, then link.

`--size NAME` (repeatable) runs or plans only the sizes named, for instance each size on a machine
of its own with the same --out on a shared disk, or the smaller sizes first; the comparison is then
written over the sizes that have finished, and names the others as not there yet. Drivers of
different sizes may run at once into one OUT (each size's folder has its own lock; OUT's is taken
only to write study.json and the comparison); the same size twice is refused.

    detour study studies/modernbert-scratch-capacity-20m.yaml --out runs/capacity-20m --size 4x256
"""

from __future__ import annotations

import hashlib
import json
from contextlib import ExitStack, contextmanager
from pathlib import Path

from detour.errors import DetourError
from detour.io import write_json
from detour.lock import FolderLocked, folder_lock, holder
from detour.report.capacity import SIZES_SCHEMA
from detour.study.spec import StudySpec


def size_spec(spec: StudySpec, size: str) -> StudySpec:
    """The study of one size: the base and arms with that size's overrides, named NAME-SIZE."""
    entry = spec.sizes[size]
    description = spec.description.strip()
    if entry.description:
        description = f"{description} Size {size}: {entry.description}".strip()
    return spec.model_copy(update={
        "name": f"{spec.name}-{size}",
        "description": description,
        "sizes": None,
        "base": spec.base.model_copy(update={"set": [*spec.base.set, *entry.set]}),
        "train": spec.train.model_copy(update={"set": [*spec.train.set, *entry.train_set]}),
    }, deep=True)


def size_folder(out: Path, size: str) -> Path:
    return Path(out) / "sizes" / size


def prepared_elsewhere(step, key: str, siblings: list[Path]) -> Path | None:
    """The prepared folder of another size that finished this prepare step with the same key (the
    same sources, tokenizer and options) and still holds the corpus it recorded; None if none does."""
    from detour.study.hashes import ContentHashes

    name = Path(step.hash_of).parent.name
    for sibling in siblings:
        try:
            record = json.loads((Path(sibling) / ".study" / "state.json").read_text())["steps"][step.name]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not started, or not this step yet
        manifest = Path(sibling) / "data" / name / "manifest.json"
        # a manifest is rewritten whenever prepare runs again there
        if record.get("key") == key and manifest.is_file() and \
                ContentHashes(None).of(manifest) == record.get("output_hash"):
            return manifest.parent
    return None


def link_prepared_elsewhere(step, key: str, siblings: list[Path]) -> Path | None:
    """A prepare step that another size has finished with the same key: its corpus linked into this
    size's folder instead of tokenized again (detour.data.outfolder.link_prepared). The folder linked
    from, or None to run the step."""
    from detour.data.outfolder import link_prepared

    theirs = prepared_elsewhere(step, key, siblings)
    if theirs is None:
        return None
    try:
        link_prepared(theirs, Path(step.hash_of).parent)
    except (DetourError, OSError) as exc:
        print(f"  could not link {theirs} ({exc}); preparing here", flush=True)
        return None
    return theirs


class PrepareClaim:
    """One driver at a time prepares a corpus the sizes share: a lock on
    OUT/.study/prepare/HASH (the step and its key), held from the moment a driver decides to
    prepare until the step has ended. A driver that finds it taken waits and then links what the
    holder made. The kernel lets go of a killed holder's lock, so a driver that dies mid-prepare
    leaves the step to the next one that reaches it."""

    def __init__(self, step, key: str, siblings: list[Path]):
        name = hashlib.sha256(f"{step.name}\n{key}".encode()).hexdigest()[:16]
        # the siblings are OUT/sizes/NAME: the claim lives in OUT, where every size's driver looks
        self.folder = Path(siblings[0]).parent.parent / ".study" / "prepare" / name
        self._held: ExitStack | None = None

    def take(self) -> bool:
        """True if this driver now holds the claim (or held it already); False if another does."""
        if self._held is None:
            stack = ExitStack()
            try:
                stack.enter_context(folder_lock(self.folder))
            except FolderLocked:
                return False
            self._held = stack
        return True

    def holder(self) -> str:
        return holder(self.folder) or "another size's driver, just letting go"

    def release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None


def chosen_sizes(spec: StudySpec, only: list[str] | None) -> list[str]:
    """The sizes to run: all of the study's, or those `--size` names (checked before anything runs)."""
    if spec.sizes is None:
        raise DetourError(f"--size {', '.join(only)}: study {spec.name} has no sizes: (a study file with a "
                          "sizes: section runs once per size)")
    if not only:
        return list(spec.sizes)
    unknown = [s for s in only if s not in spec.sizes]
    if unknown:
        raise DetourError(f"--size {', '.join(unknown)}: not a size of study {spec.name} "
                          f"(its sizes: {', '.join(spec.sizes)})")
    return [s for s in spec.sizes if s in only]  # the study file's order


@contextmanager
def naming(size: str):
    """An error of one size's study says which size (its `sizes.SIZE.set` may be what is wrong)."""
    try:
        yield
    except DetourError as exc:
        raise DetourError(f"size {size}: {exc}") from None


def run_sizes(spec: StudySpec, out: Path, dry_run: bool, run_one, only: list[str] | None, options, check_one,
              study_file: Path | None = None) -> int:
    """Run (or plan) each size's study with `run_one(spec, folder, dry_run)`, then the comparison;
    with `only`, just those sizes, once `check_one(spec, folder)` has checked every size's inputs.
    With slots to share (--jobs N) or SLURM, and the study's file to start them from, the sizes run
    at once, a driver each (detour.study.sizes_at_once)."""
    from detour.study.sizes_at_once import at_once, describe, run_sizes_at_once

    out = Path(out)
    chosen = chosen_sizes(spec, only)
    together = study_file is not None and at_once(options, chosen)
    if out.exists() and not out.is_dir():
        raise DetourError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / ".study").is_dir():
        raise DetourError(f"--out {out}: a non-empty folder that is not a study folder (no .study inside); "
                          "choose a new or empty folder")
    studies = {size: size_spec(spec, size) for size in spec.sizes}
    if dry_run:
        print(f"study {spec.name}: {len(studies)} sizes ({', '.join(studies)}), each a study in {out / 'sizes'}/"
              + (f"; this run: {', '.join(chosen)}" if len(chosen) < len(studies) else ""))
        for size in chosen:
            sub = studies[size]
            print(f"\n== size {size}")
            with naming(size):
                rc = run_one(sub, size_folder(out, size), True, [size_folder(out, s) for s in studies if s != size])
            if rc:
                return rc
        if together:
            print(f"\n{describe(options, chosen)}")
        print(f"\nthen: the capacity comparison across sizes -> {out / 'report.md'}")
        return 0
    for size in chosen:  # every size's inputs, and no size already running, before any size starts
        with naming(size):
            check_one(studies[size], size_folder(out, size))
        if (running := holder(size_folder(out, size))) is not None:
            raise DetourError(f"size {size}: {size_folder(out, size)} is in use by {running}; stop that driver "
                              "or leave this size out (--size)")
    (out / ".study").mkdir(parents=True, exist_ok=True)
    # OUT's own lock is held only while OUT's files are written. Each size is an ordinary study that
    # holds its own folder's lock for its whole run, so drivers of different sizes (one machine each,
    # or one SLURM driver each, on a shared --out) run side by side, and one size never runs twice.
    with folder_lock(out, wait_s=60):  # the other sizes' drivers hold it a file's write at a time
        write_json(out / "study.json", {"schema": SIZES_SCHEMA, "name": spec.name, "description": spec.description,
                                        "sizes": {s: str(Path("sizes") / s) for s in studies}})
    if together:
        rc = run_sizes_at_once(Path(study_file).resolve(), out, options, chosen)
        if rc:
            return rc
        chosen = []  # every size finished in its own driver
    for size in chosen:
        print(f"== size {size}: {size_folder(out, size)}", flush=True)
        # the data each size prepares alike is tokenized once: a later size links what an earlier one made
        siblings = [size_folder(out, s) for s in studies if s != size]
        with naming(size):
            rc = run_one(studies[size], size_folder(out, size), False, siblings)
        if rc:
            print(f"detour study: size {size} did not finish (exit {rc}); run the same command again to "
                  "continue (finished steps are kept)")
            return rc
    from detour.report.capacity import write_capacity_report

    with folder_lock(out, wait_s=60):
        written = write_capacity_report(out)
    print(f"capacity comparison: {written['markdown']} and {written['html']}")
    return 0

