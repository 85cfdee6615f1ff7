"""The history stays fast (issue 16, item 5): what ended longer ago than `history_days` loses its events,
monitoring tallies and progress (jobs and runs stay, for accounting); events stay append-only for everything
else; listing the live queue and the recently ended uses indexes, not a scan of the whole history."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hsched.config import Settings
from hsched.controller.loops import compact
from hsched.controller.store import Store
from hsched.model import JobSpec, JobState, Placement
from hsched.testing import Lab

DAY = 86400.0


def ended(store: Store, at: float) -> int:
    """A job submitted, run and completed at `at` (with its events), with a tally and a progress row."""
    job = store.submit(JobSpec(command=("true",)), "alice", at)
    run = store.start_run(job, Placement("n1", ("GPU-1",), ""), f"/tmp/r{job.id}", at)
    store.end_run(run, at + 1, run_state="COMPLETED", exit_code=0, reason="completed",
                  job_fields={"state": JobState.COMPLETED, "exit_code": 0, "end_time": at + 1},
                  event=("ended", "completed"))
    store.save_run_usage([(job.id, 1, "n1", {"samples": 3})])
    store.save_run_progress(job.id, 1, {"step": 10})
    return job.id


def test_compaction_forgets_the_detail_of_old_ended_jobs_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    now = 400 * DAY
    old, recent = ended(store, now - 200 * DAY), ended(store, now - DAY)
    waiting = store.submit(JobSpec(command=("true",)), "bob", now - 300 * DAY).id  # old, but not ended
    store.add_event(now - 250 * DAY, "node", "n1 drained", node="n1")
    store.add_event(now - DAY, "node", "n1 up", node="n1")
    removed = store.compact(now - 180 * DAY)
    assert removed[0] >= 4 and removed[1] == 2  # its submitted, placed?, ended events and the node's; tally, progress
    assert store.events(old) == [] and store.run_usage(old) == [] and store.run_progress(old) == []
    assert store.events(recent) and store.run_usage(recent) and store.run_progress(recent)
    assert store.events(waiting)  # a job still waiting keeps its whole story
    nodes = [e["message"] for e in store.events(None) if e["kind"] == "node"]
    assert nodes == ["n1 up"]
    # the jobs and runs themselves stay: accounting and fair share read them
    j = store.get_job(old)
    assert j is not None and j.state is JobState.COMPLETED and len(store.runs(old)) == 1
    # and nothing else may delete an event
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.db.execute("DELETE FROM events")
    assert store.compact(now - 180 * DAY) == (0, 0)


def test_the_queue_reads_live_and_recently_ended_jobs_by_index(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    for k in range(5):
        ended(store, k * DAY)
    live = store.submit(JobSpec(command=("true",)), "bob", 10 * DAY).id
    assert [r["id"] for r in store.job_rows(active_only=True)] == [live]
    assert [r["id"] for r in store.job_rows(active_only=True, ended_since=3 * DAY)] == [4, 5, live]
    # (the cost with 100,000 ended jobs: tests/bench/bench_queue.py --held-every 2000)


async def test_the_controller_compacts_by_its_setting(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, settings=Settings(history_days=30)) as lab:
        now = lab.clock.time()
        old = await lab.ctl.db(ended, lab.ctl.store, now - 31 * DAY)
        recent = await lab.ctl.db(ended, lab.ctl.store, now - 29 * DAY)
        await compact(lab.ctl)
        assert await lab.ctl.db(lab.ctl.store.events, old) == []
        assert await lab.ctl.db(lab.ctl.store.events, recent)
