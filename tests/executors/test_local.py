"""The local executor's helper server: one process for every call, started again when it dies, a helper per
call while none can start, and no zombie left by the runs it launched."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.local import LocalExecutor

from hsched.model import RunStatus
from tests.executors.waits import wait_status
from tests.procs import processes

pytestmark = pytest.mark.slow  # real processes


def children(pid: int) -> dict[int, str]:
    """The children of `pid`: pid -> state letter (Z: a zombie nobody reaped)."""
    return {p.pid: p.state for p in processes() if p.ppid == pid}


def helper_servers() -> list[int]:
    """Our children that are helper servers."""
    return [p.pid for p in processes() if p.ppid == os.getpid() and b"serve" in p.argv]


async def wait_childless(pid: int) -> None:
    while True:
        if not children(pid):
            return
        await asyncio.sleep(0.02)


async def test_one_server_answers_many_calls_at_once(tmp_path: Path) -> None:
    ex = LocalExecutor()
    try:
        replies = await asyncio.gather(*(ex.status([StatusQuery(str(tmp_path / f"r{i}"))]) for i in range(20)))
        assert [r[0].status for r in replies] == [RunStatus.NOT_STARTED] * 20
        pid = ex.server_pid
        assert pid is not None
        assert helper_servers() == [pid]  # twenty first calls at once started one server, not twenty
        await ex.probe()
        assert ex.server_pid == pid
    finally:
        await ex.close()
    assert ex.server_pid is None


async def test_a_server_that_dies_is_replaced(tmp_path: Path) -> None:
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(tmp_path / "r"), command=("sleep", "60")))
        old = ex.server_pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        # the call that finds it dead is answered by a helper of its own; the one after by a new server
        for _ in range(2):
            [rep] = await ex.status([StatusQuery(h.run_dir, h)])
            assert rep.status is RunStatus.RUNNING  # the run lives on: it never was the server's
        [rep] = await ex.status([StatusQuery(h.run_dir, h)])
        assert ex.server_pid not in (None, old) and ex.last_error is None
        assert await ex.signal(h, "KILL")
    finally:
        await ex.close()


async def test_one_helper_per_call_while_no_server_starts(tmp_path: Path) -> None:
    # an interpreter that refuses to serve but answers one-shot calls
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$2" = serve ] && exit 1\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    ex = LocalExecutor(python=str(python))
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(tmp_path / "r"), command=("sh", "-c", "exit 4")))
        assert (await wait_status(ex, h, running=False)).exit_code == 4
        assert (await ex.probe())["cpus"] == os.cpu_count()
        assert ex.server_pid is None and ex.last_error is None
    finally:
        await ex.close()
    plain = LocalExecutor(serve=False)
    try:
        assert (await plain.probe())["cpus"] == os.cpu_count() and plain.server_pid is None
    finally:
        await plain.close()


async def test_the_server_reaps_the_runs_it_launched(tmp_path: Path) -> None:
    ex = LocalExecutor()
    try:
        handles = [await ex.launch(LaunchRequest(run_dir=str(tmp_path / f"r{i}"), command=("true",)))
                   for i in range(3)]
        for h in handles:
            assert (await wait_status(ex, h, running=False)).exit_code == 0
        server = ex.server_pid
        assert server is not None
        await wait_childless(server)  # each wrapper is reaped when it ends: no zombie stays behind
    finally:
        await ex.close()


async def test_close_ends_the_server(tmp_path: Path) -> None:
    ex = LocalExecutor()
    await ex.probe()
    pid = ex.server_pid
    assert pid is not None
    await ex.close()
    assert helper_servers() == []
