"""Issue 27, point 2: the service account cannot widen its helper's confinement, and reads nothing of a member's
beyond what README says (a run's log, which the helper reads for `hsched logs`).

A node prepared as a lab with a service account prepares it (`hsched node helper-script --install`, run here as
root: the account, the helper root-owned under a prefix, its launcher, the visudo-checked sudo rule), real users
(tests/labusers.py), and everything asked as the account through `sudo -n`, as its controller asks. Before:
the rule allowed any arguments to the launcher, and the helper took the last `--confine`/`--min-uid` it was
given, so `sudo -n LAUNCHER --confine / --min-uid 0 read` read /etc/shadow and `... launch` ran a command as
root; the helper's `read` gave the account any file under its folder (a member's checkpoint files included).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pwd
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.labusers import LabUsers, as_user, lab_python, world_folder

pytestmark = pytest.mark.slow  # real users, sudo, visudo, helper processes and jobs

SVC = "hsecsvc"  # an account of this file's own: the lab tests' may be in use by a parallel run


@dataclass
class Node:
    base: Path
    python: Path
    root: Path
    launcher: str
    helper: Path
    sudoers: Path

    def ask(self, *args: str, request: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        """`sudo -n LAUNCHER ARGS...` as the service account, the request on stdin."""
        return as_user(SVC, ["sudo", "-n", self.launcher, *args], input=json.dumps(request or {}))


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture(scope="module")
def node(users: LabUsers) -> Iterator[Node]:
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        pytest.skip("sudo and visudo are needed (apt-get install sudo; .ci/run installs it)")
    had = _exists(SVC)
    base = world_folder("hsched-sec-")
    sudoers = Path(f"/etc/sudoers.d/hsched-sec-{os.getpid()}")
    try:
        python = lab_python(base)
        (base / "node").mkdir(mode=0o755)
        p = subprocess.run([str(python), "-m", "hsched", "node", "helper-script", "--install", "--account", SVC,
                            "--prefix", str(base / "node" / "lib"), "--root", str(base / "node" / "root"),
                            "--sudoers", str(sudoers)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"helper-script: {p.stdout}\n{p.stderr}"
        yield Node(base, python, base / "node" / "root", str(base / "node" / "lib" / "hsched-node-helper"),
                   base / "node" / "lib" / "nodehelper.py", sudoers)
    finally:
        sudoers.unlink(missing_ok=True)
        if not had and _exists(SVC):
            subprocess.run(["pkill", "-KILL", "-u", SVC], capture_output=True)
            subprocess.run(["userdel", "-r", SVC], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _secret_in(p: subprocess.CompletedProcess[str], secret: str) -> bool:
    """Whether `secret` came back in the helper's answer, plain or base64 (a read's data)."""
    if secret in p.stdout:
        return True
    for line in p.stdout.splitlines():
        try:
            data = json.loads(line).get("data")
        except (ValueError, AttributeError):
            continue
        if isinstance(data, str) and secret.encode() in base64.b64decode(data):
            return True
    return False


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_second_confine_or_min_uid_gains_no_root(node: Node) -> None:
    shadow_root = next(line for line in Path("/etc/shadow").read_text().splitlines() if line.startswith("root:"))
    widened = ("--confine", "/", "--min-uid", "0")
    # through sudo, as the account: the rule has no such arguments
    p = node.ask(*widened, "read", request={"path": "/etc/shadow"})
    read_rc, read_shadow = p.returncode, _secret_in(p, shadow_root)  # never printed: only whether it was read
    mark = node.base / "as-root"
    run_dir = node.base / "escape" / "run"
    p = node.ask(*widened, "launch", request={"run_dir": str(run_dir), "user": "root",
                                              "command": ["sh", "-c", f"id -u > {mark}"]})
    launch_rc, started = p.returncode, '"handle"' in p.stdout
    deadline = time.monotonic() + 30
    while started and not mark.exists() and time.monotonic() < deadline:  # the old helper's job, as root
        time.sleep(0.1)
    as_root = mark.exists() and mark.read_text().strip() == "0"
    # root's writes anywhere (a cron file, a sudo rule): here a root-only folder outside the launcher's ROOT
    # (confined to the test's folder, not /, so that the starting code's helper litters nothing of the system's)
    root_only = node.base / "root-only"
    root_only.mkdir(mode=0o700, exist_ok=True)
    elsewhere = ("--confine", str(node.base), "--min-uid", "0")
    p = node.ask(*elsewhere, "append", request={"offset": 0, "data": base64.b64encode(_tar({"cron": b"x"})).decode()})
    token = json.loads(p.stdout).get("token") if p.returncode == 0 else None
    if token:
        node.ask(*elsewhere, "unpack", request={"token": token, "dest": str(root_only / "dest")})
    got = {"read refused": read_rc != 0, "/etc/shadow read": read_shadow, "launch refused": launch_rc != 0,
           "run started": started, "ran as uid 0": as_root, "run folder made": run_dir.exists(),
           "transfer taken": token is not None, "root's folder written": (root_only / "dest").exists()}
    assert got == {"read refused": True, "/etc/shadow read": False, "launch refused": True, "run started": False,
                   "ran as uid 0": False, "run folder made": False, "transfer taken": False,
                   "root's folder written": False}, json.dumps(got)
    # and should a rule or a launcher ever pass them on: the launcher takes one command and nothing else
    for argv in ([node.launcher, *widened, "read"], [node.launcher, "read", *widened], [node.launcher]):
        p = subprocess.run(argv, input=json.dumps({"path": "/etc/shadow"}), capture_output=True, text=True)
        assert p.returncode == 2 and not _secret_in(p, shadow_root), (argv, p.returncode)
        assert len(p.stdout.splitlines()) == 1 and "error" in json.loads(p.stdout), p.stdout
    # and the helper itself takes the launcher's options as final: a second one is one JSON error, exit 2
    for extra, why in ((widened, "--confine given twice"), (("--min-uid", "0"), "--min-uid given twice")):
        argv = [str(node.python), "-E", "-s", str(node.helper), "--confine", str(node.root), "--min-uid", "1000",
                *extra, "read"]
        p = subprocess.run(argv, input=json.dumps({"path": "/etc/shadow"}), capture_output=True, text=True)
        assert p.returncode == 2 and p.stderr == "" and not _secret_in(p, shadow_root), (extra, p.returncode)
        [line] = p.stdout.splitlines()
        assert why in json.loads(line)["error"] and "final" in line, line
    p = subprocess.run([str(node.python), str(node.helper), "--confine", str(node.root), "read", "--confine", "/"],
                       input=json.dumps({"path": "/etc/shadow"}), capture_output=True, text=True)
    assert p.returncode == 2 and "takes no arguments after it" in p.stdout, p.returncode
    assert not mark.exists()


def test_the_sudo_rule_names_each_command_and_allows_nothing_more(node: Node) -> None:
    def allowed(*args: str) -> bool:  # sudo's own answer for the account, without running anything
        return as_user(SVC, ["sudo", "-n", "-l", node.launcher, *args]).returncode == 0

    for cmd in ("serve", "whoami", "read", "launch", "watch"):
        assert allowed(cmd), cmd
    for args in ((), ("--confine", "/", "whoami"), ("whoami", "--confine", "/"), ("--min-uid", "0", "launch"),
                 ("_wrap", "/tmp/x"), ("serve", "serve"), ("sh",)):
        assert not allowed(*args), args
    from hsched.labsetup import launcher_commands

    rule = node.sudoers.read_text().splitlines()
    assert rule == [f"{SVC} ALL=(root) NOPASSWD: {node.launcher} {cmd}" for cmd in launcher_commands()]
    assert "serve" in launcher_commands() and "whoami" in launcher_commands()
    assert not {"_wrap", "_probe_gpus"} & set(launcher_commands())
    # what the controller does first, it may: the helper answers, confined, with its protocol
    p = node.ask("whoami")
    assert p.returncode == 0, p.stdout + p.stderr
    who = json.loads(p.stdout)
    assert (who["uid"], who["confine"], who["min_uid"]) == (0, str(node.root), 1000)


def test_the_account_reads_a_members_run_log_and_nothing_else_of_theirs(node: Node) -> None:
    one = pwd.getpwnam("hslab1")
    run_dir = node.root / "runs" / "aaaaaaaaaaaa" / "1-1-1700000000000"
    ckpt = node.root / "files" / "bbbbbbbbbbbb" / "ckpt"
    private = Path(one.pw_dir) / "private"  # the -o file's mode is the user's umask's: a folder of theirs, 0700
    private.mkdir(mode=0o700, exist_ok=True)
    os.chown(private, one.pw_uid, one.pw_gid)
    out = private / "job.out"
    out.unlink(missing_ok=True)
    job = ('echo "log line"; echo "ckpt-secret" > "$HSCHED_CHECKPOINT_DIR/weights"; '
           'echo "step=1 total=2" > "$HSCHED_PROGRESS"')
    p = node.ask("launch", request={"run_dir": str(run_dir), "user": "hslab1", "base_dir": str(node.root),
                                    "command": ["sh", "-c", job], "output": str(out),
                                    "env": {"HSCHED_CHECKPOINT_DIR": str(ckpt)}})
    assert p.returncode == 0, p.stdout + p.stderr
    handle = json.loads(p.stdout)["handle"]
    deadline = time.monotonic() + 60
    while True:
        p = node.ask("status", request={"runs": [{"run_dir": str(run_dir), "handle": handle}]})
        if json.loads(p.stdout)["runs"][0]["status"] != "running":
            break
        assert time.monotonic() < deadline, p.stdout
        time.sleep(0.1)
    assert json.loads(p.stdout)["runs"][0]["exit_code"] == 0, p.stdout
    assert (ckpt / "weights").read_text() == "ckpt-secret\n" and out.read_text() == "log line\n"
    # the member's files stay theirs: the account opens none of them itself
    for path in (run_dir / "output.log", ckpt / "weights", out, run_dir / "progress.log"):
        assert as_user(SVC, ["cat", str(path)]).returncode != 0, path
    # through the helper: the run's log, which it reads for `hsched logs` (README), and nothing else
    p = node.ask("read", request={"path": str(run_dir / "output.log")})
    assert p.returncode == 0 and _secret_in(p, "log line"), p.stdout
    for path, secret in ((ckpt / "weights", "ckpt-secret"), (run_dir / "progress.log", "step=1"),
                         (out, "log line")):
        p = node.ask("read", request={"path": str(path)})
        assert p.returncode == 1 and not _secret_in(p, secret), (path, p.stdout)
        assert "error" in json.loads(p.stdout), p.stdout
