"""The package's layering: no import loop, no import from a lower layer to a higher one, a pure scheduling core.

The import graph follows pyproject's package-dir mapping (tui/ is hsched.tui, executors/ is hsched.executors)
and counts imports made inside functions (they hide a loop, they do not remove it) and imports under
`if TYPE_CHECKING:` (a type-only loop still ties two modules together: neither can be read, moved or tested
without the other). Only the check that nothing loops at run time leaves the type-only ones out.

`python tests/test_layers.py` prints each layer's modules and what the checks find.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

Graph = Mapping[str, set[str]]
Layers = Sequence[tuple[str, Sequence[str]]]

LAYERS: Layers = (
    # Lowest first: a module may import from its own layer and the ones before it. A name stands for the module
    # and everything under it, except the root package, which stands for hsched/__init__.py alone.
    #
    # what runs on a node (shipped there as a bundle): standard library only, nothing of hsched above it
    ("node", ("hsched.node", "hsched.nodehelper", "hsched.safefiles")),
    # the domain's types and rules, errors, clocks, paths, the socket protocol's constants
    ("base", ("hsched", "hsched.errors", "hsched.problems", "hsched.clock", "hsched.paths", "hsched.protocol",
              "hsched.model", "hsched.lifecycle", "hsched.progress", "hsched.indices", "hsched.homes")),
    # hardware: topology parsers, the accelerator table, placement inside a node
    ("topo", ("hsched.topo",)),
    # what a job asks (arrays, batch scripts, constraints, dependencies, output files, its kind, its datasets)
    # and the JSON forms of all of it
    ("spec", ("hsched.spec", "hsched.datasets", "hsched.serialize")),
    # the pure scheduling core, shared by the live round and the simulator: what the layers above learn reaches
    # it as numbers and models in its views, never by import
    ("sched", ("hsched.sched",)),
    # what the controller learns: kinds' speeds (as the core's throughput model), durations, profiles, usage
    ("learn", ("hsched.learn",)),
    # the fleet file and settings (policy names are checked against the core's registry), simulated devices
    ("settings", ("hsched.config", "hsched.simulated")),
    ("sim", ("hsched.sim",)),
    ("executors", ("hsched.executors",)),
    # inference services' data path: the router (an HTTP proxy) and readiness checks; I/O like the executors,
    # and what the controller's service manager drives, so between the two
    ("serve", ("hsched.serve",)),
    # the controller with its own store and copy engine
    ("controller", ("hsched.controller",)),
    # what people and tests run
    ("apps", ("hsched.client", "hsched.cli", "hsched.tui", "hsched.theme", "hsched.labsetup", "hsched.replay",
              "hsched.replayjob", "hsched.testing", "hsched.__main__", "hsched.examples")),
)

PENDING_UPWARD: dict[str, str] = {}
"""Upward imports being removed on other branches: each must still be found (the test says when one is gone)."""

PENDING_LOOPS: dict[tuple[str, ...], str] = {}


# ------------------------------------------------------------------------------------------------ the graph


def package_roots(repo: Path) -> dict[str, Path]:
    cfg = tomllib.loads((repo / "pyproject.toml").read_text())
    roots = {"hsched": repo / "hsched"}
    for pkg, folder in cfg["tool"]["setuptools"]["package-dir"].items():
        roots[pkg] = repo / folder
    return roots


def find_modules(roots: Mapping[str, Path]) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg, folder in roots.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


def imports(name: str, path: Path, modules: Mapping[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """(imported module of `modules`, line, whether only under `if TYPE_CHECKING:`) for every import."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                yield t, node.lineno, id(node) in typing_only


def import_graph(modules: Mapping[str, Path], *, type_only: bool,
                 found: Mapping[str, list[tuple[str, int, bool]]] | None = None) -> dict[str, set[str]]:
    """Who imports whom; `type_only`: counting the imports under `if TYPE_CHECKING:` too. `found`: each module's
    imports already read."""
    return {m: {t for t, _, typing in (found[m] if found else imports(m, p, modules)) if type_only or not typing}
            for m, p in modules.items()}


def cycles(graph: Graph, modules: Mapping[str, Path]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring a package's __init__ that
    only re-exports its own submodules."""
    def edges(m: str) -> list[str]:
        return sorted(t for t in graph[m] if not (modules[t].name == "__init__.py" and m.startswith(t + ".")))

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def layer_of(module: str, layers: Layers) -> int | None:
    """The layer (its index, lowest 0) whose longest name covers `module`; None: no layer names it."""
    best: tuple[int, int] | None = None
    for i, (_, names) in enumerate(layers):
        for n in names:
            root = "." not in n  # the root package stands for its __init__ alone
            if module == n or (not root and module.startswith(n + ".")):
                if best is None or len(n) > best[0]:
                    best = (len(n), i)
    return None if best is None else best[1]


def unplaced(graph: Graph, layers: Layers) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def upward(graph: Graph, layers: Layers) -> list[str]:
    """'a -> b' for every import of a module in a higher layer than the importer's."""
    out = []
    for m, targets in graph.items():
        lm = layer_of(m, layers)
        for t in targets:
            lt = layer_of(t, layers)
            if lm is not None and lt is not None and lt > lm:
                out.append(f"{m} -> {t} ({layers[lm][0]} -> {layers[lt][0]})")
    return sorted(out)


def global_statements(modules: Mapping[str, Path], under: str) -> list[str]:
    """'module:line: global names' for every `global` statement in `under` and its submodules."""
    out = []
    for m, p in sorted(modules.items()):
        if m == under or m.startswith(under + "."):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Global):
                    out.append(f"{m}:{node.lineno}: global {', '.join(node.names)}")
    return out


IO_LIBRARIES = frozenset({"asyncio", "sqlite3", "textual", "networkx", "asyncssh", "subprocess", "socket"})


def io_imports(modules: Mapping[str, Path], under: str) -> list[str]:
    """'module: library' for every import of an I/O library in `under` and its submodules."""
    found = []
    for m, p in sorted(modules.items()):
        if m == under or m.startswith(under + "."):
            for node in ast.walk(ast.parse(p.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{m}: {n}" for n in names if n.split(".")[0] in IO_LIBRARIES]
    return found


MODULES = find_modules(package_roots(REPO))
_FOUND = {m: list(imports(m, p, MODULES)) for m, p in MODULES.items()}  # each file read once
RUNTIME = import_graph(MODULES, type_only=False, found=_FOUND)
GRAPH = import_graph(MODULES, type_only=True, found=_FOUND)


def _without_pending(found: list[str], pending: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(new findings, pending ones no longer found): both must be empty."""
    keys = [f.split(" (")[0] for f in found]
    return [f for f, k in zip(found, keys, strict=True) if k not in pending], sorted(set(pending) - set(keys))


# ------------------------------------------------------------------------------------------------ the checks


def test_the_graph_sees_the_mapped_packages() -> None:
    assert "hsched.tui.app" in MODULES and "hsched.executors.base" in MODULES
    assert "hsched.controller.core" in RUNTIME["hsched.controller.api"]


def test_no_import_loop_at_run_time() -> None:
    assert cycles(RUNTIME, MODULES) == []


def test_no_import_loop_counting_type_only_imports() -> None:
    found = cycles(GRAPH, MODULES)
    assert [c for c in found if tuple(c) not in PENDING_LOOPS] == []
    assert sorted(set(PENDING_LOOPS) - {tuple(c) for c in found}) == [], "gone: remove them from PENDING_LOOPS"


def test_every_module_has_a_layer() -> None:
    """A new module is placed on purpose: add it (or a folder above it) to LAYERS."""
    assert unplaced(GRAPH, LAYERS) == []


def test_no_upward_import() -> None:
    new, gone = _without_pending(upward(GRAPH, LAYERS), PENDING_UPWARD)
    assert new == []
    assert gone == [], "fixed: remove them from PENDING_UPWARD"


def test_the_scheduling_core_keeps_no_module_state() -> None:
    """The core is shared by the live round and the simulator: a cache is an object its caller owns."""
    assert global_statements(MODULES, "hsched.sched") == []


def test_the_scheduling_core_imports_no_io_library() -> None:
    assert io_imports(MODULES, "hsched.sched") == []


def test_the_controller_reaches_executors_only_through_the_protocol() -> None:
    """No getattr on an executor and no `type: ignore` papering over a missing protocol method."""
    bad = []
    for f in sorted((REPO / "hsched" / "controller").glob("*.py")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if ("getattr(" in line and "executor" in line) or ("executor" in line and "type: ignore" in line):
                bad.append(f"{f.name}:{n}: {line.strip()}")
    assert bad == []


# ------------------------------------------------------------------------------------ each check can fail


def _tree(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return find_modules({"pkg": root / "pkg"})


def test_a_type_only_loop_is_a_loop(tmp_path: Path) -> None:
    """A loop closed only by a TYPE_CHECKING import (and a relative one inside a function) is found, and only
    the type-only graph has it."""
    mods = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import High\n",
        "pkg/high.py": "def f():\n    from .low import x\n",
        "pkg/other.py": "import pkg.low\n",
    })
    assert cycles(import_graph(mods, type_only=True), mods) == [["pkg.high", "pkg.low"]]
    assert cycles(import_graph(mods, type_only=False), mods) == []


def test_a_loop_in_the_package_would_be_found() -> None:
    """A made-up edge back from the store to the controller closes a loop in the real graph."""
    graph = {m: set(t) for m, t in GRAPH.items()}
    graph["hsched.controller.store"].add("hsched.controller.core")
    assert any({"hsched.controller.store", "hsched.controller.core"} <= set(c) for c in cycles(graph, MODULES))


def test_an_upward_import_would_be_found() -> None:
    layers: Layers = (("low", ("pkg", "pkg.a")), ("high", ("pkg.b",)))
    assert upward({"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg"}, "pkg": set()}, layers) == [
        "pkg.a -> pkg.b (low -> high)"]
    graph = {m: set(t) for m, t in GRAPH.items()}
    graph["hsched.model"].add("hsched.controller.core")  # the domain's types reaching up to the controller
    assert "hsched.model -> hsched.controller.core (base -> controller)" in upward(graph, LAYERS)


def test_a_module_in_no_layer_is_named() -> None:
    layers: Layers = (("only", ("pkg", "pkg.a")),)
    # the root package's name covers its __init__ alone, so a new top-level module must be placed
    assert unplaced({"pkg": set(), "pkg.a.x": set(), "pkg.new": set()}, layers) == ["pkg.new"]
    assert layer_of("hsched.sched.stages.caps", LAYERS) == layer_of("hsched.sched", LAYERS)


def test_a_global_statement_or_an_io_library_would_be_found(tmp_path: Path) -> None:
    mods = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/core/__init__.py": "",
        "pkg/core/round.py": "_CACHE = {}\n\ndef f():\n    def g():\n        global _CACHE, _OTHER\n    return g\n",
        "pkg/core/wait.py": "def f():\n    from asyncio.tasks import sleep\n",
        "pkg/outside.py": "import sqlite3\n\ndef h():\n    global X\n",
    })
    assert global_statements(mods, "pkg.core") == ["pkg.core.round:5: global _CACHE, _OTHER"]
    assert io_imports(mods, "pkg.core") == ["pkg.core.wait: asyncio.tasks"]


if __name__ == "__main__":
    for i, (layer, _) in enumerate(LAYERS):
        print(f"{i:2} {layer:10} {' '.join(sorted(m for m in GRAPH if layer_of(m, LAYERS) == i))}")
    print("unplaced:", unplaced(GRAPH, LAYERS) or "none")
    print("upward:", *upward(GRAPH, LAYERS) or ["none"], sep="\n  ")
    print("loops (type-only included):", cycles(GRAPH, MODULES) or "none")
    print("global in hsched.sched:", *global_statements(MODULES, "hsched.sched") or ["none"], sep="\n  ")
