"""Job arrays as sbatch's `--array` means them, as pure functions.

    --array 0-99%8      100 tasks (indices 0..99), at most 8 running at once
    --array 1,3,5-7     tasks 1, 3, 5, 6, 7
    --array 0-15:4      tasks 0, 4, 8, 12

A submit with an array makes one job per index (the tasks), all in one transaction; the first task's job id
is the array's id, so `12_3` is task 3 of array 12, as squeue shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from hsched.model import ArraySpec, Job, JobState
from hsched.spec.jobids import task_index

_ARRAY_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
MAX_ARRAY_TASKS = 10_000


def parse_array(text: str) -> ArraySpec:
    """sbatch's `--array`: '0-99', '1,3,5-7', '0-15:4' (a step), each with an optional '%N' (at most N tasks
    running at once). Indices from 0 to INDEX_MAX (hsched.spec.jobids). ValueError naming what is expected."""
    body, _, limit = str(text).strip().partition("%")
    indices: set[int] = set()
    for part in body.split(","):
        m = _ARRAY_RE.match(part.strip())
        if m is None:
            raise ValueError("task indices such as 0-99, 1,3,5-7 or 0-15:4, optionally %N (at most N at once)")
        lo = task_index(m.group(1))
        hi = task_index(m.group(2)) if m.group(2) is not None else lo
        step = task_index(m.group(3), "a step") if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"a range from low to high with a step >= 1 (found {part.strip()!r})")
        span = range(lo, hi + 1, step)
        # counted before it is walked: `0-1000000000` must be refused at once, not after a billion-element set
        if len(span) > MAX_ARRAY_TASKS:
            raise ValueError(f"at most {MAX_ARRAY_TASKS} tasks")
        indices.update(span)
        if len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"at most {MAX_ARRAY_TASKS} tasks")
    max_running = None
    if limit:
        try:
            max_running = task_index(limit)
        except ValueError:
            max_running = 0
        if not 1 <= max_running <= MAX_ARRAY_TASKS:
            raise ValueError(f"%N with N from 1 to {MAX_ARRAY_TASKS} (at most N tasks running at once)")
    return ArraySpec(tuple(sorted(indices)), max_running)


def within_limits(pending: Sequence[Job], active: Iterable[Job]) -> list[Job]:
    """The pending jobs that an array's `%N` still lets start: per array, N minus its tasks already running
    (or launching, or stopping), lowest task index first. Jobs of no array pass."""
    running: dict[int, int] = {}
    for j in active:
        if j.array_id is not None and j.state is not JobState.PENDING:
            running[j.array_id] = running.get(j.array_id, 0) + 1
    room: dict[int, int] = {}
    out = []
    for j in sorted(pending, key=lambda j: (j.array_task or 0) if j.array_id is not None else 0):
        spec = j.spec.array
        if j.array_id is None or spec is None or spec.max_running is None:
            out.append(j)
            continue
        left = room.setdefault(j.array_id, spec.max_running - running.get(j.array_id, 0))
        if left > 0:
            room[j.array_id] = left - 1
            out.append(j)
    order = {j.id: n for n, j in enumerate(pending)}
    return sorted(out, key=lambda j: order[j.id])

