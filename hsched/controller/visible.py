"""What of a job's events a requester may see: everyone sees every event (as squeue shows every job), but a
line quoted from a job's own log (its output, a 0600 file of its user) is shown to its owner and admins only,
the same rule that governs `hsched logs` (hsched.controller.api's may_act).

Such a line is stored in the event's figures under LOG_LINE, never in its message (hsched.controller.ending);
for the ones allowed it is put back at the end of the message at read time. Events written before that rule
quoted the line in the message itself: for everyone else that quote is cut out (LEGACY).
"""

from __future__ import annotations

import re
from typing import Any

LOG_LINE = "log_line"
"""An event's figure that quotes the job's own log."""

LEGACY = (
    # the stop a rank's end caused: "rank 1 exited with code 1 (out of GPU memory: <line>): stopping the other..."
    (re.compile(r" \(out of GPU memory: .*\)(?=: stopping the other \d+ rank\(s\)$)", re.S),
     " (out of GPU memory)"),
    # a rank's end: "run rank 1 exited with code 1 (out of GPU memory: <line>)"
    (re.compile(r" \(out of GPU memory: .*\)$", re.S), " (out of GPU memory)"),
    # the job's end: "...; its log: <line>" (the line ran to the message's end, or up to the preemption figures)
    (re.compile(r"; its log: .*?(?=; GPUs free |$)", re.S), ""),
)


def for_owner(event: dict[str, Any]) -> dict[str, Any]:
    """The event as its job's owner (or an admin) sees it: the quoted log line at the end of its message."""
    data = event.get("data") or {}
    line = data.get(LOG_LINE)
    if not line:
        return event
    return {**event, "message": f"{event['message']}; its log: {line}"}


def for_others(event: dict[str, Any]) -> dict[str, Any]:
    """The event as any other user sees it: no line of the job's log, in its figures or its message."""
    data = event.get("data")
    message = event["message"]
    for pattern, replacement in LEGACY:
        message = pattern.sub(replacement, message)
    if data and LOG_LINE in data:
        data = {k: v for k, v in data.items() if k != LOG_LINE} or None
    return {**event, "message": message, "data": data}


def quotes_log(event: dict[str, Any]) -> bool:
    """Whether the event quotes its job's log (in its figures, or, written before that rule, in its message)."""
    data = event.get("data") or {}
    return bool(data.get(LOG_LINE)) or any(p.search(event["message"]) for p, _ in LEGACY)
