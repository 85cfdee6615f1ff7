"""What a requeued job's progress said was left reaches the round (issue 33, item 4): when an attempt that reported
progress with a total ends and the job waits again, the controller keeps the seconds left and the GPU type it
measured them on (`learning.waiting_left`, the round's `FleetView.left`), forgets them when the job ends, and the
policy ranks the job by them. In-process, on a fake clock."""

from __future__ import annotations

from pathlib import Path

from hsched.controller import learning
from hsched.controller.launching import fleet_view, job_cache
from hsched.model import JobState
from hsched.testing import Lab
from tests.controller.test_moves import A100, FLEET, SETTINGS, proven_on_slow, report


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
