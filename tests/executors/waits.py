"""Waiting on an executor for a run's state, its log or a process, as fast as the node answers; the test's
own timeout is the only deadline."""

from __future__ import annotations

import asyncio

from hsched.executors.base import Executor

from hsched.model import RunHandle, RunReport
from hsched.node import procfs
from hsched.testing.conformance import wait_log, wait_status

__all__ = ["wait_exited", "wait_gone", "wait_log", "wait_status"]


async def wait_gone(pid: int) -> None:
    """Until the process has ended (a zombie for init to reap counts as ended)."""
    while True:
        if procfs.proc_start_ticks(pid) is None:
            return
        await asyncio.sleep(0.02)


async def wait_exited(ex: Executor, handle: RunHandle) -> RunReport:
    return await wait_status(ex, handle, running=False)
