"""A real controller on the simulated lab for the dashboard's Pilot tests, and helpers to drive the app."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hsched.client import Client
from hsched.errors import HschedError
from hsched.paths import Home
from tests.conftest import SAFETY_S

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab" / "fleet.toml"


@dataclass
class Lab:
    home: Home
    env: dict[str, str]

    def client(self) -> Client:
        return Client(self.home, autostart=False)

    def call(self, op: str, **args: Any) -> Any:
        with self.client() as c:
            return c.call(op, **args)

    def submit(self, command: list[str], *, gpus: int = 1, user: str = "alice", gpu_types: tuple[str, ...] = (),
               **spec: Any) -> int:
        table = {"command": command, "resources": {"gpus": gpus, "gpu_types": list(gpu_types)}, **spec}
        return int(self.call("submit", spec=table, source="test", user=user)["id"])

    def start(self) -> None:
        # through the CLI, so that the controller inherits HSCHED_FLEET without touching this process's environment
        subprocess.run([sys.executable, "-m", "hsched", "daemon", "start"], env=self.env, capture_output=True,
                       timeout=SAFETY_S, check=True)

    def drain_queue(self, limit_s: float = SAFETY_S) -> None:
        """Cancel every job and wait for them to end: `daemon stop` leaves running jobs running."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            jobs = self.call("queue")
            if not jobs:
                return
            for j in jobs:
                if j["state"] not in ("CANCELLED", "COMPLETED", "FAILED"):
                    with contextlib.suppress(HschedError):
                        self.call("cancel", id=j["id"])
            time.sleep(0.2)

    def stop(self) -> None:
        subprocess.run([sys.executable, "-m", "hsched", "daemon", "stop"], env=self.env, capture_output=True,
                       timeout=SAFETY_S)


def make_lab(root: Path) -> Lab:
    env = dict(os.environ, HSCHED_HOME=str(root), HSCHED_FLEET=str(LAB))
    lab = Lab(Home(root), env)
    lab.start()
    return lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One controller for a whole test module: starting one costs about a second."""
    lab = make_lab(tmp_path_factory.mktemp("dash") / "home")
    yield lab
    try:
        lab.drain_queue()
    finally:
        lab.stop()


def run(coro: Awaitable[None]) -> None:
    """Pilot tests are coroutines; run them without needing an asyncio pytest plugin."""
    asyncio.run(coro)  # type: ignore[arg-type]


async def until(pilot: Any, cond: Callable[[], object], what: str, limit_s: float = SAFETY_S) -> None:
    """Let the app run until `cond()` holds (frames arrive from another process, on its own schedule); the
    limit is a safety net against a hang, not a deadline the behaviour must meet."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)
