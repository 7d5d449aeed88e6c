"""The package's floor plan, read from its source: layers that only point down, no import cycles, one loader,
no module over 500 lines.

    python -m pytest -q tests/test_architecture.py

Every `import` and `from ... import` in src/detour counts, those inside functions too: an import
moved into a function to dodge a cycle is still a cycle. docs/architecture.md draws the same plan.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module may import its own layer and the layers below it.
LAYERS = ["base", "data", "model", "train", "eval", "analysis", "report", "study", "cli"]
# Top-level modules that every layer may use: errors, files, names, the recipe, the run folder, stopping,
# what a computation ran on.
BASE = {"detour", "detour.errors", "detour.io", "detour.paths", "detour.quiet", "detour.config", "detour.runs",
        "detour.stop", "detour.notices", "detour.lock", "detour.flags", "detour.compute"}

# Imports that point up on purpose, each with its reason. Keep this list short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# The one module that calls `from_pretrained` for each kind of object.
LOADERS = {
    "encoder": "detour.model.load",
    "config": "detour.model.load",
    "tokenizer": "detour.data.tokenize",
}


def layer_of(module: str) -> int:
    if module in BASE:
        return 0
    if module == "detour.cli":
        return LAYERS.index("cli")
    part = module.split(".")[1]
    if part not in LAYERS:
        raise AssertionError(f"{module}: not in any layer; add it to LAYERS or BASE in {Path(__file__).name}")
    return LAYERS.index(part)


# One concern per file: a module past this many lines has grown a second one to move out.
MAX_LINES = 500


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_package(src: Path = SRC) -> dict[str, ast.Module]:
    return {_module_name(p, src): ast.parse(p.read_text(), str(p)) for p in sorted((src / "detour").rglob("*.py"))}


def import_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the detour modules it imports (a name imported from a package counts as its submodule
    when one exists by that name)."""
    modules = set(trees)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, tree in trees.items():
        is_package = module == "detour" or any(m.startswith(module + ".") for m in modules)
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [source] + [f"{source}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module and target.startswith("detour"):
                    graph[module].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED_UPWARD:
                found.append(f"{module} ({LAYERS[layer_of(module)]}) imports {target} ({LAYERS[layer_of(target)]})")
    return found


_KINDS = {"AutoTokenizer": "tokenizer", "AutoConfig": "config", "PretrainedConfig": "config"}


def from_pretrained_calls(trees: dict[str, ast.Module]) -> list[tuple[str, str, int]]:
    """(kind, module, line) of every `X.from_pretrained(...)` call: tokenizer, config, or encoder (any model class)."""
    calls = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
                owner = node.func.value
                name = owner.id if isinstance(owner, ast.Name) else ast.unparse(owner)
                kind = _KINDS.get(name, "tokenizer" if "Tokenizer" in name else "encoder")
                calls.append((kind, module, node.lineno))
    return calls


@pytest.fixture(scope="module")
def trees():
    return read_package()


def test_every_module_has_a_layer(trees):
    for module in trees:
        layer_of(module)


def test_no_import_cycles(trees):
    cycles = find_cycles(import_graph(trees))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_layers_only_point_down(trees):
    found = upward_imports(import_graph(trees))
    assert not found, "imports that point up the layers:\n  " + "\n  ".join(found)


def test_allowed_exceptions_are_still_needed(trees):
    graph = import_graph(trees)
    stale = [f"{a} -> {b}" for a, b in ALLOWED_UPWARD if b not in graph.get(a, set())]
    assert not stale, f"listed as allowed but no longer imported: {stale}"


def test_one_from_pretrained_site_per_kind(trees):
    calls = from_pretrained_calls(trees)
    outside = [f"{kind} in {module}:{line}" for kind, module, line in calls if module != LOADERS[kind]]
    assert not outside, f"from_pretrained outside the loaders {LOADERS}: {outside}"
    for kind in LOADERS:
        sites = [f"{m}:{line}" for k, m, line in calls if k == kind]
        assert len(sites) == 1, f"{kind}: one from_pretrained site expected, found {sites}"


def _constants(tree: ast.Module):
    """String constants that are not docstrings."""
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(getattr(n, "value", None), ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


RUN_FOLDER_NAMES = {"recipe.json", "metrics.jsonl", "summary.json", "twins.json", "checkpoints", "curves.png"}


def test_the_run_folder_is_named_in_one_module(trees):
    found = [f"{module}:{n.lineno} {n.value!r}" for module, tree in trees.items() if module != "detour.runs"
             for n in _constants(tree) if n.value in RUN_FOLDER_NAMES]
    assert not found, f"run-folder names outside detour.runs (use RunFolder): {found}"


def test_one_way_to_stop(trees):
    handlers = [f"{module}:{n.lineno}" for module, tree in trees.items() if module != "detour.stop"
                for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "signal.signal"]
    assert not handlers, f"signal handlers installed outside detour.stop (use stop_signals_to): {handlers}"
    codes = [f"{module}:{n.lineno}" for module, tree in trees.items() if module != "detour.stop"
             for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "RESUMABLE_EXIT" for t in n.targets)]
    assert not codes, f"RESUMABLE_EXIT defined outside detour.stop: {codes}"


def long_modules(src: Path = SRC, limit: int = MAX_LINES) -> list[str]:
    return [f"{path.relative_to(src)}: {n} lines" for path in sorted((src / "detour").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > limit]


def test_no_module_is_over_the_line_limit():
    found = long_modules()
    assert not found, f"modules over {MAX_LINES} lines (split out a concern): {found}"


# ---- the checks themselves catch what they guard ----

def test_a_long_module_is_found(tmp_path):
    (tmp_path / "detour" / "eval").mkdir(parents=True)
    (tmp_path / "detour" / "eval" / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "detour" / "eval" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(tmp_path) == [f"detour/eval/long.py: {MAX_LINES + 1} lines"]



def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, ast.Module]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_package(tmp_path)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    trees = _package(tmp_path, {
        "detour/__init__.py": "",
        "detour/train/__init__.py": "",
        "detour/train/a.py": "from detour.train.b import x\n",
        "detour/train/b.py": "def x():\n    from detour.train import a\n",
    })
    assert find_cycles(import_graph(trees)) == [["detour.train.a", "detour.train.b"]]


def test_an_upward_import_is_found(tmp_path):
    trees = _package(tmp_path, {
        "detour/__init__.py": "",
        "detour/data/__init__.py": "",
        "detour/data/x.py": "from .. import io\nfrom detour.eval.tasks import TaskSpec\n",
        "detour/io.py": "",
        "detour/eval/__init__.py": "",
        "detour/eval/tasks.py": "",
    })
    assert upward_imports(import_graph(trees)) == ["detour.data.x (data) imports detour.eval.tasks (eval)"]


def test_a_second_loader_is_found(tmp_path):
    trees = _package(tmp_path, {
        "detour/__init__.py": "",
        "detour/eval/__init__.py": "",
        "detour/eval/x.py": "def f(p):\n    return AutoModel.from_pretrained(p), AutoTokenizer.from_pretrained(p)\n",
    })
    assert sorted(from_pretrained_calls(trees)) == [("encoder", "detour.eval.x", 2), ("tokenizer", "detour.eval.x", 2)]


def test_a_second_stop_handler_and_a_run_folder_name_are_found(tmp_path):
    trees = _package(tmp_path, {
        "detour/__init__.py": "",
        "detour/eval/__init__.py": "",
        "detour/eval/x.py": '"""Writes summary.json."""\nimport signal\nsignal.signal(signal.SIGTERM, print)\n'
                            'RESUMABLE_EXIT = 75\nPATH = "summary.json"\n',
    })
    with pytest.raises(AssertionError, match="detour.eval.x:3"):
        test_one_way_to_stop(trees)
    with pytest.raises(AssertionError, match=r"detour.eval.x:5 'summary.json'"):
        test_the_run_folder_is_named_in_one_module(trees)

