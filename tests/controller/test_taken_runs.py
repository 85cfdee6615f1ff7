"""Runs a node's own scheduler decides about (a Slurm group, issue 17), in-process over fake nodes: a run the
node took away (its node failed, it was preempted there) requeues its job without using a retry, a gang whole;
a run still waiting in the node's queue does not use its time limit, which counts from the node's real start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from hsched.executors.base import StatusQuery

from hsched.model import EndReason, JobState, RunReport, RunState, RunStatus
from hsched.testing import Lab


def reporting(lab: Lab, node: str, change: Callable[[RunReport], RunReport]) -> None:
    """Node `node`'s status reports pass through `change` (what a Slurm group adds to a report)."""
    ex = lab.executors[node]
    real = ex.status

    async def status(queries: Sequence[StatusQuery]) -> list[RunReport]:
        return [change(r) for r in await real(queries)]

    ex.status = status  # type: ignore[method-assign]


async def test_a_run_its_node_preempted_requeues_the_job_without_using_a_retry(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        cause: list[EndReason | None] = [EndReason.PREEMPTED]
        for node in lab.executors:
            reporting(lab, node, lambda r: replace(r, cause=cause[0]) if r.status is RunStatus.LOST else r)
        job = await lab.submit("train", gpus=1, retries=0)
        await lab.round()
        [run] = await lab.runs(job.id)
        lab.executors[run.node].runs[run.run_dir].lost = True
        await lab.round()
        j = await lab.job(job.id)
        assert (j.restarts, j.failures) == (1, 0) and j.state in (JobState.PENDING, JobState.RUNNING)
        [first, *_] = await lab.runs(job.id)
        assert (first.state, first.reason) == (RunState.PREEMPTED, "preempted")
        assert "preempted" in await lab.events(job.id)
        # a run lost with no cause is a failure as before: with no retries left, the job is LOST
        other = await lab.submit("other", gpus=1, retries=0)
        await lab.round()
        [orun] = await lab.runs(other.id)
        lab.executors[orun.node].runs[orun.run_dir].lost = True
        cause[0] = None
        await lab.round()
        assert (await lab.job(other.id)).state is JobState.LOST


async def test_a_gang_rank_whose_node_failed_stops_the_others_and_requeues_the_gang(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        gang = await lab.submit("ddp", gpus=4, nodes=2, retries=0)
        await lab.round()
        runs = await lab.runs(gang.id)
        assert sorted(r.node for r in runs) == ["a", "b"]
        on_b = next(r for r in runs if r.node == "b")
        reporting(lab, "b", lambda r: replace(r, cause=EndReason.NODE_LOST) if r.status is RunStatus.LOST else r)
        lab.executors["b"].runs[on_b.run_dir].lost = True
        await lab.round()
        assert (await lab.job(gang.id)).state is JobState.PREEMPTING  # the rank on a is being stopped
        [on_a] = [f for f in await lab.fake_runs(gang.id) if f.request.run_dir != on_b.run_dir]
        assert on_a.signals  # its stop signal
        await lab.finish(gang.id, 143, rank=0 if on_b.rank == 1 else 1)
        await lab.round()
        j = await lab.job(gang.id)
        assert (j.restarts, j.failures) == (1, 0) and j.state in (JobState.PENDING, JobState.RUNNING)
        assert "rank_ended" in await lab.events(gang.id) and "preempted" in await lab.events(gang.id)


async def test_the_time_limit_counts_from_the_nodes_real_start(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        queued = True
        started: list[float] = []

        def slurm_like(r: RunReport) -> RunReport:
            if r.status is not RunStatus.RUNNING:
                return r
            return replace(r, queued=True) if queued else replace(r, started_at=started[0])

        job = await lab.submit("train", gpus=1, time_limit_s=100.0)
        await lab.round()
        [run] = await lab.runs(job.id)
        reporting(lab, run.node, slurm_like)
        for _ in range(30):  # 300 s in the node's queue: three times its limit
            await lab.advance(10.0)
        assert (await lab.job(job.id)).state is JobState.RUNNING
        queued = False
        started.append(lab.clock.time() - 5.0)  # the node started it 5 s ago
        await lab.advance(90.0)  # 95 s of its 100
        assert (await lab.job(job.id)).state is JobState.RUNNING
        await lab.advance(6.0)
        j = await lab.job(job.id)
        assert j.state is JobState.COMPLETING and j.reason == "timeout"
