"""The package's layering: no import cycle, no upward import, a pure scheduling core.

The import graph follows pyproject's package-dir mapping (tui/ is hsched.tui, executors/ is
hsched.executors) and counts imports made inside functions too (they hide cycles, not remove them); only
`if TYPE_CHECKING:` blocks are left out, since they never run.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = {"hsched": REPO / "hsched"}
    for pkg, folder in cfg["tool"]["setuptools"]["package-dir"].items():
        roots[pkg] = REPO / folder
    mods: dict[str, Path] = {}
    for pkg, folder in roots.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported hsched module, line) for every import that can run."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                yield t, node.lineno


GRAPH = {m: {t for t, _ in _imports(m, p)} for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring a package's __init__ that
    only re-exports its own submodules."""
    def edges(m: str) -> set[str]:
        return {t for t in GRAPH[m] if not (MODULES[t].name == "__init__.py" and m.startswith(t + "."))}

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

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_mapped_packages() -> None:
    assert "hsched.tui.app" in MODULES and "hsched.executors.base" in MODULES
    assert "hsched.controller.core" in GRAPH["hsched.controller.api"]


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_a_cycle_would_be_found(monkeypatch: object) -> None:
    """The check itself can fail: a made-up edge back from the store to the controller closes a loop."""
    GRAPH["hsched.store"].add("hsched.controller.core")
    try:
        assert any("hsched.store" in c and "hsched.controller.core" in c for c in _cycles())
    finally:
        GRAPH["hsched.store"].discard("hsched.controller.core")


def _upward(lower: str, upper: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {t}" for m in GRAPH if m == lower or m.startswith(lower + ".")
                  for t in GRAPH[m] if any(t == u or t.startswith(u + ".") for u in upper))


def test_executors_never_import_the_controller() -> None:
    assert _upward("hsched.executors", ("hsched.controller",)) == []


def test_the_scheduling_core_is_pure() -> None:
    """hsched.sched is shared by the live controller and the simulator: no layer above it, no I/O library."""
    above = ("hsched.controller", "hsched.executors", "hsched.sim", "hsched.cli", "hsched.tui", "hsched.store")
    assert _upward("hsched.sched", above) == []
    io = {"asyncio", "sqlite3", "textual", "networkx", "asyncssh", "subprocess", "socket"}
    found = []
    for m, p in MODULES.items():
        if m == "hsched.sched" or m.startswith("hsched.sched."):
            for node in ast.walk(ast.parse(p.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{m}: {n}" for n in names if n.split(".")[0] in io]
    assert found == []


def test_lifecycle_and_clock_sit_below_the_controller() -> None:
    assert _upward("hsched.lifecycle", ("hsched.controller", "hsched.executors", "hsched.store")) == []
    assert _upward("hsched.simulated", ("hsched.controller", "hsched.executors")) == []


def test_the_controller_reaches_executors_only_through_the_protocol() -> None:
    """No getattr on an executor and no `type: ignore` papering over a missing protocol method."""
    bad = []
    for f in sorted((REPO / "hsched" / "controller").glob("*.py")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if ("getattr(" in line and "executor" in line) or ("executor" in line and "type: ignore" in line):
                bad.append(f"{f.name}:{n}: {line.strip()}")
    assert bad == []
