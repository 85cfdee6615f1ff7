"""A lab never silently splits (issue 29, items 3 and 4), end to end: root starts a lab controller without
systemd and with nothing but the lab's well-known places set; a member finds it down: `hsched queue` and `hsched
submit` exit 1 with one line, and no controller of the member's exists afterwards (pgrep); `hsched daemon
restart` as root brings back the lab (not root's personal controller), and the member's queue works again. And
prod is not everyone's (item 2): granted by `hsched daemon reload`, revoked by SIGHUP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.labusers import LabUsers, as_user, lab_python, world_folder


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


def _controllers_of(user: str) -> list[str]:
    p = subprocess.run(["pgrep", "-u", user, "-f", "hsched.controller"], capture_output=True, text=True)
    return p.stdout.split()


class SplitLab:
    """A lab at its well-known places moved under /tmp (HSCHED_LAB_HOME, HSCHED_LAB_SOCKET, nothing else set):
    root's CLI, and a member's with a login's bare environment plus those two places."""

    def __init__(self, prefix: str) -> None:
        self.base = world_folder(prefix)
        self.home = self.base / "home"
        self.python = lab_python(self.base)
        self.places = {"HSCHED_LAB_HOME": str(self.home), "HSCHED_LAB_SOCKET": str(self.base / "run" / "hsched.sock")}
        self.root_env = {k: v for k, v in os.environ.items() if not k.startswith("HSCHED_")}
        self.root_env.update(self.places)
        self.home.mkdir(mode=0o711)
        (self.home / "fleet.toml").write_text('[[node]]\nname = "here"\nexecutor = "local"\n[node.simulate]\n'
                                              'model = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
        (self.home / "settings.toml").write_text("poll_interval_s = 0.2\n")

    def root(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), "-m", "hsched", *args], env=self.root_env, capture_output=True,
                              text=True, timeout=300, cwd="/")

    def member(self, *args: str) -> subprocess.CompletedProcess[str]:
        return as_user("hslab1", ["env", *(f"{k}={v}" for k, v in self.places.items()), str(self.python), "-m",
                                  "hsched", *args], timeout=300)

    def start(self) -> int:
        """`daemon start --lab` as root; the controller's pid."""
        started = self.root("daemon", "start", "--lab", "--json")
        assert started.returncode == 0, started.stderr
        info = json.loads(started.stdout)
        assert info["mode"] == "lab"
        return int(info["pid"])


@pytest.fixture
def lab(users: LabUsers, request: pytest.FixtureRequest) -> Iterator[SplitLab]:
    made = SplitLab(f"hsched-{request.node.name[:20]}-")
    try:
        yield made
    finally:
        made.root("daemon", "stop")
        shutil.rmtree(made.base, ignore_errors=True)


def test_a_member_is_told_the_lab_is_down_and_restart_brings_back_the_lab(lab: SplitLab) -> None:
    lab.start()
    assert lab.member("queue").returncode == 0
    stopped = lab.root("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    for argv in (["queue"], ["submit", "--", "true"]):
        p = lab.member(*argv)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1, (argv, p.stdout, p.stderr)
        assert len(lines) == 1 and "the lab's controller does not answer" in lines[0], p.stderr
    assert _controllers_of("hslab1") == []
    # restart as root, with no HSCHED_HOME: the same lab comes back
    back = lab.root("daemon", "restart", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["mode"] == "lab"
    status = json.loads(lab.member("daemon", "status", "--json").stdout)
    assert (status["mode"], status["running"]) == ("lab", True)
    assert lab.member("submit", "--", "true").returncode == 0
    assert not (Path("/root/.local/state/hsched") / "controller.sock").exists()


def test_prod_is_granted_by_a_reload_and_revoked_by_sighup(lab: SplitLab) -> None:
    """Issue 29, items 2 and 4, live: a member's `--qos prod` is one line, exit 1, nothing queued; an admin's grant
    applied with `hsched daemon reload` lets the same submit through; SIGHUP (`systemctl reload`) reads the file
    again too."""
    prod = ("submit", "--qos", "prod", "--hold", "--", "true")
    pid = lab.start()
    refused = lab.member(*prod)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "hslab1 may not use QoS prod" in refused.stderr
    assert json.loads(lab.member("queue", "--json").stdout) == []
    (lab.home / "settings.toml").write_text('poll_interval_s = 0.2\n[qos.prod]\npreempts = ["normal", "scavenger"]\n'
                                            'allow = ["hslab1"]\n')
    assert lab.member("daemon", "reload").returncode == 1  # an admin's action
    reloaded = lab.root("daemon", "reload")
    assert reloaded.returncode == 0 and "qos" in reloaded.stdout, reloaded.stdout + reloaded.stderr
    assert lab.member(*prod).returncode == 0
    # revoked in the file, applied by SIGHUP: refused again once the controller has read it
    (lab.home / "settings.toml").write_text("poll_interval_s = 0.2\n")
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 120  # a safety net: the refusal is the event waited for
    while lab.member(*prod).returncode == 0:
        assert time.monotonic() < deadline, "SIGHUP did not reload the settings"
        time.sleep(0.2)
