"""Local nodes share one helper server (issue 18): every local node of a fleet is this machine, so one
`nodehelper.py serve` answers them all; what they ask at the same moment is asked once (the status of all
their runs in one request, one probe of the machine), each node still gets its own answer, and the server
lives as long as any of them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from hsched.executors import _rpc
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.local import LocalExecutor

from hsched.model import RunStatus
from tests.executors.waits import wait_status
from tests.procs import processes

pytestmark = pytest.mark.slow  # real processes

NODES = 8


def helper_servers() -> list[int]:
    return [p.pid for p in processes() if p.ppid == os.getpid() and b"serve" in p.argv]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every request sent to a helper server, in order."""
    sent: list[tuple[str, dict[str, Any]]] = []
    call = _rpc.HelperClient.call

    async def recording(self: _rpc.HelperClient, cmd: str, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        sent.append((cmd, req))
        return await call(self, cmd, req, timeout_s)

    monkeypatch.setattr(_rpc.HelperClient, "call", recording)
    return sent


async def test_local_nodes_share_one_server_and_ask_together(tmp_path: Path,
                                                             asked: list[tuple[str, dict[str, Any]]]) -> None:
    nodes = [LocalExecutor(node=f"n{i}") for i in range(NODES)]
    try:
        # each node's run ends with its own exit code: the answers must come back to the right node
        handles = [await ex.launch(LaunchRequest(run_dir=str(tmp_path / f"n{i}"), command=("sh", "-c", f"exit {i}")))
                   for i, ex in enumerate(nodes)]
        [pid] = {ex.server_pid for ex in nodes}
        assert pid is not None and helper_servers() == [pid]
        for ex, h in zip(nodes, handles, strict=True):
            await wait_status(ex, h, running=False)
        asked.clear()
        # as the watch loop asks: every node at once, plus a folder that is no run
        reports = await asyncio.gather(*(ex.status([StatusQuery(h.run_dir, h), StatusQuery(str(tmp_path / "x"))])
                                         for ex, h in zip(nodes, handles, strict=True)))
        assert [cmd for cmd, _ in asked] == ["status"]  # one request for all of them
        assert len(asked[0][1]["runs"]) == 2 * NODES
        for i, (done, none) in enumerate(reports):
            assert (done.status, done.exit_code) == (RunStatus.EXITED, i)
            assert none.status is RunStatus.NOT_STARTED
        asked.clear()
        probes = await asyncio.gather(*(ex.probe() for ex in nodes))
        assert [cmd for cmd, _ in asked] == ["probe"]  # the machine is probed once for all its nodes
        assert all(p == probes[0] for p in probes) and probes[0]["cpus"] == os.cpu_count()
        assert probes[0] is not probes[1]  # each node keeps a copy of its own
        assert all(ex.last_contact is not None for ex in nodes)
    finally:
        for ex in nodes:
            await ex.close()
    assert helper_servers() == []


async def test_the_server_lives_as_long_as_a_node_uses_it(tmp_path: Path) -> None:
    a, b = LocalExecutor(node="a"), LocalExecutor(node="b")
    try:
        await a.probe()
        await b.probe()
        pid = a.server_pid
        assert pid is not None and b.server_pid == pid
        await a.close()
        assert helper_servers() == [pid] and b.server_pid == pid
        [rep] = await b.status([StatusQuery(str(tmp_path / "r"))])
        assert rep.status is RunStatus.NOT_STARTED
        await a.probe()  # a closed node may be used again: it joins the server that is there
        assert a.server_pid == pid
    finally:
        await a.close()
        await b.close()
    assert helper_servers() == []


async def test_a_dead_server_is_replaced_for_every_node(tmp_path: Path) -> None:
    nodes = [LocalExecutor(node=f"n{i}") for i in range(3)]
    try:
        h = await nodes[0].launch(LaunchRequest(run_dir=str(tmp_path / "r"), command=("sleep", "60")))
        old = nodes[0].server_pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        # the calls that find it dead are answered by helpers of their own; the next ones by a new server
        for _ in range(2):
            reports = await asyncio.gather(*(ex.status([StatusQuery(h.run_dir, h)]) for ex in nodes))
            assert all(r[0].status is RunStatus.RUNNING for r in reports)
        await asyncio.gather(*(ex.status([StatusQuery(h.run_dir, h)]) for ex in nodes))
        assert {ex.server_pid for ex in nodes} == {helper_servers()[0]} and old not in helper_servers()
        assert await nodes[2].signal(h, "KILL")
    finally:
        for ex in nodes:
            await ex.close()


async def test_a_node_that_gives_up_on_a_status_leaves_the_others_answered(tmp_path: Path) -> None:
    a, b = LocalExecutor(node="a"), LocalExecutor(node="b")
    try:
        await a.probe()
        impatient = asyncio.create_task(a.status([StatusQuery(str(tmp_path / "a"))]))
        patient = asyncio.create_task(b.status([StatusQuery(str(tmp_path / "b"))]))
        await asyncio.sleep(0)  # both asked
        impatient.cancel()
        [rep] = await patient
        assert rep.status is RunStatus.NOT_STARTED
        with pytest.raises(asyncio.CancelledError):
            await impatient
        [rep] = await a.status([StatusQuery(str(tmp_path / "a"))])  # and it may ask again
        assert rep.status is RunStatus.NOT_STARTED
    finally:
        await a.close()
        await b.close()


async def test_separate_interpreters_keep_separate_servers(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.symlink_to(sys.executable)  # another path, the same interpreter
    a, b = LocalExecutor(node="a"), LocalExecutor(node="b", python=str(python))
    try:
        await asyncio.gather(a.probe(), b.probe())
        assert a.server_pid is not None and b.server_pid is not None and a.server_pid != b.server_pid
    finally:
        await a.close()
        await b.close()
