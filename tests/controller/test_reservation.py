"""The head of the queue keeps a reservation (issue 14): a gang of 8 GPUs behind running one-GPU jobs starts
at its reservation, not after, while a short job (its time limit ends it before) backfills into a GPU that
frees early and a job of unknown length does not. In-process, on a fake clock."""

from __future__ import annotations

from pathlib import Path

from hsched.testing import CannedNode, Lab


async def test_a_gang_at_the_head_starts_at_its_reservation_while_short_jobs_backfill(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=(CannedNode("box", "NVIDIA A100-SXM4-80GB", 8),)) as lab:
        small = [await lab.submit("python3", "s.py", gpus=1, time_limit_s=100.0) for _ in range(8)]
        await lab.round()
        assert all([(await lab.job(j.id)).placement for j in small])
        t0 = lab.clock.time()
        gang = await lab.submit("python3", "ddp.py", gpus=8)
        await lab.round()
        waiting = await lab.job(gang.id)
        assert not waiting.placement and "reserved" in waiting.reason, waiting.reason
        short = await lab.submit("python3", "eval.py", gpus=1, time_limit_s=10.0)
        endless = await lab.submit("python3", "serve.py", gpus=1)
        # one running job ends early: its GPU is free now, but reserved for the gang from t0 + 100
        lab.clock.advance(50.0)
        await lab.finish(small[0].id, 0)
        await lab.round()
        await lab.round()
        assert (await lab.job(short.id)).placement  # ends by t0 + 60: backfilled
        assert not (await lab.job(endless.id)).placement  # would hold a reserved GPU past t0 + 100
        lab.clock.advance(10.0)
        await lab.finish(short.id, 0)
        await lab.round()
        assert not (await lab.job(endless.id)).placement
        # the others end when their limits said; the gang starts then, not after
        lab.clock.advance(t0 + 100.0 - lab.clock.time())
        for j in small[1:]:
            await lab.finish(j.id, 0)
        await lab.round()
        await lab.round()
        started = await lab.job(gang.id)
        assert started.placement and started.start_time is not None
        assert started.start_time - t0 <= 100.0 + 1e-6
        assert not (await lab.job(endless.id)).placement  # it waits behind the gang now
