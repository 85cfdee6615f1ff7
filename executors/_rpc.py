"""The node helper's wire protocol, client side, for every executor that runs the helper (local and ssh).

Two ways to ask the helper something (hsched/node/, its script nodehelper.py):

* served: one long-lived `nodehelper.py serve` per node answers many requests over one pair of pipes (a
  subprocess here, an SSH channel on a remote node). A request is one JSON line `{"id", "cmd", "req"}`,
  its answer one line `{"id", "reply"}`; answers may come out of order and the id matches them. A request
  costs a round trip instead of a Python start (about 65 ms of CPU here, 100 ms on a node).
* one-shot: `nodehelper.py CMD` with the request as JSON on stdin and the reply as the last line of stdout;
  used while no server can be had.

`HelperClient` is the served side over any `LineChannel`; `parse_oneshot` reads a one-shot reply;
`check_reply` turns a helper's `{"error": ...}` into a HelperError. Both executors then say the same thing
the same way, with the same error classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import socket
from typing import Any, Protocol

from hsched.errors import ExecutorError, HelperError, NodeRefused, NodeUnreachable, Refusal
from hsched.model import GpuHolder, RunReport, RunStatus
from hsched.serialize import handle_from_dict

from .base import LaunchRequest


class LineChannel(Protocol):
    """A byte pipe to a helper server: lines out, lines in. Transport failures are raised as OSError."""

    async def readline(self) -> bytes:
        """The next line (with its newline); b'' once the helper's side is closed."""
        ...

    async def send(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Close our end at once, without waiting for the peer (the helper then ends: stdin EOF)."""
        ...


def _prefix(label: str) -> str:
    return f"{label}: " if label else ""


class HelperClient:
    """Requests to one `nodehelper.py serve`, many at once on one channel.

    When the channel dies every waiting request fails with NodeUnreachable and `dead` says why; the owner
    starts a new server (or falls back to one-shot calls) on its next request.
    """

    def __init__(self, label: str, channel: LineChannel) -> None:
        self.label = label
        self.channel = channel
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.write_lock = asyncio.Lock()
        self.dead: str | None = None
        self.closed = False
        """Closed by its owner (the executor's close()): a request it failed must not be tried again elsewhere."""
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                line = await self.channel.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # a stray line (a warning the helper's Python printed): not an answer
                if not isinstance(msg, dict) or not isinstance(msg.get("id"), int):
                    continue
                fut = self.waiting.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    reply = msg.get("reply")
                    fut.set_result(reply if isinstance(reply, dict) else {})
        except OSError as e:
            self.dead = str(e) or type(e).__name__
        finally:
            self.dead = self.dead or "the helper server's channel closed"
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(NodeUnreachable(f"{_prefix(self.label)}{self.dead}"))
            self.waiting.clear()

    async def call(self, cmd: str, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The helper's reply to one request, as it came (an `error` key is the caller's to check)."""
        if self.dead:
            raise NodeUnreachable(f"{_prefix(self.label)}{self.dead}")
        rid = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        try:
            async with asyncio.timeout(timeout_s):
                async with self.write_lock:
                    await self.channel.send(json.dumps({"id": rid, "cmd": cmd, "req": req}).encode() + b"\n")
                return await fut
        except TimeoutError:
            raise NodeUnreachable(f"{_prefix(self.label)}no answer within {timeout_s:g} s") from None
        except OSError as e:
            self.dead = str(e) or type(e).__name__
            raise NodeUnreachable(f"{_prefix(self.label)}connection failed: {e}") from None
        finally:
            self.waiting.pop(rid, None)

    def close(self) -> None:
        self.closed = True
        self.dead = self.dead or "closed"
        self.reader.cancel()
        with contextlib.suppress(Exception):
            self.channel.close()


def check_reply(reply: dict[str, Any], label: str, command: str) -> dict[str, Any]:
    """The reply itself, or HelperError if the helper answered with an error."""
    if "error" in reply:
        raise HelperError(f"{_prefix(label)}node helper '{command}': {reply['error']}", command)
    return reply


def parse_oneshot(out: bytes, err: bytes, rc: int | None, *, label: str, what: str, python: str) -> dict[str, Any]:
    """The reply of `python nodehelper.py CMD` (or any helper snippet) from its output and exit status."""
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if rc == 127 and not lines:  # the shell's "command not found"
        raise NodeRefused(f"{_prefix(label)}{python} not found on the node; hsched needs python3 >= 3.8 there",
                          Refusal.PYTHON)
    try:
        reply = json.loads(lines[-1])
        if not isinstance(reply, dict):
            raise ValueError
    except (ValueError, IndexError):
        detail = (err or out).decode("utf-8", "replace").strip().replace("\n", " | ")[:300]
        raise HelperError(f"{_prefix(label)}{what} failed (exit status {rc}): {detail or 'no output'}",
                          what) from None
    return check_reply(reply, label, what)


def report_from_dict(r: dict[str, Any]) -> RunReport:
    """One run's report as the helper's `status` gives it (the handle as the node names it). Checked again here,
    whatever helper answered: an exit code that is not an integer 0-255 is no exit code (the run is lost), an
    end time that is not a number is none, and a report the node could not make ("unknown") changes nothing."""
    status = r.get("status")
    if status == "unknown" or status not in {s.value for s in RunStatus}:
        return RunReport(RunStatus.RUNNING)  # no handle: the watcher leaves the run as it is and asks again
    code = r.get("exit_code")
    valid_code = isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255
    if status == RunStatus.EXITED and not valid_code:
        status = RunStatus.LOST.value
    raw_end = r.get("end_time")
    end = float(raw_end) if isinstance(raw_end, int | float) and not isinstance(raw_end, bool) else None
    end_ok = end is not None and end == end
    sig = r.get("signal")
    raw_left = r.get("gpu_left")
    holders: list[Any] = raw_left if isinstance(raw_left, list) else []
    return RunReport(
        status=RunStatus(status),
        exit_code=code if valid_code else None,
        signal=sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
        handle=handle_from_dict(r.get("handle")),
        end_time=end if end_ok else None,
        oom=r.get("oom") is True,
        gpu_oom=(str(r.get("gpu_oom_line") or "GPU out of memory")[:300] if r.get("gpu_oom") is True else None),
        gpu_left=tuple(GpuHolder(uuid=str(g["uuid"]), pid=int(g["pid"]), name=str(g.get("name") or ""))
                       for g in holders if isinstance(g, dict) and "uuid" in g and isinstance(g.get("pid"), int)),
        usage=r["usage"] if isinstance(r.get("usage"), dict) else None,
    )


def launch_request(req: LaunchRequest, run_dir: str) -> dict[str, Any]:
    """The helper's `launch` request for a LaunchRequest, naming the run folder as the node does."""
    return {
        "run_dir": run_dir, "command": list(req.command), "env": dict(req.env), "workdir": req.workdir,
        "inherit_env": req.inherit_env, "cpus": list(req.cpus), "memory_mib": req.memory_mib,
        "cpu_limit": req.cpu_limit, "devices": list(req.devices), "checkpoint_exit_code": req.checkpoint_exit_code,
        "stop_grace_s": req.stop_grace_s, "user": req.user, "base_dir": req.base_dir,
        "output": req.output, "error": req.error, "truncate_output": req.truncate_output,
    }


# ------------------------------------------------------------------------------ OS errors, classified

NETWORK_ERRNOS = frozenset({  # the link or the peer is gone, not a file
    errno.ENETDOWN, errno.ENETUNREACH, errno.ENETRESET, errno.EHOSTDOWN, errno.EHOSTUNREACH,
    errno.ECONNABORTED, errno.ECONNRESET, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE,
    errno.ENOTCONN, errno.EADDRNOTAVAIL,
})
_FILE_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def network_error(e: OSError, message: str) -> ExecutorError:
    """What an OSError met while reaching a node means, by its class and errno (never its text).

    Connection errors (refused, reset, aborted, broken pipe), timeouts, DNS failures (socket.gaierror), and
    the network errnos (no route, network down...) are NodeUnreachable; a file we cannot read on our side
    (a key or known_hosts file the ssh config names) is NodeRefused for a person to fix. Anything else is
    taken as transient: NodeUnreachable.
    """
    if isinstance(e, ConnectionError | TimeoutError | socket.gaierror | socket.herror) or e.errno in NETWORK_ERRNOS:
        return NodeUnreachable(message)
    if isinstance(e, _FILE_ERRORS):
        return NodeRefused(message, Refusal.CONFIG)
    return NodeUnreachable(message)
