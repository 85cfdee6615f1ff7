"""What a round reads (issue 18): the store's unended jobs are read again only after the store changed, and then
unchanged rows keep their Job objects; fair share usage is read again when it may have moved (a store change, a
new user, USAGE_REFRESH_S on the controller's clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.controller import commands, launching
from hsched.model import JobState
from hsched.testing import Lab


async def test_a_round_reads_the_jobs_again_only_after_the_store_changed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        reads: list[int] = []
        real, real_by_id = lab.ctl.store.job_rows, lab.ctl.store.job_rows_by_id
        fetched: list[int] = []

        def counted(**kw: Any) -> Any:
            reads.append(1)
            return real(**kw)

        def counted_by_id(ids: Any) -> Any:
            # (issue 33: after the first read, only the rows written since are fetched)
            reads.append(1)
            fetched.extend(ids)
            return real_by_id(ids)

        monkeypatch.setattr(lab.ctl.store, "job_rows", counted)
        monkeypatch.setattr(lab.ctl.store, "job_rows_by_id", counted_by_id)
        jobs = [await lab.submit("x", gpus=4) for _ in range(3)]  # two start, one waits
        await lab.round()
        cache = launching.job_cache(lab.ctl)
        first = {j.id: j for j in cache.last.all}
        await lab.round()  # reads it again: the first round wrote (launches, reasons)
        await lab.round()
        before = len(reads)
        await lab.round()
        await lab.round()
        assert len(reads) == before  # nothing was written: nothing read
        waiting = next(j for j in cache.last.all if j.state is JobState.PENDING)
        await commands.set_priority(lab.ctl, jobs[0].id, 5)  # a running job's row changes, the waiting one's not
        await lab.round()
        assert len(reads) == before + 1
        assert fetched[-1:] == [jobs[0].id]  # that row alone
        again = {j.id: j for j in cache.last.all}
        assert again[waiting.id] is waiting
        assert again[jobs[0].id] is not first[jobs[0].id] and again[jobs[0].id].spec.priority == 5


async def test_fair_share_usage_is_read_again_when_it_may_have_moved(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        asked: list[float] = []
        real = launching.round_usage

        async def counted(ctl: Any, now: float, users: Any, jobs: Any = (), mark: Any = None) -> dict[str, float]:
            asked.append(now)
            return await real(ctl, now, users, jobs, mark)

        monkeypatch.setattr(launching, "round_usage", counted)
        for _ in range(3):
            await lab.submit("x", gpus=4, user="ann")
        await lab.round()
        await lab.round()  # the first round's writes: read again
        n = len(asked)
        await lab.advance(1.0)
        await lab.advance(1.0)
        assert len(asked) == n  # nothing changed, well within USAGE_REFRESH_S
        await lab.advance(launching.USAGE_REFRESH_S)
        assert len(asked) == n + 1  # time enough for usage to have grown
        await lab.advance(1.0)
        assert len(asked) == n + 1
        await lab.submit("y", gpus=1, user="bob")  # a store change and a new user
        await lab.round()
        assert len(asked) == n + 2


async def test_the_incremental_read_sees_what_a_whole_read_sees(tmp_path: Path) -> None:
    """Issue 33: after the first read, the cache fetches only the rows written since (submits, starts, ends,
    cancels, a priority change, a requeue); after each step it holds exactly what a whole read of the store gives,
    in id order, and live runs likewise."""
    from hsched.executors.base import StatusQuery

    from hsched.controller.state import Jobs
    from hsched.controller.store import job_from_row

    async with Lab.open(tmp_path) as lab:
        store, cache = lab.ctl.store, launching.job_cache(lab.ctl)

        async def check() -> None:
            got = await lab.ctl.db(cache.read, store)
            whole = await lab.ctl.db(lambda: [job_from_row(r) for r in store.job_rows(active_only=True)])
            assert list(got.all) == whole
            # (the parts kept job by job as rows change split as a whole read splits them, in id order)
            split = Jobs.of(got.changes, tuple(whole))
            assert (got.queued, got.active, got.users, got.special, got.elastic, got.apart, got.requeued) == (
                split.queued, split.active, split.users, split.special, split.elastic, split.apart, split.requeued)
            assert (dict(got.queued_by_id), dict(got.active_by_id)) == (split.queued_by_id, split.active_by_id)
            runs = await lab.ctl.db(lab.ctl.state.live_runs.read, store)
            assert runs == await lab.ctl.db(store.live_runs)
            # the watch's groups, kept node by node, as grouping them afresh gives them (nodes by their first run)
            live, groups = await lab.ctl.db(lab.ctl.state.live_runs.read_grouped, store)
            want: dict[str, list[Any]] = {}
            for r in live:
                want.setdefault(r.node, []).append(r)
            assert live == runs and list(groups) == list(want)
            assert {n: list(g.runs) for n, g in groups.items()} == want
            assert all(g.queries == tuple(StatusQuery(r.run_dir, r.handle) for r in g.runs) for g in groups.values())
            for jid in {r.job_id for r in runs}:
                assert await lab.ctl.db(lab.ctl.state.live_runs.of_job, store, jid) == [r for r in runs
                                                                                        if r.job_id == jid]
            # fair share's rows of the running runs, kept while unchanged, as a whole read gives them, in its order
            await lab.ctl.db(store.user_usage, lab.clock.time(), 86400.0)
            led = store._ledger
            assert led is not None
            kept = await lab.ctl.db(store._usage_rows, led.upto, led.open)
            store._open_usage.clear()
            assert kept == await lab.ctl.db(store._usage_rows, led.upto, led.open)

        jobs = [await lab.submit("x", gpus=(1, 2, 4)[k % 3], user=f"u{k % 3}") for k in range(12)]
        # (an elastic job: the cache keeps which jobs are, for the round's resizing)
        from hsched.model import JobSpec, Resources

        await commands.submit(lab.ctl, JobSpec(command=("t",), resources=Resources(gpus=1, gpus_max=2)), "u1", None)
        await check()
        assert cache.last.elastic and not cache.last.apart
        # (a shared job: the cache keeps whether one waits, for the round's sharing stage)
        await commands.submit(lab.ctl, JobSpec(command=("s",), resources=Resources(
            gpus=1, shared=True, gpu_memory_mib=1024)), "u2", None)
        await check()
        assert cache.last.apart
        await lab.round()
        await check()
        running = [j for j in jobs if (await lab.job(j.id)).state is JobState.RUNNING]
        await lab.finish(running[0].id)
        # (its end recorded by a watch alone: no round starts another run on its node meanwhile)
        from hsched.controller.watching import watch_runs

        await lab.beat()
        assert await watch_runs(lab.ctl)
        await check()
        await commands.cancel(lab.ctl, jobs[-1].id)
        await commands.set_priority(lab.ctl, jobs[-2].id, 7)
        await check()
        await lab.round()
        await check()
        await lab.finish(running[1].id, exit_code=3)
        await lab.submit("y", gpus=1, user="u9")
        await lab.round()
        await check()
        # held and released (out of the queue and back in its place by id), an ended job requeued, a running one
        # preempted
        waiting = [j.id for j in (await lab.ctl.db(cache.read, store)).queued]
        await commands.hold(lab.ctl, waiting[:2], True)
        await check()
        await commands.hold(lab.ctl, waiting[:1], False)
        await check()
        await commands.requeue(lab.ctl, jobs[-1].id)
        await check()
        assert cache.last.requeued
        await commands.preempt(lab.ctl, (await lab.ctl.db(cache.read, store)).active[0].id)
        await check()
        await lab.round()
        await check()
        assert len(cache.last.all) >= 10
