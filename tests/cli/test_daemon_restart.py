"""Version skew with real processes: hsched reinstalled under a running controller makes it restart itself on
the new install (same process, new image) while a job runs on, adopted, and requests sent meanwhile are
answered; `hsched daemon restart` does the same by hand; a loop that keeps failing shows in `daemon status`.

The "installation" here is a dist-info folder first on PYTHONPATH, so that rewriting its RECORD is a reinstall as
importlib.metadata sees it, without touching the test environment's own hsched."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hsched.client import Client
from hsched.errors import HschedError
from hsched.paths import Home
from tests.conftest import Hs, process_gone, wait_until

pytestmark = pytest.mark.slow  # controllers, the CLI and a job as real processes

METADATA = "Metadata-Version: 2.1\nName: hsched\nVersion: 0.1.0\n"


def install(site: Path, build: str) -> None:
    """(Re)write the fake installation's record: another `build` is another install."""
    info = site / "hsched-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(METADATA)
    tmp = info / "RECORD.tmp"
    tmp.write_text(f"hsched/__init__.py,sha256={build},100\n")
    tmp.replace(info / "RECORD")


def ping(home: Home) -> dict[str, Any]:
    with Client(home, autostart=False) as c:
        result: dict[str, Any] = c.call("ping")
        return result


def ping_or_none(home: Home) -> dict[str, Any] | None:
    """Ping, or None while no controller listens (between the old image and the new)."""
    try:
        return ping(home)
    except HschedError:
        return None


def diagnose(home: Home) -> str:
    """What holds the controller's lock, and the controller log's end: what a failed stop leaves to read."""
    holders = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if fd.resolve() == home.lock.resolve():
                pid = fd.parts[2]
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                holders.append(f"{pid} {cmd}")
        except OSError:
            continue
    tail = home.log.read_text().splitlines()[-40:] if home.log.exists() else []
    return "lock held by: " + ("; ".join(holders) or "nobody") + "\n" + "\n".join(tail)


@pytest.fixture
def lab(tmp_path: Path, lab_fleet: Path) -> Hs:
    site = tmp_path / "site"
    install(site, "build-one")
    hs = Hs(tmp_path / "home", fleet=lab_fleet)
    hs.env["PYTHONPATH"] = str(site)
    return hs


def test_a_reinstall_restarts_the_controller_and_the_running_job_is_adopted(lab: Hs, tmp_path: Path) -> None:
    home = Home(lab.home)
    try:
        lab.run("daemon", "start", check=True)
        jid = lab.run("submit", "--parsable", "--", "sleep", "300", check=True).stdout.strip()
        wait_until(lambda: lab.json("show", jid)["state"] == "RUNNING", "the job to run")  # type: ignore[index]
        before = ping(home)
        [run] = lab.json("show", jid)["runs"]  # type: ignore[index]
        pid = lab.controller_pid()
        assert before["install"] is not None

        failures: list[str] = []
        answered = 0
        done = threading.Event()

        def ask() -> None:  # requests all through the restart, as the CLI sends them
            nonlocal answered
            while not done.is_set():
                try:
                    with Client(home) as c:
                        c.call("queue")
                    answered += 1
                except HschedError as e:
                    failures.append(str(e))

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            t = time.monotonic()
            install(tmp_path / "site", "build-two")
            after = wait_until(lambda: (p := ping_or_none(home)) and p["install"] != before["install"] and p,
                               "the controller to restart on the new install")
        finally:
            done.set()
            asker.join()
        print(f"\nback on the new install {time.monotonic() - t:.1f} s after it was written; {answered} queue "
              "requests answered meanwhile, none failed" if not failures else "")
        assert after["started"] != before["started"]
        assert lab.controller_pid() == pid == after["pid"]  # the same process, now running the new image
        assert failures == [] and answered > 0, failures[:3]
        job = lab.json("show", jid)
        assert job["state"] == "RUNNING" and job["runs"] == [run]  # type: ignore[index]  # adopted, not run again
        assert "restarts" in home.log.read_text()
        # by hand: `hsched daemon restart` stops it and starts another; the job goes on there too
        proc = lab.run("daemon", "restart", "--json")
        assert proc.returncode == 0, f"{proc.stderr}\n{diagnose(home)}"
        restarted = json.loads(proc.stdout)
        assert restarted["running"] is True and restarted["pid"] != pid and restarted["ready"] is True
        assert process_gone(pid)
        assert lab.json("show", jid)["state"] == "RUNNING"  # type: ignore[index]
        lab.run("cancel", jid, check=True)  # and the controller there has it in hand
        assert lab.run("wait", jid, "--timeout", "60").returncode == 1
        assert lab.json("show", jid)["state"] == "CANCELLED"  # type: ignore[index]
    finally:
        lab.stop()


def test_a_round_that_keeps_failing_makes_daemon_status_unhealthy(lab: Hs, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('HSCHED_TEST_BREAK_ROUNDS'):\n"
        "    import hsched.controller.loops as loops\n"
        "    async def broken(ctl):\n"
        "        raise RuntimeError('a round broken on purpose by the test')\n"
        "    loops.one_round = broken\n")
    lab.env["HSCHED_TEST_BREAK_ROUNDS"] = "1"
    try:
        lab.run("daemon", "start", check=True)
        wait_until(lambda: lab.run("daemon", "status").returncode == 1, "the controller to be unhealthy")
        proc = lab.run("daemon", "status", "--json")
        st = json.loads(proc.stdout)
        assert proc.returncode == 1 and st["running"] is True and isinstance(st["pid"], int)
        assert st["health"] == "unhealthy"
        assert "the schedule loop failed" in st["health_error"]
        assert "RuntimeError: a round broken on purpose by the test" in st["health_error"]
        text = lab.run("daemon", "status")
        assert text.stderr.strip().splitlines() == [f"hsched: error: {st['health_error']}"] or \
            "a round broken on purpose" in text.stderr
        assert lab.run("queue").returncode == 0  # it still answers requests
    finally:
        lab.stop()
