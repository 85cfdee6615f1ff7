"""What the stages of one round hand on to each other (hsched.sched.pipeline)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hsched.model import Job
from hsched.sched.fleet import Decision
from hsched.sched.stages.backfill import Round


# Not frozen: each stage moves jobs from `queue` to `decisions`.
@dataclass(slots=True)
class Work:
    """One round's jobs left, decisions so far and the policy's reasons, over the round's state `st`."""

    st: Round
    queue: list[Job]
    """The jobs no stage has decided yet."""
    decisions: list[Decision] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    """Why a job the plan did not start waits, as the policy says it (Resources or Priority)."""
    served: list[Job] | None = None
    """The jobs left in the order the plan served them; None: in `order(queue)`."""
    jobs: Sequence[Job] = ()
    """The round's whole queue as given (the elastic stage looks up the jobs behind the decisions)."""


Stage = Callable[[Work], None]
"""One stage of the round: reads and writes the state and the work."""
