"""Lab mode on a Slurm node group, against the real two-node cluster (tests/slurm/cluster.py) and real users
(tests/labusers.py): the controller (root) submits each run as its owner (`sbatch --uid/--gid`, or runuser where
this Slurm's sbatch has no --uid), so Slurm runs it as that user, in their home; the run folder is made as the node
helper makes a user's (root's and passable, the log, signals and scripts the user's, slurm.json root's), the
checkpoint folder is the user's; a gang's ranks run as the user too; an absent user is refused in one line."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hsched.executors.slurm.executor import SlurmError, SlurmExecutor

from hsched.config import NodeConfig
from hsched.model import RunStatus
from tests.e2e.ssh.hosts import TestHosts, sshd_available
from tests.labusers import LabUsers, passable, world_folder
from tests.slurm.cluster import SlurmCluster, available
from tests.slurm.conftest import executor, run
from tests.slurm.test_slurm_executor import request, until
from tests.slurm.test_slurm_gang import launch_all, ranks

pytestmark = pytest.mark.slow  # real users, a real Slurm cluster and its jobs


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture(scope="module")
def lab_cluster() -> Iterator[SlurmCluster]:
    """A test cluster of its own in a folder every user may pass through: Slurm runs a lab's jobs as their users,
    who reach its spool, slurm.conf and munge socket (srun inside a job), as on any cluster. (The session's
    cluster lives under pytest's folder, which pytest keeps root's only.)"""
    why = available()
    if why is not None:
        pytest.skip(why)
    root = world_folder("hsched-slurm-lab-cluster-")
    try:
        with SlurmCluster(root) as cluster:
            os.chmod(cluster.conf, 0o644)
            passable(cluster.munge_socket)
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm(lab_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield lab_cluster
    lab_cluster.cancel_all()


@pytest.fixture
def base() -> Iterator[Path]:
    """The lab's controller folder: its users pass through it."""
    d = world_folder("hsched-slurm-lab-")
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def owned(path: Path) -> tuple[str, int]:
    st = path.lstat()
    return pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)


def test_a_run_is_submitted_as_its_owner_and_its_files_are_theirs(slurm: SlurmCluster, users: LabUsers,
                                                                   base: Path) -> None:
    ckpt = base / "checkpoints" / "91"
    ckpt.mkdir(parents=True)
    (ckpt / "from-root").write_text("copied in by the controller\n")  # a checkpoint move leaves root's files
    run_dir = base / "runs" / "cluster" / "91-1-r0"
    home = pwd.getpwnam("hslab1").pw_dir
    script = 'id -un; pwd; cat "$HSCHED_CHECKPOINT_DIR/from-root"; touch "$HSCHED_CHECKPOINT_DIR/mine"'

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        req = request(run_dir, ("sh", "-c", script), job="91",
                      env={"HSCHED_CHECKPOINT_DIR": str(ckpt)}, user="hslab1", base_dir=str(base))
        h = await ex.launch(req)
        assert slurm.job(h.pid)["UserId"].startswith("hslab1(")  # Slurm's job is the user's
        rep = await until(ex, str(run_dir), h, RunStatus.EXITED)
        log = (await ex.read_log(str(run_dir), 0)).decode()
        assert rep.exit_code == 0, log
        assert log == f"hslab1\n{home}\ncopied in by the controller\n"
        # an account this machine does not have: one line, nothing submitted
        with pytest.raises(SlurmError, match=r"^grp: user hsnobody9 does not exist on the controller's machine$"):
            await ex.launch(replace(req, run_dir=str(base / "runs" / "cluster" / "92-1-r0"), user="hsnobody9"))

    run(main())
    assert owned(run_dir) == ("root", 0o711) and owned(run_dir / "slurm.json") == ("root", 0o600)
    for name, mode in (("output.log", 0o600), ("signals.log", 0o600), ("slurm.sh", 0o600)):
        assert owned(run_dir / name) == ("hslab1", mode), name
    assert owned(ckpt) == ("hslab1", 0o700) and owned(ckpt / "mine")[0] == owned(ckpt / "from-root")[0] == "hslab1"
    for d in (base / "runs", base / "runs" / "cluster", base / "checkpoints"):
        assert owned(d) == ("root", 0o711), d
    assert not (base / "runs" / "cluster" / "92-1-r0" / "slurm.json").exists()


def test_a_gangs_ranks_run_as_their_owner(slurm: SlurmCluster, users: LabUsers, base: Path) -> None:
    runs = base / "runs" / "cluster"

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        reqs = [replace(r, user="hslab2", base_dir=str(base))
                for r in ranks(runs, "93", 2, 1, ("sh", "-c", 'echo "rank $RANK as $(id -un)"'))]
        handles = await launch_all(ex, reqs)
        assert slurm.job(handles[0].pid)["UserId"].startswith("hslab2(")
        reps = [await until(ex, r.run_dir, h, RunStatus.EXITED) for r, h in zip(reqs, handles, strict=True)]
        assert [rep.exit_code for rep in reps] == [0, 0]
        srun = await asyncio.to_thread((runs / "93-1-r0" / "slurm-job.log").read_text)
        for k, r in enumerate(reqs):
            assert await ex.read_log(r.run_dir, 0) == f"rank {k} as hslab2\n".encode(), srun

    run(main())
    for name in ("slurm-ranks.sh", "slurm-job.sh", "slurm-job.log"):
        assert owned(runs / "93-1-r0" / name)[0] == "hslab2", name


@pytest.fixture(scope="module")
def lab_login(lab_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """A login node (a real sshd on this machine's loopback, logged in to as root) for the lab's cluster."""
    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")
    with TestHosts(tmp_path_factory.mktemp("lablogin"), count=1, use_netns=False, prefix="lablogin",
                   session_env={"SLURM_CONF": str(lab_cluster.conf)}) as hosts:
        yield hosts


def test_over_ssh_a_run_is_submitted_as_its_owner_under_login_dir(slurm: SlurmCluster, users: LabUsers,
                                                                   lab_login: TestHosts, base: Path) -> None:
    """Through a login node logged in to as root: the run's folder under `login_dir` (made passable), its log
    and scripts handed to the user over SFTP, sbatch as the user; Slurm runs it as them."""
    nc = NodeConfig(name="grp", executor="slurm", partition=slurm.partition, login=lab_login[0].name,
                    login_dir=str(base / "login" / "$USER"))
    run_dir = base / "controller-runs" / "94-1-r0"  # the controller's name: the folder is on the login node
    (base / "login").mkdir(mode=0o711)  # above login_dir: the admin's (as /scratch is), passable

    async def main() -> None:
        ex = SlurmExecutor.from_config(nc, env={"SLURM_CONF": str(slurm.conf)}, ssh_config=lab_login.ssh_config)
        try:
            await ex.probe()
            h = await ex.launch(request(run_dir, ("sh", "-c", "id -un; pwd"), job="94", user="hslab1"))
            assert slurm.job(h.pid)["UserId"].startswith("hslab1(")
            rep = await until(ex, str(run_dir), h, RunStatus.EXITED)
            log = (await ex.read_log(str(run_dir), 0)).decode()
            assert rep.exit_code == 0 and log == f"hslab1\n{pwd.getpwnam('hslab1').pw_dir}\n", log
            there = Path(await ex._dir(str(run_dir)))
        finally:
            await ex.close()
        assert there.is_relative_to(base / "login" / "root") and not run_dir.exists()
        assert owned(there) == ("root", 0o711) and owned(there / "slurm.json") == ("root", 0o600)
        assert owned(there / "output.log") == ("hslab1", 0o600) and owned(there / "slurm.sh") == ("hslab1", 0o600)

    run(main())


def test_without_sbatchs_uid_option_the_run_is_submitted_through_runuser(slurm: SlurmCluster, users: LabUsers,
                                                                          base: Path) -> None:
    """A Slurm whose sbatch has no --uid (newer releases dropped it): sbatch itself runs as the user."""
    run_dir = base / "runs" / "cluster" / "95-1-r0"

    async def main() -> None:
        ex = executor(slurm)
        await ex.probe()
        ex._uid_flag = False  # as `sbatch --usage` would say there
        h = await ex.launch(request(run_dir, ("id", "-un"), job="95", user="hslab2", base_dir=str(base)))
        assert slurm.job(h.pid)["UserId"].startswith("hslab2(")
        rep = await until(ex, str(run_dir), h, RunStatus.EXITED)
        assert rep.exit_code == 0 and await ex.read_log(str(run_dir), 0) == b"hslab2\n"

    run(main())
