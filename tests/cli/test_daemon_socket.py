"""The real controller's socket under abuse: three 60 MB messages and 2,000 idle connections leave its memory and
its open files bounded and it keeps answering; a bad argument is one line and exit 2 at the CLI; the database
and socket are private."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from hsched.client import Client
from hsched.errors import ControllerError
from hsched.paths import Home
from hsched.protocol import MAX_CONNECTIONS, MAX_LINE, request
from tests.conftest import Hs, wait_until

pytestmark = pytest.mark.slow  # a controller as a real process, abused over its real socket

BIG = 60 * 1000 * 1000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


def flood(path: Path, replies: list[bytes]) -> None:
    """One 60 MB request line, sent as fast as the controller takes it; then whatever it answered."""
    s = connect(path)
    chunk = b'{"op": "submit", "args": {"spec": {"command": ["' + b"x" * (1 << 20)
    sent = 0
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < BIG:
                s.sendall(chunk)
                sent += len(chunk)
            s.sendall(b"\n")
        s.settimeout(60)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while not got.endswith(b"\n"):
                more = s.recv(4096)
                if not more:
                    break
                got += more
        replies.append(got)
    finally:
        s.close()


def test_big_messages_and_idle_connections_leave_the_controller_bounded(hs: Hs, lab_fleet: Path) -> None:
    hs.env["HSCHED_FLEET"] = str(lab_fleet)
    hs.run("daemon", "start", check=True)
    home = Home(hs.home)
    pid = hs.controller_pid()
    assert pid is not None
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in home.private_files() if p.exists()} == {
        p.name: 0o600 for p in home.private_files() if p.exists()}
    rss0, fds0 = rss_mib(pid), fds(pid)

    replies: list[bytes] = []
    senders = [threading.Thread(target=flood, args=(home.socket, replies)) for _ in range(3)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    rss_big = rss_mib(pid)
    assert len(replies) == 3
    for r in replies:
        reply = json.loads(r)
        assert reply["ok"] is False and reply["kind"] == "user"
        assert reply["error"] == f"request too large: over {MAX_LINE} bytes"

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle: list[socket.socket] = []
    try:
        peak = 0
        for i in range(2000):
            idle.append(connect(home.socket))
            if i % 50 == 0:
                peak = max(peak, fds(pid))
        # the first MAX_CONNECTIONS are held; every later one is told so at once and closed
        last = idle[-1]
        last.settimeout(60)
        turned_away = json.loads(last.recv(4096))
        assert turned_away["kind"] == "failed" and "too many connections" in turned_away["error"]
        # those turned away are closed a loop turn after their answer: then only the held ones stay open
        wait_until(lambda: fds(pid) <= fds0 + MAX_CONNECTIONS + 8, "the turned-away connections to be closed")
        rss_idle, fds_idle = rss_mib(pid), fds(pid)
        # it still answers (once the cap has room: a held connection goes away)
        idle.pop(0).close()
        t = time.perf_counter()
        deadline = time.monotonic() + 60
        while True:
            try:
                with Client(home, autostart=False) as c:
                    c.call("queue")
                break
            except ControllerError:  # turned away until the controller sees the freed slot: try again
                if time.monotonic() > deadline:
                    raise
        queue_ms = (time.perf_counter() - t) * 1000
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"\nbaseline RSS {rss0:.0f} MiB, {fds0} fds; after 3 x 60 MB messages RSS {rss_big:.0f} MiB; with 2,000 "
          f"idle connections open RSS {rss_idle:.0f} MiB, {fds_idle} fds (at most {peak} while they came); "
          f"a queue with the cap full {queue_ms:.0f} ms")
    assert rss_big < rss0 + 64, (rss0, rss_big)  # not one 60 MB message was held whole (3 would be 180 MB)
    assert peak < fds0 + 2 * MAX_CONNECTIONS + 100, (fds0, peak)  # never one per connection (2,000)
    assert rss_idle < rss0 + 64, (rss0, rss_idle)
    assert hs.controller_pid() == pid  # it survived all of it


def test_bad_arguments_at_the_cli_are_one_line_and_exit_2(hs: Hs, lab_fleet: Path) -> None:
    hs.env["HSCHED_FLEET"] = str(lab_fleet)
    jid = hs.run("submit", "--parsable", "--hold", "--", "true", check=True).stdout.strip()
    proc = hs.run("priority", jid, "99999999")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hsched: error: priority: expected an integer from -1000000 to 1000000, found 99999999"]
    proc = hs.run("submit", "--priority", "10000000", "--", "true")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "priority: expected an integer from -1000000 to 1000000, found 10000000" in proc.stderr
    proc = hs.run("cancel", str(2**64))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # a raw request with a list for `args`, as a broken client would send it
    with Client(Home(hs.home), autostart=False) as c:
        sock = c.connect()
        sock.sendall(b'{"op": "queue", "args": [1, 2], "protocol": 2, "hsched": "0.1.0"}\n')
        reply = json.loads(c._readline(sock))
        assert reply["kind"] == "user" and reply["error"] == "args: expected a JSON object, found list"
        sock.sendall(request("show", {"id": "seven"}))
        assert json.loads(c._readline(sock))["error"] == "id: not a job id: 'seven'"
    job = hs.json("show", jid)
    assert job["user"] == __import__("pwd").getpwuid(os.getuid()).pw_name  # type: ignore[index]
