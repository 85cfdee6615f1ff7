"""The CLI's side of the control socket: blocking, small, and quick to import (no asyncio).

Version skew: every request carries this hsched's version and protocol, every reply the controller's. A
controller that restarts itself on a reinstalled hsched answers "restarting" (having done nothing): the
request is sent again, once, to the controller that comes back. A controller this CLI cannot talk to (another
protocol, or one from before protocol numbers) makes the call fail with one line: `hsched daemon restart`.
"""

from __future__ import annotations

import _socket  # (the C module: socket.py's import, its selectors and constants made enums, is ~4 ms of a CLI start)
import json
import os
import sys
import time

from hsched import homes
from hsched.errors import ControllerError, PermissionDenied, UserError
from hsched.protocol import (
    MAX_LINE,
    OPS_ANY_PROTOCOL,
    PACKAGE_VERSION,
    PROTOCOL,
    RESULT_MARK,
    Kind,
    request,
    too_large,
)

TYPE_CHECKING = False  # typing's own costs a CLI start a few ms, and only the type checker needs it here
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    from hsched.paths import Home

START_TIMEOUT_S = 30.0
RESTART_TIMEOUT_S = 60.0
"""How long a request waits for a controller that restarts itself (it stops, then starts and probes)."""

_WRITTEN = memoryview(b"")
"""`_answer`'s text for a reply whose result went to its writer already (`write_text`)."""


class WriterGone(Exception):
    """The writer a reply's text went to failed (`error`: its OSError; a reader gone, `hsched queue --json | head`):
    not the controller's connection, so nothing is sent again."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class NotDelivered(ControllerError):
    """The controller closed the connection before it read the request (the kernel says so: a reset, a broken
    pipe), so the request was not carried out."""


class Client:
    def __init__(self, home: Home | None = None, *, autostart: bool = True, start_lab: bool = False) -> None:
        self._home = home
        self.autostart = autostart
        self.start_lab = start_lab
        """A lab's controller is started by `daemon start`/`restart` alone (start_lab), by its home's owner: any
        other command finding it down says so rather than starting it behind systemd's back."""
        self._sock: _socket.socket | None = None
        self._buf = b""

    @property
    def home(self) -> Home:
        """This client's home: the one given, else this CLI's (`Home.from_env`), made on first need. A call whose
        controller answers needs only its socket (`_socket_path`), so a quick path never imports `pathlib`."""
        if self._home is None:
            from hsched.paths import Home

            self._home = Home.from_env()
        return self._home

    def _socket_path(self) -> str:
        if self._home is not None:
            return str(self._home.socket)
        return homes.socket_path()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect_once(self) -> _socket.socket | None:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(self._socket_path())
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError):
            s.close()
            return None  # nothing listens there (or the folder cannot exist): starting one says what is wrong
        except PermissionError:
            s.close()
            raise ControllerError(f"permission denied on {self.home.socket}: it belongs to another user") from None
        return s

    def reachable(self) -> bool:
        """Whether a controller answers the socket now (connected, and the connection kept for the next call);
        never starts one. A socket this user may not use is not reachable (the next call says why)."""
        if self._sock is None:
            try:
                self._sock = self._connect_once()
            except ControllerError:
                return False
        return self._sock is not None

    def connect(self) -> _socket.socket:
        if self._sock is not None:
            return self._sock
        s = self._connect_once()
        if s is None:
            if self.home.lab and not (self.start_lab and self._may_start_lab()):
                who = "start it" if self._may_start_lab() else "an admin starts it"
                raise ControllerError(f"the lab's controller does not answer on {self.home.socket}: {who} "
                                      "(`sudo systemctl start hsched`, or `sudo hsched daemon start --lab`)")
            if not self.autostart:
                raise ControllerError(f"no controller runs for {self.home.root} (`hsched daemon start` starts one)")
            s = self._wait_or_start()
        self._sock = s
        return s

    def _wait_or_start(self) -> _socket.socket:
        """No socket to connect to. A controller that holds the lock is between two images (it restarts on a
        reinstalled hsched) or still opening its store: its socket is coming, so wait for it. Start one only while
        no controller holds the lock: one started during a restart would wait for the lock, and took the home over
        with this CLI's environment (another fleet, another install) when that controller was next stopped."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            if controller_pid(self.home) is None:
                return self._start_and_connect()
            s = self._connect_once()
            if s is not None:
                return s
            if time.monotonic() > deadline:
                raise ControllerError(f"the controller for {self.home.root} holds its lock but has not listened on "
                                      f"{self.home.socket} for {RESTART_TIMEOUT_S:g} s; see {self.home.log}")
            time.sleep(0.05)

    def _may_start_lab(self) -> bool:
        """Only the lab home's owner (root, or the service account) starts its controller; a user who finds the
        lab's socket dead is told to ask an admin, never given a controller of their own in its place."""
        try:
            return self.home.root.stat().st_uid == os.geteuid()
        except OSError:
            return False

    def _start_and_connect(self) -> _socket.socket:
        import subprocess  # only here: most calls find a controller running

        self.home.ensure()
        err_path = self.home.stderr
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hsched.controller.server", str(self.home.root)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                close_fds=True, cwd="/",
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            s = self._connect_once()
            if s is not None:
                return s
            rc = proc.poll()
            if rc is not None and rc != 3:  # 3: another CLI started it first; its socket is coming
                lines = [ln.removeprefix("hsched: error: ") for ln in
                         err_path.read_text(errors="replace").splitlines() if ln.strip()]
                if rc == 2 and lines:
                    raise UserError(lines[0], problems=lines)
                raise ControllerError(f"the controller failed to start (exit {rc}); see {err_path} and "
                                      f"{self.home.log}: {lines[-1] if lines else ''}")
            time.sleep(0.02)
        raise ControllerError(f"the controller did not answer within {START_TIMEOUT_S:g} s; see {self.home.log}")

    def _reconnect_after_restart(self) -> _socket.socket:
        """The controller said it restarts: wait for the one that comes back (or start one, as any request
        would); without autostart, for as long as RESTART_TIMEOUT_S."""
        self.close()
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            s = self._connect_once()
            if s is not None:
                self._sock = s
                return s
            if self.autostart and controller_pid(self.home) is None:
                return self.connect()
            time.sleep(0.05)
        raise ControllerError(f"the controller for {self.home.root} restarted and did not come back within "
                              f"{RESTART_TIMEOUT_S:g} s; see {self.home.log} (`hsched daemon start` starts one)")

    def _readline(self, sock: _socket.socket) -> bytes:
        """The next line, its newline kept when it ends what was read (the usual reply: not copied again; JSON
        reads past the newline)."""
        if b"\n" not in self._buf:
            # the chunks are kept apart and only the newest is searched: growing one buffer and searching all of it
            # for every chunk was quadratic (`queue --all --json` with 100,000 jobs, 77 MB: 40 s of a 42 s call)
            parts = [self._buf]
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    self._buf = b"".join(parts)
                    raise ControllerError("the controller closed the connection (see its log: "
                                          f"{self.home.log})")
                parts.append(chunk)
                if b"\n" in chunk:
                    break
            self._buf = b"".join(parts)
        buf = self._buf
        if buf.find(b"\n") == len(buf) - 1:
            self._buf = b""
            return buf
        line, _, self._buf = buf.partition(b"\n")
        return line

    def call(self, op: str, **args: Any) -> Any:
        return self._result(op, self._reply(op, args, text=False)[0])

    def call_text(self, op: str, **args: Any) -> Any:
        """`call`, for a result the controller sends as JSON text (`queue` with `text=True`): that text (a
        memoryview of the reply), never decoded: a 10,000-job listing is written through, not decoded and encoded
        again. From a controller that sends objects: the decoded result."""
        reply, body = self._reply(op, {**args, "text": True}, text=True)
        return body if body is not None else self._result(op, reply)

    def write_text(self, op: str, out: BinaryIO, **args: Any) -> Any:
        """`call_text`, the text written to `out` as it arrives, never held whole: None once written. A 10,000-job
        listing is ~9 MB; read whole, its chunks and then their joined copy were ~4,500 pages of fresh memory for
        the kernel to fault in, a third of what `queue --json` cost beyond `--version`. A reply that is not such a
        text (an error; a controller that sends objects) is read whole: its decoded result, as `call_text`'s."""
        reply, body = self._reply(op, {**args, "text": True}, text=True, out=out)
        if body is _WRITTEN:
            return None
        if body is not None:
            out.write(body)
            return None
        return self._result(op, reply)

    def _reply(self, op: str, args: dict[str, Any], *, text: bool, out: BinaryIO | None = None
               ) -> tuple[dict[str, Any], memoryview | None]:
        line = request(op, args)
        if len(line) > MAX_LINE:
            raise UserError(f"{op}: {too_large()} (the job's environment or spec is too big)")
        try:
            reply, body = self._answer(line, text, out)
        except NotDelivered:
            reply, body = None, None
        if reply is None or reply.get("kind") == Kind.RESTARTING:
            # nothing was done: the same request, once, to the controller that comes back (on the new hsched)
            self._reconnect_after_restart()
            try:
                reply, body = self._answer(line, text, out)
            except NotDelivered as e:
                raise ControllerError(f"lost the controller: {e}") from None
        return reply, body

    def _answer(self, line: bytes, text: bool, out: BinaryIO | None) -> tuple[dict[str, Any], memoryview | None]:
        """The reply to `line`: its object and text apart (`_parse`), or (`out`) its head with `_WRITTEN` once a
        pre-encoded result's text went to `out`."""
        got = self._exchange(line) if out is None else self._exchange(line, out)
        if isinstance(got, dict):
            return got, _WRITTEN
        return self._parse(got, text)

    def _exchange(self, line: bytes, out: BinaryIO | None = None) -> bytes | dict[str, Any]:
        sock = self.connect()
        try:
            sock.sendall(line)
            if out is not None:
                head = self._write_through(sock, out)
                if head is not None:
                    return head
            return self._readline(sock)
        except (ConnectionResetError, BrokenPipeError) as e:
            # the controller let go of the connection with our request still unread in the socket (a stop or
            # restart closing its door, or a crash): it was never carried out, so it may be sent again
            self.close()
            raise NotDelivered(str(e)) from None
        except OSError as e:
            self.close()
            raise ControllerError(f"lost the controller: {e}") from None

    def _write_through(self, sock: _socket.socket, out: BinaryIO) -> dict[str, Any] | None:
        """A reply whose result is pre-encoded text of this protocol (`_parse`'s test, on its first 4 KiB): the text
        written to `out` as it is read, and the reply's head returned; else None, with what was read left for
        `_readline`. Reads go into one buffer, each written from there, so no part of the text is copied again."""
        buf, mark = self._buf, RESULT_MARK
        while (i := buf.find(mark, 0, 4096)) < 0 and b"\n" not in buf and len(buf) < 4096:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break  # (`_readline` says the controller closed the connection)
            buf += chunk
        self._buf = buf
        if i < 0 or not buf.startswith(b'{"ok":true,'):
            return None
        try:
            head = json.loads(buf[:i] + b"}")
        except ValueError:
            return None
        if not (isinstance(head, dict) and head.get("protocol") == PROTOCOL and head.get("ok") is True):
            return None
        self._buf = b""
        rest = buf[i + len(mark):]
        room = bytearray(max(1 << 20, len(rest) + 1))
        view = memoryview(room)
        room[:len(rest)] = rest
        filled = len(rest)
        # the line ends with the reply's own `}` and the newline: each read's last byte is held back (moved to the
        # front) until the next shows whether it was that `}`
        while (nl := room.find(b"\n", 0, filled)) < 0:
            if filled:
                _write(out, view[:filled - 1])
                room[0] = room[filled - 1]
                filled = 1
            try:
                n = sock.recv_into(view[filled:])
            except OSError as e:
                # (some of the text went out already: the request is not sent again)
                self.close()
                raise ControllerError(f"lost the controller in the middle of its reply: {e}") from None
            if not n:
                self.close()
                raise ControllerError(f"the controller closed the connection in the middle of its reply (see its "
                                      f"log: {self.home.log})")
            filled += n
        if nl < 1 or room[nl - 1] != 0x7D:  # "}"
            self.close()
            raise ControllerError("the controller sent a reply that is not JSON; `hsched daemon restart` restarts it")
        _write(out, view[:nl - 1])
        self._buf = bytes(room[nl + 1:filled])
        return head

    def _parse(self, raw: bytes, text: bool) -> tuple[dict[str, Any], memoryview | None]:
        """A reply line: its object, and (`text`) a pre-encoded result's text apart (hsched.protocol.Preencoded),
        as a view of the line (10 MB of listing is not copied again)."""
        end = len(raw) - 1 if raw.endswith(b"\n") else len(raw)
        if text and raw.startswith(b'{"ok":true,') and raw[end - 1:end] == b"}":
            i = raw.find(RESULT_MARK, 0, 4096)
            try:
                head = json.loads(raw[:i] + b"}") if i > 0 else None
            except ValueError:
                head = None
            # (a controller that puts its result first has no protocol in what precedes it: decoded whole)
            if isinstance(head, dict) and head.get("protocol") == PROTOCOL and head.get("ok") is True:
                return head, memoryview(raw)[i + len(RESULT_MARK):end - 1]
        try:
            reply = json.loads(raw)
        except ValueError:
            self.close()
            raise ControllerError("the controller sent a reply that is not JSON; `hsched daemon restart` "
                                  "restarts it") from None
        if not isinstance(reply, dict):
            raise ControllerError("the controller sent a reply that is not an object; `hsched daemon restart` "
                                  "restarts it")
        return reply, None

    def _result(self, op: str, reply: dict[str, Any]) -> Any:
        kind = reply.get("kind")
        if reply.get("protocol") is None and op not in OPS_ANY_PROTOCOL:
            # a controller from before protocol numbers ignores ours: it may not read the request as we meant
            raise ControllerError(f"the controller for {self.home.root} runs an older hsched than this one "
                                  f"({PACKAGE_VERSION}): `hsched daemon restart` restarts it on this hsched")
        if reply.get("ok"):
            if reply.get("protocol") not in (None, PROTOCOL) and op not in OPS_ANY_PROTOCOL:
                raise ControllerError(self._skew(reply))
            return reply.get("result")
        if kind == Kind.USER:
            raise UserError(reply.get("error", "bad request"), problems=reply.get("problems"))
        if kind == Kind.DENIED:
            raise PermissionDenied(reply.get("error", "permission denied"))
        if kind in (Kind.VERSION, Kind.RESTARTING):
            raise ControllerError(reply.get("error") or self._skew(reply))
        raise ControllerError(reply.get("error", "request failed"))

    def _skew(self, reply: dict[str, Any]) -> str:
        return (f"this hsched ({PACKAGE_VERSION}, protocol {PROTOCOL}) and the controller for {self.home.root} "
                f"(hsched {reply.get('hsched')}, protocol {reply.get('protocol')}) cannot talk: "
                "`hsched daemon restart` restarts the controller on this hsched")

    def stream(self, interval: float = 1.0) -> Any:
        """Yield snapshots from the subscription stream until the controller goes away."""
        sock = self.connect()
        sock.sendall(request("subscribe", {"interval": interval}))
        while True:
            yield json.loads(self._readline(sock))


def _write(out: BinaryIO, data: memoryview) -> None:
    try:
        out.write(data)
    except OSError as e:
        # (raised inside the exchange, whose handlers take a broken pipe for the controller's)
        raise WriterGone(e) from None


def controller_pid(home: Home) -> int | None:
    """The pid in the lock file if a controller holds the lock, else None."""
    import fcntl

    try:
        fd = os.open(home.lock, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        return None  # a lab's lock is its owner's: a user asks the controller itself (ping) instead
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            data = os.read(fd, 64).decode().strip()
            return int(data) if data.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
