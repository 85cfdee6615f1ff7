from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hsched.controller.store import SCHEMA_VERSION, Store
from hsched.model import JobSpec, JobState, Placement, RunHandle


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "h.db")


def test_pragmas_and_version(store: Store) -> None:
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_events_are_append_only(store: Store) -> None:
    store.add_event(1.0, "x", "hello")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.db.execute("UPDATE events SET message = 'changed'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.db.execute("DELETE FROM events")


def test_reopen_keeps_everything_and_does_not_remigrate(tmp_path: Path) -> None:
    s = Store(tmp_path / "h.db")
    job = s.submit(JobSpec(command=("true",), name="a"), "alice", 10.0)
    s.close()
    s2 = Store(tmp_path / "h.db")
    again = s2.get_job(job.id)
    assert again is not None and again.name == "a" and again.state is JobState.PENDING
    assert s2.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    from hsched.errors import UserError

    s = Store(tmp_path / "h.db")
    s.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 5}")
    s.close()
    with pytest.raises(UserError, match="newer than this hsched knows"):
        Store(tmp_path / "h.db")


def test_run_lifecycle_is_recorded_with_events(store: Store) -> None:
    job = store.submit(JobSpec(command=("true",)), "bob", 1.0)
    run = store.start_run(job, Placement("n1", ("GPU-1",), "first free"), "/tmp/r", 2.0)
    assert store.get_job(job.id).state is JobState.LAUNCHING  # type: ignore[union-attr]
    assert [r.id for r in store.live_runs()] == [run.id]
    store.run_launched(run, RunHandle("/tmp/r", 10, 11, 1234, "boot"), 3.0)
    j = store.get_job(job.id)
    # the job started when its run did (placed at 2.0, as its time limit counts), not when the launch's reply came
    assert j is not None and j.state is JobState.RUNNING and j.start_time == 2.0
    store.end_run(run, 4.0, run_state="COMPLETED", exit_code=0, reason="completed",
                  job_fields={"state": JobState.COMPLETED, "exit_code": 0, "end_time": 4.0},
                  event=("ended", "completed"))
    j = store.get_job(job.id)
    assert j is not None and j.state is JobState.COMPLETED and j.exit_code == 0
    assert store.live_runs() == []
    kinds = [e["kind"] for e in store.events(job.id)]
    assert kinds == ["submitted", "placed", "started", "ended"]


def test_failed_transaction_leaves_nothing(store: Store) -> None:
    job = store.submit(JobSpec(command=("true",)), "bob", 1.0)
    with pytest.raises(sqlite3.OperationalError):
        store.set_job(job.id, 2.0, state=JobState.RUNNING, no_such_column=1)
    j = store.get_job(job.id)
    assert j is not None and j.state is JobState.PENDING


def test_schema_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    """A store written by the first release (no ranks) opens with its jobs and runs intact."""
    import json

    from hsched.controller import store as store_mod

    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for stmt in store_mod._MIGRATIONS[0]:
        db.execute(stmt)
    db.execute("PRAGMA user_version=1")
    spec = {"command": ["true"], "name": "old", "resources": {"gpus": 1}}
    db.execute("INSERT INTO jobs(user, state, reason, qos, priority, spec, submit_time) VALUES "
               "('u', 'RUNNING', '', 'normal', 0, ?, 1.0)", (json.dumps(spec),))
    db.execute("INSERT INTO runs(job_id, attempt, node, devices, state, run_dir) VALUES "
               "(1, 1, 'n', '[\"GPU-1\"]', 'RUNNING', '/r')")
    db.close()
    s = Store(path)
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    run = s.live_runs()[0]
    assert (run.rank, run.world, run.devices) == (0, 1, ("GPU-1",))
    job = s.get_job(1)
    assert job is not None and job.name == "old" and job.spec.resources.gpus == 1
