"""Lab mode on a real node: the helper (root) starts a run as its owner, by name, with their groups and home;
the run's control files stay root's, its log and checkpoint folder become the user's; an absent user is
refused; a link planted in the checkpoint folder is never followed. Real users (useradd), real setuid."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.local import LocalExecutor

from hsched.errors import HelperError
from tests.executors.waits import wait_status
from tests.labusers import ADMIN_GROUP, LabUsers, world_folder

pytestmark = pytest.mark.slow  # real users and processes


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture
def base() -> Iterator[Path]:
    d = world_folder("hsched-owner-")
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_run_is_its_owners_and_its_files_are_placed_accordingly(users: LabUsers, base: Path) -> None:
    adm = pwd.getpwnam("hslabadm")
    ckpt = base / "checkpoints" / "7"
    ckpt.mkdir(parents=True)
    (ckpt / "from-root").write_text("copied in by the controller")  # what a checkpoint move leaves: root's
    (ckpt / "passwd").symlink_to("/etc/passwd")  # a link the user planted: changed, never followed
    run_dir = base / "runs" / "users" / "hslabadm" / "here" / "7-1-r0"
    ex = LocalExecutor()
    try:
        script = 'id -u; id -G; echo "$HOME"; pwd; echo "$USER"; touch "$HSCHED_CHECKPOINT_DIR/mine"'
        h = await ex.launch(LaunchRequest(run_dir=str(run_dir), command=("sh", "-c", script),
                                          env={"HSCHED_CHECKPOINT_DIR": str(ckpt)}, user="hslabadm",
                                          base_dir=str(base)))
        rep = await wait_status(ex, h, running=False)
        assert rep.exit_code == 0, (run_dir / "output.log").read_text()
    finally:
        await ex.close()
    uid, groups, home, cwd, user = (run_dir / "output.log").read_text().split("\n")[:5]
    assert int(uid) == adm.pw_uid and user == "hslabadm" and home == cwd == adm.pw_dir
    assert grp.getgrnam(ADMIN_GROUP).gr_gid in {int(g) for g in groups.split()}  # supplementary groups too
    # the log and the checkpoint folder are the user's, private; the run's control files root's
    log, folder = (run_dir / "output.log").stat(), ckpt.stat()
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (adm.pw_uid, 0o600)
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (adm.pw_uid, 0o700)
    for name in ("spec.json", "handle.json", "exit.json"):
        st = (run_dir / name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), name
    assert (run_dir.stat().st_uid, stat.S_IMODE(run_dir.stat().st_mode)) == (0, 0o711)
    for d in (base / "runs", base / "runs" / "users", run_dir.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o711
    assert (ckpt / "mine").stat().st_uid == adm.pw_uid
    assert (ckpt / "from-root").stat().st_uid == adm.pw_uid
    assert os.lstat(ckpt / "passwd").st_uid == adm.pw_uid and os.stat("/etc/passwd").st_uid == 0


async def test_a_user_without_an_account_is_refused_and_users_says_who_exists(users: LabUsers, base: Path) -> None:
    ex = LocalExecutor()
    try:
        assert await ex.users(["hslab1", "no-such-user-hs"]) == {"hslab1": True, "no-such-user-hs": False}
        with pytest.raises(HelperError, match="user no-such-user-hs does not exist on this node"):
            await ex.launch(LaunchRequest(run_dir=str(base / "runs" / "x"), command=("true",),
                                          user="no-such-user-hs", base_dir=str(base)))
        assert not (base / "runs" / "x").exists()  # refused before anything was made
    finally:
        await ex.close()


async def test_a_folder_the_user_may_not_enter_fails_the_run_as_cannot_execute(users: LabUsers,
                                                                               base: Path) -> None:
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(base / "runs" / "y"), command=("pwd",), workdir=str(closed),
                                          user="hslab1", base_dir=str(base)))
        rep = await wait_status(ex, h, running=False)
    finally:
        await ex.close()
    assert rep.exit_code == 126
    assert "hsched: cannot enter" in (base / "runs" / "y" / "output.log").read_text()
