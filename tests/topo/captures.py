"""Helpers for the topology tests: where the captured tool outputs live, and how to read one."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURES

# Real tool outputs, copied into the repository with their source headers (tests/fixtures/README.md)
TOPO_CAPTURES = FIXTURES / "topo"
MARKER = "# ---- verbatim output below"


def strip_header(text: str) -> str:
    """Drop the capture's `# ...` header block: everything through the `# ---- verbatim output below` line."""
    i = text.index(MARKER)
    return text[text.index("\n", i) + 1 :]


def capture(name: str) -> str:
    """The verbatim output of one capture; a missing name is an error, never a skip."""
    return strip_header((TOPO_CAPTURES / name).read_text(encoding="utf-8"))


def all_captures() -> list[Path]:
    return sorted(TOPO_CAPTURES.glob("*.txt"))
