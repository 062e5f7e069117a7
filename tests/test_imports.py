"""The import graph of the core and of each plugin, read from the source: no cycles, and a contract that stands alone.

Every import statement counts (function-level ones and those under ``if TYPE_CHECKING:`` included): a late import
hides a cycle from Python, not from the reader. ``import a.b.c`` and ``from a.b import c`` (c a module) depend on
``a.b.c`` alone; the ``__init__`` of the packages above runs too, but counting it would make every package that
re-exports its submodules a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = [ROOT / "core", *sorted(p for p in (ROOT / "plugins").iterdir() if p.is_dir())]


def module_files(roots: list[Path]) -> dict[str, Path]:
    """Module name -> file, for every Python package under each root (a folder holding ``__init__.py``); compiled
    extension modules count (they import nothing we can read)."""
    modules: dict[str, Path] = {}
    for root in roots:
        for init in sorted(root.glob("*/__init__.py")):
            for path in sorted([*init.parent.rglob("*.py"), *init.parent.rglob("*.so"), *init.parent.rglob("*.pyd")]):
                parts = (*path.relative_to(root).parent.parts, path.name.split(".")[0])  # _native.cpython-312-...so
                if any(not p.isidentifier() for p in parts):
                    continue  # build trees, scratch folders
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def dependencies(path: Path, module: str, modules: set[str]) -> set[str]:
    """The modules an import statement of this file names, relative imports resolved: ``from a import b`` depends on
    ``a.b`` when that is a module, else on ``a``; names outside ``modules`` stay as written (third-party, stdlib)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    found.discard(module)
    return found


def import_graph(roots: list[Path]) -> dict[str, set[str]]:
    modules = module_files(roots)
    return {m: dependencies(path, m, set(modules)) & set(modules) if path.suffix == ".py" else set()
            for m, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, set(c), c[0]) for c in components]


def _a_cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """The shortest path start -> ... -> start inside one component (breadth first)."""
    parent: dict[str, str] = {start: start}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{start} is in a component without a cycle through it")


# -- the checker itself, on a made-up tree ---------------------------------------------------------------------
def write_package(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_late_relative_and_type_checking_cycles(tmp_path: Path) -> None:
    write_package(tmp_path, {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "A = 1\n\ndef f():\n    from . import b\n",  # a function-level import
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.c import C\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from ..a import A\nimport os\n",
        "pkg/leaf.py": "import pkg.a\n",
    })
    graph = import_graph([tmp_path])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.leaf"] == {"pkg.a"} and graph["pkg"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]


def test_a_package_importing_its_own_members_is_no_cycle(tmp_path: Path) -> None:
    write_package(tmp_path, {
        "pkg/__init__.py": "from . import a\nfrom .a import X\n",
        "pkg/a.py": "from . import b\nX = 1\n",
        "pkg/b.py": "",
    })
    graph = import_graph([tmp_path])
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert cycles(graph) == []


def test_a_name_from_a_package_init_depends_on_that_init(tmp_path: Path) -> None:
    write_package(tmp_path, {
        "pkg/__init__.py": "from .a import X\n",
        "pkg/a.py": "from .b import Y\nX = 1\n",
        "pkg/b.py": "from . import X\nY = X\n",  # X comes from pkg/__init__, which is still importing a
    })
    assert cycles(import_graph([tmp_path])) == [["pkg", "pkg.a", "pkg.b", "pkg"]]


# -- the repository -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("root", SOURCE_ROOTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_import_cycle(root: Path) -> None:
    # Each plugin is read together with the core, so that a cycle through hetero would show too.
    roots = [ROOT / "core"] if root == ROOT / "core" else [ROOT / "core", root]
    graph = import_graph(roots)
    assert len(graph) > 10, f"no modules found under {root}"
    found = cycles(graph)
    assert not found, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in found)


# Outside the standard library, what the contract may import: numpy (arrays), ml_dtypes (the low-precision dtypes),
# pluggy (the hook markers), onnx (contract.onnx_export writes a segment as a model for whole-graph backends' vendor
# compilers; a dependency of the core, imported inside its functions).
CONTRACT_THIRD_PARTY = {"numpy", "ml_dtypes", "pluggy", "onnx"}


def test_the_contract_imports_nothing_outside_itself() -> None:
    modules = module_files([ROOT / "core"])
    contract = {m: p for m, p in modules.items() if m == "hetero.contract" or m.startswith("hetero.contract.")}
    assert {"hetero.contract.backend", "hetero.contract.tensor", "hetero.contract.dtypes"} <= set(contract)
    outside = []
    for module, path in contract.items():
        for name in dependencies(path, module, set(modules)):
            top = name.split(".")[0]
            if name in contract or top == "__future__" or top in sys.stdlib_module_names or top in CONTRACT_THIRD_PARTY:
                continue
            outside.append(f"{module} imports {name}")
    assert not outside, "\n".join(outside)


PLUGIN_ROOTS = [*SOURCE_ROOTS[1:], ROOT / "examples" / "hetero-toy"]


@pytest.mark.parametrize("root", PLUGIN_ROOTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_plugins_import_the_contract_alone(root: Path) -> None:
    """Of hetero, a backend package imports ``hetero.contract`` and nothing else (what API_VERSION covers)."""
    core = set(module_files([ROOT / "core"]))
    modules = module_files([root])
    assert modules, f"no package under {root}"
    outside = sorted(
        f"{module} imports {name}"
        for module, path in modules.items() if path.suffix == ".py"
        for name in dependencies(path, module, core | set(modules))
        if name.split(".")[0] == "hetero" and name != "hetero.contract" and not name.startswith("hetero.contract.")
    )
    assert not outside, "\n".join(outside)


@pytest.mark.parametrize("module", ["hetero.contract.dtypes", "hetero.contract.tensor", "hetero.contract.registry"])
def test_leaf_modules_import_only_leaves_below_them(module: str) -> None:
    """dtypes, tensor info and the op registry are leaves: they reach no backend, discovery, runtime or ops."""
    graph = import_graph([ROOT / "core"])
    reached, todo = set(), [module]
    while todo:
        for w in graph[todo.pop()] - reached:
            reached.add(w)
            todo.append(w)
    allowed = {"hetero.contract.errors", "hetero.contract.dtypes", "hetero.contract.tensor", "hetero.contract.graph"}
    assert reached <= allowed, f"{module} reaches {sorted(reached - allowed)}"
