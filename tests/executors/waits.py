"""Waiting on an executor for a run's state, its log or a process, as fast as the node answers; the test's
own timeout is the only deadline."""

from __future__ import annotations

import asyncio

from hsched.executors.base import Executor, StatusQuery

from hsched.model import RunHandle, RunReport, RunStatus
from hsched.node import procfs


async def wait_status(ex: Executor, handle: RunHandle, *, running: bool) -> RunReport:
    """The run's report once it is (or is no longer) running; bounded by the test's deadline."""
    while True:
        [rep] = await ex.status([StatusQuery(handle.run_dir, handle)])
        if (rep.status is RunStatus.RUNNING) == running:
            return rep
        await asyncio.sleep(0.02)


async def wait_log(ex: Executor, run_dir: str, text: bytes) -> bytes:
    while True:
        log = await ex.read_log(run_dir, 0)
        if text in log:
            return log
        await asyncio.sleep(0.02)


async def wait_gone(pid: int) -> None:
    """Until the process has ended (a zombie for init to reap counts as ended)."""
    while True:
        if procfs.proc_start_ticks(pid) is None:
            return
        await asyncio.sleep(0.02)


async def wait_exited(ex: Executor, handle: RunHandle) -> RunReport:
    return await wait_status(ex, handle, running=False)
