"""What the simulator accepts: every number of a trace, a cluster spec or an option is finite and in a range.

A NaN never compares true, so `work <= 0` let a `nan` step count through and the job never finished (the
replay looped for ever); an infinite arrival or duration did the same, and `--cluster v100:1000000000` built a
quarter of a billion servers before the first round. Each bound below is far beyond any real trace or fleet
and keeps a replay's work finite: a job's GPUs up to MAX_JOB_GPUS (one larger than the cluster is reported
unschedulable, never run), a cluster up to MAX_CLUSTER_GPUS, a job's running time at its fastest up to
MAX_DURATION_S (time-sharing policies round every --round-s while it runs), arrivals within MAX_SPAN_S.
"""

from __future__ import annotations

import math

from hsched.errors import UserError

MAX_JOB_GPUS = 1_000_000
MAX_CLUSTER_GPUS = 100_000
MAX_GPUS_PER_NODE = 64
"""Devices of one simulated server: every pair is linked, so the links grow as its square."""
MAX_DURATION_S = 365 * 86400.0
"""A job's running time on its fastest GPU type (or a trace's duration): one year."""
MAX_SPAN_S = 10 * 365 * 86400.0
"""From a trace's first arrival to its last: ten years."""
MAX_STEPS = 1e15
MAX_JOBS = 1_000_000
"""Jobs of --synthetic N (a trace's own rows are bounded by its file)."""
MAX_ROUND_S = 86400.0
MIN_ROUND_S = 1.0
"""A round (a time-sharing policy's quantum): from a second to a day; shorter ones make a year-long job a
replay of tens of millions of rounds."""


def number(text: str, where: str, what: str, *, low: float, high: float, above: bool = False) -> float:
    """`text` as a finite number from `low` (excluded with `above`) to `high`; else a UserError naming `where`
    (a file and line, or an option) and `what` (the field)."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {what}: expected a number, found {_shown(text)}") from None
    return check(v, where, what, low=low, high=high, above=above)


def check(v: float, where: str, what: str, *, low: float, high: float, above: bool = False) -> float:
    """`v` if finite and in range, else a UserError naming `where` and `what` (may be empty) and the range."""
    if not math.isfinite(v) or v < low or (above and v == low) or v > high:
        rng = f"{'above' if above else 'from'} {_g(low)}{'' if above else f' to {_g(high)}'}"
        if above:
            rng += f" and at most {_g(high)}"
        raise UserError(f"{where}: {f'{what}: ' if what else ''}expected a finite number {rng}, found {_g(v)}")
    return v


def whole(text: str, where: str, what: str, *, low: int, high: int) -> int:
    """`text` as a whole number from `low` to `high` ("4", "4.0" and "4e0" are 4); else a UserError."""
    v = number(text, where, what, low=low, high=high)
    if v != int(v):
        raise UserError(f"{where}: {what}: expected a whole number, found {_shown(text)}")
    return int(v)


def _g(v: float) -> str:
    return f"{v:,.0f}" if math.isfinite(v) and v == int(v) and abs(v) < 1e16 else f"{v:g}"


def _shown(text: object) -> str:
    s = repr(text)
    return s if len(s) <= 40 else s[:37] + "..."

