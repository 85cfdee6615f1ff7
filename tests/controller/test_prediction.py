"""Predictions (issue 14, item 4): a kind's expected duration from its history (its user's runs first), a
running job's predicted end from its progress or that history, `submit --test-only`'s start from the
running jobs' predicted ends (the round's own forecast: test_forecast.py), and how wrong the predictions were, per
kind. In-process, on a fake clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hsched.controller import learning
from hsched.controller.api import Api
from hsched.controller.launching import job_cache
from hsched.learn.predict import expected_duration, remaining
from hsched.testing import Lab


def test_expected_duration_prefers_the_users_own_runs() -> None:
    assert expected_duration([100.0, 120.0, 110.0], [1.0] * 9) == 110.0
    assert expected_duration([100.0], [10.0, 20.0, 30.0]) == 20.0  # too few of theirs: everyone's
    assert expected_duration([], [5.0]) is None
    assert expected_duration([], [1.0] * 5 + [100.0] * 10) == 100.0  # only the last ten count


def test_remaining_from_progress_else_history() -> None:
    assert remaining(50.0, 200.0, step=100.0, total=400.0, steps_per_s=2.0) == 150.0
    assert remaining(50.0, 200.0) == 150.0
    assert remaining(250.0, 200.0) is None  # ran longer than its kind does: history has nothing to say
    assert remaining(10.0, None) is None


async def _complete(lab: Lab, job_id: int, seconds: float) -> None:
    lab.clock.advance(seconds)
    await lab.finish(job_id, 0)
    await lab.round()
    await lab.settle_tasks()


async def test_history_predicts_the_next_jobs_end_and_the_error_is_kept(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        for seconds in (100.0, 120.0, 110.0):
            j = await lab.submit("python3", "train.py", "--model", "m", gpus=1)
            await lab.round()
            await _complete(lab, j.id, seconds)
        nxt = await lab.submit("python3", "train.py", "--model", "m", gpus=1)
        await lab.round()
        shown = await api.handle("show", {"id": nxt.id}, os.getuid())
        assert shown["expected_duration_s"] == 110.0
        started = (await lab.job(nxt.id)).start_time
        assert shown["predicted_end"]["from"] == "history"
        assert shown["predicted_end"]["time"] == (await api.handle("show", {"id": nxt.id}, os.getuid())
                                                  )["predicted_end"]["time"]
        from hsched.serialize import iso

        assert shown["predicted_end"]["time"] == iso(started + 110.0)
        await _complete(lab, nxt.id, 132.0)
        kinds = {k["kind"]: k for k in await api.handle("kinds", {}, os.getuid())}
        k = kinds["train.py model=m"]
        assert k["completed"] == 4 and k["prediction"]["jobs"] == 2  # the second job on had a history
        # the median of 100 and 120 for the third (it ran 110), of 100, 120, 110 for the fourth (it ran 132)
        assert k["prediction"]["mean_abs_error"] == pytest.approx((0 / 110 + 22 / 132) / 2)


async def test_test_only_predicts_the_start_behind_a_running_gang(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        gang = await lab.submit("python3", "big.py", gpus=4, nodes=2)
        await lab.round()
        (run0,) = [r for r in await lab.runs(gang.id) if r.rank == 0]
        # the gang reports: 1,000 steps of 10,000 done in 100 s
        sample = {"seq": 1, "gpus": {"source": None, "devices": []}, "processes": [],
                  "progress": [{"run_dir": run0.run_dir, "job_run_dir": run0.run_dir, "t": lab.clock.time(),
                                "step": 0.0, "total": 10_000.0, "reports": 1}]}
        await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
        learning.observe(lab.ctl, lab.ctl.nodes[run0.node], sample, lab.clock.time(), job_cache(lab.ctl).last)
        lab.clock.advance(100.0)
        sample["progress"][0].update(t=lab.clock.time(), step=1_000.0)
        learning.observe(lab.ctl, lab.ctl.nodes[run0.node], sample, lab.clock.time(), job_cache(lab.ctl).last)
        guess = await api.handle("test_only", {"spec": {"command": ["python3", "small.py"],
                                                        "resources": {"gpus": 1}}}, os.getuid())
        assert not guess["now"] and guess["waits_for"] == [gang.id]
        assert guess["start_in_s"] == pytest.approx(900.0)
        assert len(await lab.ctl.db(lab.ctl.store.job_rows, active_only=True)) == 1  # nothing queued but the gang
        # it then starts when the gang ends, as predicted
        small = await lab.submit("python3", "small.py", gpus=1)
        await _complete(lab, gang.id, 900.0)
        await lab.round()
        started = (await lab.job(small.id)).start_time
        assert started is not None and started - (lab.clock.time() - 900.0) == pytest.approx(900.0, rel=0.1)
        now_guess = await api.handle("test_only", {"spec": {"command": ["true"], "resources": {"gpus": 1}}},
                                     os.getuid())
        assert now_guess["now"] and now_guess["start_in_s"] == 0.0
        too_big = await api.handle("test_only", {"spec": {"command": ["true"], "resources": {"gpus": 9}}},
                                   os.getuid())
        assert too_big["start_time"] is None and "GPU" in too_big["reason"]


async def test_queue_start_predicts_each_waiting_job(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        gang = await lab.submit("python3", "big.py", gpus=4, nodes=2, time_limit_s=1000.0)
        await lab.round()
        big = await lab.submit("python3", "big.py", gpus=4, nodes=2)
        small = await lab.submit("python3", "small.py", gpus=1, time_limit_s=60.0)
        await lab.round()
        got = await api.handle("starts", {}, os.getuid())
        from hsched.serialize import iso

        started = (await lab.job(gang.id)).start_time
        assert got[str(big.id)] == iso(started + 1000.0)  # the gang's time limit is all that is known of it
        assert got[str(small.id)] is None  # behind a job whose length nobody knows, on every node


async def test_jobs_of_no_kind_share_no_history(tmp_path: Path) -> None:
    # issue 29: `sh -c 'echo ...'` jobs used to be kind "echo" and predicted one another; a shell line that runs
    # no program of its own has no kind, keeps no history and predicts nothing
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        for seconds in (100.0, 120.0, 110.0):
            j = await lab.submit("sh", "-c", f"echo {seconds}; id", gpus=1)
            await lab.round()
            await _complete(lab, j.id, seconds)
        nxt = await lab.submit("sh", "-c", "echo other", gpus=1)
        await lab.round()
        shown = await api.handle("show", {"id": nxt.id}, os.getuid())
        assert shown["expected_duration_s"] is None
        assert await lab.ctl.db(lab.ctl.store.durations, "") == []
        kinds = {k["kind"]: k for k in await api.handle("kinds", {}, os.getuid())}
        assert "echo" not in kinds and kinds.get("", {"completed": 0})["completed"] == 0
