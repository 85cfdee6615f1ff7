"""Shared helpers for the topology tests: where the captured tool outputs live, and how to read one."""

from __future__ import annotations

from pathlib import Path

import pytest

# The shared captures sit beside the repository checkout (CI has them at ../shared); never copy them in.
SHARED_TOPO = (Path(__file__).resolve().parents[2] / ".." / "shared" / "topo").resolve()
MARKER = "# ---- verbatim output below"


def strip_header(text: str) -> str:
    """Drop the capture's `# ...` header block: everything through the `# ---- verbatim output below` line."""
    i = text.index(MARKER)
    return text[text.index("\n", i) + 1 :]


def capture(name: str) -> str:
    path = SHARED_TOPO / name
    if not path.is_file():
        pytest.skip(f"shared capture {name} not found under {SHARED_TOPO} (the ../shared folder is absent)")
    return strip_header(path.read_text(encoding="utf-8"))


def all_captures() -> list[Path]:
    if not SHARED_TOPO.is_dir():
        return []
    return sorted(p for p in SHARED_TOPO.glob("*.txt"))


@pytest.fixture
def shared_topo() -> Path:
    if not SHARED_TOPO.is_dir():
        pytest.skip(f"shared captures not found at {SHARED_TOPO} (expected ../shared beside the repo)")
    return SHARED_TOPO
