"""Fixtures of the fault matrix: one set of sshd hosts per test module (rebootable, tests/faults/cluster.py), and
the slow mark on everything here (real processes; the fast lane starts none)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ssh.hosts import sshd_available
from tests.faults.cluster import FaultHosts

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)


def need_sshd() -> None:
    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")


@pytest.fixture(scope="module")
def fault_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultHosts]:
    """Three sshd hosts for the module (each test leaves them restored)."""
    need_sshd()
    with FaultHosts(tmp_path_factory.mktemp("faulthosts"), 3) as hosts:
        yield hosts


def job_script(marks: Path, body: str) -> list[str]:
    """`sh -c` that notes each start in marks/<job>.starts (node and attempt), then runs `body`."""
    return ["sh", "-c", f'echo "$HSCHED_NODE $HSCHED_RUN" >> {marks}/$HSCHED_JOB_ID.starts; {body}']


def starts(marks: Path, jid: int) -> list[tuple[str, int]]:
    """(node, attempt) of every start the job noted, in order."""
    f = marks / f"{jid}.starts"
    if not f.exists():
        return []
    return [(ln.split()[0], int(ln.split()[1])) for ln in f.read_text().splitlines() if ln.strip()]
