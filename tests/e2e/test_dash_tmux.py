"""Smoke test: `hsched dash` in a real terminal (tmux) on the simulated lab; keys in, text read with capture-pane."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SAFETY_S, wait_until
from tests.tui.conftest import Lab, make_lab

pytestmark = [
    pytest.mark.slow,  # a real controller and a real terminal
    pytest.mark.skipif(shutil.which("tmux") is None,
                       reason="tmux is not installed (.ci/run installs it): the smoke test needs a terminal"),
]


class Tmux:
    """A private tmux server (its own socket), so that nothing else running tmux is touched."""

    def __init__(self, name: str) -> None:
        self.base = ["tmux", "-L", name]

    def __call__(self, *args: str) -> str:
        # COLUMNS / LINES from the caller would override the pane's real size (Textual honours them)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=SAFETY_S, env=env).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "dash")

    def wait_for(self, text: str, *, gone: bool = False, limit_s: float = SAFETY_S) -> str:
        """Until `text` is on the screen (or, with gone, off it); the limit is only a safety net."""
        deadline = time.monotonic() + limit_s
        while True:
            screen = self.screen()
            if (text in screen) != gone:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never {'left' if gone else 'appeared'}; the screen was:\n{screen}")
            time.sleep(0.2)


@pytest.fixture
def lab_home(tmp_path: Path) -> Iterator[Lab]:
    lab = make_lab(tmp_path / "home")
    yield lab
    try:
        lab.drain_queue()
    finally:
        lab.stop()


def test_dash_in_tmux(lab_home: Lab) -> None:
    lab = lab_home
    jid = lab.submit(["sleep", "300"], gpus=2, name="smoke-job", user=os.environ.get("USER", "root"))
    tmux = Tmux(f"hsched-dash-{os.getpid()}")
    env = [arg for k in ("HSCHED_HOME", "HSCHED_FLEET", "PATH", "HOME") for arg in ("-e", f"{k}={lab.env[k]}")]
    tmux("new-session", "-d", "-s", "dash", "-x", "120", "-y", "36", *env, sys.executable, "-m", "hsched", "dash",
         "--interval", "0.5")
    try:
        tmux.wait_for("dgx-h100")  # Fleet view: every node
        tmux.wait_for("H100 80GB HBM3")
        tmux("send-keys", "-t", "dash", "3")
        # the Jobs view's header first: the job's name shows on the Fleet view's history panel too
        tmux.wait_for("JOBID")
        tmux.wait_for("smoke-job")
        tmux("send-keys", "-t", "dash", "2")
        tmux.wait_for("nvlink0")  # Topology view of the first node: its NVLink domain (one graph, topo show's)
        tmux("send-keys", "-t", "dash", "?")
        tmux.wait_for("hsched dash: keys")
        tmux("send-keys", "-t", "dash", "Escape")
        # a key sent before the app has taken Escape alone would read as Alt+key: wait for the help to close
        tmux.wait_for("hsched dash: keys", gone=True)
        tmux("send-keys", "-t", "dash", "1")
        tmux.wait_for("UTIL 60")
        tmux("send-keys", "-t", "dash", "q")
        wait_until(lambda: "dash" not in tmux("list-sessions"), "q to quit the dashboard (its tmux session ends)")
    finally:
        tmux("kill-server")
    lab.call("cancel", id=jid)
