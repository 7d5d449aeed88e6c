"""A study folder's record of its steps: OUT/.study/state.json (what finished, under which key) and
OUT/.study/log.jsonl (every start, end and stop), and each step's state read from them.

    python -c "from pathlib import Path; from detour.study.state import State; \
print(State(Path('runs/study-tiny')).steps.keys())"
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from detour.io import write_json
from detour.study.graph import Step, step_key
from detour.study.hashes import ContentHashes

STATE_SCHEMA = "detour.study-state/1"


class State:
    """OUT/.study/state.json (what finished, with which key) and OUT/.study/log.jsonl (every event)."""

    def __init__(self, out: Path):
        self.dir = out / ".study"
        self.path = self.dir / "state.json"
        data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.steps: dict[str, dict] = data.get("steps", {})
        self.started: dict[str, str] = data.get("started", {})
        self.jobs: dict[str, dict] = data.get("jobs", {})  # SLURM: step -> its job (id, key, attempts)
        self.content = ContentHashes(self.dir / "hashes.json")

    def save(self) -> None:
        write_json(self.path, {"schema": STATE_SCHEMA, "steps": self.steps, "started": self.started,
                               **({"jobs": self.jobs} if self.jobs else {})})
        self.content.save()

    def event(self, step: str, event: str, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        line = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "step": step, "event": event, **fields}
        with open(self.dir / "log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")


def plan(steps: list[Step], out: Path, state: State) -> dict[str, str]:
    """Each step's state: done, to run, stale (finished before, inputs changed) or resume (half done)."""
    hashes, states = {}, {}
    for step in steps:
        record = state.steps.get(step.name)
        if any(d not in hashes for d in step.deps):
            states[step.name] = "stale" if record else "to run"  # its inputs are not there yet
            continue
        key = step_key(step, out, hashes, state.content)
        if record and record["key"] == key and all(p.exists() for p in step.outputs):
            states[step.name] = "done"
            hashes[step.name] = record["output_hash"]
        elif record:
            states[step.name] = "stale"
        else:
            states[step.name] = "resume" if state.started.get(step.name) == key else "to run"
    return states
