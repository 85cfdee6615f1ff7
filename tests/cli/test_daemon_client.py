"""The CLI's side of version skew and controller health, against canned replies: a restart under way is asked
again once, a controller it cannot talk to is one line naming `hsched daemon restart`, and `daemon status`
shows the controller's health and exits 1 when it is unhealthy or does not answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from hsched.cli import daemon
from hsched.client import Client, NotDelivered
from hsched.errors import ControllerError, UserError
from hsched.paths import Home
from hsched.protocol import MAX_LINE, PACKAGE_VERSION, PROTOCOL


def stamped(**reply: Any) -> dict[str, Any]:
    return {**reply, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL}


class Canned(Client):
    """A client whose exchanges are the replies a test gives, in order."""

    def __init__(self, home: Home, replies: list[Any]) -> None:
        super().__init__(home, autostart=False)
        self.replies = replies
        self.sent: list[bytes] = []
        self.reconnects = 0

    def _exchange(self, line: bytes) -> bytes:
        self.sent.append(line)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return json.dumps(reply).encode()

    def _reconnect_after_restart(self) -> Any:
        self.reconnects += 1
        return None


RESTARTING = stamped(ok=False, kind="restarting", error="the controller restarts (test); nothing was done")


def test_a_restarting_controller_is_asked_again_once(tmp_path: Path) -> None:
    c = Canned(Home(tmp_path), [RESTARTING, stamped(ok=True, result=[])])
    assert c.call("queue") == []
    assert c.reconnects == 1 and len(c.sent) == 2 and c.sent[0] == c.sent[1]
    twice = Canned(Home(tmp_path), [RESTARTING, RESTARTING])
    with pytest.raises(ControllerError, match="restarts"):
        twice.call("queue")
    assert twice.reconnects == 1  # once, not a loop


def test_a_request_the_controller_never_read_is_sent_again_once(tmp_path: Path) -> None:
    reset = NotDelivered("[Errno 104] Connection reset by peer")  # its door closed with our line unread
    c = Canned(Home(tmp_path), [reset, stamped(ok=True, result=[])])
    assert c.call("queue") == [] and c.reconnects == 1
    with pytest.raises(ControllerError, match=r"lost the controller: .*reset"):
        Canned(Home(tmp_path), [reset, reset]).call("queue")


def test_a_controller_it_cannot_talk_to_is_one_line_naming_daemon_restart(tmp_path: Path) -> None:
    old = {"ok": True, "result": []}  # a controller from before protocol numbers: its answer is not trusted
    with pytest.raises(ControllerError, match=r"runs an older hsched .*`hsched daemon restart`"):
        Canned(Home(tmp_path), [old]).call("queue")
    assert Canned(Home(tmp_path), [{"ok": True, "result": {"pid": 7}}]).call("ping") == {"pid": 7}  # status works
    newer = {"ok": True, "result": [], "hsched": "9.0", "protocol": PROTOCOL + 1}
    with pytest.raises(ControllerError, match=f"protocol {PROTOCOL + 1}\\) cannot talk: `hsched daemon restart`"):
        Canned(Home(tmp_path), [newer]).call("queue")
    refused = stamped(ok=False, kind="version", error="this hsched (x) ... `hsched daemon restart` restarts it")
    with pytest.raises(ControllerError, match="daemon restart"):
        Canned(Home(tmp_path), [refused]).call("queue")
    with pytest.raises(UserError, match="id: not a job id"):
        Canned(Home(tmp_path), [stamped(ok=False, kind="user", error="id: not a job id: 'x'")]).call("show")


def test_a_request_too_large_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    c = Canned(Home(tmp_path), [])
    with pytest.raises(UserError, match=f"submit: request too large: over {MAX_LINE} bytes"):
        c.call("submit", spec={"command": ["x" * MAX_LINE]})
    assert c.sent == []


class StatusClient:
    """What `daemon status` gets from a running controller's ping."""

    answer: dict[str, Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.home = Home(Path("/nonexistent/hsched-home"))

    def __enter__(self) -> StatusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def call(self, op: str, **args: Any) -> Any:
        if self.answer is None:
            raise ControllerError("lost the controller: connection refused")
        return self.answer


def status(monkeypatch: pytest.MonkeyPatch, pid: int | None, answer: dict[str, Any] | None,
           as_json: bool = False) -> tuple[int, str, str]:
    """`hsched daemon status` with a controller that holds the lock as `pid` and answers ping with `answer`
    (None: does not answer): (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    import hsched.client

    StatusClient.answer = answer
    monkeypatch.setattr(hsched.client, "Client", StatusClient)
    monkeypatch.setattr(hsched.client, "controller_pid", lambda home: pid)
    app = typer.Typer()
    daemon.register(app)
    result = CliRunner().invoke(app, ["daemon", "status", *(["--json"] if as_json else [])])
    return result.exit_code, result.stdout, result.stderr


def test_daemon_status_shows_health_and_fails_when_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = {"pid": 42, "health": "ok", "health_error": None}
    assert status(monkeypatch, 42, ok) == (0, "controller running (pid 42) for /nonexistent/hsched-home: ok\n", "")
    sick = {"pid": 42, "health": "unhealthy",
            "health_error": "the schedule loop failed 3 times in a row; last: KeyError: 'runs'"}
    assert status(monkeypatch, 42, sick)[0::2] == (
        1, "hsched: error: the schedule loop failed 3 times in a row; last: KeyError: 'runs'\n")
    code, out, _ = status(monkeypatch, 42, sick, as_json=True)
    shown = json.loads(out)
    assert code == 1 and shown["running"] is True and shown["pid"] == 42 and shown["health"] == "unhealthy"
    code, _, err = status(monkeypatch, 42, None)  # holds the lock but does not answer
    assert code == 1 and "does not answer" in err
    code, out, _ = status(monkeypatch, None, None, as_json=True)
    assert code == 0 and json.loads(out) == {"running": False, "pid": None, "home": "/nonexistent/hsched-home",
                                            "mode": "personal",
                                            "socket": "/nonexistent/hsched-home/controller.sock"}


def test_a_cli_waits_for_a_restarting_controller_instead_of_starting_another(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a controller's two images (it restarts on a reinstalled hsched) it holds the lock and no socket
    listens. A CLI then waits for the socket: one started in that window waited for the lock and took the home
    over, with that CLI's environment, when the controller was next stopped (CI: `daemon restart` saw the lock
    held 30 s on). Once no controller holds the lock, the CLI starts one as before."""
    import os
    import socket
    import threading

    from hsched import client as client_mod
    from hsched.controller.server import acquire_lock

    home = Home.at(tmp_path / "home")
    home.ensure()
    lock = acquire_lock(home)  # the controller between its images: lock held, no socket
    started: list[str] = []

    def start(self: Client) -> socket.socket:
        started.append("spawned")
        raise ControllerError("would spawn a controller")

    monkeypatch.setattr(Client, "_start_and_connect", start)
    looked = threading.Event()
    real_pid = client_mod.controller_pid

    def pid(h: Home) -> int | None:
        looked.set()
        return real_pid(h)

    monkeypatch.setattr(client_mod, "controller_pid", pid)
    got: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.update(sock=Client(home).connect()))
    waiter.start()
    assert looked.wait(30)  # the CLI found no socket and looked at the lock: it is waiting now
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(home.socket))  # the new image listens
    server.listen()
    waiter.join(60)
    assert "sock" in got and started == []
    got["sock"].close()
    server.close()
    home.socket.unlink()
    os.close(lock)  # no controller now: the CLI starts one
    with pytest.raises(ControllerError, match="would spawn"):
        Client(home).connect()
    assert started == ["spawned"]
