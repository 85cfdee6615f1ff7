"""The live tallies by job (`Usage.by_job`, issue 33): an end reads its job's own tallies, not every running job's;
the index holds exactly what `tallies` holds, and lets go of a job's once they are stored."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hsched.controller import usage as U
from hsched.controller.state import Usage
from hsched.learn.efficiency import RunTally


class Ctl:
    """What the flush touches of a controller: its store's thread and its spawned tasks."""

    def __init__(self, u: Usage) -> None:
        self.state = SimpleNamespace(usage=u)
        self.saved: list[Any] = []
        self.store = SimpleNamespace(save_run_usage=self.saved.extend)
        self.tasks: list[asyncio.Task[None]] = []

    async def db(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def spawn(self, coro: Any) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))


def job(i: int, restarts: int = 0) -> Any:
    return SimpleNamespace(id=i, restarts=restarts)


async def test_a_jobs_tallies_come_from_its_own_index_and_leave_it_once_stored() -> None:
    u = Usage()
    ctl = Ctl(u)
    for key in ((1, 1, "a"), (1, 1, "b"), (2, 1, "a"), (3, 2, "c")):
        U._tally(u, key)
    stored = [RunTally(1, 0, "a").to_dict()]  # an earlier attempt, kept in the store
    assert [(t.attempt, t.node) for t in U.tallies_of(ctl, 1, stored)] == [(0, "a"), (1, "a"), (1, "b")]  # type: ignore[arg-type]
    assert U.tallies_of(ctl, 9, []) == []  # type: ignore[arg-type]
    # jobs 1 and 3 no longer hold GPUs (3 restarted: attempt 2 ran; its job is on attempt 3 now)
    u.jobs = SimpleNamespace(active=[job(2), job(3, restarts=2)])  # type: ignore[assignment]
    U._flush_ended(ctl, u)  # type: ignore[arg-type]
    await asyncio.gather(*ctl.tasks)
    assert sorted((r[0], r[1], r[2]) for r in ctl.saved) == [(1, 1, "a"), (1, 1, "b"), (3, 2, "c")]
    assert set(u.tallies) == {(2, 1, "a")}
    assert u.by_job == {2: {(1, "a"): u.tallies[(2, 1, "a")]}}  # (no job left behind with an empty entry)
