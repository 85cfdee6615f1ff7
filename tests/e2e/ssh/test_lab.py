"""Lab mode end to end: root starts one controller with `hsched daemon start --lab`; real users (useradd) use
plain `hsched` with a login's bare environment (no HSCHED_* variables: the CLI finds /run/hsched/hsched.sock by
itself); their jobs run as them here and on an SSH host, their files are theirs; another user may look but not
touch; an admin group's member and root may; a request cannot claim another user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hsched.controller.fleet import LAB_NODE_ROOT
from hsched.paths import LAB_SOCKET
from tests.e2e.ssh.hosts import TestHosts
from tests.labusers import ADMIN_GROUP, LabUsers, as_user, lab_python, world_folder

pytestmark = pytest.mark.slow  # real users, sshd, controller and jobs


class LabCtl:
    """The lab's controller (run by root) and the CLI as any user."""

    def __init__(self, python: Path, home: Path, ssh_env: dict[str, str]) -> None:
        self.python = python
        self.home = home
        self.root_env = {**os.environ, "HSCHED_HOME": str(home), **ssh_env}
        self.root_env.pop("HSCHED_LAB_SOCKET", None)

    def root(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([str(self.python), "-m", "hsched", *args], env=self.root_env, capture_output=True,
                           text=True, timeout=300, cwd="/")
        if check and p.returncode != 0:
            raise AssertionError(f"root: hsched {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def user(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return as_user(name, [str(self.python), "-m", "hsched", *args], timeout=300)

    def user_json(self, name: str, *args: str) -> Any:
        cut = args.index("--") if "--" in args else len(args)  # options before a command's own words
        p = self.user(name, *args[:cut], "--json", *args[cut:])
        assert p.returncode == 0, f"{name}: hsched {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
        return json.loads(p.stdout)


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture
def lab(users: LabUsers, ssh_hosts: TestHosts) -> Iterator[LabCtl]:
    base = world_folder("hsched-lab-")
    home = base / "home"
    home.mkdir(mode=0o711)
    host = ssh_hosts[0]
    (home / "fleet.toml").write_text(
        '[[node]]\nname = "here"\nexecutor = "local"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 2\n\n'
        f'[[node]]\nname = "{host.name}"\nexecutor = "ssh"\nhost = "{host.name}"\n'
        '[node.simulate]\nmodel = "NVIDIA H100 80GB HBM3"\ncount = 1\n')
    (home / "settings.toml").write_text(f'poll_interval_s = 0.2\nadmins = ["@{ADMIN_GROUP}"]\n')
    ctl = LabCtl(lab_python(base), home, ssh_hosts.env())
    started = ctl.root("daemon", "start", "--lab", "--json")
    assert json.loads(started.stdout)["mode"] == "lab"
    try:
        yield ctl
    finally:
        queue = ctl.root("queue", "--json", check=False)
        ids = [str(j["id"]) for j in json.loads(queue.stdout)] if queue.returncode == 0 else []
        if ids:
            ctl.root("cancel", *ids, check=False)
            ctl.root("wait", *ids, "--timeout", "120", check=False)
        ctl.root("daemon", "stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


SCRIPT = 'echo "uid=$(id -u) home=$HOME"; echo saved > "$HSCHED_CHECKPOINT_DIR/ck"'


def test_users_share_one_queue_their_jobs_run_as_them_and_only_they_touch_them(lab: LabCtl) -> None:
    one, two = pwd.getpwnam("hslab1"), pwd.getpwnam("hslab2")
    # found without configuration, and says so
    status = lab.user_json("hslab1", "daemon", "status")
    assert (status["mode"], status["running"], status["socket"], status["you"]) == ("lab", True, str(LAB_SOCKET),
                                                                                 "hslab1")
    here = lab.user_json("hslab1", "submit", "--gpus", "1", "--gpu-type", "A100", "--", "sh", "-c", SCRIPT)
    there = lab.user_json("hslab1", "submit", "--gpus", "1", "--gpu-type", "H100", "--", "sh", "-c", SCRIPT)
    assert here["user"] == there["user"] == "hslab1"
    waited = lab.user("hslab1", "wait", str(here["id"]), str(there["id"]))
    assert waited.returncode == 0, waited.stdout + waited.stderr
    for job in (here, there):
        log = lab.user("hslab1", "logs", str(job["id"]))
        assert f"uid={one.pw_uid} home={one.pw_dir}" in log.stdout, log.stdout + log.stderr
    # on this machine: the log and the checkpoint folder are the submitter's, private
    shown = lab.user_json("hslab1", "show", str(here["id"]))
    out_log = Path(shown["runs"][0]["run_dir"]) / "output.log"
    ckpt = Path(shown["checkpoint_dir"])
    for path, mode in ((out_log, 0o600), (ckpt, 0o700)):
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (one.pw_uid, mode), path
    assert (ckpt / "ck").stat().st_uid == one.pw_uid
    assert as_user("hslab2", ["cat", str(out_log)]).returncode != 0
    assert as_user("hslab2", ["ls", str(ckpt)]).returncode != 0
    assert as_user("hslab1", ["cat", str(out_log)]).returncode == 0  # theirs to read directly too
    # on the SSH host: the same, under the lab's node folder
    from hsched.executors.ssh import _mapped

    shown = lab.user_json("hslab1", "show", str(there["id"]))
    remote_log = Path(_mapped(LAB_NODE_ROOT, "runs", shown["runs"][0]["run_dir"])) / "output.log"
    remote_ckpt = Path(_mapped(LAB_NODE_ROOT, "files", shown["checkpoint_dir"]))
    assert (remote_log.stat().st_uid, stat.S_IMODE(remote_log.stat().st_mode)) == (one.pw_uid, 0o600)
    assert (remote_ckpt.stat().st_uid, stat.S_IMODE(remote_ckpt.stat().st_mode)) == (one.pw_uid, 0o700)
    assert as_user("hslab2", ["cat", str(remote_log)]).returncode != 0

    # another user may look, not touch: exit 1, one line, nothing changed
    long = lab.user_json("hslab1", "submit", "--gpus", "1", "--gpu-type", "A100", "--", "sleep", "600")
    jid = str(long["id"])
    assert jid in {str(j["id"]) for j in lab.user_json("hslab2", "queue")}
    for args in (("cancel", jid), ("hold", jid), ("priority", jid, "5"), ("requeue", jid), ("logs", jid),
                 ("preempt", jid)):
        p = lab.user("hslab2", *args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert p.stderr.strip() == f"hsched: error: permission denied: job {jid} belongs to hslab1", p.stderr
    after = lab.user_json("hslab1", "show", jid)
    assert after["state"] in ("PENDING", "RUNNING") and after["priority"] == long["priority"]
    stop = lab.user("hslab2", "daemon", "stop")
    assert stop.returncode == 1 and "permission denied" in stop.stderr
    # a request body claiming another user acts as the one who connected
    claim = ("import json; from hsched.client import Client; "
             "print(json.dumps(Client().call('submit', spec={'command': ['true']}, user='hslab1')))")
    p = as_user("hslab2", [str(lab.python), "-c", claim])
    assert p.returncode == 0 and json.loads(p.stdout)["user"] == "hslab2", p.stderr
    # an admin group's member and root may act on anyone's job
    assert lab.user("hslabadm", "priority", jid, "3").returncode == 0
    assert lab.user_json("hslab1", "show", jid)["priority"] == 3
    assert lab.root("cancel", jid).returncode == 0
    assert two.pw_uid != one.pw_uid


def test_the_unit_that_runs_the_lab_under_systemd(lab: LabCtl) -> None:
    p = lab.root("daemon", "install", "--print")
    unit = p.stdout
    for line in ("Restart=on-failure", "KillMode=process", "RuntimeDirectory=hsched", "[Install]",
                 f"ExecStart={lab.python} -m hsched.controller.server {lab.home}"):
        assert line in unit.splitlines(), line
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:  # where systemd exists, it must accept the unit as it is
        path = lab.home.parent / "hsched.service"
        path.write_text(unit)
        v = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
        assert v.returncode == 0, v.stderr
