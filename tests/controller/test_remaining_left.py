"""What a requeued job's progress said was left reaches the round (issue 33, item 4): when an attempt that reported
progress with a total ends and the job waits again, the controller keeps the seconds left and the GPU type it
measured them on (`learning.waiting_left`, the round's `FleetView.left`), forgets them when the job ends, and the
policy ranks the job by them. In-process, on a fake clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hsched.controller import learning
from hsched.controller.launching import fleet_view, job_cache
from hsched.learn.kinds import PlacementClass
from hsched.model import JobState
from hsched.sched.view import PolicyInput
from hsched.testing import Lab
from tests.controller.test_moves import A100, FLEET, H100, SETTINGS, proven_on_slow, report


async def test_a_requeued_jobs_remaining_time_is_kept_for_the_round_and_dropped_when_it_ends(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        # 7,000 steps done of 8,000 at 10 steps/s: 100 s left (a move to the H100 would not pay for its checkpoint)
        jid = await proven_on_slow(lab, total=8_000.0)
        assert learning.waiting_left(lab.ctl) == {}  # nothing ended with a total yet (its first attempt had none)
        await lab.finish(jid, 85)  # it checkpoints on its own: requeued, its attempt over
        await lab.round()
        other = await lab.submit("python3", "other.py", gpus=1, kind="blocker")
        await lab.round()
        await report(lab, other.id, 0.0, None)  # (a monitoring sample: the controller notices the ended attempt)
        left = learning.waiting_left(lab.ctl)
        assert set(left) == {jid}
        seconds, gpu_type = left[jid]
        assert abs(seconds - 100.0) < 1.0 and gpu_type == A100
        jobs = job_cache(lab.ctl).last
        assert jobs is not None
        assert fleet_view(lab.ctl, jobs.active).left == left
        # it ends: forgotten at the next sample
        await lab.round()
        assert (await lab.job(jid)).state is JobState.RUNNING
        await lab.finish(jid, 0)
        await lab.round()
        await report(lab, other.id, 10.0, None)
        assert jid not in learning.waiting_left(lab.ctl)


async def test_a_short_attempts_remaining_time_is_its_work_left_over_its_kinds_speed_as_the_simulators(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt shorter than MIN_WINDOW_S has no speed of its own (a time-compressed replay's quantum is 4.2 s):
    the policy must still get its remaining time, the work its progress says is left over its kind's learned speed
    where it runs, normalised to the fastest type and counted down since its report: the simulator's figure
    (hsched.sim.engine._ProgressLeft: work left over the fastest rate). Without it the live policy ranked such jobs
    by attained service and the others by remaining time, and they swapped places (issue 33: 330 stops against
    the simulator's 103)."""
    from hsched.sched.stages import plan as plan_stage

    seen: list[PolicyInput] = []
    make_plan = plan_stage.make_plan

    def spy(policy: Any, inp: PolicyInput, *a: Any) -> Any:
        seen.append(inp)
        return make_plan(policy, inp, *a)

    monkeypatch.setattr(plan_stage, "make_plan", spy)
    async with Lab.open(tmp_path, nodes=FLEET, settings=replace(SETTINGS, policy="hsched")) as lab:
        rates = {H100: 20.0, A100: 10.0}  # steps per second of kind k (the fastest: 20)
        for gpu_type, rate in rates.items():
            await lab.ctl.db(lab.ctl.store.learn_kind_rate, "k", gpu_type, 1, PlacementClass.SINGLE.value, rate,
                             lab.clock.time())
        await learning.rates(lab.ctl)  # (as the controller's start reads them)
        blocker = await lab.submit("python3", "other.py", gpus=1, kind="blocker")
        await lab.round()
        job = await lab.submit("python3", "train.py", gpus=1, kind="k")
        await lab.round()
        await lab.finish(job.id, 85)  # it checkpoints on its own: it may be time-shared from now on
        await lab.round()
        await lab.round()
        assert (await lab.job(job.id)).restarts == 1 and (await lab.job(blocker.id)).state is JobState.RUNNING
        # two reports 2 s apart (< MIN_WINDOW_S: no speed of its own): 8,000 - 1,020 steps left at 10 steps/s
        await report(lab, job.id, 1_000.0, 8_000.0)
        lab.clock.advance(2.0)
        await report(lab, job.id, 1_020.0, 8_000.0)
        lab.clock.advance(1.0)
        waiting = await lab.submit("python3", "w.py", gpus=1, kind="w")  # (a round with a job to place)
        seen.clear()
        await lab.round()
        sim = (8_000.0 - 1_020.0) / rates[H100]  # the simulator's: work left over the fastest rate...
        assert seen and seen[-1].forecast_s.get(job.id) == pytest.approx(sim - 1.0 * rates[A100] / rates[H100])
        # ...and once it is stopped and waits, the work left at its last report over the fastest rate
        await lab.finish(job.id, 85)
        await lab.round()
        assert (await lab.job(waiting.id)).state is JobState.RUNNING
        await report(lab, waiting.id, 0.0, None)  # (a monitoring sample: the controller notices the ended attempt)
        seen.clear()
        await lab.advance(1.0)
        assert (await lab.job(job.id)).state is JobState.PENDING
        assert seen and seen[-1].forecast_s.get(job.id) == pytest.approx(sim)


async def test_the_first_round_knows_the_stored_speeds(tmp_path: Path) -> None:
    """The learned speeds are read at the controller's start: before, they were read when a run first ended, and until
    then (and for MODEL_EVERY_S after) the policy placed and counted remaining time by the accelerator table alone."""
    from hsched.controller import loops

    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        await lab.ctl.db(lab.ctl.store.learn_kind_rate, "k", A100, 1, PlacementClass.SINGLE.value, 10.0,
                         lab.clock.time())
        assert learning.learning(lab.ctl).rates is None
        await loops.start(lab.ctl)
        model = learning.throughput(lab.ctl, lab.clock.monotonic(), [A100, H100])
        assert model is not None and model.rate("k", 1, A100) == pytest.approx(10.0)
