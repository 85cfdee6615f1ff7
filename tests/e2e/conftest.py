"""End-to-end tests: the hsched CLI, a controller, sshd hosts in network namespaces, tmux, pip; real
processes and real time. Everything here is in the slow lane, whatever a file declares."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)
