"""Time as the controller sees it: wall time for records, a monotonic clock for intervals, and sleeping.

The controller never calls `time.time()` or `asyncio.sleep` itself: it is handed a clock, so tests drive a
whole controller on `hsched.testing.FakeClock` and a 30 s grace period passes in a microsecond.

Every decision (a lease, a time limit, a retry's backoff, a stop's escalation, a heartbeat) is taken on the
monotonic clock, never on the wall clock: an administrator's `date -s`, an NTP step or a VM resumed hours later
moves the wall clock, and a decision counted on it would kill, requeue or hold up jobs for nothing (issue 27).
Wall time is for what is shown and what is recorded; a recorded wall time a decision needs (a run's start,
a retry's not-before time, read back after a restart) is converted once, when the controller takes it over
(`Timeline.since`, `Timeline.until`), and kept on the monotonic timeline from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (what the store records)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals)."""
        ...

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        """Until `event` is set or `seconds` pass on this clock, whichever comes first."""
        ...


class SystemClock:
    """The machine's clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        await wait_at_most(event, seconds)


async def wait_at_most(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set or `seconds` (real) pass, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


SYSTEM_CLOCK = SystemClock()


class Timeline:
    """The controller's clock for its job timers: the monotonic clock, counted from the wall time when the
    controller started (so its readings look like, and at start equal, epoch seconds, and compare with what the
    round's pure scheduler is given), but moved by nothing but time passing. After a step of the wall clock it
    differs from the wall time by that step: what it says is converted back (`wall`) before it is shown."""

    __slots__ = ("_base", "clock")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._base = clock.time() - clock.monotonic()

    def now(self) -> float:
        return self.clock.monotonic() + self._base

    def since(self, recorded: float) -> float:
        """A past moment recorded in wall time (a run's start), on this timeline: as long before now as the wall
        clock says now, and never after now (a record ahead of the wall clock, written before it was stepped
        back, counts as now). Call it once, when the controller takes the record over, and keep the result."""
        return self.now() - max(0.0, self.clock.time() - recorded)

    def until(self, recorded: float, at_most: float) -> float:
        """A future moment recorded in wall time (a retry's not-before time), on this timeline: as far after now
        as the wall clock says, but never more than `at_most` seconds (a record made before the wall clock was
        stepped back would otherwise wait for the step too), and never before now."""
        return self.now() + min(max(0.0, recorded - self.clock.time()), max(0.0, at_most))

    def wall(self, t: float) -> float:
        """A moment of this timeline as the wall clock shows it now (for display and records)."""
        return self.clock.time() - (self.now() - t)
