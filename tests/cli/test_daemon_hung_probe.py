"""A hung `nvidia-smi` on this machine (a stub first on PATH that never answers and ignores SIGTERM): the real
controller answers `queue` at once from the first second, the node is UNHEALTHY within its probe timeout (and
says why), a simulated node beside it runs jobs, and after `hsched daemon stop` no hung probe is alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hsched.client import Client
from hsched.controller.health import PROBE_TIMEOUT_S
from hsched.errors import ControllerError
from hsched.paths import Home
from tests.conftest import Hs, wait_until
from tests.procs import processes

pytestmark = pytest.mark.slow  # a controller, its helpers and hung stubs as real processes

HUNG = "876543"
"""The stub's sleep: how its processes are told apart from everything else on the machine."""
STUB = f"#!/bin/sh\n# a hung nvidia-smi: never answers, ignores polite signals\ntrap '' TERM INT HUP\nsleep {HUNG}\n"
FLEET = ('[[node]]\nname = "here"\n\n'  # this machine, its GPUs probed for real: the stub answers for them
         '[[node]]\nname = "sim"\n[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 2\n')


def helpers_of(home: Path) -> list[int]:
    """Node helper processes (server, sampler, one-shot) started by the controller of `home` (they inherit its
    HSCHED_HOME); job wrappers are the jobs' own."""
    mark = f"HSCHED_HOME={home}".encode()
    out = []
    for p in processes():
        if p.state == "Z" or not any(a.endswith(b"nodehelper.py") for a in p.argv) or b"_wrap" in p.argv:
            continue
        try:
            if mark in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0"):
                out.append(p.pid)
        except OSError:
            continue
    return out


def stubs() -> list[int]:
    return [p.pid for p in processes() if p.state != "Z" and any(HUNG.encode() in a for a in p.argv)]


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[Hs]:
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "nvidia-smi").write_text(STUB)
    (stub / "nvidia-smi").chmod(0o755)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    hs = Hs(tmp_path / "home", fleet=fleet)
    hs.env["PATH"] = f"{stub}:{hs.env['PATH']}"
    try:
        yield hs
    finally:
        hs.stop()
        for pid in stubs():  # whatever a failed test left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def nodes(home: Home) -> dict[str, dict[str, Any]]:
    with Client(home, autostart=False) as c:
        return {n["name"]: n for n in c.call("nodes")}


def test_a_hung_gpu_probe_never_holds_up_the_controller(hung: Hs) -> None:
    home = Home(hung.home)
    home.ensure()
    t0 = time.monotonic()
    # started as the CLI starts it on demand (its own session), so that "from the first second" is measurable
    subprocess.Popen([sys.executable, "-m", "hsched.controller.server", str(home.root)], env=hung.env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, cwd="/")

    def answers() -> bool:
        try:
            with Client(home, autostart=False) as c:
                c.call("ping")
            return True
        except ControllerError:
            return False

    wait_until(answers, "the controller to answer", every_s=0.01)
    listening_s = time.monotonic() - t0
    wait_until(stubs, "the GPU probe to hang on the stub", every_s=0.01)
    assert nodes(home)["here"]["state"] == "PROBING"  # a hung probe: not UP with 0 GPUs
    wait_until(lambda: time.monotonic() >= t0 + 1.0, "the first second after start", every_s=0.01)
    took = []
    for _ in range(100):  # what `hsched queue` asks, each on a connection of its own as the CLI does
        t = time.perf_counter()
        with Client(home, autostart=False) as c:
            c.call("queue")
        took.append((time.perf_counter() - t) * 1000)
    p99 = sorted(took)[98]
    probing_during = time.monotonic() - t0 < PROBE_TIMEOUT_S
    here = wait_until(lambda: (n := nodes(home)["here"])["state"] == "UNHEALTHY" and n,
                      "the node to be unhealthy", every_s=0.05)
    unhealthy_s = time.monotonic() - t0
    cli = time.perf_counter()
    assert hung.run("queue").returncode == 0
    cli_ms = (time.perf_counter() - cli) * 1000
    print(f"\nlistening {listening_s:.2f} s after start; queue p99 {p99:.1f} ms (max {max(took):.1f} ms, all "
          f"during the hung probe: {probing_during}); UNHEALTHY after {unhealthy_s:.1f} s ({here['message']}); "
          f"a whole `hsched queue` process {cli_ms:.0f} ms")
    assert p99 < 200, sorted(took)[-5:]
    # the node's helper kills its hung GPU tool within the bound it was given (half the probe's timeout) and
    # says so; the controller's own timeout is the net under that
    assert here["message"].startswith(f"GPU probe did not answer within {PROBE_TIMEOUT_S / 2:g} s"), here
    assert unhealthy_s <= PROBE_TIMEOUT_S + 5.0, unhealthy_s  # its timeout, plus a loaded machine's slack
    # the simulated node beside it works; nothing goes to the unhealthy one
    jid = hung.run("submit", "--parsable", "--gpus", "1", "--", "true", check=True).stdout.strip()
    assert hung.run("wait", jid, "--timeout", "120").returncode == 0
    assert hung.json("show", jid)["placement"][0]["node"] == "sim"  # type: ignore[index]
    status = hung.json("daemon", "status")
    assert status["health"] == "ok" and status["unhealthy_nodes"] == ["here"]  # type: ignore[index]
    pid = hung.controller_pid()
    hanging = len(stubs())  # the helper kills its hung GPU tools itself; any still hanging must go with the stop
    assert helpers_of(hung.home)  # the proof below looks for the right processes
    assert hung.run("daemon", "stop").returncode == 0
    assert hung.controller_pid() is None
    # killed at the stop with the helpers that ran them: gone once the kernel has delivered the SIGKILLs
    wait_until(lambda: not stubs(), f"no hung probe of controller {pid} alive after daemon stop ({hanging} were "
                                    "before it)", every_s=0.05)
    wait_until(lambda: not helpers_of(hung.home), "no node helper of the controller alive after daemon stop",
               every_s=0.05)
