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


def test_a_member_is_told_the_lab_is_down_and_restart_brings_back_the_lab(users: LabUsers) -> None:
    base = world_folder("hsched-split-")
    home = base / "home"
    sock = base / "run" / "hsched.sock"
    python = lab_python(base)
    places = {"HSCHED_LAB_HOME": str(home), "HSCHED_LAB_SOCKET": str(sock)}
    root_env = {k: v for k, v in os.environ.items() if not k.startswith("HSCHED_")}
    root_env.update(places)
    home.mkdir(mode=0o711)
    (home / "fleet.toml").write_text('[[node]]\nname = "here"\nexecutor = "local"\n[node.simulate]\n'
                                     'model = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
    (home / "settings.toml").write_text("poll_interval_s = 0.2\n")

    def root(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "hsched", *args], env=root_env, capture_output=True, text=True,
                              timeout=300, cwd="/")

    def member(*args: str) -> subprocess.CompletedProcess[str]:
        return as_user("hslab1", ["env", *(f"{k}={v}" for k, v in places.items()), str(python), "-m", "hsched",
                                  *args], timeout=300)

    try:
        started = root("daemon", "start", "--lab", "--json")
        assert started.returncode == 0, started.stderr
        assert json.loads(started.stdout)["mode"] == "lab"
        assert member("queue").returncode == 0
        stopped = root("daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        for argv in (["queue"], ["submit", "--", "true"]):
            p = member(*argv)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 1, (argv, p.stdout, p.stderr)
            assert len(lines) == 1 and "the lab's controller does not answer" in lines[0], p.stderr
        assert _controllers_of("hslab1") == []
        # restart as root, with no HSCHED_HOME: the same lab comes back
        back = root("daemon", "restart", "--json")
        assert back.returncode == 0, back.stderr
        assert json.loads(back.stdout)["mode"] == "lab"
        status = json.loads(member("daemon", "status", "--json").stdout)
        assert (status["mode"], status["running"]) == ("lab", True)
        assert member("submit", "--", "true").returncode == 0
        assert not (Path("/root/.local/state/hsched") / "controller.sock").exists()
    finally:
        root("daemon", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_prod_is_granted_by_a_reload_and_revoked_by_sighup(users: LabUsers) -> None:
    """Issue 29, items 2 and 4, live: a member's `--qos prod` is one line, exit 1, nothing queued; an admin's grant
    applied with `hsched daemon reload` lets the same submit through; SIGHUP (`systemctl reload`) reads the file
    again too."""
    base = world_folder("hsched-qos-")
    home = base / "home"
    python = lab_python(base)
    places = {"HSCHED_LAB_HOME": str(home), "HSCHED_LAB_SOCKET": str(base / "run" / "hsched.sock")}
    root_env = {k: v for k, v in os.environ.items() if not k.startswith("HSCHED_")}
    root_env.update(places)
    home.mkdir(mode=0o711)
    (home / "fleet.toml").write_text('[[node]]\nname = "here"\nexecutor = "local"\n[node.simulate]\n'
                                     'model = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
    (home / "settings.toml").write_text("poll_interval_s = 0.2\n")

    def root(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "hsched", *args], env=root_env, capture_output=True, text=True,
                              timeout=300, cwd="/")

    def member(*args: str) -> subprocess.CompletedProcess[str]:
        return as_user("hslab1", ["env", *(f"{k}={v}" for k, v in places.items()), str(python), "-m", "hsched",
                                  *args], timeout=300)

    prod = ("submit", "--qos", "prod", "--hold", "--", "true")
    try:
        started = root("daemon", "start", "--lab", "--json")
        assert started.returncode == 0, started.stderr
        pid = json.loads(started.stdout)["pid"]
        refused = member(*prod)
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "hslab1 may not use QoS prod" in refused.stderr
        assert json.loads(member("queue", "--json").stdout) == []
        (home / "settings.toml").write_text('poll_interval_s = 0.2\n[qos.prod]\npreempts = ["normal", "scavenger"]\n'
                                            'allow = ["hslab1"]\n')
        assert member("daemon", "reload").returncode == 1  # an admin's action
        reloaded = root("daemon", "reload")
        assert reloaded.returncode == 0 and "qos" in reloaded.stdout, reloaded.stdout + reloaded.stderr
        assert member(*prod).returncode == 0
        # revoked in the file, applied by SIGHUP: refused again once the controller has read it
        (home / "settings.toml").write_text("poll_interval_s = 0.2\n")
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 120  # a safety net: the refusal is the event waited for
        while member(*prod).returncode == 0:
            assert time.monotonic() < deadline, "SIGHUP did not reload the settings"
            time.sleep(0.2)
    finally:
        root("daemon", "stop")
        shutil.rmtree(base, ignore_errors=True)
