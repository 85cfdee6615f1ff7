"""Replicas for router tests: small aiohttp servers in the test's own event loop, that hold requests until the test
releases them (an event, never a sleep), stream in steps the test drives, and echo what they were sent."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Replica:
    name: str
    arrived: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    """One entry (the request's path) per request that reached the replica, as it arrives."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: /hold requests answer."""
    step: asyncio.Event = field(default_factory=asyncio.Event)
    """/stream sends its second chunk when this is set."""
    seen: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def hold(self, request: web.Request) -> web.Response:
        self.seen.append(request.path)
        self.arrived.put_nowait(request.path)
        await self.release.wait()
        return web.Response(text=self.name)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path)
        self.arrived.put_nowait(request.path)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"first;")
        await self.step.wait()
        await resp.write(b"second")
        await resp.write_eof()
        return resp

    async def echo(self, request: web.Request) -> web.Response:
        self.seen.append(request.path)
        self.arrived.put_nowait(request.path)
        body = await request.read()
        return web.json_response({"replica": self.name, "method": request.method, "path": request.path_qs,
                                  "headers": dict(request.headers), "body": body.decode()},
                                 headers={"X-Replica": self.name})

    async def start(self) -> Replica:
        app = web.Application()
        app.router.add_route("*", "/hold", self.hold)
        app.router.add_get("/stream", self.stream)
        app.router.add_route("*", "/echo", self.echo)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        self.release.set()
        self.step.set()
        if self.runner is not None:
            await self.runner.cleanup()


def refused_url() -> str:
    """A loopback address where nothing listens (a port just bound and closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait for a condition the event loop makes true (yielding to it), failing with what after timeout_s: a
    guard against a hang, not a timing the test depends on."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:  # the conditions are the router's counters: nothing to await but the loop's next turn
                if cond():
                    return
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


def loads(text: str) -> dict[str, object]:
    out = json.loads(text)
    assert isinstance(out, dict)
    return out
