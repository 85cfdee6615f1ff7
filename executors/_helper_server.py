"""One long-lived node helper per SSH node (`nodehelper.py serve`): many requests on one channel.

Without it every probe, status or signal starts a Python on the node (about 100 ms of its CPU); with it a
request is one JSON line each way. Requests carry ids and may be answered out of order. When the channel
dies every waiting request fails with ExecutorError and the next one starts a new server; callers fall back
to one channel per request while no server can be had.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from typing import Any

import asyncssh

from hsched.errors import ExecutorError

log = logging.getLogger("hsched.ssh")


class HelperServer:
    def __init__(self, name: str, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.name = name
        self.proc = proc
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.write_lock = asyncio.Lock()
        self.dead: str | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                fut = self.waiting.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg.get("reply") or {})
        except (asyncssh.Error, OSError) as e:
            self.dead = str(e) or type(e).__name__
        finally:
            self.dead = self.dead or "the helper server's channel closed"
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ExecutorError(f"{self.name}: {self.dead}"))
            self.waiting.clear()

    async def call(self, cmd: str, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.dead:
            raise ExecutorError(f"{self.name}: {self.dead}")
        rid = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        try:
            async with asyncio.timeout(timeout_s):
                async with self.write_lock:
                    self.proc.stdin.write(json.dumps({"id": rid, "cmd": cmd, "req": req}).encode() + b"\n")
                return await fut
        except TimeoutError:
            raise ExecutorError(f"{self.name}: no answer within {timeout_s:g} s") from None
        except (asyncssh.Error, OSError) as e:
            self.dead = str(e) or type(e).__name__
            raise ExecutorError(f"{self.name}: connection failed: {e}") from None
        finally:
            self.waiting.pop(rid, None)

    def close(self) -> None:
        self.dead = self.dead or "closed"
        self.reader.cancel()
        with contextlib.suppress(Exception):
            self.proc.close()
