"""`detour compare`: is model A's gain over model B real? A paired bootstrap over tasks x seeds.

    detour compare runs/eval/results.json --a detour-base --b mlm-base
    detour compare runs/eval/results.json detour-base mlm-base          # the same, positional
    detour compare detour/results.json mlm/results.json          # one model in each file: A, then B
    detour compare results.json --a A --b B --tasks ncbi-disease,gad --metric micro_f1 --json cmp.json
    detour compare one-seed.json --a A --b B --allow    # compare anyway; the output carries WARNINGs

Reads the `results.json` written by `detour eval` (schema `detour.eval/1`), from one file or several.
For each task only seeds run by both models count, and the two models' scores are paired by seed.
The statistic is the mean over tasks of the mean difference A - B. Each bootstrap resample draws, for
every task, seeds with replacement, with the SAME draw applied to both models (so it resamples the
paired differences). The p-value uses the shift method (the resampled statistics, centred on their
mean, stand in for the null) with add-one smoothing,

    p = (1 + #{ |d* - mean(d*)| >= |d| }) / (1 + N),

so two identical arms give p = 1. The 95% confidence interval is the percentile interval of d*.
The metric is each run's headline metric unless `--metric` names another one.

Small-sample correction (on by default, `--no-correction` turns it off): with few seeds (the paper
ran 5 to 9) a plain bootstrap of a mean is anti-conservative, because the resampled variance is
(n-1)/n of the unbiased sample variance. Before resampling, each task's differences are spread
about their mean by sqrt(n / (n-1)) (Davison & Hinkley's modified residuals), which restores the
unbiased variance and leaves the observed statistic unchanged. On a synthetic null of 5 seeds x 4
tasks the false-positive rate at alpha 0.05 measured about 0.06-0.10 with it, 0.09-0.13 without
(tests/eval/test_significance.py checks the corrected rate).

Before any resampling, `compare` refuses (DetourError, exit 2) a comparison that cannot mean what
it prints, and `--allow` turns each refusal into a WARNING on stderr and in the JSON:

- a task with fewer than 2 seeds shared by the two models: the bootstrap of one difference is that
  difference, so p = 1/(1+N) and the interval has zero width whatever the difference is;
- fewer distinct resamples than --resamples: per task, the n seeds drawn with replacement form one
  of C(2n-1, n) multisets (the task's mean ignores their order), and the tasks draw independently,
  so the design has prod_t C(2n_t-1, n_t) distinct resamples (2 tasks x 2 seeds: 3 x 3 = 9);
  beyond that N only repeats them. The count is printed and written to the JSON;
- evaluation settings that differ between the two models' runs of a task: the task spec, the
  examples used (`data_sha256`), linear probe, epochs, example counts, max length, lr, batch size,
  label count. Settings an older results file did not record are named as not checkable.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from detour import io
from detour.errors import DetourError
from detour.flags import positive_int

SCHEMA = "detour.eval/1"
MIN_SEEDS = 2  # paired seeds per task below which the bootstrap says nothing


@dataclass
class TaskDiff:
    task: str
    metric: str
    seeds: list[int]
    a: list[float]
    b: list[float]
    seeds_a: list[int] = field(default_factory=list)  # every seed model A ran on this task
    seeds_b: list[int] = field(default_factory=list)

    @property
    def diffs(self) -> np.ndarray:
        return np.asarray(self.a, dtype=np.float64) - np.asarray(self.b, dtype=np.float64)


@dataclass
class Comparison:
    model_a: str
    model_b: str
    metric: str  # "headline" when each task uses its own headline metric
    delta: float  # mean over tasks of the mean difference A - B
    ci_low: float
    ci_high: float
    p_value: float
    resamples: int
    seed: int
    correction: bool
    tasks: list[TaskDiff]
    distinct_resamples: int = 0  # resamples the design can tell apart (see distinct_resamples)
    allowed: bool = False  # --allow: the refusals below were turned into warnings
    warnings: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # settings the results did not record

    def to_dict(self) -> dict:
        out = asdict(self)
        out["schema"] = "detour.compare/1"
        for row, task in zip(out["tasks"], self.tasks):
            row["mean_diff"] = float(task.diffs.mean())
            row["mean_a"] = float(np.mean(task.a))
            row["mean_b"] = float(np.mean(task.b))
        return out


def bootstrap_statistics(per_task_diffs: list[np.ndarray], resamples: int = 10_000, seed: int = 0,
                         correction: bool = True) -> tuple[float, np.ndarray]:
    """(observed statistic, the `resamples` resampled statistics) of the mean over tasks of the
    mean paired difference: each resample draws every task's seeds with replacement."""
    if resamples < 1:
        raise DetourError(f"--resamples must be at least 1, got {resamples}")
    if not per_task_diffs or any(len(d) == 0 for d in per_task_diffs):
        raise DetourError("paired bootstrap needs at least one seed for every task")
    rng = np.random.default_rng(seed)
    observed = float(np.mean([np.mean(d) for d in per_task_diffs]))
    boot = np.zeros(resamples, dtype=np.float64)
    for diffs in per_task_diffs:
        diffs = np.asarray(diffs, dtype=np.float64)
        if correction and len(diffs) > 1:
            n = len(diffs)
            diffs = diffs.mean() + (diffs - diffs.mean()) * np.sqrt(n / (n - 1))
        idx = rng.integers(0, len(diffs), size=(resamples, len(diffs)))
        boot += diffs[idx].mean(axis=1)
    boot /= len(per_task_diffs)
    return observed, boot


def paired_bootstrap(per_task_diffs: list[np.ndarray], resamples: int = 10_000, seed: int = 0,
                     correction: bool = True):
    """(statistic, ci_low, ci_high, p_value) for the mean over tasks of the mean paired difference.

    `per_task_diffs[t]` holds the differences A - B of task t, one per seed (paired by seed).
    `correction` spreads each task's differences by sqrt(n / (n-1)) about their mean first.
    """
    observed, boot = bootstrap_statistics(per_task_diffs, resamples, seed, correction)
    centred = np.abs(boot - boot.mean())
    # A tiny tolerance so float noise in the centring cannot turn "equal" into "smaller".
    extreme = int(np.count_nonzero(centred >= abs(observed) - 1e-12))
    p_value = (1 + extreme) / (1 + resamples)
    ci_low, ci_high = np.percentile(boot, [2.5, 97.5])
    return observed, float(ci_low), float(ci_high), float(p_value)


def distinct_resamples(seed_counts: list[int]) -> int:
    """How many different resamples `bootstrap_statistics` can draw, exactly.

    A task with n seeds draws n of them with replacement; its mean depends only on how often each
    seed was drawn, one of C(2n-1, n) multisets. Tasks draw independently, so the counts multiply.
    """
    return math.prod(math.comb(2 * n - 1, n) for n in seed_counts)


def design_problems(pairs: list[TaskDiff], resamples: int) -> tuple[int, list[str]]:
    """(distinct resamples, what makes the bootstrap's p-value or interval meaningless)."""
    problems = []
    for t in pairs:
        if len(t.seeds) < MIN_SEEDS:
            problems.append(
                f"task {t.task}: {len(t.seeds)} seed shared by the two models (A ran {len(t.seeds_a)}: "
                f"{t.seeds_a}; B ran {len(t.seeds_b)}: {t.seeds_b}); a paired bootstrap over 1 seed gives "
                f"p = 1/(1+N) = 1/{1 + resamples} and a zero-width interval for any difference; "
                f"evaluate both with --seeds {MIN_SEEDS} or more (5 is usual)")
    distinct = distinct_resamples([len(t.seeds) for t in pairs])
    if distinct < resamples:
        design = " x ".join(f"C({2 * len(t.seeds) - 1},{len(t.seeds)})" for t in pairs)
        problems.append(
            f"only {distinct} distinct bootstrap resamples exist for {len(pairs)} task(s) with "
            f"{', '.join(str(len(t.seeds)) for t in pairs)} seed(s) ({design}), fewer than "
            f"--resamples {resamples}: the extra resamples only repeat them, so the p-value and "
            f"interval rest on {distinct} cases; add seeds or tasks, or lower --resamples to {distinct}")
    return distinct, problems


# Per-run evaluation settings that must agree for a comparison to compare models, not setups.
# `spec` is the task spec (flattened to spec.<field>), `data_sha256` the examples actually used.
BUDGET_SETTINGS = ("epochs", "train_examples", "validation_examples", "eval_examples", "max_length",
                   "lr", "batch_size", "labels")
IGNORED_SPEC_FIELDS = ("description", "source", "root")  # wording and where the files lie
RECORDED = ("spec", "data_sha256", "linear_probe", *BUDGET_SETTINGS)  # what `detour eval` records


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value


def run_settings(run: dict) -> dict[str, object]:
    """The evaluation settings a run recorded, by name; a setting it did not record is absent."""
    out: dict[str, object] = {}
    if isinstance(run.get("spec"), dict):
        _flatten("spec", {k: v for k, v in run["spec"].items() if k not in IGNORED_SPEC_FIELDS}, out)
    if "data_sha256" in run:
        out["data_sha256"] = run["data_sha256"]
    probe = run.get("linear_probe", (run.get("_config") or {}).get("linear_probe"))
    if probe is not None:  # older runs carry it only in their file's config
        out["linear_probe"] = probe
    budget = run.get("budget") or {}
    out.update({key: budget[key] for key in BUDGET_SETTINGS if key in budget})
    return out


def _show(values: list) -> str:
    if not values:
        return "not recorded"
    shown = [v[:12] if isinstance(v, str) and len(v) == 64 else v for v in values]  # sha256: a prefix
    return str(shown[0]) if len(shown) == 1 else str(shown)


def check_settings(arm_a: list[dict], arm_b: list[dict], pairs: list[TaskDiff]) -> tuple[list[str], list[str]]:
    """(settings that differ between A's and B's paired runs, settings that cannot be checked)."""
    runs = ({(r["task"], int(r["seed"])): r for r in arm_a}, {(r["task"], int(r["seed"])): r for r in arm_b})
    differences: list[str] = []
    missing: dict[tuple[str, str], list[str]] = {}  # (who lacks them, task) -> settings
    for t in pairs:
        values: dict[str, tuple[dict, dict]] = {}  # setting -> (A's values, B's values), seed order
        lacking: dict[str, set[str]] = {}  # setting (top level) -> "A" and/or "B"
        for seed in t.seeds:
            for side, arm_runs in zip("AB", runs):
                settings = run_settings(arm_runs[t.task, seed])
                for top in RECORDED:
                    if not any(k == top or k.startswith(top + ".") for k in settings):
                        lacking.setdefault(top, set()).add(side)
                for key, value in settings.items():
                    seen = values.setdefault(key, ({}, {}))["AB".index(side)]
                    seen.setdefault(json.dumps(value, sort_keys=True), value)
        for key, (va, vb) in values.items():
            if key.split(".")[0] not in lacking and set(va) != set(vb):
                differences.append(f"task {t.task}: {key} differs (A: {_show(list(va.values()))}, "
                                   f"B: {_show(list(vb.values()))})")
        for top, who in lacking.items():
            missing.setdefault((" and ".join(sorted(who)), t.task), []).append(top)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (who, settings) -> tasks
    for (who, task), settings in missing.items():
        grouped.setdefault((who, tuple(settings)), []).append(task)
    unchecked = [f"cannot check {', '.join(settings)} for task(s) {', '.join(tasks)}: not recorded in the "
                 f"results of {who} (written by an older `detour eval`)"
                 for (who, settings), tasks in grouped.items()]
    return differences, unchecked


def load_runs(paths: list[Path]) -> list[dict]:
    """Every run of every results file, each tagged with the file it came from (`_file`, `_index`)."""
    runs: list[dict] = []
    for index, path in enumerate(paths):
        path = Path(path)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise DetourError(f"{path}: no such results file (written by `detour eval --out DIR`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DetourError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise DetourError(f"{path}: field 'schema' must be {SCHEMA!r}, got {data.get('schema') if isinstance(data, dict) else type(data).__name__!r}")
        if not isinstance(data.get("runs"), list):
            raise DetourError(f"{path}: field 'runs' must be a list")
        for i, run in enumerate(data["runs"]):
            for key in ("model", "task", "seed", "metrics"):
                if key not in run:
                    raise DetourError(f"{path}: runs[{i}] has no field {key!r}")
            runs.append({**run, "_file": str(path), "_index": index, "_config": data.get("config") or {}})
    return runs


def _resolve_model(wanted: str, models: list[str], flag: str) -> str:
    """The model as recorded, as results.md labels it, or as a path (relative or absolute, any trailing slash)."""
    from detour.eval.results import display_name

    if wanted in models:
        return wanted
    clean = wanted.rstrip("/")

    def same_path(m: str) -> bool:
        try:
            return Path(m).resolve() == Path(clean).resolve()
        except OSError:
            return False

    for rule in (lambda m: m.rstrip("/") == clean, same_path, lambda m: display_name(m.rstrip("/")) == clean,
                 lambda m: Path(m.rstrip("/")).name == clean):
        matches = [m for m in models if rule(m)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            break
    raise DetourError(f"{flag} {wanted!r}: not found among the models in the results ({', '.join(models)})"
                      if not matches else f"{flag} {wanted!r} is ambiguous: {', '.join(matches)}")


def select_arms(runs: list[dict], n_files: int, a: str | None, b: str | None) -> tuple[list[dict], list[dict], str, str]:
    """Split runs into arm A and arm B, by --a/--b, or by file when two files hold one model each."""
    if a is None and b is None:
        per_file = [sorted({r["model"] for r in runs if r["_index"] == i}) for i in range(n_files)]
        if n_files == 2 and all(len(m) == 1 for m in per_file):
            arm_a = [r for r in runs if r["_index"] == 0]
            arm_b = [r for r in runs if r["_index"] == 1]
            return arm_a, arm_b, per_file[0][0], per_file[1][0]
        models = sorted({r["model"] for r in runs})
        if len(models) == 2 and n_files == 1:
            raise DetourError(f"say which model is A and which is B: --a {models[0]} --b {models[1]} (or the reverse)")
        raise DetourError(f"name the two models with --a and --b; the results hold: {', '.join(models)}")
    if a is None or b is None:
        raise DetourError("give both --a and --b (or neither, with two files of one model each)")
    models = sorted({r["model"] for r in runs})
    name_a, name_b = _resolve_model(a, models, "--a"), _resolve_model(b, models, "--b")
    if name_a == name_b:
        raise DetourError(f"--a and --b both name {name_a!r}: compare two different models")
    return ([r for r in runs if r["model"] == name_a], [r for r in runs if r["model"] == name_b], name_a, name_b)


def _scores(arm: list[dict], model: str, metric: str | None) -> dict[str, dict[int, tuple[float, str]]]:
    """task -> seed -> (score, metric name), refusing duplicates and missing metrics."""
    out: dict[str, dict[int, tuple[float, str]]] = {}
    for run in arm:
        name = metric or run.get("headline")
        if not name:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) has no 'headline'; pass --metric")
        if name not in run["metrics"]:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) has no metric {name!r} "
                              f"(it has: {', '.join(sorted(run['metrics']))})")
        value = run["metrics"][name]
        if value is None or not np.isfinite(float(value)):
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) metric {name!r} is not finite: {value}")
        seeds = out.setdefault(run["task"], {})
        if run["seed"] in seeds:
            raise DetourError(f"{run['_file']}: run ({model}, {run['task']}, seed {run['seed']}) appears twice in the results")
        seeds[int(run["seed"])] = (float(value), name)
    return out


def pair_tasks(arm_a: list[dict], arm_b: list[dict], name_a: str, name_b: str,
               tasks: list[str] | None, metric: str | None) -> list[TaskDiff]:
    """Per task, the two models' scores on the seeds both ran, paired by seed."""
    sa, sb = _scores(arm_a, name_a, metric), _scores(arm_b, name_b, metric)
    if tasks is None:
        only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
        if only_a or only_b:
            detail = "; ".join(x for x in (f"only {name_a}: {', '.join(only_a)}" if only_a else "",
                                           f"only {name_b}: {', '.join(only_b)}" if only_b else "") if x)
            raise DetourError(f"the two models were not run on the same tasks ({detail}); restrict with --tasks")
        tasks = sorted(sa)
    if not tasks:
        raise DetourError(f"no tasks to compare for {name_a} and {name_b}")
    out = []
    for task in tasks:
        for name, scores in ((name_a, sa), (name_b, sb)):
            if task not in scores:
                raise DetourError(f"task {task!r}: no runs of model {name!r} in the results")
        seeds = sorted(set(sa[task]) & set(sb[task]))
        if not seeds:
            raise DetourError(f"task {task!r}: models {name_a!r} and {name_b!r} share no seed "
                              f"({sorted(sa[task])} vs {sorted(sb[task])})")
        metrics = {sa[task][s][1] for s in seeds} | {sb[task][s][1] for s in seeds}
        if len(metrics) > 1:
            raise DetourError(f"task {task!r}: the runs headline different metrics ({', '.join(sorted(metrics))}); pass --metric")
        out.append(TaskDiff(task, metrics.pop(), seeds, [sa[task][s][0] for s in seeds], [sb[task][s][0] for s in seeds],
                            sorted(sa[task]), sorted(sb[task])))
    return out


def compare(paths: list[Path], a: str | None = None, b: str | None = None, tasks: list[str] | None = None,
            metric: str | None = None, resamples: int = 10_000, seed: int = 0,
            correction: bool = True, allow: bool = False) -> Comparison:
    """The paired bootstrap of A - B; refuses (unless `allow`) a design or setup it cannot judge."""
    runs = load_runs(paths)
    arm_a, arm_b, name_a, name_b = select_arms(runs, len(paths), a, b)
    pairs = pair_tasks(arm_a, arm_b, name_a, name_b, tasks, metric)
    if resamples < 1:
        raise DetourError(f"--resamples must be at least 1, got {resamples}")
    distinct, problems = design_problems(pairs, resamples)
    differences, unchecked = check_settings(arm_a, arm_b, pairs)
    if differences:
        problems.append("the two models were evaluated with different settings, so A - B mixes the model "
                        "with the setup:\n    " + "\n    ".join(differences) +
                        "\n  rerun one of them with the other's settings (same task spec, data and budget flags)")
    if problems and not allow:
        raise DetourError(f"cannot compare A = {name_a} with B = {name_b} reliably:\n  - " + "\n  - ".join(problems) +
                          "\n(pass --allow to compare anyway; the output then carries these warnings)")
    delta, lo, hi, p = paired_bootstrap([t.diffs for t in pairs], resamples, seed, correction)
    return Comparison(name_a, name_b, metric or "headline", delta, lo, hi, p, resamples, seed, correction, pairs,
                      distinct_resamples=distinct, allowed=allow, warnings=problems, unchecked=unchecked)


def print_comparison(result: Comparison) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"A = {result.model_a}   vs   B = {result.model_b}")
    for col in ("task", "metric", "seeds", "A mean", "B mean", "A - B"):
        table.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for t in result.tasks:
        table.add_row(t.task, t.metric, str(len(t.seeds)), f"{np.mean(t.a):.4f}", f"{np.mean(t.b):.4f}", f"{t.diffs.mean():+.4f}")
    Console().print(table)
    # plain print: a terminal's width must not wrap these lines (people grep them)
    print(f"mean over {len(result.tasks)} tasks of A - B: {result.delta:+.4f}   "
          f"95% CI [{result.ci_low:+.4f}, {result.ci_high:+.4f}]   p = {result.p_value:.4f}")
    print(f"paired bootstrap over tasks x seeds: {result.resamples} resamples, seed {result.seed}, "
          f"small-sample correction {'on' if result.correction else 'off'}; "
          f"{_count(result.distinct_resamples)} distinct resamples possible (product over tasks of C(2n-1, n))")
    for t in result.tasks:
        dropped = sorted((set(t.seeds_a) | set(t.seeds_b)) - set(t.seeds))
        if dropped:
            print(f"note: task {t.task}: seeds {dropped} were run by one model only and are left out of the pairs")


def _count(n: int) -> str:
    return str(n) if n < 10**12 else f"about {float(n):.3e} ({len(str(n))} digits)"


def print_warnings(result: Comparison) -> None:
    """The refusals --allow turned into warnings, and the settings that could not be checked, on stderr."""
    for text in result.warnings:
        print(f"WARNING: {text}", file=sys.stderr)
    for text in result.unchecked:
        print(f"note: {text}", file=sys.stderr)


def write_json(result: Comparison, out: Path) -> None:
    io.write_json(out, result.to_dict())


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS",
                        help="results.json files (or their folders) written by `detour eval`, "
                        "optionally followed by the two model names (instead of --a/--b)")
    parser.add_argument("--a", help="model A (the name as given to `detour eval`, or its folder name)")
    parser.add_argument("--b", help="model B; without --a/--b, two files of one model each give A then B")
    parser.add_argument("--tasks", help="comma-separated tasks (default: every task both models ran)")
    parser.add_argument("--metric", help="metric to compare (default: each task's headline metric)")
    parser.add_argument("--resamples", type=positive_int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")
    parser.add_argument("--no-correction", action="store_true",
                        help="plain bootstrap, without the sqrt(n/(n-1)) small-sample correction")
    parser.add_argument("--json", type=Path, dest="json_out", metavar="OUT", help="also write the result as JSON")
    parser.add_argument("--allow", action="store_true",
                        help="compare even with fewer than 2 seeds a task, fewer distinct resamples than "
                        "--resamples, or differing evaluation settings; each becomes a WARNING (stderr and JSON)")


def run(args) -> int:
    paths, a, b = list(args.results), args.a, args.b
    if a is None and b is None and len(paths) >= 3 and not any(p.exists() for p in paths[-2:]):
        paths, a, b = paths[:-2], str(paths[-2]), str(paths[-1])  # `detour compare RESULTS A B`
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    result = compare(paths, a, b, tasks, args.metric, args.resamples, args.seed,
                     correction=not args.no_correction, allow=args.allow)
    if args.json_out is not None:  # an unwritable --json fails before anything is printed
        if Path(args.json_out).is_dir():
            raise DetourError(f"--json {args.json_out}: is a folder; give a file name such as {Path(args.json_out) / 'compare.json'}")
        io.ensure_output_dir(Path(args.json_out).parent, "--json (its folder)")
    print_comparison(result)
    print_warnings(result)  # after the table, so they are the last thing on screen
    if args.json_out:
        write_json(result, args.json_out)
        print(f"wrote {args.json_out}")
    return 0
