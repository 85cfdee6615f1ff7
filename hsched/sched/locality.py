"""Data locality: the one rule that decides whether a job waits for a server holding its data or pays a copy.

Pure and tiny, so the live controller and the simulator (hsched.sim.data) apply the very same rule:

    copy_s = copy_seconds(dataset_bytes, link_bytes_per_s(10.0))    # 500 GB over 10 Gbit/s: 400 s
    if choose_wait(copy_s, holder_free_in_s, waited_s):             # the holder frees in time: wait for it
        ...                                                         # (and hold it: see below)
    else:                                                           # start elsewhere now and copy the data
        ...

A job whose data sits on a busy server can start now elsewhere, holding its GPUs idle while the data is copied
there, or wait for the holder. Waiting is the better bet exactly when the holder is predicted to free no later
than the copy would finish: either way the job starts computing at about the same time, but waiting moves no
bytes and leaves the other server's GPUs to someone else.

That bet holds only if the job gets the holder when it frees. Measured in the simulator (issue 15), it often did
not: jobs behind it took the holder's GPUs as they freed (a stream of one-GPU jobs kept a 4-GPU job waiting 1,900 s
for a 390 s copy), so it waited again and again, and the rule, a prediction that reserved nothing, lost 30 % of mean
JCT against ignoring the data. Hence three parts, which the caller applies:

- a job that waits holds the holder for itself (a reservation, as EASY backfill holds GPUs for the queue's head):
  another job may take the holder's free GPUs only where the holder still has room for the waiting job by its
  predicted time (`leaves_room`);
- a holder held for another job is not one to wait for (first in line): the job copies, or waits for another;
- the wait is bounded by the copy (`choose_wait`'s `waited_s`): a job that has waited as long as its copy would
  have taken copies, whatever the next prediction says.
"""

from __future__ import annotations

import enum
import math

__all__ = ["Locality", "choose_wait", "copy_seconds", "leaves_room", "link_bytes_per_s"]


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


def choose_wait(copy_s: float, holder_free_in_s: float | None, waited_s: float = 0.0) -> bool:
    """Whether to wait for a server holding the data rather than start elsewhere and copy it there.

    Args:
        copy_s: what the copy would take (`copy_seconds`).
        holder_free_in_s: when, from now, a holder is predicted to have room for the job; None when no holder
            can ever hold it (none, all too small, or all held for other waiting jobs). A prediction already
            overdue (< 0) counts as now.
        waited_s: how long the job has already waited for a holder (since its first decision to wait; 0 the
            first time). The whole wait is bounded by the copy: predictions that keep slipping (the holder taken,
            a run longer than predicted) never make a job wait longer than copying at once would have.

    Returns:
        True when the wait so far plus the holder's predicted free time is no later than the copy's end (<=: at
        a tie waiting moves no bytes for the same start); False when there is no such prediction or it is
        unknown (NaN).
    """
    if holder_free_in_s is None or math.isnan(holder_free_in_s) or math.isnan(copy_s) or math.isnan(waited_s):
        return False
    return max(0.0, waited_s) + max(0.0, holder_free_in_s) <= copy_s


def leaves_room(free_in_s: float | None, reserved_in_s: float) -> bool:
    """Whether another job may take free GPUs on a holder held for a waiting job: the holder must still have room
    for the waiting job by the time it was promised (EASY backfill's rule for the head's reservation).

    Args:
        free_in_s: when, from now, the holder is predicted to have room for the waiting job if the other job took
            those GPUs (and, its end unknown, kept them); None when never.
        reserved_in_s: when, from now, the waiting job was predicted to have room there.
    """
    return free_in_s is not None and not math.isnan(free_in_s) and free_in_s <= reserved_in_s
