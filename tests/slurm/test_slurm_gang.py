"""Jobs of several ranks on a Slurm node group, against the real two-node cluster (tests/slurm/cluster.py): one
sbatch per attempt with --nodes/--ntasks-per-node, srun starting each rank's own command with its hsched rank
environment, each rank's log and handle its own; a failing rank ends the gang; a signal reaches each rank once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.slurm.executor import SlurmError, SlurmExecutor

from hsched.model import RunHandle, RunStatus
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import executor, run
from tests.slurm.test_slurm_executor import job_state, until, until_log

pytestmark = pytest.mark.slow  # a real Slurm cluster and its jobs

SHOW = ('echo "rank=$RANK procid=$SLURM_PROCID local=$LOCAL_RANK slocal=$SLURM_LOCALID world=$WORLD_SIZE '
        'ntasks=$SLURM_NTASKS node=$SLURMD_NODENAME job=$HSCHED_JOB_ID dir=$HSCHED_RUN_DIR master=$MASTER_ADDR"')


def ranks(runs: Path, job: str, nodes: int, per_node: int, command: tuple[str, ...], *,
          devices: tuple[str, ...] = ("slurm-grp-n1-gpu0",), group: str = "grp") -> list[LaunchRequest]:
    """The launch requests the controller makes for a job of `nodes` x `per_node` ranks on the group, one per
    rank, each with its torchrun/Slurm environment (hsched.controller.launching.job_env's)."""
    world = nodes * per_node
    out = []
    for r in range(world):
        env = {"HSCHED_JOB_ID": job, "HSCHED_JOB_NAME": f"gang-{job}", "HSCHED_RUN": "1", "WORLD_SIZE": str(world),
               "RANK": str(r), "LOCAL_RANK": str(r % per_node), "LOCAL_WORLD_SIZE": str(per_node),
               "NODE_RANK": str(r // per_node), "MASTER_ADDR": "127.0.0.9", "MASTER_PORT": "29500",
               "HSCHED_GANG_NODES": ",".join([group] * nodes), "SLURM_PROCID": str(r), "SLURM_NTASKS": str(world),
               "CUDA_VISIBLE_DEVICES": ",".join(devices)}
        out.append(LaunchRequest(run_dir=str(runs / f"{job}-1-r{r}"), command=command, env=env, devices=devices))
    return out


async def launch_all(ex: SlurmExecutor, reqs: list[LaunchRequest]) -> list[RunHandle]:
    # as the controller does: every rank's launch at once, in any order
    return list(await asyncio.gather(*(ex.launch(r) for r in reversed(reqs))))[::-1]


def test_a_gang_of_two_nodes_is_one_sbatch_and_srun_starts_each_rank(slurm: SlurmCluster, runs: Path) -> None:
    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        reqs = ranks(runs, "31", 2, 2, ("sh", "-c", SHOW + "; exit 0"))
        handles = await launch_all(ex, reqs)
        assert len({h.pid for h in handles}) == 1 and [h.run_dir for h in handles] == [r.run_dir for r in reqs]
        job = slurm.job(handles[0].pid)
        assert (job["NumNodes"].split("-")[0], job["NumTasks"], job["TresPerNode"]) == ("2", "4", "gres:gpu:a100:1")
        assert job["Comment"].startswith("hsched:31:") and job["JobName"] == "gang-31"
        reps = [await until(ex, r.run_dir, h, RunStatus.EXITED) for r, h in zip(reqs, handles, strict=True)]
        assert [rep.exit_code for rep in reps] == [0, 0, 0, 0]
        seen = {}
        for r, req in enumerate(reqs):
            line = (await ex.read_log(req.run_dir, 0)).decode().strip()
            f = dict(x.split("=", 1) for x in line.split())
            assert (f["rank"], f["procid"], f["world"], f["ntasks"]) == (str(r), str(r), "4", "4"), line
            assert (f["local"], f["slocal"], f["job"], f["dir"]) == (str(r % 2), str(r % 2), "31", req.run_dir)
            seen[r] = f["node"]
            assert f["master"] != "127.0.0.9"  # the job's first node, not hsched's name for the group
        assert seen[0] == seen[1] != seen[2] == seen[3]  # two ranks per Slurm node
        assert sorted(seen.values()) == ["n1", "n1", "n2", "n2"]
        # a new executor (a restarted controller) finds the one job again for every rank, launches nothing
        again = executor(slurm)
        assert [(await again.launch(r)).pid for r in reqs] == [handles[0].pid] * 4
        assert len(slurm.run("squeue", "-h", "-t", "all", "-o", "%k").stdout.split("hsched:31:")) == 2

    run(main())


def test_a_failing_rank_ends_the_gang_and_a_signal_reaches_each_rank_once(slurm: SlurmCluster, runs: Path) -> None:
    trainer = ('trap \'echo "rank $RANK got USR1"\' USR1; echo "ready $RANK"; '
               'while :; do sleep 0.1; [ -e "$HSCHED_RUN_DIR/fail" ] && exit 3; done')

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        reqs = ranks(runs, "32", 1, 2, ("bash", "-c", trainer))
        handles = await launch_all(ex, reqs)
        assert slurm.job(handles[0].pid)["NumTasks"] == "2"
        await job_state(slurm, handles[0].pid, "RUNNING")
        for r, req in enumerate(reqs):
            await until_log(ex, req.run_dir, f"ready {r}".encode())
        # the controller's checkpoint step goes to every rank; each rank's task gets it once
        assert all([await ex.signal(h, "USR1", purpose="checkpoint") for h in handles])
        for r, req in enumerate(reqs):
            await until_log(ex, req.run_dir, f"rank {r} got USR1".encode())
            text = await asyncio.to_thread(Path(req.run_dir, "signals.log").read_text)
            lines = [json.loads(x) for x in text.splitlines()]
            assert [(x["signal"], x["purpose"]) for x in lines] == [("USR1", "checkpoint")]
        # rank 1 fails: srun ends rank 0 too (--kill-on-bad-exit); every rank reports the job's end
        await asyncio.to_thread(Path(reqs[1].run_dir, "fail").touch)
        reps = [await until(ex, r.run_dir, h, RunStatus.EXITED) for r, h in zip(reqs, handles, strict=True)]
        # rank 1 exited 3 by itself, rank 0 was ended by srun (SIGTERM): each rank says so, as srun did
        assert [(rep.exit_code, rep.signal) for rep in reps] == [(143, 15), (3, None)]
        for req in reqs:
            assert (await ex.read_log(req.run_dir, 0)).decode().count("got USR1") == 1

    run(main())


def test_a_gang_spread_over_the_group_and_another_node_is_refused(slurm: SlurmCluster, runs: Path) -> None:
    async def main() -> None:
        ex = executor(slurm)
        [r0, _r1] = ranks(runs, "33", 2, 1, ("true",))
        mixed = LaunchRequest(run_dir=r0.run_dir, command=r0.command, devices=r0.devices,
                              env={**r0.env, "HSCHED_GANG_NODES": "grp,ws1"})
        with pytest.raises(SlurmError, match=r"^grp: a job of 2 ranks placed on grp, ws1: all its ranks must be on"):
            await ex.launch(mixed)
        assert not slurm.run("squeue", "-h", "-o", "%i").stdout.strip()

    run(main())


def test_a_rank_whose_other_ranks_never_come_is_not_submitted(slurm: SlurmCluster, runs: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from hsched.executors.slurm import executor as module

    monkeypatch.setattr(module, "GATHER_S", 0.5)

    async def main() -> None:
        ex = executor(slurm)
        [r0, _r1] = ranks(runs, "34", 1, 2, ("true",))
        with pytest.raises(SlurmError, match=r"^grp: rank 0 of job 34 waited 0.5 s for the launches of its other "
                                             r"ranks \(1 of 2 came\)"):
            await ex.launch(r0)
        assert not slurm.run("squeue", "-h", "-o", "%i").stdout.strip()

    run(main())
