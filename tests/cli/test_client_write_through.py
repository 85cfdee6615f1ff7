"""`Client.write_text` (issue 33): a pre-encoded result (a 10,000-job `queue --json` is ~9 MB) goes to the writer as it
is read, never held whole, and is exactly the text the controller sent, however the socket cuts the reply (the
reply's own closing brace may come alone, or with the newline, at the end of a read). A reply that is not such a text
is read whole and answered as `call_text` answers it. Once text went out the request is never sent again; a writer
that fails is the writer's failure, not the controller's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hsched.client import Client, WriterGone
from hsched.errors import ControllerError, UserError
from hsched.paths import Home
from hsched.protocol import PACKAGE_VERSION, PROTOCOL, Preencoded, encode, encode_reply
from tests.conftest import Hs

TEXT = json.dumps([{"id": i, "name": f"job-{i}", "note": "}\\n{"} for i in range(3000)]).encode()
"""A listing's text, as the controller keeps it (json.dumps' separators; braces and escaped newlines inside)."""

REPLY = encode_reply({"ok": True, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL, "result": Preencoded(TEXT)})


class Reads:
    """A socket whose reads return these chunks in turn (`recv` and `recv_into` alike), then nothing (closed)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = [c for c in chunks if c]

    def recv(self, size: int) -> bytes:
        if not self.chunks:
            return b""
        c = self.chunks.pop(0)
        if len(c) > size:
            self.chunks.insert(0, c[size:])
        return c[:size]

    def recv_into(self, view: memoryview) -> int:
        c = self.recv(len(view))
        view[:len(c)] = c
        return len(c)


def cuts(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, k = [], 0
    while k < len(data):
        n = rng.choice((1, 2, 3, 17, 4096, 65536, 1 << 20))
        out.append(data[k:k + n])
        k += n
    return out


@pytest.mark.parametrize("chunks", [
    [REPLY],
    [REPLY[:-1], REPLY[-1:]],  # the newline alone
    [REPLY[:-2], REPLY[-2:]],  # the reply's brace and the newline
    [REPLY[:-2], REPLY[-2:-1], REPLY[-1:]],  # the brace alone, then the newline
    [REPLY[:3], REPLY[3:40], REPLY[40:]],  # the head cut
    *(cuts(REPLY, seed) for seed in range(5)),
], ids=["whole", "newline-apart", "brace-and-newline", "brace-alone", "head-cut", *(f"random{s}" for s in range(5))])
def test_the_text_is_written_as_sent_however_the_reads_cut_it(chunks: list[bytes], tmp_path: Path) -> None:
    c = Client(Home(tmp_path / "h"), autostart=False)
    out = io.BytesIO()
    head = c._write_through(Reads([*chunks, b'{"next":1}\n']), out)  # type: ignore[arg-type]
    assert head == {"ok": True, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL}
    assert out.getvalue() == TEXT
    json.loads(out.getvalue())
    assert c._buf in (b"", b'{"next":1}\n')  # what followed the line is kept for the next read, never written


@contextmanager
def controller(home: Home, replies: list[bytes], *, close_after: int | None = None) -> Iterator[list[bytes]]:
    """A controller on `home`'s socket that answers each request line with the next reply (`close_after`: only
    that many bytes of it, then the connection closed); yields the request lines it read."""
    home.root.mkdir(parents=True, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(home.socket))
    srv.listen()
    asked: list[bytes] = []

    def serve() -> None:
        for reply in replies:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        break
                    buf += got
                asked.append(buf)
                with contextlib.suppress(OSError):  # (a client that hangs up mid-reply: what these tests make happen)
                    conn.sendall(reply if close_after is None else reply[:close_after])
                    if close_after is None:
                        conn.recv(1)  # (until the client hangs up)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield asked
    finally:
        srv.shutdown(socket.SHUT_RDWR)  # (ends an accept still waiting for a request sent again)
        srv.close()
        t.join()


def test_a_listing_goes_to_the_writer_and_the_call_says_it_was_written(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    with controller(home, [REPLY]) as asked, Client(home, autostart=False) as c:
        out = io.BytesIO()
        assert c.write_text("queue", out, all=False) is None
        assert out.getvalue() == TEXT
    assert len(asked) == 1 and json.loads(asked[0])["args"] == {"all": False, "text": True}


def test_a_reply_of_objects_or_an_error_is_read_whole_and_nothing_is_written(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    # (a controller that sends objects puts its result where it likes: first, nothing of the protocol before it)
    objects = encode({"ok": True, "result": [{"id": 1}], "hsched": PACKAGE_VERSION, "protocol": PROTOCOL})
    refused = encode({"ok": False, "hsched": PACKAGE_VERSION, "protocol": PROTOCOL, "kind": "user",
                      "error": "queue: no such state 'X'", "problems": ["queue: no such state 'X'"]})
    out = io.BytesIO()
    with controller(home, [objects, refused]), Client(home, autostart=False) as c:
        assert c.write_text("queue", out) == [{"id": 1}]  # (a controller that sends objects: the caller picks)
        c.close()
        with pytest.raises(UserError, match="no such state"):
            c.write_text("queue", out)
    assert out.getvalue() == b""


def test_a_reply_cut_short_fails_once_and_is_not_asked_again(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    out = io.BytesIO()
    with controller(home, [REPLY, REPLY], close_after=len(REPLY) // 2) as asked, Client(home, autostart=False) as c:
        with pytest.raises(ControllerError, match="in the middle of its reply"):
            c.write_text("queue", out)
    assert len(asked) == 1  # half the text went out already: sending the request again would write it twice
    assert TEXT.startswith(out.getvalue()) and 0 < len(out.getvalue()) < len(TEXT)


class Gone(io.RawIOBase):
    """A writer whose reader went away (`| head`)."""

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_writer_that_fails_is_the_writers_failure_not_the_controllers(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    with controller(home, [REPLY, REPLY]) as asked, Client(home, autostart=False) as c:
        with pytest.raises(WriterGone) as e:
            c.write_text("queue", Gone())  # type: ignore[arg-type]
    assert isinstance(e.value.error, BrokenPipeError)
    assert len(asked) == 1  # (a broken pipe inside the exchange was taken for the controller's, and sent again)


@pytest.mark.slow  # a real controller and CLI processes
def test_a_reader_that_goes_away_ends_the_listing_quietly(hs: Hs) -> None:
    """`hsched queue --json | head -c 10` (and the table): exit 1, nothing on stderr, as Click's commands do. It
    printed a traceback (the table and the written-through text alike); and where the text is written as it is read,
    a broken pipe inside the exchange was taken for the controller's: the request was sent again, and the CLI said it
    lost the controller."""
    hs.run("daemon", "start", check=True)
    with Client(Home(hs.home)) as c:  # 2,000 held jobs, apart (a pending array is one line of the table)
        for _ in range(20):
            c.call("submit_many", jobs=[{"spec": {"command": ["true"], "hold": True}, "source": "<test>"}] * 100,
                   environ=dict(os.environ))
    # (both listings are far past a pipe's 64 KiB: the CLI is still writing when its reader goes)
    assert len(hs.run("queue", check=True).stdout) > 1 << 16
    for args in (["queue", "--json"], ["queue"]):
        proc = subprocess.Popen([sys.executable, "-m", "hsched", *args], env=hs.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert len(proc.stdout.read(10)) == 10
        proc.stdout.close()
        err = proc.stderr.read()
        # (1 where a write failed; a kernel may also take the rest of a single write as written, as gVisor's
        # pipes do: 0)
        assert proc.wait(timeout=120) in (0, 1) and err == b"", (args, err)
