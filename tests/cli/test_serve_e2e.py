"""A service end to end (issue 30): the CLI, a controller, the local executor, real replicas (the stand-in model server,
examples/serve/standin.py) behind the real router. Requests through `serve show`'s address succeed; under a load
of three requests at a time it scales 1 -> 2 (the autoscaler's own decision), and back to 1 (`serve scale`) with no
failed request; a killed replica is replaced; `serve stop` ends it. Real processes and real time: slow lane; every
wait is for an event (a state the CLI reports), the timeouts only safety nets."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAFETY_S, Hs

pytestmark = pytest.mark.slow

FLEET = """
[[node]]
name = "a"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 4
topology = "nvswitch"
"""


@pytest.fixture
def hs(tmp_path: Path) -> Any:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text("poll_interval_s = 0.2\nkill_after_s = 2\n")
    h = Hs(tmp_path / "home", fleet=fleet)
    yield h
    h.run("serve", "stop", "chat", timeout=60)
    h.stop()


def wait_until(pred: Any, timeout: float = SAFETY_S, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)


def show(h: Hs) -> dict[str, Any]:
    return h.json("serve", "show", "chat")  # type: ignore[return-value]


def generate(address: str, tokens: int = 100) -> tuple[int, str]:
    body = json.dumps({"context_tokens": 200, "generated_tokens": tokens}).encode()
    req = urllib.request.Request(f"{address}/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())["replica"]
    except urllib.error.HTTPError as e:
        return e.code, ""


class Load:
    """`n` clients, each sending its next request when the last is answered, until stopped: every status kept."""

    def __init__(self, address: str, n: int) -> None:
        self.address, self.statuses, self.stopping = address, [], threading.Event()
        self.replicas: set[str] = set()
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def client(self) -> None:
        while not self.stopping.is_set():
            status, replica = generate(self.address, tokens=400)  # about 0.5 s each at the stand-in's speed 1
            self.statuses.append(status)
            self.replicas.add(replica)

    def stop(self) -> list[int]:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=SAFETY_S)
        return self.statuses


def replica_pid(service: str, replica: str) -> int | None:
    """The replica's process: the one of ours whose environment names the service and replica."""
    mine = os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != mine:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (f"HSCHED_SERVICE={service}".encode() in env and f"HSCHED_REPLICA={replica}".encode() in env
                and b"standin" in cmd):
            return int(entry.name)
    return None


def test_a_service_scales_and_replaces_a_killed_replica(hs: Hs) -> None:
    bad = hs.run("serve", "start", "chat", "--replicas", "3-1", "--slo", "p99=2s", "--", "true")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--replicas '3-1'" in bad.stderr
    out = hs.run("serve", "start", "chat", "--replicas", "1-2", "--gpus-per-replica", "1", "--ready", "/health",
                 "--slo", "p99=2s", "--target-concurrency", "1", "--json", "--",
                 sys.executable, "-m", "hsched.examples.serve.standin", "--load-s", "0.5", "--speed", "1", check=True)
    started = json.loads(out.stdout)
    address = started["address"]
    assert started["replicas"]["wanted"] == 1
    wait_until(lambda: show(hs)["replicas"]["ready"] == 1)
    assert generate(address)[0] == 200
    s = show(hs)
    assert s["cold_start_s"] is not None and s["cold_start_s"] >= 0.5  # launch to ready: at least its load time
    assert any("ready on a" in e["message"] for e in s["events"])
    (replica,) = s["instances"]
    job = hs.json("show", str(replica["job"]))
    assert (job["workload"], job["service"], job["replica"]) == ("inference", "chat", 0)

    # three clients at a time against a target of one in flight per replica: the autoscaler adds the second
    load = Load(address, 3)
    try:
        wait_until(lambda: show(hs)["replicas"]["ready"] == 2)
        wait_until(lambda: len(load.replicas) == 2)  # both take requests
        scaled = hs.json("serve", "scale", "chat", "1-1")  # and back down, the load still on: drained first
        assert scaled["replicas"]["wanted"] == 1
        wait_until(lambda: show(hs)["replicas"] == {"min": 1, "max": 1, "wanted": 1, "ready": 1, "starting": 0,
                                                    "draining": 0})
    finally:
        statuses = load.stop()
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests, not all answered: {set(statuses)}"
    s = show(hs)
    messages = [e["message"] for e in s["events"]]
    assert any("scale up 1 -> 2" in m for m in messages)
    assert any("drained and stopped" in m for m in messages)
    assert s["stats"]["errors"] == 0 and s["requests"] == len(statuses) + 1

    # a replica killed is replaced, and the service answers again
    (live,) = s["instances"]
    pid = wait_until(lambda: replica_pid("chat", str(live["replica"])))
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: any("ended unasked" in e["message"] for e in show(hs)["events"]))
    wait_until(lambda: show(hs)["replicas"]["ready"] == 1)
    assert show(hs)["instances"][0]["job"] != live["job"]
    assert generate(address)[0] == 200

    # a restarted controller listens on the same address and adopts the running replica
    before = show(hs)["instances"][0]["job"]
    hs.run("daemon", "restart", check=True)
    wait_until(lambda: show(hs)["replicas"]["ready"] == 1)
    again = show(hs)
    assert again["address"] == address and again["instances"][0]["job"] == before
    assert any("adopted 1 replica job(s)" in e["message"] for e in again["events"])
    assert generate(address)[0] == 200

    text = hs.run("serve", "show", "chat", check=True).stdout
    assert address in text and "1 ready" in text and "p99 2000 ms" in text
    listed = hs.json("serve", "list")
    assert [x["name"] for x in listed] == ["chat"]
    status = hs.json("daemon", "status")
    assert [x["name"] for x in status["services"]] == ["chat"]
    hs.run("serve", "stop", "chat", check=True)
    wait_until(lambda: show(hs)["state"] == "stopped")
