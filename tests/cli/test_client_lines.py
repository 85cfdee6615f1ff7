"""The client reads the controller's reply lines whole, however the socket cuts them: several lines in one
chunk, one line over many chunks (a 100,000-job `queue --all --json` is tens of MB), a connection closed
mid-line."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from hsched.client import Client
from hsched.errors import ControllerError
from hsched.paths import Home


def test_lines_are_read_whole_whatever_the_chunks(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    big = b"x" * (5 << 20)
    payload = b"one\ntwo\n" + big + b"\nthree\npart"

    def send() -> None:
        for k in range(0, len(payload), 65536 + 7):
            b.sendall(payload[k:k + 65536 + 7])
        b.close()

    t = threading.Thread(target=send)
    t.start()
    c = Client(Home(tmp_path / "h"), autostart=False)
    try:
        assert c._readline(a) == b"one"
        assert c._readline(a) == b"two"
        assert c._readline(a) == big
        assert c._readline(a) == b"three"
        with pytest.raises(ControllerError, match="closed the connection"):
            c._readline(a)
        assert c._buf == b"part"  # what came before the close is not lost
    finally:
        t.join()
        a.close()
