"""The local executor: the node helper as a subprocess of the controller, on this machine.

It is the same helper file the SSH executor ships to remote nodes, so local and remote runs share one code
path (launch, status, signal, exit codes written by the wrapper).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsched.executors.base import LaunchRequest, StatusQuery

from hsched import nodehelper
from hsched.errors import ExecutorError
from hsched.model import RunHandle, RunReport, RunStatus
from hsched.serialize import handle_from_dict, handle_to_dict

if TYPE_CHECKING:
    from hsched.config import SimulatedDevices

HELPER_PATH = Path(nodehelper.__file__).resolve()


class LocalExecutor:
    kind = "local"

    def __init__(self, *, node: str = "local", simulate: SimulatedDevices | None = None, timeout_s: float = 60.0,
                 python: str = sys.executable) -> None:
        self.node = node
        self.simulate = simulate
        self.timeout_s = timeout_s
        self.python = python

    async def _call(self, command: str, request: dict[str, Any] | None) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self.timeout_s):
                proc = await asyncio.create_subprocess_exec(
                    self.python, str(HELPER_PATH), command,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
                out, err = await proc.communicate(json.dumps(request or {}).encode())
        except TimeoutError:
            raise ExecutorError(f"node helper '{command}' did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            raise ExecutorError(f"cannot run the node helper: {e}") from None
        try:
            reply = json.loads(out.decode() or "{}")
        except ValueError:
            raise ExecutorError(
                f"node helper '{command}' answered garbage: {(out or err).decode(errors='replace')[:200]!r}"
            ) from None
        if "error" in reply:
            raise ExecutorError(f"node helper '{command}': {reply['error']}")
        return reply

    async def probe(self) -> dict[str, Any]:
        return await self._call("probe", None)

    async def launch(self, req: LaunchRequest) -> RunHandle:
        reply = await self._call("launch", {
            "run_dir": req.run_dir, "command": list(req.command), "env": dict(req.env),
            "workdir": req.workdir, "inherit_env": req.inherit_env, "cpus": list(req.cpus),
        })
        handle = handle_from_dict(reply.get("handle"))
        if handle is None:
            raise ExecutorError(f"launch of {req.run_dir} returned no handle")
        return handle

    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        if not queries:
            return []
        reply = await self._call("status", {
            "runs": [{"run_dir": q.run_dir, "handle": handle_to_dict(q.handle)} for q in queries]
        })
        return [report_from_dict(r) for r in reply["runs"]]

    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False) -> bool:
        reply = await self._call("signal", {"handle": handle_to_dict(handle), "signal": signal,
                                            "all_processes": all_processes})
        return bool(reply.get("sent"))

    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        return await asyncio.to_thread(_read_at, Path(run_dir) / "output.log", offset, max_bytes)

    async def newest_mtime(self, path: str) -> float | None:
        """When a file under `path` last changed (a job's last checkpoint), None if there is none."""
        reply = await self._call("newest", {"path": path})
        return reply.get("newest")

    async def watch(self, interval_s: float = 1.0, *, count: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Monitoring samples from this machine every `interval_s` (see nodehelper.watch for the shape)."""
        simulate = None
        if self.simulate is not None:
            from hsched.simulated import simulated_uuid

            simulate = {"uuids": [simulated_uuid(self.node, i) for i in range(self.simulate.count)],
                        "memory_mib": self.simulate.memory_mib}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, str(HELPER_PATH), "watch", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        except OSError as e:
            raise ExecutorError(f"cannot run the node helper: {e}") from None
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"interval_s": interval_s, "count": count, "simulate": simulate}).encode())
            await proc.stdin.drain()
            proc.stdin.close()
            while True:
                try:
                    async with asyncio.timeout(max(10.0, 5 * interval_s)):
                        line = await proc.stdout.readline()
                except TimeoutError:
                    raise ExecutorError("node helper 'watch' sent nothing") from None
                if not line:
                    return
                sample = json.loads(line)
                if "seq" not in sample:
                    return
                sample["node"] = self.node
                for p in sample.get("processes") or ():
                    p["job_run_dir"] = p.get("run_dir")  # local run folders are the controller's own
                yield sample
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def close(self) -> None:
        return None


def _read_at(path: Path, offset: int, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""


def report_from_dict(r: dict[str, Any]) -> RunReport:
    return RunReport(
        status=RunStatus(r["status"]),
        exit_code=r.get("exit_code"),
        signal=r.get("signal"),
        handle=handle_from_dict(r.get("handle")),
    )
