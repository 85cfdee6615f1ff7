"""A lab whose controller runs as a service account, not root (issue 13, item 4), end to end.

Each node (this machine, and an SSH host) is prepared by the script `hsched node helper-script` prints, run as
root: the account (with its own SSH key authorized), the node helper installed root-owned and confined to one
folder, and a sudo rule that lets the account run exactly that helper. The controller runs as the account;
real users submit; their jobs run as them on both nodes; a checkpoint moves from one node to the other through
the helpers (the account itself can read none of it); and the account gets nothing of root's through sudo.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hsched.executors._confined import mapped

from tests.e2e.ssh.hosts import TestHosts
from tests.labusers import ADMIN_GROUP, LabUsers, as_user, lab_python, world_folder

pytestmark = pytest.mark.slow  # real users, sudo, sshd, a controller and jobs

SVC = "hslabsvc"


def _account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


class ServiceLab:
    def __init__(self, base: Path, python: Path, sock: Path, ssh_config: Path, nodes: dict[str, Path]) -> None:
        self.base, self.python, self.sock, self.ssh_config, self.nodes = base, python, sock, ssh_config, nodes
        self.home = base / "home"

    def launcher(self, node: str) -> str:
        return str(self.nodes[node] / "lib" / "hsched-node-helper")

    def root_of(self, node: str) -> Path:
        return self.nodes[node] / "root"

    def svc(self, *args: str) -> subprocess.CompletedProcess[str]:
        """hsched as the service account, with the controller's environment."""
        return as_user(SVC, ["env", f"HSCHED_HOME={self.home}", f"HSCHED_LAB_SOCKET={self.sock}",
                             f"HSCHED_SSH_CONFIG={self.ssh_config}", str(self.python), "-m", "hsched", *args],
                       timeout=300)

    def user(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return as_user(name, ["env", f"HSCHED_LAB_SOCKET={self.sock}", str(self.python), "-m", "hsched", *args],
                       timeout=300)

    def user_json(self, name: str, *args: str) -> Any:
        cut = args.index("--") if "--" in args else len(args)
        p = self.user(name, *args[:cut], "--json", *args[cut:])
        assert p.returncode == 0, f"{name}: hsched {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"
        return json.loads(p.stdout)

    def admin(self, *args: str) -> None:
        p = self.user("hslabadm", *args)
        assert p.returncode == 0, f"hslabadm: hsched {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}"

    def helper(self, node: str, command: str, request: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """The installed helper, run by the account through its sudo rule, as the controller runs it."""
        return as_user(SVC, ["sudo", "-n", self.launcher(node), command], input=json.dumps(request))


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture
def lab(users: LabUsers, ssh_hosts: TestHosts) -> Iterator[ServiceLab]:
    if shutil.which("sudo") is None:
        pytest.skip("sudo is needed for the service-account lab (apt-get install sudo; .ci/run installs it)")
    had_account = _account_exists(SVC)
    base = world_folder("hsched-svc-")
    host = ssh_hosts[0]
    python = lab_python(base)
    nodes = {"here": base / "node-here", host.name: base / "node-there"}
    sudoers = [f"/etc/sudoers.d/hsched-test-{i}" for i in range(len(nodes))]
    ssh_dir = base / "svc-ssh"
    ssh_dir.mkdir(mode=0o700)
    try:
        for (name, folder), rule in zip(nodes.items(), sudoers, strict=True):
            folder.mkdir(mode=0o755)
            # this machine first: the account and its own SSH key (--keygen), which the other node authorizes
            # (sshd reads a user's authorized keys as that user)
            key_args = ["--keygen"] if name == "here" else ["--key", f"{pwd.getpwnam(SVC).pw_dir}/.ssh/id_ed25519.pub"]
            p = subprocess.run([str(python), "-m", "hsched", "node", "helper-script", "--install", "--account", SVC,
                                *key_args, "--prefix", str(folder / "lib"), "--root", str(folder / "root"),
                                "--sudoers", rule], capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, f"helper-script on {name}: {p.stdout}\n{p.stderr}"
        svc = pwd.getpwnam(SVC)
        key = Path(svc.pw_dir) / ".ssh" / "id_ed25519"
        (ssh_dir / "known_hosts").write_text(ssh_hosts.known_hosts.read_text())
        config = ssh_dir / "config"
        config.write_text("".join(
            f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n  User {SVC}\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n" for h in ssh_hosts))
        run = base / "run"
        run.mkdir(mode=0o755)
        home = base / "home"
        home.mkdir(mode=0o711)
        (home / "fleet.toml").write_text(
            f'[[node]]\nname = "here"\nexecutor = "local"\nhelper = "{nodes["here"] / "lib" / "hsched-node-helper"}"\n'
            '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n\n'
            f'[[node]]\nname = "{host.name}"\nexecutor = "ssh"\nhost = "{host.name}"\n'
            f'helper = "{nodes[host.name] / "lib" / "hsched-node-helper"}"\n'
            '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
        (home / "settings.toml").write_text(f'poll_interval_s = 0.2\nadmins = ["@{ADMIN_GROUP}"]\n')
        for path in (ssh_dir, run, home):
            for top, dirs, files in os.walk(path):
                for n in (*dirs, *files):
                    os.chown(Path(top) / n, svc.pw_uid, svc.pw_gid)
            os.chown(path, svc.pw_uid, svc.pw_gid)
        ctl = ServiceLab(base, python, run / "hsched.sock", config, nodes)
        started = ctl.svc("daemon", "start", "--lab", "--json")
        assert started.returncode == 0, started.stdout + started.stderr
        assert json.loads(started.stdout)["mode"] == "lab"
        yield ctl
        queue = ctl.svc("queue", "--json")
        ids = [str(j["id"]) for j in json.loads(queue.stdout)] if queue.returncode == 0 else []
        if ids:
            ctl.svc("cancel", *ids)
            ctl.svc("wait", *ids, "--timeout", "120")
        ctl.svc("daemon", "stop")
    finally:
        for rule in sudoers:
            Path(rule).unlink(missing_ok=True)
        if not had_account and _account_exists(SVC):
            subprocess.run(["pkill", "-KILL", "-u", SVC], capture_output=True)
            subprocess.run(["userdel", "-r", SVC], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


SCRIPT = ('echo "uid=$(id -u) home=$HOME"; f="$HSCHED_CHECKPOINT_DIR/n"; n=$(cat "$f" 2>/dev/null || echo 0); '
          'echo "n=$n"; echo $((n + 1)) > "$f"; [ "$n" -ge 1 ] && exit 0; exec sleep 600')


def _wait_for_log(lab: ServiceLab, user: str, job: str, text: str, timeout_s: float = 40.0) -> str:
    """The job's log once it holds `text` (read through the node's helper, as the user would)."""
    deadline = time.monotonic() + timeout_s
    out = ""
    while time.monotonic() < deadline:
        p = lab.user(user, "logs", job)
        out = p.stdout
        if text in out:
            return out
        time.sleep(0.2)
    shown = lab.user(user, "show", job, "--json").stdout
    logs = sorted(lab.home.glob("*.log"))
    tail = logs[0].read_text()[-3000:] if logs else "(no controller log)"
    raise AssertionError(f"job {job}'s log never showed {text!r}: {out!r} {p.stderr!r}\n{shown}\n{tail}")


def test_a_service_account_lab_runs_jobs_as_their_owners_and_moves_their_checkpoints(lab: ServiceLab) -> None:
    one = pwd.getpwnam("hslab1")
    there = next(n for n in lab.nodes if n != "here")
    status = lab.user_json("hslab1", "daemon", "status")
    assert (status["mode"], status["running"]) == ("lab", True)
    # the controller is the account's, never root's
    pid = int(status["pid"])
    assert Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam(SVC).pw_uid

    # first run here (the other node drained), then the job goes there with its checkpoint
    lab.admin("node", "drain", there)
    job = lab.user_json("hslab1", "submit", "--gpus", "1", "--", "sh", "-c", SCRIPT)
    jid = str(job["id"])
    first = _wait_for_log(lab, "hslab1", jid, "n=0")
    assert f"uid={one.pw_uid} home={one.pw_dir}" in first
    shown = lab.user_json("hslab1", "show", jid)
    run_dir = Path(mapped(str(lab.root_of("here")), "runs", shown["runs"][0]["run_dir"]))
    ckpt_here = Path(mapped(str(lab.root_of("here")), "files", shown["checkpoint_dir"]))
    for path, mode in ((run_dir / "output.log", 0o600), (ckpt_here, 0o700)):
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (one.pw_uid, mode), path
    # neither another user nor the account itself can read the user's files
    for who in ("hslab2", SVC):
        assert as_user(who, ["cat", str(run_dir / "output.log")]).returncode != 0, who
        assert as_user(who, ["ls", str(ckpt_here)]).returncode != 0, who

    lab.admin("node", "resume", there)
    lab.admin("node", "drain", "here")
    lab.admin("preempt", jid)  # stopped and requeued: its next run starts where it is free
    waited = lab.user("hslab1", "wait", jid, "--timeout", "180")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    log = _wait_for_log(lab, "hslab1", jid, "n=1")  # the last run's log: it found the first run's checkpoint
    assert f"uid={one.pw_uid} home={one.pw_dir}" in log, log
    final = lab.user_json("hslab1", "show", jid)
    assert final["state"] == "COMPLETED" and [r["node"] for r in final["runs"]] == ["here", there], final
    # the checkpoint went through both helpers and is the user's there
    ckpt_there = Path(mapped(str(lab.root_of(there)), "files", shown["checkpoint_dir"]))
    st = ckpt_there.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (one.pw_uid, 0o700)
    assert (ckpt_there / "n").read_text().strip() == "2"
    assert (ckpt_there / "n").stat().st_uid == one.pw_uid


def test_the_sudo_rule_gives_the_account_exactly_the_confined_helper(lab: ServiceLab) -> None:
    # nothing else through sudo
    p = as_user(SVC, ["sudo", "-n", "/bin/sh", "-c", "id -u"])
    assert p.returncode != 0 and p.stdout.strip() != "0"
    # and the helper does nothing with root's powers that the account could not do as a lab user
    refused = [
        ("launch", {"run_dir": f"{lab.root_of('here')}/runs/x/y", "command": ["id"], "user": "root"}, "uid 0"),
        ("launch", {"run_dir": f"{lab.root_of('here')}/runs/x/y", "command": ["id"]}, "named user"),
        ("launch", {"run_dir": "/etc/hsched-x", "command": ["id"], "user": "hslab1"}, "outside"),
        ("read", {"path": "/etc/shadow"}, "outside"),
        ("pack", {"path": "/root"}, "outside"),
        ("signal", {"handle": {"run_dir": "/", "pid": 1, "pgid": 1, "start_ticks": 1, "boot_id": "x"},
                    "signal": "KILL"}, "outside"),
    ]
    for command, request, why in refused:
        p = lab.helper("here", command, request)
        assert p.returncode == 1 and why in json.loads(p.stdout)["error"], (command, p.stdout, p.stderr)
    # trusting a node's key is done in the name of the account that runs the controller
    there = next(n for n in lab.nodes if n != "here")
    p = as_user("hslab1", ["env", f"HSCHED_HOME={lab.home}", str(lab.python), "-m", "hsched", "node", "trust", there])
    assert p.returncode == 1 and f"sudo -u {SVC} hsched node trust {there}" in p.stderr, p.stderr
    # a spec the account wrote itself is never run by the wrapper
    fake = lab.base / "fake-run"
    fake.mkdir()
    (fake / "spec.json").write_text(json.dumps({"account": None, "command": ["touch", "/root/owned"]}))
    p = as_user(SVC, ["sudo", "-n", lab.launcher("here"), "_wrap", str(fake)])  # not in the rule: sudo says no
    assert p.returncode == 1 and "password is required" in p.stderr, p.stderr
    p = subprocess.run([lab.launcher("here"), "_wrap", str(fake)], capture_output=True, text=True)  # root: nor it
    assert p.returncode == 2 and "takes one command" in p.stdout, p.stdout
    p = subprocess.run([str(lab.python), str(lab.nodes["here"] / "lib" / "nodehelper.py"), "--confine",
                        str(lab.root_of("here")), "_wrap", str(fake)], capture_output=True, text=True)
    assert p.returncode == 2 and "outside" in p.stderr  # and the helper itself runs no folder it did not make
    assert not Path("/root/owned").exists()
