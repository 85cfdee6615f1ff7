"""hsched/node as the package a node runs (issue 28): standard library only and Python 3.8, modules small and
named so that none can shadow the standard library from the helper's own folder (the first entry of a node's
sys.path), and the executors reaching it through public names only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "hsched" / "node"
MODULES = sorted(NODE.glob("*.py"))
OPTIONAL = {"pynvml"}
"""Imported inside a function where NVML may be missing (shipped beside the helper, else nvidia-smi)."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in `path`, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_the_package_is_all_there() -> None:
    names = {p.name for p in MODULES}
    assert {"__init__.py", "nodehelper.py", "main.py", "version.py", "safefiles.py"} <= names
    assert not (REPO / "hsched" / "nodehelper.py").exists() and not (REPO / "hsched" / "safefiles.py").exists()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_each_module_parses_as_python38(path: Path) -> None:
    ast.parse(path.read_text(), feature_version=(3, 8))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_each_module_imports_the_standard_library_and_its_siblings_only(path: Path) -> None:
    foreign = [m for level, m in _imports(path)
               if level == 0 and m.split(".")[0] not in sys.stdlib_module_names and m not in OPTIONAL]
    assert foreign == [], f"{path.name} imports {foreign}: a node has nothing but python3"
    absolute_own = [m for level, m in _imports(path) if level == 0 and m.split(".")[0] == "hsched"]
    assert absolute_own == [], f"{path.name}: import siblings relatively (a node loads the folder under its own name)"


def test_no_module_shadows_the_standard_library() -> None:
    """Run as a script, the helper's folder is sys.path[0]: a `signal.py` there would be every module's signal."""
    clash = sorted(p.stem for p in MODULES if p.stem in sys.stdlib_module_names)
    assert clash == []


def test_no_module_reaches_800_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in MODULES}
    assert max(sizes.values()) < 800, sizes


def test_the_check_would_see_a_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom hsched.config import NodeConfig\ndef f():\n    import asyncssh\n")
    found = [m for level, m in _imports(bad) if level == 0 and m.split(".")[0] not in sys.stdlib_module_names]
    assert found == ["hsched.config", "asyncssh"]


def test_callers_use_public_names_only() -> None:
    """Outside hsched/node (the executors, the controller, the CLI): no `_private` name of the helper's."""
    found = []
    for root in ("executors", "hsched", "tui"):
        for path in sorted((REPO / root).rglob("*.py")):
            if NODE in path.parents:
                continue
            tree = ast.parse(path.read_text())
            modules = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hsched.node"):
                    found += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
                    if node.module == "hsched.node":
                        modules.update(a.asname or a.name for a in node.names)
                    else:
                        modules.update(a.asname or a.name for a in node.names if (NODE / f"{a.name}.py").exists())
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in modules and node.attr.startswith("_") and not node.attr.endswith("__")):
                    found.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert found == []
