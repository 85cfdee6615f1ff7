"""Data locality: the one rule that decides whether a job waits for a server holding its data or pays a copy.

Pure and tiny, so the live controller and the simulator (hsched.sim.data) apply the very same rule:

    copy_s = copy_seconds(dataset_bytes, link_bytes_per_s(10.0))    # 500 GB over 10 Gbit/s: 400 s
    if choose_wait(copy_s, holder_free_in_s):                       # the holder frees in time: wait for it
        ...
    else:                                                           # start elsewhere now and copy the data
        ...

A job whose data sits on a busy server can start now elsewhere, holding its GPUs idle while the data is copied
there, or wait for the holder. Waiting is the better bet exactly when the holder is predicted to free no later
than the copy would finish: either way the job starts computing at about the same time, but waiting moves no
bytes and leaves the other server's GPUs to someone else.
"""

from __future__ import annotations

import enum
import math

__all__ = ["Locality", "choose_wait", "copy_seconds", "link_bytes_per_s"]


class Locality(enum.StrEnum):
    """How placement treats a job's data."""

    AWARE = "aware"
    """Prefer servers holding the data; wait for a busy holder when `choose_wait` says so."""
    IGNORE = "ignore"
    """Place as if there were no data; every start on a server without it pays the copy."""


def link_bytes_per_s(gbit_per_s: float) -> float:
    """A link's speed in bytes per second from Gbit/s (10 Gbit/s -> 1.25e9 B/s)."""
    return gbit_per_s * 1e9 / 8.0


def copy_seconds(bytes_: int, bytes_per_s: float) -> float:
    """Seconds to copy `bytes_` over a link of `bytes_per_s` BYTES per second (not bits: see `link_bytes_per_s`).

    Nothing to copy takes no time; a link of no speed never finishes (inf).
    """
    if bytes_ <= 0:
        return 0.0
    if bytes_per_s <= 0:
        return math.inf
    return bytes_ / bytes_per_s


def choose_wait(copy_s: float, holder_free_in_s: float | None) -> bool:
    """Whether to wait for a server holding the data rather than start elsewhere and copy it there.

    Args:
        copy_s: what the copy would take (`copy_seconds`).
        holder_free_in_s: when, from now, a holder is predicted to have room for the job; None when no holder
            can ever hold it (none, or all too small). A prediction already overdue (< 0) counts as now.

    Returns:
        True when the holder's predicted free time is no later than the copy's end (<=: at a tie waiting moves
        no bytes for the same start); False when there is no such prediction or it is unknown (NaN).
    """
    if holder_free_in_s is None or math.isnan(holder_free_in_s) or math.isnan(copy_s):
        return False
    return max(0.0, holder_free_in_s) <= copy_s
