"""Store.in_one (issue 33): several writes in one transaction, one commit; a write that fails undoes them all, and a
write's own failure inside it is undone alone when the write catches it (its savepoint)."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import pytest

from hsched.controller.store import Store
from hsched.model import JobSpec, JobState, Placement


def test_writes_in_one_commit_and_all_undone_when_one_fails(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.db")
    a, b = (store.submit(JobSpec(command=("true",), name=n), "alice", 1.0) for n in "ab")
    p = Placement(node="n0", devices=("GPU-0",))
    commits: list[str] = []
    store.db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    runs, _ = store.in_one([functools.partial(store.start_runs, a, [(p, "/r/a")], 2.0),
                            functools.partial(store.set_reasons, [(b.id, "Resources")])])
    store.db.set_trace_callback(None)
    assert len(commits) == 1
    assert runs[0].job_id == a.id and store.get_job(a.id).state is JobState.LAUNCHING  # type: ignore[union-attr]
    assert store.get_job(b.id).reason == "Resources"  # type: ignore[union-attr]

    def boom() -> None:
        raise RuntimeError("the disk went away")

    with pytest.raises(RuntimeError, match="went away"):
        store.in_one([functools.partial(store.set_reasons, [(b.id, "Priority")]), boom])
    assert store.get_job(b.id).reason == "Resources"  # type: ignore[union-attr]  (undone with the batch)
    assert not store.db.in_transaction

    def caught() -> None:
        # a write that fails inside its own transaction and handles it: only its part is undone
        with contextlib.suppress(ValueError), store.tx() as db:
            db.execute("UPDATE jobs SET reason = 'half' WHERE id = ?", (a.id,))
            raise ValueError("no")

    store.in_one([caught, functools.partial(store.set_reasons, [(b.id, "Priority")])])
    assert store.get_job(a.id).reason != "half"  # type: ignore[union-attr]
    assert store.get_job(b.id).reason == "Priority"  # type: ignore[union-attr]
