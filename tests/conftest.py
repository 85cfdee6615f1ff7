"""Shared fixtures: a private HSCHED_HOME per test, the CLI as a real subprocess, the data in tests/fixtures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
# Captured tool outputs and traces the tests read, copied into the repository (see tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Real-time tests wait for the event they need, never for a wall-clock deadline shorter than the behaviour
# allows: this bound is only a safety net against a hang, far above what a loaded 2-core machine takes.
SAFETY_S = 120.0

T = TypeVar("T")


def wait_until(cond: Callable[[], T], what: str, limit_s: float = SAFETY_S, every_s: float = 0.1) -> T:
    """Poll `cond()` until it returns something true, and return that; fail only after the safety net."""
    deadline = time.monotonic() + limit_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:g} s waiting for {what}")
        time.sleep(every_s)


def process_gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie nobody reaped counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast lane (`-m "not slow"`) starts no process: a test that does must be marked `slow`.

    Every way the tests start one goes through subprocess.Popen (asyncio's subprocesses too) or os.fork.
    """
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it slow (pytest.mark.slow)")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)


class Hs:
    """Runs `hsched ...` as a subprocess against one HSCHED_HOME."""

    def __init__(self, home: Path, fleet: Path | None = None) -> None:
        self.home = home
        self.env = dict(os.environ)
        self.env["HSCHED_HOME"] = str(home)
        self.env.pop("HSCHED_FLEET", None)
        if fleet is not None:
            self.env["HSCHED_FLEET"] = str(fleet)

    def run(self, *args: str, check: bool = False, timeout: float = 300,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "hsched", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"hsched {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> object:
        proc = self.run(*args, "--json", check=True)
        return json.loads(proc.stdout)

    def controller_pid(self) -> int | None:
        from hsched.client import controller_pid
        from hsched.paths import Home

        return controller_pid(Home(self.home))

    def stop(self) -> None:
        """Cancel what still runs (jobs outlive the controller), then stop the controller."""
        pid = self.controller_pid()
        if pid is None:
            return
        active = self.run("queue", "--json", timeout=60)
        if active.returncode == 0:
            ids = [str(j["id"]) for j in json.loads(active.stdout)]
            if ids:
                self.run("cancel", *ids, timeout=60)
                self.run("wait", *ids, "--timeout", "120", timeout=300)
        self.run("daemon", "stop", timeout=60)
        if self.controller_pid() is not None:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


@pytest.fixture
def hs(tmp_path: Path) -> Iterator[Hs]:
    h = Hs(tmp_path / "home")
    yield h
    h.stop()


def write_fleet(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def lab_fleet() -> Path:
    return REPO / "examples" / "lab" / "fleet.toml"
