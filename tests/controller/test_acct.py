"""Accounting (issue 16): the window's jobs with their runs, and GPU-hours by user and by GPU model that add
up to the runs' placements times durations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hsched.cli.acct import parse_when
from hsched.controller.api import Api
from hsched.errors import UserError
from hsched.learn.accounting import in_window, run_gpu_seconds
from hsched.model import Job, JobSpec, JobState, Run, RunState
from hsched.testing import CannedNode, Lab

TWO_KINDS = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4), CannedNode("h", "NVIDIA H100 80GB HBM3", 4))


def run(devices: int, start: float | None, end: float | None) -> Run:
    return Run(id=1, job_id=1, attempt=1, node="a", devices=tuple(f"g{i}" for i in range(devices)),
               state=RunState.COMPLETED, run_dir="x", start_time=start, end_time=end)


def test_gpu_seconds_are_clipped_to_the_window() -> None:
    assert run_gpu_seconds(run(2, 100.0, 200.0), None, None, 1000.0) == 200.0
    assert run_gpu_seconds(run(2, 100.0, 200.0), 150.0, None, 1000.0) == 100.0
    assert run_gpu_seconds(run(2, 100.0, None), None, 300.0, 1000.0) == 400.0  # still running: up to `until`
    assert run_gpu_seconds(run(2, None, None), None, None, 1000.0) == 0.0
    job = Job(id=1, spec=JobSpec(command=("x",)), user="u", state=JobState.COMPLETED, reason="", submit_time=50.0,
              end_time=90.0)
    assert in_window(job, None, None) and not in_window(job, 100.0, None) and not in_window(job, None, 10.0)


async def test_gpu_hours_by_user_and_model_add_up(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=TWO_KINDS) as lab:
        a = await lab.submit("train", gpus=2, user="ann")
        await lab.round()
        lab.clock.advance(3600.0)
        await lab.finish(a.id, 0)
        await lab.round()
        api = Api(lab.ctl)
        reply = await api.handle("acct", {}, os.getuid())
        [job] = [j for j in reply["jobs"] if j["id"] == a.id]
        [r] = job["runs"]
        hours = reply["gpu_hours"]
        assert hours["total"] == pytest.approx(2.0)  # 2 GPUs for an hour
        assert sum(hours["by_model"].values()) == pytest.approx(2.0)
        assert list(hours["by_model"]) == r["models"]  # the run's GPUs' model
        assert list(hours["by_user"].values()) == [pytest.approx(2.0)]
        # a window after it ended holds nothing
        later = await api.handle("acct", {"since": lab.clock.time() + 10}, os.getuid())
        assert later["jobs"] == [] and later["gpu_hours"]["total"] == 0


def test_times() -> None:
    assert parse_when("now-2h", 10_000.0, "-S") == 10_000.0 - 7200
    assert parse_when("now", 5.0, "-S") == 5.0
    assert parse_when("2026-12-01", 0.0, "-S") > 0
    with pytest.raises(UserError, match="-S 'yesterday': expected a time such as"):
        parse_when("yesterday", 0.0, "-S")
