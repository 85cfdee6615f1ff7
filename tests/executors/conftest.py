"""Fixtures for the executor tests: `node` is one executor kind (fake, local, ssh) with everything a test
needs to drive it, and `async def` tests run on a fresh event loop each, bounded in time."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import Executor

from hsched.errors import Refusal
from hsched.testing.conformance import ExecutorUnderTest, fake_subject, local_subject
from tests.e2e.ssh.hosts import TestHost, TestHosts, _free_port, keygen, sshd_available

TEST_DEADLINE_S = 120.0
"""A hung remote call fails its test instead of the whole run."""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args: dict[str, Any] = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def bounded() -> None:
        async with asyncio.timeout(TEST_DEADLINE_S):
            await pyfuncitem.obj(**args)

    asyncio.run(bounded())
    return True


Node = ExecutorUnderTest
"""One executor kind under test (the conformance check's subject): how to make one, where its runs go, and how
to make it fail."""


def _ssh(tmp_path: Path, hosts: TestHosts) -> Node:
    from hsched.executors.ssh import SSHExecutor

    from hsched.config import NodeConfig

    h: TestHost = hosts[0]
    impostor = keygen(tmp_path / "impostor_key", "impostor")
    changed = tmp_path / "known_hosts_changed"
    changed.write_text(f"{h.known_hosts_name} {' '.join(impostor.split()[:2])}\n")
    (tmp_path / "empty_ssh_config").write_text("")

    def unreachable() -> Executor:
        port = _free_port("127.0.0.1")  # nothing listens there: the connection is refused
        cfg = NodeConfig(name="nowhere", executor="ssh", host="127.0.0.1", port=port,
                         known_hosts=str(tmp_path / "kh"))
        return SSHExecutor(cfg, ssh_config=tmp_path / "empty_ssh_config")

    return Node(kind="ssh", runs=tmp_path / "home" / "runs", make=lambda: hosts.executor(h),
                make_unreachable=unreachable,
                make_refused=lambda: hosts.executor(h, cfg={"known_hosts": str(changed)}),
                refusal=Refusal.HOST_KEY_CHANGED)  # the test hosts share this machine's files and processes


@pytest.fixture(scope="session")
def conformance_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")
    with TestHosts(tmp_path_factory.mktemp("conformance-hosts"), count=1, prefix="conf") as hosts:
        yield hosts


@pytest.fixture(params=["fake", pytest.param("local", marks=pytest.mark.slow),
                        pytest.param("ssh", marks=pytest.mark.slow)])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Node:
    tmp_path = Path(os.path.realpath(tmp_path))
    if request.param == "fake":
        n = fake_subject(tmp_path / "home" / "runs")
    elif request.param == "local":
        n = local_subject(tmp_path / "home" / "runs", tmp_path)
    else:
        n = _ssh(tmp_path, request.getfixturevalue("conformance_hosts"))
    n.runs.mkdir(parents=True)
    return n
