"""The node helper with real processes and signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hsched.node import nodehelper, procfs, records

pytestmark = pytest.mark.slow  # real processes

HELPER = str(Path(nodehelper.__file__).resolve())


def call(cmd: str, req: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, HELPER, cmd], input=json.dumps(req or {}), capture_output=True, text=True,
                         timeout=60)
    return json.loads(out.stdout)


def wait_status(run_dir: str, want: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = call("status", {"runs": [{"run_dir": run_dir}]})["runs"][0]
        if st["status"] == want or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def test_probe_reports_this_machine() -> None:
    p = call("probe")
    assert p["cpus"] == os.cpu_count()
    assert p["memory_total_mib"] > 0
    assert p["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert isinstance(p["gpus"]["devices"], list)


def test_launch_runs_detached_and_records_exit_code(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "runs" / "r1")
    arg = "it's; $(rm -rf /) \"quoted\"\nnewline ünïcode"
    h = call("launch", {"run_dir": run_dir, "command": [sys.executable, "-c",
             "import os,sys; print(sys.argv[1]); print(os.environ['X']); sys.exit(3)", arg],
             "env": {"X": "a b;c"}})["handle"]
    assert h["pid"] > 0 and h["pgid"] != h["pid"]
    st = wait_status(run_dir, "exited")
    assert st["exit_code"] == 3 and st["signal"] is None
    assert (Path(run_dir) / "output.log").read_text() == f"{arg}\na b;c\n"
    exit_json = json.loads((Path(run_dir) / "exit.json").read_text())
    assert exit_json["exit_code"] == 3


def test_launch_is_idempotent_per_run_dir(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "r")
    marker = tmp_path / "count"
    cmd = ["sh", "-c", f"echo x >> {marker}"]
    h1 = call("launch", {"run_dir": run_dir, "command": cmd})["handle"]
    h2 = call("launch", {"run_dir": run_dir, "command": cmd})["handle"]
    assert h1 == h2
    wait_status(run_dir, "exited")
    assert marker.read_text() == "x\n"


def test_signal_reaches_the_job_and_the_wrapper_records_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "r")
    h = call("launch", {"run_dir": run_dir, "command": ["sleep", "60"]})["handle"]
    assert wait_status(run_dir, "running")["status"] == "running"
    assert call("signal", {"handle": h, "signal": "TERM"})["sent"] is True
    st = wait_status(run_dir, "exited")
    assert st["signal"] == signal.SIGTERM and st["exit_code"] == 128 + signal.SIGTERM


def test_kill_all_processes_finds_setsid_escapees(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "r")
    pidfile = tmp_path / "escapee.pid"
    script = (f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 1; done' & "
              "trap '' TERM; while :; do sleep 1; done")
    h = call("launch", {"run_dir": run_dir, "command": ["sh", "-c", script]})["handle"]
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    escapee = int(pidfile.read_text())
    call("signal", {"handle": h, "signal": "KILL", "all_processes": True})
    wait_status(run_dir, "exited")
    deadline = time.monotonic() + 5
    while procfs.proc_start_ticks(escapee) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procfs.proc_start_ticks(escapee) is None


def test_status_of_unknown_and_reused_pids(tmp_path: Path) -> None:
    assert call("status", {"runs": [{"run_dir": str(tmp_path / "never")}]})["runs"][0]["status"] == "not_started"
    run_dir = tmp_path / "fake"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text("{}")
    # a handle naming a live process (ourselves) with the wrong start time: pid reuse, not our run
    (run_dir / "handle.json").write_text(json.dumps({"run_dir": str(run_dir), "pid": os.getpid(), "pgid": os.getpid(),
                                                     "start_ticks": 1, "boot_id": records.boot_id()}))
    st = call("status", {"runs": [{"run_dir": str(run_dir)}]})["runs"][0]
    assert st["status"] == "lost"
    h = json.loads((run_dir / "handle.json").read_text())
    assert call("signal", {"handle": h, "signal": "TERM"})["sent"] is False


def test_missing_program_is_exit_127(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "r")
    call("launch", {"run_dir": run_dir, "command": ["/no/such/program"]})
    st = wait_status(run_dir, "exited")
    assert st["exit_code"] == 127
    assert "cannot start" in (Path(run_dir) / "output.log").read_text()


def test_bad_request_is_a_json_error() -> None:
    out = subprocess.run([sys.executable, HELPER, "launch"], input="{not json", capture_output=True, text=True)
    assert out.returncode == 1 and "error" in json.loads(out.stdout)


def test_run_is_pinned_to_its_cores(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "r")
    allowed = sorted(os.sched_getaffinity(0))
    want = [*allowed[:1], 10_000]  # a core this machine does not have is dropped, not an error
    call("launch", {"run_dir": run_dir, "cpus": want, "command": [
        sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), os.environ['HSCHED_CPUS'])"]})
    assert wait_status(run_dir, "exited")["exit_code"] == 0
    assert (Path(run_dir) / "output.log").read_text() == f"{allowed[:1]} {allowed[0]}\n"
