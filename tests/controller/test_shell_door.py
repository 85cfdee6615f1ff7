"""The control socket's door, driven in memory (a StreamReader fed by the test, a writer that records): limits,
malformed requests, version skew, a restart under way; and which processes a stop reaps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from hsched.controller.api import Api
from hsched.controller.server import Door, Limits, Proc, helper_groups, strays
from hsched.protocol import PACKAGE_VERSION, PROTOCOL, encode, request
from hsched.testing import Lab
from tests.controller.conftest import until


class Writer:
    """What a StreamWriter is to the door: the replies it wrote, and whether it was closed."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed.set()

    def get_extra_info(self, name: str) -> Any:
        return None  # no socket: the peer is taken as this uid

    def replies(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.data.splitlines()]


@asynccontextmanager
async def door(tmp_path: Path, **limits: Any) -> AsyncIterator[tuple[Lab, Door]]:
    async with Lab.open(tmp_path) as lab:
        yield lab, Door(Api(lab.ctl), Limits(**limits))


def connect(d: Door, limit: int) -> tuple[asyncio.StreamReader, Writer, asyncio.Task[None]]:
    reader = asyncio.StreamReader(limit=limit)
    writer = Writer()
    task = asyncio.create_task(d.serve(reader, writer))  # type: ignore[arg-type]
    return reader, writer, task


async def test_requests_are_answered_in_order_and_stamped_with_the_version(tmp_path: Path) -> None:
    async with door(tmp_path) as (_, d):
        reader, writer, task = connect(d, 1 << 20)
        reader.feed_data(request("ping", {}) + request("queue", {"all": True}))
        reader.feed_eof()
        await task
        ping, queue = writer.replies()
        assert ping["ok"] and ping["result"]["protocol"] == PROTOCOL
        assert queue == {"ok": True, "result": [], "hsched": PACKAGE_VERSION, "protocol": PROTOCOL}
        assert writer.closed.is_set()


async def test_an_oversized_request_gets_one_clear_error_and_the_connection_closes(tmp_path: Path) -> None:
    async with door(tmp_path, max_line=1000) as (_, d):
        reader, writer, task = connect(d, 1000)
        reader.feed_data(b'{"op": "submit", "args": {"spec": "' + b"x" * 5000)  # no newline yet: still refused
        await task
        [reply] = writer.replies()
        assert reply["ok"] is False and reply["kind"] == "user"
        assert reply["error"] == "request too large: over 1000 bytes"
        # the door still serves everyone else
        reader, writer, task = connect(d, 1000)
        reader.feed_data(request("ping", {}))
        reader.feed_eof()
        await task
        assert writer.replies()[0]["ok"] is True


async def test_malformed_requests_are_user_errors_and_the_connection_goes_on(tmp_path: Path) -> None:
    async with door(tmp_path) as (_, d):
        reader, writer, task = connect(d, 1 << 20)
        stamp = {"hsched": PACKAGE_VERSION, "protocol": PROTOCOL}
        lines = [b"not json\n", b"[" * 200_000 + b"\n",  # the second nests deeper than any parser goes
                 b"[1, 2]\n", encode({"args": {}, **stamp}), encode({"op": 3, **stamp}),
                 encode({"op": "queue", "args": [1], **stamp}), encode({"op": "show", "args": {"id": "x"}, **stamp})]
        for line in lines:
            reader.feed_data(line)
        reader.feed_data(request("ping", {}))
        reader.feed_eof()
        await task
        replies = writer.replies()
        assert [r["kind"] for r in replies[:-1]] == ["user"] * 7
        assert [r["error"] for r in replies[:-1]] == [
            "malformed request: not JSON", "malformed request: not JSON", "malformed request: expected a JSON object",
            "malformed request: `op` must be a non-empty string", "malformed request: `op` must be a non-empty string",
            "args: expected a JSON object, found list", "id: not a job id: 'x'"]
        assert replies[-1]["ok"] is True


async def test_a_client_of_another_protocol_is_told_to_restart_the_controller(tmp_path: Path) -> None:
    async with door(tmp_path) as (lab, d):
        lab.ctl.fingerprint = None  # nothing changed on disk: a restart of this controller would not help
        reader, writer, task = connect(d, 1 << 20)
        old_cli = {"op": "queue", "args": {}}  # protocol 1 clients sent no version at all
        reader.feed_data(encode(old_cli) + encode({"op": "ping"}) + encode({"op": "stop"}))
        reader.feed_eof()
        await task
        queue, ping, stop = writer.replies()
        assert queue["kind"] == "version" and "`hsched daemon restart`" in queue["error"]
        assert "protocol 1" in queue["error"] and f"protocol {PROTOCOL}" in queue["error"]
        assert ping["ok"] and stop["ok"]  # status and stop work across any skew
        assert lab.ctl.stopping.is_set()


async def test_while_restarting_nothing_is_done_and_the_client_is_told_to_ask_again(tmp_path: Path) -> None:
    async with door(tmp_path) as (lab, d):
        lab.ctl.request_restart("hsched was reinstalled under it (test)")
        reader, writer, task = connect(d, 1 << 20)
        reader.feed_data(request("submit", {"spec": {"command": ["true"]}}))
        reader.feed_eof()
        await task
        [reply] = writer.replies()
        assert reply["kind"] == "restarting" and "send the request again" in reply["error"]
        assert await lab.ctl.db(lab.ctl.store.jobs) == []  # the submit was not carried out


async def test_a_skewed_client_after_a_reinstall_restarts_the_controller(tmp_path: Path, monkeypatch: Any) -> None:
    from hsched.controller import loops

    monkeypatch.setattr(loops, "installed_fingerprint", lambda: "new-install")
    async with door(tmp_path) as (lab, d):
        lab.ctl.fingerprint = "old-install"
        reader, writer, task = connect(d, 1 << 20)
        reader.feed_data(encode({"op": "queue", "args": {}, "hsched": "9.9.9", "protocol": PROTOCOL + 1}))
        reader.feed_eof()
        await task
        [reply] = writer.replies()
        assert reply["kind"] == "restarting"
        assert lab.ctl.restart_reason is not None and "old-install -> new-install" in lab.ctl.restart_reason


async def test_idle_connections_close_and_the_cap_turns_newcomers_away(tmp_path: Path) -> None:
    async with door(tmp_path, idle_timeout_s=0.2, max_connections=2) as (_, d):
        held = [connect(d, 1 << 20) for _ in range(2)]
        await until(lambda: len(d.connections) == 2)
        _, writer, task = connect(d, 1 << 20)
        await task
        [reply] = writer.replies()
        assert reply["kind"] == "failed" and "too many connections to the controller (2 open)" in reply["error"]
        # the held ones sent nothing: closed once idle for the timeout, without a word
        await asyncio.gather(*(t for _, _, t in held))
        assert all(w.closed.is_set() and w.data == b"" for _, w, _ in held)
        assert not d.connections


async def test_a_stop_answers_requests_under_way_and_closes_idle_connections(tmp_path: Path) -> None:
    async with door(tmp_path, drain_s=5.0) as (lab, d):
        job = await lab.submit("python", "train.py")
        waiting_r, waiting_w, waiting = connect(d, 1 << 20)
        waiting_r.feed_data(request("wait", {"ids": [job.id], "timeout": 600}))
        _, idle_w, idle = connect(d, 1 << 20)
        await until(lambda: d.busy)
        lab.ctl.request_restart("test")
        await lab.ctl.notify()
        await d.close()
        assert waiting.done() and idle.done()
        [reply] = waiting_w.replies()
        assert reply["kind"] == "restarting"  # the wait was cut short, to be sent again to the new controller
        assert idle_w.data == b"" and idle_w.closed.is_set()


def proc(pid: int, ppid: int, pgrp: int, session: int, start: int = 100) -> Proc:
    return Proc(pid=pid, ppid=ppid, pgrp=pgrp, session=session, start=start)


def test_a_stop_reaps_what_is_left_of_its_helpers_and_never_a_job() -> None:
    me = 1000
    procs = {p.pid: p for p in [
        proc(1, 0, 1, 1),
        proc(900, 1, 900, 900),                 # the shell that started the controller
        proc(me, 900, me, me),                  # the controller, leading its own session (as the CLI starts it)
        proc(1001, me, 1001, 1001),             # a helper server, in a session of its own
        proc(1002, 1001, 1001, 1001),           # its nvidia-smi, hung
        proc(1003, 1001, 1003, 1003),           # a job wrapper that helper started: its own session
        proc(1004, 1003, 1004, 1004),           # the job
        proc(1005, me, me, me),                 # a sampler (watch helper) in the controller's own group
        proc(1006, 1, me, me),                  # a sampler's nvidia-smi, orphaned
        proc(1007, 900, 1007, 900),             # something else the shell runs
    ]}
    groups = helper_groups(procs, me)
    assert groups == {1001: 100}
    # a helper server that is still there (its executor could not close it) goes too
    assert strays(procs, me, groups) == [1001, 1002, 1005, 1006]
    # after the executors closed, the helper server is gone and its hung child is still in its group
    del procs[1001]
    assert strays(procs, me, groups) == [1002, 1005, 1006]


def test_a_reused_group_id_is_left_alone() -> None:
    me = 1000
    before = {me: proc(me, 1, me, me), 1001: proc(1001, me, 1001, 1001, start=100)}
    groups = helper_groups(before, me)
    after = {me: proc(me, 1, me, me), 1001: proc(1001, 1, 1001, 1001, start=999),  # another process, same pid
             1002: proc(1002, 1001, 1001, 1001, start=999)}
    assert strays(after, me, groups) == []


def test_a_controller_in_someone_elses_group_reaps_only_its_helper_groups() -> None:
    me = 1000
    procs = {p.pid: p for p in [proc(900, 1, 900, 900), proc(me, 900, 900, 900), proc(1001, me, 1001, 1001),
                                proc(1002, 1001, 1001, 1001), proc(1003, 900, 900, 900)]}
    assert strays(procs, me, helper_groups(procs, me)) == [1001, 1002]  # never 1003, its shell's other child
