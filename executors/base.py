"""The executor protocol: how the controller probes a node and runs jobs there.

One small async protocol, several transports (as httpx's transports): `local` runs the node helper as a
subprocess on this machine, `ssh` will run it over SSH, `fake` keeps everything in memory for tests.
Every method is bounded in time by the caller's `asyncio.timeout`; a node that cannot answer raises
ExecutorError, which the controller turns into a node state, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hsched.model import RunHandle, RunReport


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    run_dir: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    inherit_env: bool = False
    """Start from the helper's own environment (local runs) rather than a bare PATH (remote runs)."""
    cpus: tuple[int, ...] = ()
    """Pin the run to these CPU cores (those local to its GPUs); empty: no pinning."""


@dataclass(frozen=True, slots=True)
class StatusQuery:
    run_dir: str
    handle: RunHandle | None = None


@runtime_checkable
class Executor(Protocol):
    kind: str

    async def probe(self) -> dict[str, Any]:
        """Machine facts as the node helper reports them (see hsched/nodehelper.py `probe`)."""
        ...

    async def launch(self, req: LaunchRequest) -> RunHandle:
        """Start a run detached; idempotent per run_dir (a second call returns the first run's handle)."""
        ...

    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        """One report per query, in order."""
        ...

    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False) -> bool:
        """Send `signal` (e.g. 'TERM', 'USR1') to the run's process group; False if it is not running."""
        ...

    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Bytes of the run's output log from `offset` (b'' at the end or if there is none yet)."""
        ...

    async def newest_mtime(self, path: str) -> float | None:
        """When a file under `path` (a checkpoint folder on the node) last changed; None if there is none."""
        ...

    async def close(self) -> None: ...
