"""A public in-memory executor for tests: runs are records, and the test decides when they end.

    ex = FakeExecutor(devices=[...])
    handle = await ex.launch(req)
    ex.finish(req.run_dir, exit_code=0)     # the next status() reports it exited
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hsched.executors.base import LaunchRequest, StatusQuery

from hsched.errors import ExecutorError
from hsched.model import RunHandle, RunReport, RunStatus


@dataclass
class FakeRun:
    request: LaunchRequest
    handle: RunHandle
    exit_code: int | None = None
    signals: list[str] = field(default_factory=list)
    log: bytes = b""


class FakeExecutor:
    kind = "fake"

    def __init__(self, *, devices: Sequence[dict[str, Any]] = (), cpus: int = 8, memory_total_mib: int = 65536,
                 boot_id: str = "fake-boot") -> None:
        self.devices = list(devices)
        self.cpus = cpus
        self.memory_total_mib = memory_total_mib
        self.boot_id = boot_id
        self.runs: dict[str, FakeRun] = {}
        self.launches = 0
        self.unreachable = False
        self.exit_on_signal: dict[str, int] = {"TERM": 143, "KILL": 137, "INT": 130}
        self.checkpoint_mtimes: dict[str, float] = {}
        self._pids = itertools.count(1000)

    def _check(self) -> None:
        if self.unreachable:
            raise ExecutorError("fake node is unreachable")

    async def probe(self) -> dict[str, Any]:
        self._check()
        return {"helper_version": 1, "hostname": "fake", "boot_id": self.boot_id, "cpus": self.cpus,
                "memory_total_mib": self.memory_total_mib, "numa": [],
                "gpus": {"source": "fake", "devices": list(self.devices)}}

    async def launch(self, req: LaunchRequest) -> RunHandle:
        self._check()
        if req.run_dir in self.runs:
            return self.runs[req.run_dir].handle
        pid = next(self._pids)
        handle = RunHandle(run_dir=req.run_dir, pid=pid, pgid=pid, start_ticks=pid * 10, boot_id=self.boot_id)
        self.runs[req.run_dir] = FakeRun(request=req, handle=handle)
        self.launches += 1
        return handle

    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        self._check()
        out = []
        for q in queries:
            run = self.runs.get(q.run_dir)
            if run is None:
                out.append(RunReport(RunStatus.NOT_STARTED))
            elif run.exit_code is None:
                out.append(RunReport(RunStatus.RUNNING, handle=run.handle))
            else:
                out.append(RunReport(RunStatus.EXITED, exit_code=run.exit_code, handle=run.handle))
        return out

    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False) -> bool:
        self._check()
        run = self.runs.get(handle.run_dir)
        if run is None or run.exit_code is not None:
            return False
        run.signals.append(signal)
        if signal in self.exit_on_signal:
            run.exit_code = self.exit_on_signal[signal]
        return True

    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        run = self.runs.get(run_dir)
        return run.log[offset:offset + max_bytes] if run else b""

    async def newest_mtime(self, path: str) -> float | None:
        return self.checkpoint_mtimes.get(path)

    async def close(self) -> None:
        return None

    # -- for tests

    def finish(self, run_dir: str, exit_code: int = 0) -> None:
        self.runs[run_dir].exit_code = exit_code

    def running(self) -> list[str]:
        return [d for d, r in self.runs.items() if r.exit_code is None]
