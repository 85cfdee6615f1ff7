"""What the live round keeps from one round to the next, owned by its caller (`RoundCache`): the controller makes one
and hands it to every round; a forecast or a test that passes none gets a fresh one (the same decisions, computed
from scratch). Nothing in the scheduling core keeps state of its own between calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hsched.model import Job
    from hsched.sched.fleet import Running, Wait
    from hsched.sched.view import JobView

OrderKey = tuple[int, int, bool, float, float, int]
"""A waiting job's importance (hsched.sched.stages.reservation.order_key): the smallest is the head."""
ViewCache = dict[int, tuple["Job", tuple[str, ...], "JobView"]]
"""Job id -> (the Job, its allowed GPU types, its view)."""


# Not frozen: a cache is written every round. Each field is replaced whole by the round that made it (never updated in
# place), so a round that raises half-way leaves the last complete round's values.
@dataclass(slots=True)
class RoundCache:
    """The last round's work that the next one reuses while its inputs are the very same objects (the controller
    keeps unchanged jobs and nodes): each entry says what it was made of, and is used only when that is unchanged."""

    waits: dict[int, Wait] = field(default_factory=dict)
    """The last round's waits by job id (a Wait that says the same again is the same object)."""
    keys: dict[int, tuple[Job, bool, OrderKey]] = field(default_factory=dict)
    """The last round's order key of each waiting job, by id, with the job and its fair share flag."""
    keys_out: tuple[tuple[Job, ...], frozenset[str], dict[int, OrderKey]] = ((), frozenset(), {})
    """The last round's waiting jobs, fair share flags and keys by id (handed back whole while the jobs are the
same)."""
    run_parts: dict[int, tuple[Running, str | None, tuple[object, ...], tuple[object, ...], bool, float]] = field(
        default_factory=dict)
    """The last round's running views in parts, by job id (only run_s and service_s move from round to round)."""
    views: tuple[tuple[object, ...], ViewCache, tuple[Job, ...], list[JobView]] = ((), {}, (), [])
    """The last round's fleet signature, its waiting jobs' views, and its waiting jobs and their views in order."""
    where: tuple[tuple[object, ...], dict[int, tuple[Job, frozenset[str]]]] = ((), {})
    """The last round's nodes that could ever hold each waiting job, and what that was made of."""
    eligible: dict[tuple[str, tuple[str, ...], int | None], tuple[str, ...]] = field(default_factory=dict)
    """The last round's eligible devices per (node, GPU types, GPU memory), for the same nodes (`where`'s)."""
    where_shapes: dict[tuple[object, ...], frozenset[str]] = field(default_factory=dict)
    """The last round's `where` per request shape, for the same nodes (`where`'s): a job that arrives is one of a
    shape asked before."""
    reserved: tuple[object, tuple[float, frozenset[str], str] | None] = ((), None)
    """The last round's reservation: what it was made of, and (its time, its devices, the head's reason)."""
    victim_parts: dict[int, tuple[Running, tuple[object, ...], tuple[object, ...]]] = field(default_factory=dict)
    """The last round's views of the running jobs as QoS victims (no GPU types) in parts, by job id."""
    policy: dict[str, object] = field(default_factory=dict)
    """What the policy keeps between rounds (PolicyInput.cache: the hsched policy's order memo)."""
