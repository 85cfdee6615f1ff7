"""Fixtures for the executor tests: `node` is one executor kind (fake, local, ssh) with everything a test
needs to drive it, and `async def` tests run on a fresh event loop each, bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import Executor

from hsched.errors import NodeRefused, Refusal
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


@dataclass
class Node:
    """One executor kind under test: how to make one, where its runs go, and how to make it fail."""

    kind: str
    runs: Path
    """A folder standing for HSCHED_HOME/runs/<node> on the controller: run folders are named under it."""
    make: Callable[[], Executor]
    make_unreachable: Callable[[], Executor]
    """An executor for a node nobody answers for."""
    make_refused: Callable[[], Executor]
    """An executor for a node that refuses us in a way only a person can fix."""
    refusal: Refusal
    """The reason make_refused's node gives."""

    @property
    def real(self) -> bool:
        """Whether commands really run (fake: the test plays their part with `plays`)."""
        return self.kind != "fake"

    @contextlib.asynccontextmanager
    async def executor(self, make: Callable[[], Executor] | None = None) -> AsyncIterator[Executor]:
        ex = (make or self.make)()
        try:
            yield ex
        finally:
            await ex.close()

    def plays(self, ex: Executor, run_dir: str, *, output: bytes = b"", exit_code: int | None = None) -> None:
        """What a real node does by running the command: for the fake, write its output and end it (with the
        exit record's end time, as a node's wrapper writes it)."""
        if self.real:
            return
        from hsched.executors.fake import FakeExecutor

        assert isinstance(ex, FakeExecutor)
        if output:
            ex.write_log(run_dir, output)
        if exit_code is not None:
            ex.finish(run_dir, exit_code, end_time=time.time())


def _fake(tmp_path: Path) -> Node:
    from hsched.executors.fake import FakeExecutor

    def refused() -> Executor:
        ex = FakeExecutor(name="fake")
        ex.fail_with = NodeRefused("fake: HOST KEY CHANGED", Refusal.HOST_KEY_CHANGED)
        return ex

    def unreachable() -> Executor:
        ex = FakeExecutor(name="fake")
        ex.unreachable = True
        return ex

    # a node with a disk of its own: put/get really move the files (in memory)
    return Node(kind="fake", runs=tmp_path / "home" / "runs", make=lambda: FakeExecutor(remote_root="/node"),
                make_unreachable=unreachable, make_refused=refused, refusal=Refusal.HOST_KEY_CHANGED)


def _local(tmp_path: Path) -> Node:
    from hsched.executors.local import LocalExecutor

    # a helper that never answers: it reads its requests, keeps its stdout open and says nothing
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nwhile read -r line; do :; done\n")
    silent.chmod(0o755)
    return Node(kind="local", runs=tmp_path / "home" / "runs", make=lambda: LocalExecutor(node="here"),
                make_unreachable=lambda: LocalExecutor(node="here", python=str(silent), timeout_s=0.2),
                make_refused=lambda: LocalExecutor(node="here", python=str(tmp_path / "no-python3")),
                refusal=Refusal.PYTHON)


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
                refusal=Refusal.HOST_KEY_CHANGED)


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
        n = _fake(tmp_path)
    elif request.param == "local":
        n = _local(tmp_path)
    else:
        n = _ssh(tmp_path, request.getfixturevalue("conformance_hosts"))
    n.runs.mkdir(parents=True)
    return n
