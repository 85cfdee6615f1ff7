"""Time as the controller sees it: wall time for records, a monotonic clock for intervals, and sleeping.

The controller never calls `time.time()` or `asyncio.sleep` itself: it is handed a clock, so tests drive a
whole controller on `hsched.testing.FakeClock` and a 30 s grace period passes in a microsecond.
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
