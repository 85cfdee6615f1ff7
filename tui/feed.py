"""The one subscriber: reads the controller's snapshot stream in a thread and hands the app immutable frames.

Blocking socket reads live here and only here, so no handler of the app ever waits on the controller.
A broken stream is reported (the app shows a banner) and retried every second until `stop()`.
"""

from __future__ import annotations

import _socket
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from hsched.tui.model import Frame, parse_snapshot

from hsched.client import Client
from hsched.errors import HschedError
from hsched.paths import Home

RETRY_S = 1.0
EVENTS_LIMIT = 200


def controller_ops(client: Client) -> frozenset[str]:
    """The requests the controller answers (ping's `ops`); none known if it cannot say."""
    try:
        return frozenset(client.call("ping").get("ops") or ())
    except HschedError:
        return frozenset()


def controller_can_preempt(client: Client) -> bool:
    """True when the controller lists op `preempt` among the requests it answers (ping's `ops`)."""
    return "preempt" in controller_ops(client)


class Feed:
    def __init__(self, home: Home, interval: float, *, on_frame: Callable[[Frame], None],
                 on_lost: Callable[[str, int], object], on_restored: Callable[[], object]) -> None:
        self.home = home
        self.interval = interval
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.on_restored = on_restored
        self._stop = threading.Event()
        self._sock: _socket.socket | None = None  # (the client's: hsched.client connects through the C module)
        self._last_event = 0

    def stop(self) -> None:
        """Called from the UI thread: wakes the blocked read (shutdown, not close, interrupts recv)."""
        self._stop.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(_socket.SHUT_RDWR)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            # the first connection starts the controller on demand, like every CLI command; a controller
            # that went away later is waited for, not restarted behind the user's back
            try:
                self._session(autostart=attempt == 0, restored=attempt > 0)
            except Exception as e:  # any failure is a banner and a retry, never the end of the app
                if self._stop.is_set():
                    return
                attempt += 1
                self.on_lost(str(e) or type(e).__name__, attempt)
                self._stop.wait(RETRY_S)
            else:
                return

    def _session(self, *, autostart: bool, restored: bool) -> None:
        stream = Client(self.home, autostart=autostart)
        calls = Client(self.home, autostart=False)
        try:
            self._sock = stream.connect()
            if self._stop.is_set():
                return
            ops = controller_ops(calls)
            can_preempt = "preempt" in ops
            # a controller that keeps history (op `history`): its whole window once per connection, then what
            # is new with each frame; an older one: the dashboard samples the frames itself (tui/history.py)
            since: float | None = 0.0 if "history" in ops else None
            if restored:
                self.on_restored()
            for snap in stream.stream(self.interval):
                if self._stop.is_set():
                    return
                events = self._new_events(calls)
                history = None
                if since is not None:
                    history = calls.call("history", since=since)
                    since = float(history.get("now") or since)
                self.on_frame(parse_snapshot(snap, events, can_preempt, history))
        finally:
            self._sock = None
            stream.close()
            calls.close()
        if self._stop.is_set():
            return
        raise HschedError("the controller closed the stream")

    def _new_events(self, calls: Client) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = calls.call("events", after=self._last_event, limit=EVENTS_LIMIT)
        if events:
            self._last_event = max(int(e.get("id", 0)) for e in events)
        return events
