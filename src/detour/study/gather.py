"""The gather step of a study's evaluation: each arm's runs on a task into OUT/eval/TASK/results.json.

    detour study studies/tiny.yaml --out runs/study-tiny   # eval:synthetic-ner gathers eval/synthetic-ner/arms/*/

Every evaluated arm is fine-tuned by its own step (`eval:TASK:ARM`, `detour eval` of that arm alone
into OUT/eval/TASK/arms/ARM/), so an arm's evaluation waits for its own training only and a changed
arm reruns its own fine-tunes only. The report and `detour compare` read one results.json per task
with every arm in it: this step writes it from the arms' files, in the study's arm order, through
the same writer as `detour eval` (detour.eval.results), so it holds what one `detour eval` call of
all the arms would have written: the same runs in the same order, the same config and summary, and
results.md beside it. A seed's score does not depend on which call ran it (the same examples, the
same seeded fine-tune).
"""

from __future__ import annotations

from pathlib import Path

from detour.errors import DetourError
from detour.eval.results import Results
from detour.lock import folder_lock


def gather(sources: list[str | Path], into: Path) -> int:
    """Write into/results.json (and results.md) from the runs of each source results.json, in order;
    returns the number of runs."""
    runs: list[dict] = []
    seen: dict[tuple, Path] = {}
    for source in map(Path, sources):
        if not source.is_file():
            raise DetourError(f"{source}: not found; its evaluation step did not write it")
        for run in Results.open(source.parent).runs:
            where = (run["model"], run["task"], run["seed"])
            if where in seen:  # two arms' steps cannot evaluate one model: a table row would hide one
                raise DetourError(f"{source} and {seen[where]} both hold {where[0]} {where[1]} seed {where[2]}")
            seen[where] = source
            runs.append(run)
    into.mkdir(parents=True, exist_ok=True)
    # not under a `detour eval` that an earlier study left writing into this folder
    with folder_lock(into):
        Results(into, runs).write()
    return len(runs)


def run_gather(step, out: Path) -> None:
    """The study's `gather` step (detour.study.graph): its sources are in step.spec["results"]."""
    into = step.hash_of.parent
    n = gather(step.spec["results"], into)
    print(f"  gathered {n} run(s) of {len(step.spec['results'])} arm(s) into {into / 'results.json'}", flush=True)
