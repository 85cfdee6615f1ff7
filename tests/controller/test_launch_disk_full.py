"""Issue 27: a job whose launch fails because the controller's own disk is full (no room for its run folder) never
ran and is not at fault: it waits in the queue with its retries untouched, and is launched once there is room. It
was ended LOST."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsched.controller import launching
from hsched.errors import HelperError
from hsched.model import JobState
from hsched.testing import Lab


def no_room(lab: Lab, monkeypatch: pytest.MonkeyPatch, full: bool) -> None:
    """Every node's launch fails as the node helper's does on a full disk; `full`: the store's disk says so."""
    for ex in lab.executors.values():
        async def launch(req: Any, _name: str = ex.name) -> Any:
            raise HelperError(f"{_name}: node helper 'launch': OSError: [Errno 28] No space left on device", "launch")
        monkeypatch.setattr(ex, "launch", launch)
    monkeypatch.setattr(launching, "disk_full", lambda ctl: full)


async def test_launch_on_a_full_disk_waits_and_runs_once_there_is_room(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", gpus=1)
        with monkeypatch.context() as m:
            no_room(lab, m, full=True)
            await lab.round()
            j = await lab.job(job.id)
            assert j.state is JobState.PENDING and j.failures == 0, j
            assert "launch_failed" in await lab.events(job.id) and "requeued" in await lab.events(job.id)
            await lab.advance(lab.ctl.settings.retry_backoff_s)  # still full: it waits again, never LOST
            assert (await lab.job(job.id)).state is JobState.PENDING
        await lab.advance(lab.ctl.settings.retry_backoff_s)  # room again
        assert (await lab.job(job.id)).state in (JobState.LAUNCHING, JobState.RUNNING)
        assert (await lab.job(job.id)).failures == 0


async def test_a_launch_failing_with_room_on_the_disk_is_still_the_jobs(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        job = await lab.submit("python", "train.py", gpus=1)
        no_room(lab, monkeypatch, full=False)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.LOST  # no retries by default: as before
