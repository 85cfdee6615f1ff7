"""The Slurm executor against a real two-node Slurm cluster (tests/slurm/cluster.py): discovery, a job through
sbatch with Slurm's GPUs and its exit code, hostile strings byte-exact, signals and cancel, a pending job, a
restarted controller finding its runs again, and the failures that come back as one line."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.slurm import text
from hsched.executors.slurm.executor import SlurmError, SlurmExecutor, SlurmUnreachable

from hsched.model import RunHandle, RunReport, RunStatus
from tests.e2e.ssh.test_quoting import DUMP, corpus
from tests.slurm.cluster import SlurmCluster, free_port
from tests.slurm.conftest import executor, run

pytestmark = pytest.mark.slow  # a real Slurm cluster and its jobs


async def until(ex: SlurmExecutor, rd: str, handle: RunHandle | None, *want: RunStatus,
                limit_s: float = 60.0) -> RunReport:
    deadline = time.monotonic() + limit_s
    while True:
        [rep] = await ex.status([StatusQuery(rd, handle)])
        if rep.status in want:
            return rep
        if time.monotonic() > deadline:
            raise AssertionError(f"{rd}: still {rep.status} after {limit_s:g} s, wanted {want}")
        await asyncio.sleep(0.2)


async def until_log(ex: SlurmExecutor, rd: str, needle: bytes, limit_s: float = 60.0) -> bytes:
    deadline = time.monotonic() + limit_s
    while True:
        data = await ex.read_log(rd, 0)
        if needle in data:
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"{rd}: {needle!r} not in the log after {limit_s:g} s: {data[-500:]!r}")
        await asyncio.sleep(0.1)


async def job_state(slurm: SlurmCluster, job: int | str, want: str, limit_s: float = 60.0) -> None:
    """Wait until Slurm says job `job` is in state `want` (scontrol, off the event loop)."""
    deadline = time.monotonic() + limit_s
    while (state := (await asyncio.to_thread(slurm.job, job))["JobState"]) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job}: still {state} after {limit_s:g} s, wanted {want}")
        await asyncio.sleep(0.1)


def request(rd: Path, command: tuple[str, ...], *, devices: tuple[str, ...] = (), job: str = "1",
            env: dict[str, str] | None = None, **kw: object) -> LaunchRequest:
    e = {"HSCHED_JOB_ID": job, "HSCHED_JOB_NAME": f"test-{job}", "SLURM_JOB_ID": job,
         "CUDA_VISIBLE_DEVICES": ",".join(devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **(env or {})}
    return LaunchRequest(run_dir=str(rd), command=command, env=e, devices=devices, **kw)  # type: ignore[arg-type]


def test_discovery_sees_the_partition_as_one_group(slurm: SlurmCluster) -> None:
    async def main() -> None:
        ex = executor(slurm)
        probe = await ex.probe()
        devices = probe["gpus"]["devices"]
        assert [(d["slurm_node"], d["gres_index"], d["name"]) for d in devices] == [
            ("n1", 0, "a100"), ("n1", 1, "a100"), ("n2", 0, "a100"), ("n2", 1, "a100")]
        assert [d["uuid"] for d in devices] == ["slurm-grp-n1-gpu0", "slurm-grp-n1-gpu1", "slurm-grp-n2-gpu0",
                                                "slurm-grp-n2-gpu1"]
        assert probe["cpus"] == 4 and probe["memory_total_mib"] == 4000 and probe["gpus"]["source"] == "slurm"
        assert probe["boot_id"] == ex.boot_id
        nodes = {n["name"]: n for n in probe["slurm"]["nodes"]}
        assert nodes["n1"]["features"] == ["nvme"] and nodes["n2"]["usable"]
        assert ex.last_contact is not None and ex.last_error is None
        # a drained Slurm node's GPUs are nobody's to place: gone from the group until it is resumed
        slurm.run("scontrol", "update", "nodename=n2", "state=drain", "reason=fan")
        try:
            drained = await ex.probe()
            assert [d["slurm_node"] for d in drained["gpus"]["devices"]] == ["n1", "n1"]
            assert drained["cpus"] == 2
            assert {n["name"]: n["state"] for n in drained["slurm"]["nodes"]}["n2"] == "IDLE+DRAIN"
        finally:
            slurm.run("scontrol", "update", "nodename=n2", "state=resume")

    run(main())


def test_a_job_runs_with_slurms_gpus_and_its_exit_code_comes_back(slurm: SlurmCluster, runs: Path) -> None:
    script = ('echo "cvd=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER job=$HSCHED_JOB_ID slurm=$SLURM_JOB_ID '
              'node=$SLURMD_NODENAME dir=$HSCHED_RUN_DIR pwd=$(pwd)"; exit 3')

    async def main() -> None:
        ex = executor(slurm)
        probe = await ex.probe()
        two = tuple(d["uuid"] for d in probe["gpus"]["devices"][:2])
        rd = runs / "12-1-r0"
        h = await ex.launch(request(rd, ("sh", "-c", script), devices=two, job="12", memory_mib=700, cpu_limit=1.5))
        assert h.run_dir == str(rd) and h.boot_id == ex.boot_id and h.pid > 0
        # the mapped request as Slurm sees it: 2 a100 per node, 2 CPUs, 700 MiB, hsched's comment and name
        job = slurm.job(h.pid)
        assert job["TresPerNode"] == "gres:gpu:a100:2" and job["NumCPUs"] == "2" and job["Requeue"] == "0"
        assert job["MinMemoryNode"] == "700M" and job["JobName"] == "test-12" and job["Partition"] == "debug"
        assert job["Comment"].startswith("hsched:12:") and job["StdOut"] == str(rd / "output.log")
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert (rep.exit_code, rep.signal, rep.handle) == (3, None, h)
        assert rep.end_time is not None and abs(rep.end_time - time.time()) < 60
        line = (await ex.read_log(str(rd), 0)).decode()
        fields = dict(f.split("=", 1) for f in line.split())
        # Slurm's GPUs (node-local indices), Slurm's own job id; hsched's variables as the controller set them
        detail = slurm.job(h.pid)
        assert fields["cvd"] == "0,1" and fields["order"] == "PCI_BUS_ID" and fields["job"] == "12"
        assert fields["slurm"] == str(h.pid) and fields["node"] == detail["NodeList"]
        assert fields["dir"] == str(rd) and fields["pwd"] == str(rd)
        record = json.loads((rd / "slurm.json").read_text())
        assert record["job_id"] == h.pid and record["final"]["exit_status"] == 3
        assert (await ex.read_log(str(rd), 4)) == line.encode()[4:]

    run(main())


def test_hostile_strings_arrive_byte_exact(slurm: SlurmCluster, runs: Path, tmp_path: Path) -> None:
    """argv, environment, working folder and run folder names with quotes, `$`, backquotes, newlines, leading
    dashes: sbatch and the batch script reinterpret none of them, and nothing runs (the canary stays absent)."""
    canary = tmp_path / "CANARY"
    strings = corpus(canary)
    env = {f"HOSTILE_{i}": s for i, s in enumerate(strings)}
    env["HSCHED_JOB_NAME"] = f"job $(touch {canary}); 'name'\n\"ünï\""
    env["HOSTILE_KEYS"] = json.dumps(sorted(env))
    workdir = tmp_path / f"wd a b;$(touch {canary}) it's \"x\" 日本"
    workdir.mkdir(parents=True)
    rd = runs / f"run 1 $(touch {canary}) 50%j 'q'"

    async def main() -> dict[str, object]:
        ex = executor(slurm)
        h = await ex.launch(request(rd, ("python3", "-c", DUMP, *strings), env=env, workdir=str(workdir)))
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert rep.exit_code == 0, (await ex.read_log(str(rd), 0)).decode()
        result: dict[str, object] = json.loads((await ex.read_log(str(rd), 0)).decode().splitlines()[-1])
        return result

    got = run(main())
    assert [bytes.fromhex(a).decode() for a in got["argv"]] == strings  # type: ignore[union-attr]
    sent = {k: v for k, v in env.items() if k != "HOSTILE_KEYS"}
    assert {k: bytes.fromhex(v).decode() for k, v in got["env"].items() if k in sent} == sent  # type: ignore[union-attr]
    assert bytes.fromhex(str(got["cwd"])).decode() == str(workdir)
    assert not canary.exists()


def test_signals_reach_the_job_and_a_cancel_ends_it_in_slurm(slurm: SlurmCluster, runs: Path) -> None:
    trainer = ('trap \'echo "got USR1 $(tail -n1 "$HSCHED_RUN_DIR/signals.log")"\' USR1; echo ready; '
               'while :; do sleep 0.1; done')

    async def main() -> None:
        ex = executor(slurm)
        rd = runs / "5-1-r0"
        h = await ex.launch(request(rd, ("bash", "-c", trainer), job="5"))
        await until(ex, str(rd), h, RunStatus.RUNNING)
        await until_log(ex, str(rd), b"ready")
        assert await ex.signal(h, "USR1", purpose="checkpoint") is True
        log = await until_log(ex, str(rd), b"got USR1")
        assert b'"purpose": "checkpoint"' in log and b'"signal": "USR1"' in log
        [rep] = await ex.status([StatusQuery(str(rd), h)])
        assert rep.status is RunStatus.RUNNING  # a checkpoint signal: the job goes on
        with pytest.raises(SlurmError, match="unknown signal NOPE"):
            await ex.signal(h, "NOPE")
        t0 = time.monotonic()
        assert await ex.signal(h, "TERM", all_processes=True, purpose="cancelled") is True
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert time.monotonic() - t0 < 5.0, "a cancel ends the job in Slurm within 5 s"
        assert (rep.exit_code, rep.signal) == (143, 15)
        assert slurm.job(h.pid)["JobState"] in ("FAILED", "CANCELLED")
        assert await ex.signal(h, "TERM") is False  # ended: nothing to signal
        lines = [json.loads(x) for x in (rd / "signals.log").read_text().splitlines()]
        assert [(x["signal"], x["purpose"]) for x in lines] == [("USR1", "checkpoint"), ("TERM", "cancelled")]

    run(main())


def test_a_job_pending_in_slurm_is_running_for_hsched_and_a_stop_cancels_it(slurm: SlurmCluster,
                                                                            runs: Path) -> None:
    # every GPU taken by someone else's jobs: ours waits in Slurm's queue
    others = [slurm.run("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:a100:2", "--wrap", "sleep 120")
              .stdout.strip() for _ in range(2)]

    async def main() -> None:
        ex = executor(slurm)
        for job in others:
            await job_state(slurm, job, "RUNNING")
        # monitoring: the others' GPUs are busy and nobody's of ours (foreign for the controller)
        sample = await anext(aiter(ex.watch(0.1, count=1)))
        assert sorted(p["uuid"] for p in sample["processes"]) == [
            "slurm-grp-n1-gpu0", "slurm-grp-n1-gpu1", "slurm-grp-n2-gpu0", "slurm-grp-n2-gpu1"]
        assert all(p["job_run_dir"] is None for p in sample["processes"])
        rd = runs / "6-1-r0"
        h = await ex.launch(request(rd, ("true",), devices=("slurm-grp-n1-gpu0",), job="6"))
        rep = await until(ex, str(rd), h, RunStatus.RUNNING)
        assert slurm.job(h.pid)["JobState"] == "PENDING"
        assert await ex.signal(h, "USR1", purpose="checkpoint") is False  # nothing runs that could checkpoint
        assert await ex.signal(h, "TERM", purpose="cancelled") is True
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert (rep.exit_code, rep.signal) == (143, 15)  # as if the stop signal had ended it
        assert slurm.job(h.pid)["JobState"] == "CANCELLED"

    run(main())


def test_monitoring_counts_exactly_the_gpus_slurm_gave_out(slurm: SlurmCluster, runs: Path) -> None:
    """Ours are reported on the devices hsched placed them on (Slurm put them elsewhere); another job's GPU is
    reported on a device none of ours is counted on: busy devices = GPUs Slurm gave out."""
    other = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "n1", "--gres=gpu:a100:1", "--wrap",
                      "sleep 120").stdout.strip()

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        await job_state(slurm, other, "RUNNING")
        assert slurm.job(other)["GRES"] == "gpu:a100:1(IDX:0)"
        rd = runs / "8-1-r0"
        # hsched counts our job on n1's GPU 0, which is really the other job's
        h = await ex.launch(request(rd, ("sleep", "60"), devices=("slurm-grp-n1-gpu0",), job="8"))
        await job_state(slurm, h.pid, "RUNNING")
        sample = await anext(aiter(ex.watch(0.1, count=1)))
        ours = [p for p in sample["processes"] if p["job_run_dir"] is not None]
        foreign = [p for p in sample["processes"] if p["job_run_dir"] is None]
        assert [(p["uuid"], p["pid"], p["job_run_dir"]) for p in ours] == [("slurm-grp-n1-gpu0", h.pid, str(rd))]
        assert [p["uuid"] for p in foreign] == ["slurm-grp-n1-gpu1"]  # n1's other GPU: busy, whoever has it
        used = sum(len(text.gres_indices(n.split("GresUsed=")[1].split()[0]))
                   for n in slurm.run("scontrol", "-d", "-o", "show", "node").stdout.splitlines())
        assert used == len(sample["processes"]) == 2
        assert sample["node"] == "grp" and sample["gpus"]["source"] == "slurm"
        assert sample["cpu"]["count"] == 4 and sample["cpu"]["util"] == 50.0

    run(main())


def test_a_restarted_controller_finds_its_runs_again(slurm: SlurmCluster, runs: Path) -> None:
    async def main() -> None:
        first = executor(slurm)
        rd = runs / "9-1-r0"
        h = await first.launch(request(rd, ("sh", "-c", "sleep 3; echo done; exit 4"), job="9"))
        # a new executor (a new controller): by the stored handle, by slurm.json alone, and by the comment
        # alone (the controller died before slurm.json was written)
        again = executor(slurm)
        assert (await until(again, str(rd), h, RunStatus.RUNNING)).handle == h
        assert (await until(executor(slurm), str(rd), None, RunStatus.RUNNING)).handle == h
        record = rd / "slurm.json"
        saved = record.read_text()
        record.unlink()
        found = await until(executor(slurm), str(rd), None, RunStatus.RUNNING)
        assert found.handle is not None and found.handle.pid == h.pid
        assert json.loads(record.read_text())["job_id"] == h.pid
        record.write_text(saved)
        # launch is idempotent per run folder: the same run, no second sbatch
        assert await executor(slurm).launch(request(rd, ("sh", "-c", "exit 99"), job="9")) == h
        ours = [ln for ln in slurm.run("squeue", "-h", "-t", "all", "-o", "%k").stdout.split()
                if ln.startswith("hsched:9:")]
        assert len(ours) == 1
        rep = await until(again, str(rd), h, RunStatus.EXITED)
        assert rep.exit_code == 4
        # the end is kept in the run folder: known even once Slurm forgets the job (no accounting here)
        record_now = json.loads(record.read_text())
        assert record_now["final"]["state"] == "FAILED"
        forgotten = SlurmExecutor(name="grp", partition="debug", env={**slurm.env, "SLURM_CONF": "/nonexistent"})
        assert (await forgotten.status([StatusQuery(str(rd), h)]))[0].exit_code == 4
        # a run whose Slurm job nobody knows, with no end recorded: lost
        (runs / "lost").mkdir()
        (runs / "lost" / "slurm.json").write_text(json.dumps({"job_id": 999999, "comment": "hsched:1:x"}))
        [rep] = await executor(slurm).status([StatusQuery(str(runs / "lost"), None)])
        assert rep.status is RunStatus.LOST
        [rep] = await executor(slurm).status([StatusQuery(str(runs / "never"), None)])
        assert rep.status is RunStatus.NOT_STARTED
        # a Slurm job id that now names someone else's job (a cluster whose state was wiped starts ids again)
        stranger = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "--comment=hsched:1:ffffffffffffffff",
                             "--wrap", "sleep 30").stdout.strip()
        (runs / "reused").mkdir()
        (runs / "reused" / "slurm.json").write_text(json.dumps({"job_id": int(stranger), "comment": "hsched:1:x"}))
        [rep] = await executor(slurm).status([StatusQuery(str(runs / "reused"), None)])
        assert rep.status is RunStatus.LOST
        fake = RunHandle(str(runs / "reused"), int(stranger), 0, 0, executor(slurm).boot_id)
        assert await executor(slurm).signal(fake, "KILL") is False  # never a signal to a stranger
        assert slurm.job(stranger)["JobState"] in ("PENDING", "RUNNING")

    run(main())


def test_a_slurm_outage_makes_the_group_unreachable_and_loses_no_job(slurm: SlurmCluster, runs: Path,
                                                                    tmp_path: Path) -> None:
    go = tmp_path / "go"

    # the client commands give up on an absent slurmctld after 2 s rather than Slurm's default 10
    conf = tmp_path / "client.conf"
    conf.write_text(slurm.conf.read_text() + "MessageTimeout=2\n")

    async def main() -> None:
        ex = SlurmExecutor(name="grp", partition=slurm.partition, env={**slurm.env, "SLURM_CONF": str(conf)})
        rd = runs / "11-1-r0"
        h = await ex.launch(request(rd, ("sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.1; done; exit 5'), job="11"))
        await until(ex, str(rd), h, RunStatus.RUNNING)
        await job_state(slurm, h.pid, "RUNNING")
        await asyncio.to_thread(slurm.stop_controller)
        await asyncio.sleep(ex.poll_s)  # squeue's last answer no longer serves
        try:
            with pytest.raises(SlurmUnreachable, match=r"^grp: slurmctld does not answer"):
                await ex.status([StatusQuery(str(rd), h)])
            assert isinstance(ex.last_error, SlurmUnreachable)
            go.touch()  # the job ends while Slurm's controller is away
        finally:
            await asyncio.to_thread(slurm.start_controller)
        rep = await until(ex, str(rd), h, RunStatus.EXITED)
        assert rep.exit_code == 5 and ex.last_error is None

    run(main())


def test_failures_are_one_line_errors(slurm: SlurmCluster, runs: Path, tmp_path: Path) -> None:
    async def main() -> None:
        wrong = SlurmExecutor(name="grp", partition="nosuch", env=slurm.env)
        with pytest.raises(SlurmError) as e:
            await wrong.probe()
        assert str(e.value).startswith("grp: scontrol failed: ") and "\n" not in str(e.value)
        assert isinstance(wrong.last_error, SlurmError)
        ex = executor(slurm)
        await ex.probe()
        too_many = tuple(f"slurm-grp-n1-gpu{i}" for i in range(3))  # no node has 3 GPUs
        with pytest.raises(SlurmError, match=r"^grp: sbatch failed: .*Requested node configuration is not available"):
            await ex.launch(request(runs / "big", ("true",), devices=too_many))
        with pytest.raises(SlurmError, match="2 ranks"):
            await ex.launch(request(runs / "gang", ("true",), env={"WORLD_SIZE": "2", "RANK": "0"}))
        # slurmctld away (a port nobody listens on): unreachable, not an error of the request
        conf = tmp_path / "away.conf"
        lines = [f"SlurmctldPort={free_port()}" if ln.startswith("SlurmctldPort=") else ln
                 for ln in slurm.conf.read_text().splitlines()]
        conf.write_text("\n".join([*lines, "MessageTimeout=1"]) + "\n")  # the clients' retries: 1 s, not 10
        away = SlurmExecutor(name="grp", partition="debug", env={**slurm.env, "SLURM_CONF": str(conf)},
                             timeout_s=20)
        with pytest.raises(SlurmUnreachable, match=r"^grp: slurmctld does not answer"):
            await away.probe()
        with pytest.raises(SlurmUnreachable):
            await anext(aiter(away.watch(0.1, count=1)))
        missing = SlurmExecutor(name="grp", partition="debug", env={"PATH": str(tmp_path)})
        from hsched.errors import NodeRefused

        with pytest.raises(NodeRefused, match="install Slurm's client commands"):
            await missing.probe()

    run(main())


def test_files_stay_where_they_are(slurm: SlurmCluster, tmp_path: Path) -> None:
    async def main() -> None:
        ex = executor(slurm)
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        (ckpt / "a").write_text("x")
        assert await ex.remote_path(str(ckpt)) == str(ckpt)
        await ex.put(ckpt, str(ckpt))  # the same folder: nothing to do
        assert await ex.newest_mtime(str(ckpt)) == os.stat(ckpt / "a").st_mtime
        assert await ex.newest_mtime(str(tmp_path / "none")) is None
        await ex.get(str(ckpt), tmp_path / "copy")
        assert (tmp_path / "copy" / "a").read_text() == "x"
        assert await ex.users(["root", "no-such-user-x"]) == {"root": True, "no-such-user-x": False}

    run(main())
