"""A Slurm group reached over SSH (executors/slurm/login.py): the real two-node test cluster, and a real sshd
test host (tests/e2e/ssh/hosts.py) standing for the cluster's login node. The host runs on this machine's
loopback (not in a network namespace: its sessions' Slurm commands must reach the test slurmctld, which listens
here), with its own host key, verified against the test known_hosts as on any SSH node. Its sessions set
HSCHED_NODE_ROOT, so the run folders live under the host's folder, not beside the controller's names.

What is proven: a job submitted over SSH runs under Slurm, its exit code and log come back, a cancel ends it in
Slurm; hostile strings reach the job byte-exact through the SSH quoting and the batch script both; a restarted
executor finds its runs from slurm.json on the login node; a checkpoint folder goes there and back by SFTP; the
login node's host key is checked (an unknown one is refused, nothing runs)."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import StatusQuery
from hsched.executors.slurm.executor import SlurmError, SlurmExecutor

from hsched.config import NodeConfig, fleet_from_table
from hsched.controller.fleet import make_executor
from hsched.errors import NodeRefused, NodeUnreachable, Refusal
from hsched.model import RunStatus
from tests.conftest import Hs, wait_until
from tests.e2e.ssh.hosts import TestHosts, sshd_available
from tests.e2e.ssh.test_quoting import DUMP, corpus
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import run
from tests.slurm.test_slurm_executor import job_state, request, until, until_log
from tests.slurm.test_slurm_gang import launch_all, ranks

pytestmark = pytest.mark.slow  # a Slurm cluster, an sshd and their jobs


@pytest.fixture(scope="module")
def login_host(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """The login node: its sessions find the test cluster's slurm.conf as a real login node finds its own."""
    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")
    with TestHosts(tmp_path_factory.mktemp("login"), count=1, use_netns=False, prefix="login",
                   session_env={"SLURM_CONF": str(slurm_cluster.conf)}) as hosts:
        yield hosts


def read(*parts: str | Path) -> bytes:
    return Path(*parts).read_bytes()  # the login node shares this machine's disk: what is there, seen directly


def over_ssh(slurm: SlurmCluster, hosts: TestHosts, **kw: Any) -> SlurmExecutor:
    """The cluster's partition reached through the login host, as the fleet file's entry makes it (`login` names
    the host's alias in the test ssh config; SLURM_CONF is set for the commands there)."""
    cfg = NodeConfig(name="grp", executor="slurm", partition=slurm.partition, login=hosts[0].name)  # an alias
    return SlurmExecutor.from_config(cfg, env={"SLURM_CONF": str(slurm.conf)}, ssh_config=hosts.ssh_config, **kw)


def test_a_job_over_ssh_runs_its_exit_code_and_log_come_back_and_a_cancel_ends_it(
        slurm: SlurmCluster, login_host: TestHosts, runs: Path) -> None:
    script = 'echo "job=$HSCHED_JOB_ID slurm=$SLURM_JOB_ID dir=$HSCHED_RUN_DIR pwd=$(pwd)"; exit 3'
    trainer = 'echo ready; while :; do sleep 0.1; done'

    async def main() -> None:
        ex = over_ssh(slurm, login_host)
        try:
            probe = await ex.probe()
            assert len(probe["gpus"]["devices"]) == 4 and probe["cpus"] == 4
            one = (probe["gpus"]["devices"][0]["uuid"],)
            rd = runs / "7-1-r0"
            h = await ex.launch(request(rd, ("sh", "-c", script), devices=one, job="7", memory_mib=500))
            assert h.run_dir == str(rd) and h.boot_id == ex.boot_id and h.pid > 0
            # the run folder is on the login node (under its HSCHED_NODE_ROOT), not the controller's name
            there = await ex._dir(str(rd))
            assert there.startswith(str(login_host[0].root) + "/runs/") and not rd.exists()
            job = slurm.job(h.pid)
            assert job["TresPerNode"] == "gres:gpu:a100:1" and job["StdOut"] == f"{there}/output.log"
            assert job["Comment"].startswith("hsched:7:") and job["JobName"] == "test-7"
            rep = await until(ex, str(rd), h, RunStatus.EXITED)
            assert (rep.exit_code, rep.signal, rep.handle) == (3, None, h)
            line = (await ex.read_log(str(rd), 0)).decode()
            assert line == f"job=7 slurm={h.pid} dir={there} pwd={there}\n"
            assert (await ex.read_log(str(rd), 4)) == line.encode()[4:]
            record = json.loads(read(there, "slurm.json"))
            assert record["job_id"] == h.pid and record["final"]["exit_status"] == 3
            # a cancel: the job ends in Slurm within 5 s, killed by the stop signal
            rd2 = runs / "8-1-r0"
            h2 = await ex.launch(request(rd2, ("bash", "-c", trainer), job="8"))
            await until_log(ex, str(rd2), b"ready")
            t0 = time.monotonic()
            assert await ex.signal(h2, "TERM", all_processes=True, purpose="cancelled") is True
            rep2 = await until(ex, str(rd2), h2, RunStatus.EXITED)
            assert time.monotonic() - t0 < 5.0, "a cancel ends the job in Slurm within 5 s"
            assert (rep2.exit_code, rep2.signal) == (143, 15)
            assert slurm.job(h2.pid)["JobState"] in ("FAILED", "CANCELLED")
            assert await ex.signal(h2, "TERM") is False  # ended: nothing to signal
            signals = [json.loads(x) for x in read(await ex._dir(str(rd2)), "signals.log").splitlines()]
            assert [(x["signal"], x["purpose"]) for x in signals] == [("TERM", "cancelled")]
            # a restarted controller (a new executor, no handle) finds both runs from slurm.json over SFTP
            again = over_ssh(slurm, login_host)
            try:
                found = await again.status([StatusQuery(str(rd), None), StatusQuery(str(rd2), None)])
                assert [(r.status, r.exit_code, r.handle.pid if r.handle else None) for r in found] == [
                    (RunStatus.EXITED, 3, h.pid), (RunStatus.EXITED, rep2.exit_code, h2.pid)]
                # the launch is idempotent per run folder: the same job, never a second sbatch
                assert (await again.launch(request(rd, ("sh", "-c", script), devices=one, job="7"))).pid == h.pid
            finally:
                await again.close()
        finally:
            await ex.close()

    run(main())


def test_hostile_strings_arrive_byte_exact_over_ssh(slurm: SlurmCluster, login_host: TestHosts, runs: Path,
                                                    tmp_path: Path) -> None:
    """argv, environment, working folder and run folder names with quotes, `$`, backquotes, newlines, leading
    dashes: the login shell (every word shlex-quoted), sbatch and the batch script reinterpret none of them, and
    nothing runs (the canary stays absent)."""
    canary = tmp_path / "CANARY"
    strings = corpus(canary)
    env = {f"HOSTILE_{i}": s for i, s in enumerate(strings)}
    env["HSCHED_JOB_NAME"] = f"job $(touch {canary}); 'name'\n\"ünï\""
    env["HOSTILE_KEYS"] = json.dumps(sorted(env))
    workdir = tmp_path / f"wd a b;$(touch {canary}) it's \"x\" 日本"
    workdir.mkdir(parents=True)  # the login node shares this machine's disk
    rd = runs / f"run 1 $(touch {canary}) 50%j 'q'"

    async def main() -> dict[str, object]:
        ex = over_ssh(slurm, login_host)
        try:
            h = await ex.launch(request(rd, ("python3", "-c", DUMP, *strings), env=env, workdir=str(workdir)))
            rep = await until(ex, str(rd), h, RunStatus.EXITED)
            log = (await ex.read_log(str(rd), 0)).decode()
            assert rep.exit_code == 0, log
            result: dict[str, object] = json.loads(log.splitlines()[-1])
            return result
        finally:
            await ex.close()

    got = run(main())
    assert [bytes.fromhex(a).decode() for a in got["argv"]] == strings  # type: ignore[union-attr]
    sent = {k: v for k, v in env.items() if k != "HOSTILE_KEYS"}
    assert {k: bytes.fromhex(v).decode() for k, v in got["env"].items() if k in sent} == sent  # type: ignore[union-attr]
    assert bytes.fromhex(str(got["cwd"])).decode() == str(workdir)
    assert not canary.exists()


def test_checkpoints_go_to_the_login_node_and_back_and_its_accounts_are_the_groups(
        slurm: SlurmCluster, login_host: TestHosts, tmp_path: Path) -> None:
    local = tmp_path / "home" / "checkpoints" / "9"
    local.mkdir(parents=True)
    (local / "step-1.pt").write_bytes(b"\x00weights" * 1000)

    async def main() -> None:
        ex = over_ssh(slurm, login_host)
        try:
            remote = await ex.remote_path(str(local))
            assert remote.startswith(str(login_host[0].root) + "/files/") and remote.endswith("/9")
            assert await ex.newest_mtime(remote) is None
            await ex.put(local, remote)
            assert read(remote, "step-1.pt") == read(local, "step-1.pt")
            await asyncio.to_thread(Path(remote, "step-2.pt").write_bytes, b"more")
            newest = await ex.newest_mtime(remote)
            mtime = (await asyncio.to_thread(Path(remote, "step-2.pt").stat)).st_mtime
            assert newest is not None and abs(newest - mtime) < 1.0
            back = tmp_path / "back"
            await ex.get(remote, back)
            assert sorted(p.name for p in back.iterdir()) == ["step-1.pt", "step-2.pt"]
            # a job writes its checkpoint in the folder made for it there; it comes back with get
            ckpt = await ex.remote_path(str(tmp_path / "home" / "checkpoints" / "10"))
            rd = tmp_path / "runs" / "10-1-r0"
            h = await ex.launch(request(rd, ("sh", "-c", 'echo 3 > "$HSCHED_CHECKPOINT_DIR/step-3.pt"'), job="10",
                                        env={"HSCHED_CHECKPOINT_DIR": ckpt}))
            rep = await until(ex, str(rd), h, RunStatus.EXITED)
            assert rep.exit_code == 0, await ex.read_log(str(rd), 0)
            await ex.get(ckpt, tmp_path / "ck10")
            assert read(tmp_path / "ck10" / "step-3.pt") == b"3\n"
            # the login node's accounts; a run as a user it lacks (lab mode) is refused in one line, never run as
            # the login user (a run as one it has: tests/slurm/test_slurm_lab.py)
            assert await ex.users(["root", "hsched-no-such-user"]) == {"root": True, "hsched-no-such-user": False}
            with pytest.raises(SlurmError, match=r"^grp: user hsched-no-such-user does not exist on login node "
                                                 rf"{login_host[0].name}$"):
                await ex.launch(request(tmp_path / "runs" / "1-1-r1", ("true",), user="hsched-no-such-user"))
            assert not await asyncio.to_thread((tmp_path / "runs" / "1-1-r1").exists)
        finally:
            await ex.close()

    run(main())


def test_an_unknown_login_host_key_is_refused_and_nothing_runs(slurm: SlurmCluster, login_host: TestHosts,
                                                               runs: Path, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")

    async def main() -> None:
        h = login_host[0]
        cfg = NodeConfig(name="grp", executor="ssh", host=h.address, port=h.port, user=login_host.user,
                         identity_file=str(login_host.user_key), known_hosts=str(empty))
        ex = SlurmExecutor(name="grp", partition=slurm.partition, env={"SLURM_CONF": str(slurm.conf)}, login=cfg,
                           ssh_config=tmp_path / "no_ssh_config")
        (tmp_path / "no_ssh_config").write_text("")
        try:
            with pytest.raises(NodeRefused) as e:
                await ex.launch(request(runs / "1-1-r0", ("true",)))
            assert e.value.reason is Refusal.HOST_KEY_UNKNOWN and "hsched node trust grp" in str(e.value)
            assert "\n" not in str(e.value)
        finally:
            await ex.close()

    run(main())
    assert not list(login_host[0].root.glob("runs/*/1-1-r0"))  # refused before any file or command


def test_a_silent_login_node_makes_the_group_unreachable_and_loses_no_job(slurm: SlurmCluster,
                                                                         login_host: TestHosts, runs: Path) -> None:
    """The login node stops answering (its sshd frozen: the connection stays open and goes silent, as a cut
    link): calls fail within the command timeout as NodeUnreachable, one line; the job runs on in Slurm, and
    once the node answers again its end is reported as if nothing happened."""
    go = runs / "go"

    async def main() -> None:
        ex = over_ssh(slurm, login_host, timeout_s=2.0)
        host = login_host[0]
        try:
            rd = runs / "4-1-r0"
            h = await ex.launch(request(rd, ("sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.1; done; exit 4'),
                                        job="4"))
            await until(ex, str(rd), h, RunStatus.RUNNING)
            await asyncio.to_thread(host.cut)
            try:
                with pytest.raises(NodeUnreachable) as e:
                    await ex.status([StatusQuery(str(rd), h)])
                assert "\n" not in str(e.value) and ex.last_error is e.value
                await asyncio.to_thread(go.touch)  # the job ends while the login node is away
                await job_state(slurm, h.pid, "FAILED")
            finally:
                await asyncio.to_thread(host.restore)
            rep = await until(ex, str(rd), h, RunStatus.EXITED, limit_s=30)
            assert (rep.exit_code, rep.handle) == (4, h) and ex.last_error is None
        finally:
            await ex.close()

    run(main())


def test_a_gang_over_ssh_is_one_sbatch_each_rank_with_its_folder_log_and_exit_code(
        slurm: SlurmCluster, login_host: TestHosts, runs: Path) -> None:
    """A job of 2 nodes x 1 rank: one sbatch through the login node, srun starting each rank's script from its
    folder there (the dispatch names the login node's folders), each rank's log and own exit code back (rank 1
    fails once rank 0 has written its line; srun ends rank 0); a restarted executor finds the one job again."""

    async def main() -> None:
        ex = over_ssh(slurm, login_host)
        try:
            await ex.probe()
            first = await ex._dir(str(runs / "41-1-r0"))
            show = ('echo "rank=$RANK node=$SLURMD_NODENAME dir=$HSCHED_RUN_DIR"; if [ "$RANK" = 1 ]; then '
                    f'until grep -q rank=0 "{first}/output.log"; do sleep 0.1; done; exit 3; fi; '
                    'while :; do sleep 0.1; done')
            reqs = ranks(runs, "41", 2, 1, ("sh", "-c", show))
            handles = await launch_all(ex, reqs)
            assert len({h.pid for h in handles}) == 1
            job = slurm.job(handles[0].pid)
            assert (job["NumNodes"].split("-")[0], job["NumTasks"]) == ("2", "2")
            reps = [await until(ex, r.run_dir, h, RunStatus.EXITED) for r, h in zip(reqs, handles, strict=True)]
            assert [(rep.exit_code, rep.signal) for rep in reps] == [(143, 15), (3, None)]
            nodes = []
            for r, req in enumerate(reqs):
                there = await ex._dir(req.run_dir)
                assert there.startswith(str(login_host[0].root) + "/runs/")
                f = dict(x.split("=", 1) for x in (await ex.read_log(req.run_dir, 0)).decode().split())
                assert (f["rank"], f["dir"]) == (str(r), there)
                nodes.append(f["node"])
            assert sorted(nodes) == ["n1", "n2"]  # one rank per Slurm node
            again = over_ssh(slurm, login_host)
            try:
                assert [(await again.launch(r)).pid for r in reqs] == [handles[0].pid] * 2
            finally:
                await again.close()
        finally:
            await ex.close()

    run(main())


FLEET = """
[[node]]
name = "cluster"
executor = "slurm"
partition = "{partition}"
login = "{login}"
"""


def test_hsched_submits_to_a_group_reached_over_ssh_and_cancels_there(slurm: SlurmCluster, login_host: TestHosts,
                                                                      tmp_path: Path) -> None:
    """The CLI and a controller process whose fleet file's slurm group has `login`: the job runs under Slurm
    through the login node, its exit code and log come back through `hsched`, `hsched cancel` ends a job in
    Slurm within 5 s. The controller reaches the host through HSCHED_SSH_CONFIG (its alias, key, known_hosts)."""
    nc = NodeConfig(name="cluster", executor="slurm", partition=slurm.partition, login=login_host[0].name)
    assert make_executor(nc).login is not None  # type: ignore[attr-defined]  # (the controller's own builder)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(partition=slurm.partition, login=login_host[0].name))
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("poll_interval_s = 0.2\nkill_after_s = 2\n")
    h = Hs(home, fleet)
    h.env.update(login_host.env())
    h.env.pop("SLURM_CONF", None)  # only the login node knows where the cluster is
    try:
        wait_until(lambda: [n for n in h.json("nodes") if n["state"] == "UP"], "the group UP")  # type: ignore[union-attr]
        jid = h.run("submit", "--parsable", "--gpus", "1", "--", "sh", "-c",
                    'echo "job=$HSCHED_JOB_ID dir=$HSCHED_RUN_DIR"; exit 3', check=True).stdout.strip()
        assert h.run("wait", jid, "--timeout", "120").returncode != 0
        shown = h.json("show", jid)
        assert isinstance(shown, dict) and shown["state"] == "FAILED" and shown["exit_code"] == 3
        sid = shown["runs"][0]["pid"]  # Slurm's job id
        detail = slurm.job(sid)
        assert detail["JobState"] == "FAILED" and detail["Comment"].startswith(f"hsched:{jid}:")
        there = str(Path(detail["StdOut"]).parent)
        assert there.startswith(str(login_host[0].root) + "/runs/")  # on the login node, not under HSCHED_HOME
        assert h.run("logs", jid, check=True).stdout == f"job={jid} dir={there}\n"
        # hsched cancel of a running job: it ends in Slurm within 5 s
        jid = h.run("submit", "--parsable", "--gpus", "1", "--", "sleep", "300", check=True).stdout.strip()

        def launched() -> int | None:
            shown = h.json("show", jid)
            assert isinstance(shown, dict)
            runs = shown["runs"]
            return int(runs[0]["pid"]) if shown["state"] == "RUNNING" and runs and runs[0].get("pid") else None

        sid = wait_until(launched, "hsched's job running")
        wait_until(lambda: slurm.job(sid)["JobState"] == "RUNNING", "the Slurm job running")
        t0 = time.monotonic()
        h.run("cancel", jid, check=True)
        wait_until(lambda: slurm.job(sid)["JobState"] not in ("RUNNING", "COMPLETING"), "the Slurm job gone",
                   every_s=0.05)
        assert time.monotonic() - t0 < 5.0
        assert h.run("wait", jid, "--timeout", "60").returncode != 0
        assert h.json("show", jid)["state"] == "CANCELLED"  # type: ignore[index]
    finally:
        h.stop()


def test_login_dir_holds_the_run_folders_and_one_that_cannot_be_made_is_refused_in_one_line(
        slurm: SlurmCluster, login_host: TestHosts, runs: Path, tmp_path: Path) -> None:
    """The fleet file's `login_dir = ".../$USER/hsched"` (over the host's HSCHED_NODE_ROOT): made on first contact
    (0700), `$USER` the login user's; the job's run folder is under it. A login_dir that cannot be made (under a
    file) refuses the group with one line naming the key; nothing is submitted."""
    scratch = tmp_path / "scratch"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")

    def group(login_dir: str) -> SlurmExecutor:
        text = FLEET.format(partition=slurm.partition, login=login_host[0].name) + f'login_dir = "{login_dir}"\n'
        [nc] = fleet_from_table(tomllib.loads(text), "fleet.toml", tmp_path).nodes
        return SlurmExecutor.from_config(nc, env={"SLURM_CONF": str(slurm.conf)}, ssh_config=login_host.ssh_config)

    async def main() -> None:
        ex = group(f"{scratch}/$USER/hsched")
        try:
            await ex.probe()
            user = await ex._site.user()
            root = scratch / user / "hsched"
            assert await asyncio.to_thread(lambda: root.stat().st_mode & 0o777) == 0o700
            rd = runs / "71-1-r0"
            h = await ex.launch(request(rd, ("sh", "-c", 'echo "dir=$HSCHED_RUN_DIR"'), job="71"))
            there = await ex._dir(str(rd))
            assert there.startswith(f"{root}/runs/"), there
            rep = await until(ex, str(rd), h, RunStatus.EXITED)
            assert rep.exit_code == 0 and await ex.read_log(str(rd), 0) == f"dir={there}\n".encode()
        finally:
            await ex.close()
        bad = group(f"{blocker}/hsched")
        try:
            with pytest.raises(NodeRefused) as e:
                await bad.probe()
            assert e.value.reason is Refusal.CONFIG and "\n" not in str(e.value)
            assert str(e.value).startswith(f"cluster: login_dir '{blocker}/hsched' ({blocker}/hsched on the login "
                                           "node) cannot be made there ("), str(e.value)
            assert str(e.value).endswith("): make it, or change login_dir in the fleet file")
        finally:
            await bad.close()

    run(main())
