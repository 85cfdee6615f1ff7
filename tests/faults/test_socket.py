"""Abuse of the control socket: idle connections, more connections than the cap, oversized and malformed
messages. The controller stays responsive, its descriptors and memory bounded. The controller's idle timeout is
shrunk to 3 s for this module (hsched.controller.server.Limits, as its tests do); the other limits are the
product's."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAFETY_S
from tests.faults.cluster import Cluster, wait_for

pytestmark = pytest.mark.slow  # a controller process and hundreds of connections

IDLE_S = 3.0
FLEET = """
[[node]]
name = "sock"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 2
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    c = Cluster(tmp_path_factory.mktemp("socket"), fleet_text=FLEET, limits={"idle_timeout_s": IDLE_S})
    try:
        c.start()
        yield c
    finally:
        c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def connect(lab: Cluster) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(SAFETY_S)
    while True:
        try:
            s.connect(str(lab.home / "controller.sock"))
            return s
        except BlockingIOError:  # the listen backlog is full: the controller has not accepted the others yet
            time.sleep(0.001)


def line(op: str, args: Any) -> bytes:
    try:
        from hsched.protocol import request  # stamped with this side's version and protocol
    except ImportError:
        return json.dumps({"op": op, "args": args}).encode() + b"\n"
    if isinstance(args, dict):
        return request(op, args)
    return request(op, {})[:-1].replace(b'"args":{}', b'"args":' + json.dumps(args).encode()) + b"\n"


def reply(s: socket.socket) -> dict[str, Any] | None:
    """The next reply line, or None when the controller closed the connection first."""
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = s.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return None
        if not chunk:
            return None
        buf += chunk
    return json.loads(buf)


def queue_ms(lab: Cluster) -> float:
    t = time.perf_counter()
    lab.call("queue")
    return (time.perf_counter() - t) * 1000


def test_idle_connections_are_closed_and_the_controller_answers_meanwhile(lab: Cluster) -> None:
    pid = lab.start()
    base = fds(pid)
    idle = [connect(lab) for _ in range(200)]
    try:
        took = queue_ms(lab)  # answered while 200 connections sit idle
        for s in idle:  # each is closed by the controller (after its idle timeout), none is left open
            assert reply(s) is None
        wait_for(lambda: fds(pid) <= base + 2, "the controller's descriptors to come back down")
    finally:
        for s in idle:
            s.close()
    print(f"queue with 200 idle connections: {took:.1f} ms")
    lab.check()


def test_connections_past_the_cap_are_refused_and_the_controller_stays_responsive(lab: Cluster) -> None:
    try:
        from hsched.protocol import MAX_CONNECTIONS as cap
    except ImportError:
        cap = 256
    pid = lab.start()
    base = fds(pid)
    socks = [connect(lab) for _ in range(cap + 40)]
    try:
        refused = 0
        for s in socks[cap:]:  # the newcomers past the cap: told so in one line, then closed
            got = reply(s)
            refused += got is not None and not got.get("ok") and "too many" in str(got.get("error"))
        # the refused ones are closed once their reply is out (asyncio closes a transport after it flushed, which
        # may be just after this side read the reply): the controller's descriptors come down to the cap's
        wait_for(lambda: fds(pid) <= base + cap + 8, f"the refused connections to be closed ({cap} kept)")
        assert refused >= 30, refused  # (a few of ours may not have been counted as open yet)
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: fds(pid) <= base + 2, "the controller's descriptors to come back down")
    print(f"queue after {cap + 40} connections: {queue_ms(lab):.1f} ms")
    lab.check()


def test_oversized_messages_are_refused_and_memory_stays_bounded(lab: Cluster) -> None:
    pid = lab.start()
    lab.call("queue")
    before = rss_mib(pid)
    answers = []
    for _ in range(3):  # three 60 MB messages (issue 12: RSS went to 293 MB)
        s = connect(lab)
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(b'{"op": "submit", "args": {"spec": {"command": ["' + b"x" * (60 << 20) + b'"]}}}\n')
            answers.append(reply(s))
        finally:
            s.close()
    after = rss_mib(pid)
    assert after - before < 64, f"RSS {before:.0f} MiB -> {after:.0f} MiB after three 60 MB messages"
    for a in answers:
        assert a is None or (a["ok"] is False and a.get("kind") == "user"), a
    print(f"RSS {before:.0f} -> {after:.0f} MiB; answers {[a and a.get('error') for a in answers]}")
    lab.call("queue")
    lab.check()


@pytest.mark.parametrize("raw, field", [
    (b"not json\n", None),
    (b"[1, 2]\n", None),
    (line("cancel", [1]), "args"),
    (line("cancel", {"id": "x"}), "id"),
    (line("priority", {"id": "JOB", "priority": 10 ** 30}), "priority"),
    (line("wait", {"ids": [1], "timeout": "soon"}), "timeout"),
], ids=["not-json", "not-an-object", "args-a-list", "id-a-word", "priority-huge", "timeout-a-word"])
def test_malformed_requests_are_user_errors_naming_the_field(lab: Cluster, raw: bytes, field: str | None) -> None:
    held = lab.submit(["true"], gpus=0, hold=True)
    s = connect(lab)
    try:
        s.sendall(raw.replace(b'"JOB"', str(held).encode()))
        got = reply(s)
    finally:
        s.close()
    assert got is not None and got["ok"] is False and got.get("kind") == "user", got
    if field is not None:
        assert field in got["error"], got
    lab.cancel(held)
    lab.check()
