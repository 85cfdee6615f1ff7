"""The control socket's protocol: JSON lines over a Unix socket of mode 0600.

    request   {"op": "submit", "args": {...}, "hsched": "0.1.0", "protocol": 2}
    reply     {"ok": true, "result": ..., "hsched": ..., "protocol": ...}
              {"ok": false, "error": "one line", "kind": KIND, "hsched": ..., "protocol": ...}
    stream    after {"op": "subscribe"}: {"type": "snapshot", ...} lines until the client goes away

Every request carries the client's package version and protocol number, every reply the controller's, so
either side sees a skew on the next exchange. Reply kinds (`Kind`): `user` (bad input: the CLI exits 2),
`failed` (a refused or failed operation: exit 1), `version` (the two sides cannot talk: `hsched daemon
restart`), `restarting` (the controller restarts itself on a newly installed hsched; nothing was done, send
the request again once it is back).

A connection may carry many requests, answered in order. Peers of another uid are refused (SO_PEERCRED);
the submitting user is the peer's uid, never a name in the request. Limits (the controller enforces them):
one request line at most `MAX_LINE` bytes, `IDLE_TIMEOUT_S` without a whole request closes the connection,
at most `MAX_CONNECTIONS` open at once, and per uid at most settings `max_connections_per_user` of them (the
controller's settings hold all these numbers; these are their defaults).
"""

from __future__ import annotations

import enum
import json

from hsched import __version__

TYPE_CHECKING = False  # the CLI imports this module: typing's import is left to the type checker
if TYPE_CHECKING:
    import socket
    from typing import Any

PROTOCOL = 2
"""Bumped whenever a request or reply changes shape. 1: the requests before this number existed (no
`protocol` field); 2: version fields, validated arguments, the user from the kernel."""

PACKAGE_VERSION = __version__

MAX_LINE = 1 << 20
"""The longest request line (1 MiB): a job spec and its environment are a few KiB; a bigger line is refused
before it is buffered whole."""

IDLE_TIMEOUT_S = 60.0
"""A connection that sends no whole request for this long is closed (a subscription is never idle)."""

MAX_CONNECTIONS = 256
"""Connections served at once; the next is told so in one line and closed."""

OPS_ANY_PROTOCOL = frozenset({"ping", "stop"})
"""Answered whatever the client's protocol: `daemon status` and `daemon stop` must work across a skew."""


class Kind(enum.StrEnum):
    """Why a request was not carried out (the reply's `kind`)."""

    USER = "user"
    FAILED = "failed"
    DENIED = "denied"
    """Lab mode: not this peer's to do (another user's job, an admin's action); nothing was changed."""
    VERSION = "version"
    RESTARTING = "restarting"


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"


class Preencoded:
    """A reply's result already encoded as JSON text, spliced into the reply line as it is.

    Why: `hsched queue --json` with 10,000 jobs decoded and re-encoded 10 MB of JSON in the CLI (6x `--version`);
    the controller keeps each job's text and the CLI writes the listing through (`Client.call_text`). The text
    uses json.dumps' default separators, which is what the CLI prints to a pipe, and is valid JSON inside the
    reply line, so a client that decodes the line whole reads the same objects."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


RESULT_MARK = b',"result":'
"""Where a pre-encoded result starts in a reply line: after the head (ok, hsched, protocol), which holds no text
of anyone's, so the mark's first occurrence is the result's."""


def encode_reply(reply: dict[str, Any]) -> bytes:
    """A reply line; a `Preencoded` result goes last, as it is."""
    result = reply.get("result")
    if isinstance(result, Preencoded):
        head = encode({k: v for k, v in reply.items() if k != "result"})
        return head[:-2] + RESULT_MARK + result.text + b"}\n"
    return encode(reply)


def request(op: str, args: dict[str, Any]) -> bytes:
    """One request line, stamped with this side's version and protocol."""
    return encode({"op": op, "args": args, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL})


def stamped(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply carrying this side's version and protocol."""
    return {**reply, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL}


def too_large(limit: int = MAX_LINE) -> str:
    return f"request too large: over {limit} bytes"


def peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid from SO_PEERCRED (Linux), or None where the platform lacks it."""
    import socket  # (the controller's side alone: socket.py's own import is ~4 ms of every CLI start)
    import struct

    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
