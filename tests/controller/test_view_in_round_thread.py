"""The round counts what the active jobs hold and predicts the running jobs' ends in its own thread (issue 33), from
what it took under the controller's lock (`round_input(later=True)`, `RoundInput.whole`): the view it gets is the one
counted on the event loop at that moment, whatever the loop changes after (an attempt's start, a run's progress, a
kind's history)."""

from __future__ import annotations

from pathlib import Path

from hsched.controller.launching import round_input
from hsched.controller.learning import learning
from hsched.model import JobState
from hsched.testing import CannedNode, Lab


async def test_the_view_counted_in_the_round_thread_is_the_one_counted_under_the_lock(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=[CannedNode("n0", "NVIDIA H100 80GB HBM3", 8),
                                         CannedNode("n1", "NVIDIA H100 80GB HBM3", 8)]) as lab:
        # a kind with a history (two jobs of it completed), so that its running jobs have predicted ends
        first = [await lab.submit("train", gpus=1, user="alice", kind="train") for _ in range(2)]
        await lab.round()
        for j in first:
            await lab.finish(j.id)
        await lab.advance(60.0)
        assert len(learning(lab.ctl).history.get("train", [])) == 2
        for k in range(10):
            await lab.submit("train", gpus=1, user=("alice", "bob")[k % 2], kind="train",
                             time_limit_s=3600.0 if k % 3 == 0 else None, cpus=2 if k % 4 == 0 else None)
        await lab.round()
        for _ in range(3):
            await lab.submit("train", gpus=8, user="carol", kind="train")
        ctl = lab.ctl
        async with ctl.lock:
            later = await round_input(ctl, later=True)
            now = await round_input(ctl)
        assert later is not None and now is not None and later.finish is not None and now.finish is None
        running = [j for j in now.view.holders if j.state is JobState.RUNNING]
        assert len(running) == 10 and len(now.view.running) == 10 and len(now.view.busy) == 10
        assert set(now.view.ends) == {j.id for j in running}  # (by the kind's history, or the time limit)
        # the loop moves on before the round's thread counts: none of it is the round's
        ctl.attempt_start[running[0].id] = ctl.attempt_start[running[0].id] - 10.0
        learning(ctl).history["train"].append(("alice", 1.0))
        assert later.whole().view == now.view
        # and counted again now (the round's caches of what is held and predicted are checked, never trusted)
        async with ctl.lock:
            again = await round_input(ctl)
        assert again is not None and again.view != now.view
        assert again.view.ends[running[0].id] != now.view.ends[running[0].id]
