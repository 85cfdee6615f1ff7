"""How Slurm's side of a run's life reaches hsched, against the real two-node cluster (tests/slurm/cluster.py):
a job Slurm preempts or whose node fails is LOST with that cause (requeued without using a retry), and a job's
reports say whether it still waits in Slurm's queue and when Slurm really started it (the time limit counts
from there)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from hsched.executors.base import StatusQuery
from hsched.executors.slurm.executor import SlurmExecutor, SlurmRunReport

from hsched.model import EndReason, RunHandle, RunStatus
from tests.slurm.cluster import URGENT, SlurmCluster
from tests.slurm.conftest import executor, run
from tests.slurm.test_slurm_executor import job_state, request, until

pytestmark = pytest.mark.slow  # a real Slurm cluster and its jobs


async def until_started(ex: SlurmExecutor, rd: str, handle: RunHandle, limit_s: float = 60.0) -> SlurmRunReport:
    """The first report that says the job runs in Slurm (squeue's answer is kept for poll_s)."""
    deadline = time.monotonic() + limit_s
    while True:
        [rep] = await ex.status([StatusQuery(rd, handle)])
        assert isinstance(rep, SlurmRunReport) and rep.status is RunStatus.RUNNING, rep
        if not rep.queued:
            return rep
        if time.monotonic() > deadline:
            raise AssertionError(f"{rd}: still queued after {limit_s:g} s")
        await asyncio.sleep(0.2)


def test_a_job_slurm_preempts_is_lost_as_preempted(slurm: SlurmCluster, runs: Path) -> None:
    async def main() -> None:
        ex = executor(slurm)
        rd = runs / "21-1-r0"
        h = await ex.launch(request(rd, ("sleep", "300"), devices=("slurm-grp-n1-gpu0",), job="21"))
        await job_state(slurm, h.pid, "RUNNING")
        node = slurm.job(h.pid)["NodeList"]
        # Slurm never runs our job again behind hsched's back (--no-requeue): an administrator's requeue is refused
        refused = slurm.run("scontrol", "requeue", str(h.pid), check=False)
        assert refused.returncode != 0 and "disabled" in refused.stderr
        assert slurm.job(h.pid)["JobState"] == "RUNNING"
        # a job of the higher partition that needs the whole node: Slurm cancels ours for it
        urgent = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-p", URGENT, "-w", node,
                           f"--gres=gpu:{slurm.gpu_type}:{slurm.gpus}", "--wrap", "sleep 120").stdout.strip()
        rep = await until(ex, str(rd), h, RunStatus.LOST, RunStatus.EXITED)
        assert slurm.job(h.pid)["JobState"] == "PREEMPTED"
        assert isinstance(rep, SlurmRunReport)
        assert (rep.status, rep.cause, rep.exit_code) == (RunStatus.LOST, EndReason.PREEMPTED, None)
        assert rep.started_at == slurm.start_time(h.pid) and rep.end_time is not None
        await job_state(slurm, urgent, "RUNNING")
        # the end is kept: a restarted controller (a new executor) is told the same from slurm.json
        assert json.loads((rd / "slurm.json").read_text())["final"]["state"] == "PREEMPTED"
        [again] = await executor(slurm).status([StatusQuery(str(rd), None)])
        assert isinstance(again, SlurmRunReport) and again.cause is EndReason.PREEMPTED

    run(main())


def test_a_job_whose_slurm_node_fails_is_lost_as_node_lost(slurm: SlurmCluster, runs: Path) -> None:
    async def main() -> None:
        ex = executor(slurm)
        rd = runs / "22-1-r0"
        h = await ex.launch(request(rd, ("sleep", "300"), devices=("slurm-grp-n2-gpu0",), job="22"))
        await job_state(slurm, h.pid, "RUNNING")
        await asyncio.to_thread(slurm.node_down, slurm.job(h.pid)["NodeList"], "hsched test: node failure")
        rep = await until(ex, str(rd), h, RunStatus.LOST, RunStatus.EXITED)
        assert slurm.job(h.pid)["JobState"] == "NODE_FAIL"
        assert isinstance(rep, SlurmRunReport)
        assert (rep.status, rep.cause, rep.exit_code) == (RunStatus.LOST, EndReason.NODE_LOST, None)
        assert rep.started_at == slurm.start_time(h.pid)
        [again] = await executor(slurm).status([StatusQuery(str(rd), h)])
        assert isinstance(again, SlurmRunReport) and again.cause is EndReason.NODE_LOST
        await asyncio.to_thread(slurm.wait_nodes_up)

    run(main())


def test_the_wait_in_slurms_queue_is_not_running_time(slurm: SlurmCluster, runs: Path) -> None:
    """While Slurm holds the job pending its reports say `queued` and no start; once Slurm starts it they say
    when (Slurm's StartTime, after the moment the GPUs were given back), not when sbatch queued it."""
    blockers = [slurm.run("sbatch", "--parsable", "-o", "/dev/null", f"--gres=gpu:{slurm.gpu_type}:{slurm.gpus}",
                          "--wrap", "sleep 120").stdout.strip() for _ in slurm.nodes]

    async def main() -> None:
        ex = executor(slurm)
        for b in blockers:
            await job_state(slurm, b, "RUNNING")
        rd = runs / "23-1-r0"
        h = await ex.launch(request(rd, ("sh", "-c", "sleep 1; exit 7"), devices=("slurm-grp-n1-gpu0",), job="23"))
        rep = await until(ex, str(rd), h, RunStatus.RUNNING)
        assert slurm.job(h.pid)["JobState"] == "PENDING"
        assert isinstance(rep, SlurmRunReport) and (rep.queued, rep.started_at) == (True, None)
        freed = int(time.time())  # Slurm's times are whole seconds
        slurm.run("scancel", *blockers)
        await job_state(slurm, h.pid, "RUNNING")
        rep = await until_started(ex, str(rd), h)
        assert rep.started_at == slurm.start_time(h.pid) and rep.started_at >= freed
        assert rep.started_at >= h.start_ticks  # sbatch's time (the handle's) is before it
        done = await until(ex, str(rd), h, RunStatus.EXITED)
        assert isinstance(done, SlurmRunReport) and (done.exit_code, done.started_at) == (7, rep.started_at)

    run(main())
