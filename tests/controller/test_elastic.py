"""Elastic jobs, live (issue 31): on a simulated 8-GPU node an elastic job `--gpus 2-8` grows into the GPUs that
free, shrinks when one-GPU jobs arrive so that they start once it has checkpointed, and grows back when they end;
each restart carries the new size in its environment; only a job that proved it checkpoints is resized; the events
say why and what it gains. In-process, on a fake clock (the real trainer: tests/e2e/test_elastic_trainer.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hsched.config import Settings, parse_checkpoint_signal
from hsched.controller import commands, learning
from hsched.controller.api import Api
from hsched.controller.launching import job_cache
from hsched.model import Job, JobSpec, JobState, Resources
from hsched.testing import CannedNode, Lab
from tests.controller.test_learning import progress

FLEET = (CannedNode("n", "NVIDIA H100 80GB HBM3", 8),)
SETTINGS = Settings(move_min_run_s=300.0, move_cost_s=60.0)
CKPT_S = 20.0
"""How long the fake trainer takes to checkpoint after its signal."""


def read_json(path: Path) -> dict[str, Any]:
    got = json.loads(path.read_text())
    assert isinstance(got, dict)
    return got


async def submit_elastic(lab: Lab, lo: int, hi: int, kind: str = "elastic-k") -> Job:
    spec = JobSpec(command=("python3", "trainer.py"), resources=Resources(gpus=lo, gpus_max=hi), kind=kind,
                   checkpoint_signal=parse_checkpoint_signal("USR1@60"))
    return await commands.submit(lab.ctl, spec, "alice", None)


async def report(lab: Lab, job_id: int, step: float) -> None:
    run = next(r for r in await lab.runs(job_id) if r.state.is_live() and r.rank == 0)  # (rank 0 reports)
    await lab.ctl.db(job_cache(lab.ctl).read, lab.ctl.store)
    learning.observe(lab.ctl, lab.ctl.nodes[run.node], progress(run.run_dir, lab.clock.time(), step, None),
                     lab.clock.time(), job_cache(lab.ctl).last)


async def size(lab: Lab, job_id: int) -> int | None:
    job = await lab.job(job_id)
    return len(job.placement[0].devices) if job.state is JobState.RUNNING else None


async def env(lab: Lab, job_id: int) -> dict[str, str]:
    return dict((await lab.fake_runs(job_id))[-1].request.env)


async def checkpoint(lab: Lab, job_id: int) -> None:
    """The trainer got its signal: it saves for CKPT_S and exits with the checkpoint code."""
    lab.clock.advance(CKPT_S)
    await lab.finish(job_id, 85)


async def run_for(lab: Lab, job_id: int, seconds: float, step: float, rate: float) -> float:
    """The job reports progress at `rate` steps/s for `seconds` (every 50 s), one round each time."""
    t = 0.0
    await report(lab, job_id, step)
    while t < seconds:
        lab.clock.advance(50.0)
        t += 50.0
        step += 50.0 * rate
        await report(lab, job_id, step)
        await lab.round()
    return step


async def test_elastic_job_grows_into_free_gpus_shrinks_for_waiting_jobs_and_grows_back(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")
        blocker = await lab.submit("python3", "other.py", gpus=6, kind="blocker")
        await lab.round()
        job = await submit_elastic(lab, 2, 8)
        await lab.round()
        assert await size(lab, job.id) == 2  # MIN fits: it starts at once
        first = await env(lab, job.id)
        assert (first["HSCHED_GPUS"], first["WORLD_SIZE"], first["HSCHED_ELASTIC"]) == ("2", "2", "1")
        assert len(first["CUDA_VISIBLE_DEVICES"].split(",")) == 2
        # it proves it checkpoints (its own checkpoint exit) and runs on
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        assert await size(lab, job.id) == 2 and (await lab.job(job.id)).restarts == 1
        step = await run_for(lab, job.id, SETTINGS.move_min_run_s, 0.0, 2.0)
        assert await size(lab, job.id) == 2  # nothing free: it stays
        # the GPUs free: within two rounds it is told to grow to 8
        await lab.finish(blocker.id, 0)
        rounds = 0
        while (await lab.job(job.id)).state is JobState.RUNNING and rounds < 5:
            await lab.round()
            rounds += 1
        assert rounds <= 2, rounds
        assert "grow" in await lab.events(job.id)
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        assert await size(lab, job.id) == 8
        grown = await env(lab, job.id)
        assert (grown["HSCHED_GPUS"], grown["WORLD_SIZE"], grown["HSCHED_RESUME"]) == ("8", "8", "1")
        assert len(grown["CUDA_VISIBLE_DEVICES"].split(",")) == 8
        step = await run_for(lab, job.id, SETTINGS.move_min_run_s, step, 7.0)
        # four one-GPU jobs arrive: it shrinks to 4 at once (no minimum run time for giving back), and they start
        # in the round after its checkpoint
        small = [await lab.submit("python3", "eval.py", gpus=1, kind="small") for _ in range(4)]
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.PREEMPTING
        assert "shrink" in await lab.events(job.id)
        t_shrink = lab.clock.time()
        await checkpoint(lab, job.id)
        await lab.round()
        assert [(await lab.job(s.id)).state for s in small] == [JobState.RUNNING] * 4
        started = lab.clock.time() - t_shrink
        assert started <= CKPT_S + 1
        await lab.round()
        assert await size(lab, job.id) == 4
        assert (await env(lab, job.id))["HSCHED_GPUS"] == "4"
        step = await run_for(lab, job.id, SETTINGS.move_min_run_s, step, 4.0)
        # they end: it grows back to 8
        for s in small:
            await lab.finish(s.id, 0)
        for _ in range(2):
            await lab.round()
        assert (await lab.job(job.id)).state is JobState.PREEMPTING
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        assert await size(lab, job.id) == 8
        kinds = [k for k in await lab.events(job.id) if k in ("grow", "shrink")]
        assert kinds == ["grow", "shrink", "grow"]
        shown = await Api(lab.ctl).handle("show", {"id": job.id}, os.getuid())
        assert (shown["gpus_min"], shown["gpus_max"], shown["gpus_now"]) == (2, 8, 8)
        resizes = shown["resizes"]
        assert [(r["kind"], r["from"], r["to"]) for r in resizes] == [("grow", 2, 8), ("shrink", 8, 4),
                                                                      ("grow", 4, 8)]
        # the second grow had both sizes measured (4 and 8 GPUs ran and reported): its speedup is the measured one
        assert resizes[2]["scaling"] == "measured" and abs(resizes[2]["speedup"] - 7.0 / 4.0) < 0.05
        assert resizes[1]["for_jobs"] == [small[0].id]
        # the events stream (the dashboard's Events view) carries them with their figures
        stream = [e for e in await Api(lab.ctl).handle("events", {}, os.getuid()) if e["kind"] in ("grow", "shrink")]
        assert [(e["kind"], e["data"]["to"]) for e in stream] == [("grow", 8), ("shrink", 4), ("grow", 8)]
        assert "GPUs" in stream[0]["message"] and stream[0]["data"]["gain_s"] > 2 * stream[0]["data"]["cost_s"] > 0


async def test_never_resized_without_proof_and_never_below_min(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        blocker = await lab.submit("python3", "other.py", gpus=5, kind="blocker")
        await lab.round()
        job = await submit_elastic(lab, 3, 8)
        await lab.round()
        assert await size(lab, job.id) == 3
        await run_for(lab, job.id, 2 * SETTINGS.move_min_run_s, 0.0, 2.0)
        await lab.finish(blocker.id, 0)
        for _ in range(3):
            await lab.round()
        # never checkpointed: it keeps its 3 GPUs whatever is free
        assert await size(lab, job.id) == 3 and "grow" not in await lab.events(job.id)
        # and waiting jobs that need more than it could spare above MIN are not served by shrinking it
        big = await lab.submit("python3", "other.py", gpus=6, kind="blocker")
        await lab.round()
        assert (await lab.job(big.id)).state is JobState.PENDING
        assert "shrink" not in await lab.events(job.id)


async def test_an_elastic_job_that_can_give_gpus_back_starts_bigger_when_nobody_waits(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        # never checkpointed: it could never give them back, so it starts at its MIN (and grows once it has proved it)
        rigid = await submit_elastic(lab, 2, 6)
        await lab.round()
        assert await size(lab, rigid.id) == 2
        # it requeues itself (its proof): when it starts again with nobody waiting, it takes up to its MAX at once
        await checkpoint(lab, rigid.id)
        await lab.round()
        await lab.round()
        assert await size(lab, rigid.id) == 6
        assert (await env(lab, rigid.id))["HSCHED_GPUS"] == "6"
        # a job that resizes in place can always give them back: the rest of the node
        spec = JobSpec(command=("python3", "trainer.py"), resources=Resources(gpus=1, gpus_max=8), kind="inplace",
                       resize_signal="USR2")
        other = await commands.submit(lab.ctl, spec, "alice", None)
        await lab.round()
        assert await size(lab, other.id) == 2


async def test_a_restarted_controller_still_holds_a_growing_jobs_gpus(tmp_path: Path) -> None:
    """The devices a grow promised were in the controller's memory: the `grow` event holds them again after a
    restart, as a `move` event does."""
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")
        blocker = await lab.submit("python3", "other.py", gpus=6, kind="blocker")
        await lab.round()
        job = await submit_elastic(lab, 2, 8)
        await lab.round()
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        await run_for(lab, job.id, SETTINGS.move_min_run_s, 0.0, 2.0)
        await lab.finish(blocker.id, 0)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.PREEMPTING and "grow" in await lab.events(job.id)
        # a job that comes first for everything else arrives while it stops: the 8 GPUs are not its
        other = await lab.submit("python3", "other.py", gpus=1, kind="blocker", priority=100)
        await lab.round()
        assert (await lab.job(other.id)).state is JobState.PENDING
        await checkpoint(lab, job.id)  # it checkpoints; the controller stops before it sees that
        clock = lab.clock
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS, clock=clock) as lab:
        await lab.round()
        # it starts first, on the held GPUs (without them the other job, first by priority, would have), at the
        # largest allowed size that leaves the other job its GPU (starting smaller costs nothing now)
        assert await size(lab, job.id) == 4
        assert (await lab.job(other.id)).state is JobState.PENDING
        await lab.round()
        assert (await lab.job(other.id)).state is JobState.RUNNING
        assert await size(lab, job.id) == 4 and "shrink" not in await lab.events(job.id)


async def test_a_job_that_resizes_in_place_gets_its_signal_and_devices_not_a_restart(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=FLEET, settings=SETTINGS) as lab:
        blocker = await lab.submit("python3", "other.py", gpus=6, kind="blocker")
        await lab.round()
        spec = JobSpec(command=("python3", "trainer.py"), resources=Resources(gpus=2, gpus_max=8), kind="inplace",
                       resize_signal="USR2")
        job = await commands.submit(lab.ctl, spec, "alice", None)
        await lab.round()
        assert await size(lab, job.id) == 2
        resize_file = Path((await env(lab, job.id))["HSCHED_RESIZE_FILE"])
        assert resize_file.parent == lab.ctl.checkpoint_dir(job.id)
        # it never checkpointed, but says it resizes in place: it grows without a stop
        await run_for(lab, job.id, SETTINGS.move_min_run_s, 0.0, 2.0)
        await lab.finish(blocker.id, 0)
        await lab.round()
        grown = await lab.job(job.id)
        assert grown.state is JobState.RUNNING and grown.restarts == 0
        assert len(grown.placement[0].devices) == 8
        (run,) = await lab.fake_runs(job.id)
        assert run.signals == ["USR2"]
        told = read_json(resize_file)
        assert told["gpus"] == 8 and told["devices"]["n"] == list(grown.placement[0].devices) and told["run"] == 1
        (live,) = [r for r in await lab.runs(job.id) if r.state.is_live()]
        assert live.devices == grown.placement[0].devices  # the run's devices too: monitoring and ends agree
        # four one-GPU jobs arrive: it shrinks in place and they start in the next round (no checkpoint to wait)
        small = [await lab.submit("python3", "eval.py", gpus=1, kind="small") for _ in range(4)]
        await lab.round()
        assert await size(lab, job.id) == 4 and (await lab.fake_runs(job.id))[0].signals == ["USR2", "USR2"]
        await lab.round()
        assert [(await lab.job(s.id)).state for s in small] == [JobState.RUNNING] * 4
        kept = set((await lab.job(job.id)).placement[0].devices)
        theirs = [u for s in small for u in (await lab.job(s.id)).placement[0].devices]
        assert kept.isdisjoint(theirs) and len(set(theirs)) == 4
        assert read_json(resize_file)["gpus"] == 4
        shown = await Api(lab.ctl).handle("show", {"id": job.id}, os.getuid())
        assert [(r["kind"], r["to"], r["in_place"]) for r in shown["resizes"]] == [("grow", 8, True),
                                                                                  ("shrink", 4, True)]
        assert shown["restarts"] == 0 and "preempting" not in await lab.events(job.id)


async def test_an_elastic_gang_grows_by_whole_nodes_and_gives_back_its_last(tmp_path: Path) -> None:
    four = tuple(CannedNode(n, "NVIDIA H100 80GB HBM3", 2) for n in "abcd")
    async with Lab.open(tmp_path, nodes=four, settings=SETTINGS) as lab:
        for ex in lab.executors.values():
            ex.exit_on_signal.pop("TERM")
        blockers = [await lab.submit("python3", "other.py", gpus=2, kind="blocker") for _ in range(2)]
        await lab.round()
        spec = JobSpec(command=("python3", "trainer.py"), resources=Resources(gpus=2, nodes=2, nodes_max=4),
                       kind="gang-k", checkpoint_signal=parse_checkpoint_signal("USR1@60"))
        job = await commands.submit(lab.ctl, spec, "alice", None)
        await lab.round()
        assert len((await lab.job(job.id)).placement) == 2
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        assert (await lab.job(job.id)).restarts == 1
        await run_for(lab, job.id, SETTINGS.move_min_run_s, 0.0, 2.0)
        for b in blockers:
            await lab.finish(b.id, 0)
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.PREEMPTING
        first = (await lab.job(job.id)).placement[0].node
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        grown = await lab.job(job.id)
        assert grown.state is JobState.RUNNING and len(grown.placement) == 4 and grown.placement[0].node == first
        envs = [dict(r.request.env) for r in (await lab.fake_runs(job.id))[-4:]]
        assert {e["HSCHED_GPUS"] for e in envs} == {"8"} and {e["WORLD_SIZE"] for e in envs} == {"4"}
        assert sorted(e["RANK"] for e in envs) == ["0", "1", "2", "3"]
        await run_for(lab, job.id, SETTINGS.move_min_run_s, 1000.0, 4.0)
        # two one-GPU jobs arrive: a node's worth; it gives back its last nodes, never its first
        small = [await lab.submit("python3", "eval.py", gpus=1, kind="small") for _ in range(2)]
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.PREEMPTING
        await checkpoint(lab, job.id)
        await lab.round()
        await lab.round()
        assert [(await lab.job(s.id)).state for s in small] == [JobState.RUNNING] * 2
        shrunk = await lab.job(job.id)
        assert shrunk.state is JobState.RUNNING and shrunk.placement[0].node == first
        shown = await Api(lab.ctl).handle("show", {"id": job.id}, os.getuid())
        assert [(r["kind"], r["from"], r["to"], r["unit"]) for r in shown["resizes"]] == [
            ("grow", 2, 4, "nodes"), ("shrink", 4, 2, "nodes")]  # (the policy's sizes: 2 and 4, powers of two)
        assert (shown["nodes_min"], shown["nodes_max"], shown["nodes_now"]) == (2, 4, len(shrunk.placement))
