"""Fixtures for the SSH tests: three real sshd test hosts for the whole session (see hosts.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.e2e.ssh.hosts import TestHosts, sshd_available

T = TypeVar("T")


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")
    with TestHosts(tmp_path_factory.mktemp("sshhosts"), count=3) as hosts:
        yield hosts


def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    """Run one test coroutine with a deadline (a hung remote call fails the test instead of the suite)."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def local_runs(tmp_path: Path) -> Path:
    """A folder standing for HSCHED_HOME/runs/<node> on the controller (run folders are named under it)."""
    d = tmp_path / "home" / "runs"
    d.mkdir(parents=True)
    return d
