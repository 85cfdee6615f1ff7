"""The control socket's protocol: JSON lines over a Unix socket of mode 0600.

    request   {"op": "submit", "args": {...}}
    reply     {"ok": true, "result": ...}  |  {"ok": false, "error": "one line", "kind": "user" | "failed"}
    stream    after {"op": "subscribe"}: {"type": "snapshot", ...} lines until the client goes away

A connection may carry many requests, answered in order. Peers of another uid are refused (SO_PEERCRED).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAX_LINE = 64 * 1024 * 1024


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"


def peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid from SO_PEERCRED (Linux), or None where the platform lacks it."""
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
