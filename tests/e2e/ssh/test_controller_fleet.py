"""The controller over SSH: unreachable hosts, leases, fencing, and a checkpoint that follows its job."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SAFETY_S, Hs
from tests.e2e.ssh.hosts import TestHost, TestHosts

pytestmark = pytest.mark.slow  # real sshd hosts and processes

TRAINER = str(REPO / "examples" / "trainer.py")


def fleet(hosts: list[TestHost], path: Path) -> Path:
    parts = []
    for h in hosts:
        parts.append(f'[[node]]\nname = "{h.name}"\nexecutor = "ssh"\nhost = "{h.name}"\n'
                     '[node.simulate]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 1\n')
    path.write_text("\n".join(parts))
    return path


@pytest.fixture
def ctl(ssh_hosts: TestHosts, tmp_path: Path) -> Iterator[Callable[..., Hs]]:
    made: list[Hs] = []

    def make(hosts: list[TestHost], **settings: Any) -> Hs:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        text = "poll_interval_s = 0.2\nheartbeat_timeout_s = 3\n" + "".join(f"{k} = {v}\n" for k, v in settings.items())
        (home / "settings.toml").write_text(text)
        h = Hs(home, fleet=fleet(hosts, tmp_path / "fleet.toml"))
        h.env.update(ssh_hosts.env())
        made.append(h)
        return h

    yield make
    for h in made:
        for job in h.json("queue"):  # type: ignore[union-attr]
            h.run("cancel", str(job["id"]))  # type: ignore[index]
        h.stop()
    for host in ssh_hosts:
        if host.frozen or (host.veth and not _link_up(host)):
            host.restore()


def _link_up(host: TestHost) -> bool:
    import subprocess

    out = subprocess.run(["ip", "link", "show", str(host.veth)], capture_output=True, text=True)
    return "state DOWN" not in out.stdout


def wait_until(pred: Callable[[], Any], timeout: float = SAFETY_S, step: float = 0.2) -> Any:
    """Poll until `pred()` is true; the timeout is a safety net for a loaded machine, not the behaviour."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(step)


def job(h: Hs, jid: str) -> dict[str, Any]:
    return h.json("show", jid)  # type: ignore[return-value]


def node_state(h: Hs, name: str) -> str:
    return next(n["state"] for n in h.json("nodes") if n["name"] == name)  # type: ignore[union-attr,index]


def test_cut_within_the_lease_reattaches_and_keeps_the_real_exit_code(
        ssh_hosts: TestHosts, ctl: Callable[..., Hs], tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    h = ctl(list(ssh_hosts)[:2], lease_s=120)
    jid = h.run("submit", "--parsable", "--gpus", "1", "--", "sh", "-c",
                f"echo start >> {marks}/$HSCHED_RUN; sleep 14; echo done >> {marks}/$HSCHED_RUN; exit 7",
                check=True).stdout.strip()
    wait_until(lambda: job(h, jid)["state"] == "RUNNING")
    where = job(h, jid)["placement"][0]["node"]
    host = next(x for x in ssh_hosts if x.name == where)
    t0 = time.monotonic()
    host.cut()
    try:
        wait_until(lambda: node_state(h, where) == "UNREACHABLE", 15)
        assert time.monotonic() - t0 <= 15  # heartbeats time out after 3 s: detected in seconds, not minutes
        j = job(h, jid)
        assert j["state"] == "RUNNING" and j["restarts"] == 0  # unreachable, but not requeued within the lease
    finally:
        host.restore()
    wait_until(lambda: node_state(h, where) == "UP")
    assert h.run("wait", jid, "--timeout", "120", timeout=180).returncode == 1
    j = job(h, jid)
    assert j["state"] == "FAILED" and j["exit_code"] == 7 and len(j["runs"]) == 1
    assert (marks / "1").read_text() == "start\ndone\n"


def test_cut_beyond_the_lease_requeues_elsewhere_and_fences_the_stale_copy(
        ssh_hosts: TestHosts, ctl: Callable[..., Hs], tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    h = ctl(list(ssh_hosts)[:2], lease_s=5)
    script = (f'echo "$HSCHED_NODE" > {marks}/start.$HSCHED_RUN; '
              'if [ "$HSCHED_RUN" = 1 ]; then sleep 60; else sleep 3; fi; '
              f'echo "$HSCHED_NODE" > {marks}/done.$HSCHED_RUN')
    jid = h.run("submit", "--parsable", "--gpus", "1", "--", "sh", "-c", script, check=True).stdout.strip()
    wait_until(lambda: (marks / "start.1").exists())
    first = (marks / "start.1").read_text().strip()
    host = next(x for x in ssh_hosts if x.name == first)
    host.cut()
    try:
        wait_until(lambda: job(h, jid)["restarts"] == 1)
        wait_until(lambda: (marks / "start.2").exists())
        assert (marks / "start.2").read_text().strip() != first  # requeued elsewhere
    finally:
        host.restore()
    wait_until(lambda: node_state(h, first) == "UP")
    assert h.run("wait", jid, "--timeout", "120", timeout=180).returncode == 0
    events = [e["kind"] for e in job(h, jid)["events"]]
    assert "node_lost" in events
    wait_until(lambda: "fenced" in [e["kind"] for e in job(h, jid)["events"]])
    # fenced: the stale copy was killed before it could finish, so only the second run wrote its end
    assert sorted(p.name for p in marks.iterdir()) == ["done.2", "start.1", "start.2"]  # one copy finished


def test_preempted_job_resumes_on_another_host_with_its_checkpoint(
        ssh_hosts: TestHosts, ctl: Callable[..., Hs]) -> None:
    h = ctl(list(ssh_hosts)[:2], lease_s=120)
    # 300 steps of 0.1 s: a loaded machine's slow CLI cannot let it finish before the preemption reaches it
    scav = h.run("submit", "--parsable", "--gpus", "1", "--qos", "scavenger", "--checkpoint-signal", "USR1@10",
                 "--", "python3", TRAINER, "--steps", "300", "--step-seconds", "0.1", check=True).stdout.strip()
    wait_until(lambda: job(h, scav)["state"] == "RUNNING")
    first = job(h, scav)["placement"][0]["node"]
    blocker = h.run("submit", "--parsable", "--gpus", "1", "--qos", "prod", "--", "sleep", "300",
                    check=True).stdout.strip()
    wait_until(lambda: job(h, blocker)["state"] == "RUNNING")
    wait_until(lambda: "step 5\n" in h.run("logs", scav).stdout)
    prod = h.run("submit", "--parsable", "--gpus", "1", "--qos", "prod", "--", "sleep", "300",
                 check=True).stdout.strip()
    wait_until(lambda: job(h, prod)["state"] == "RUNNING")
    log1 = wait_until(lambda: (out := h.run("logs", scav, "--run", "1").stdout) and "checkpointed at step " in out
                      and out)
    saved = int(log1.split("checkpointed at step ")[1].split()[0])
    h.run("cancel", blocker, check=True)
    assert h.run("wait", scav, "--timeout", "240", timeout=300).returncode == 0
    j = job(h, scav)
    assert j["placement"][0]["node"] != first
    moved = [e for e in j["events"] if e["kind"] == "checkpoint_moved"]
    assert moved, [e["message"] for e in j["events"]]
    log2 = h.run("logs", scav, "--run", "2").stdout
    assert log2.startswith(f"starting at step {saved} ") and log2.rstrip().endswith("done")
    h.run("cancel", prod)
