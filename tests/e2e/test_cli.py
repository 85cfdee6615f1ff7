"""The foundation's acceptance, end to end: the real CLI, controller, store, helper and processes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Hs, process_gone, wait_until

pytestmark = pytest.mark.slow  # every test here runs the CLI and the controller as real processes


def test_hello_exit_3(hs: Hs) -> None:
    proc = hs.run("submit", "--json", "--", "sh", "-c", "echo hello; exit 3", check=True)
    job = json.loads(proc.stdout)
    assert set(job) >= {"id", "state"}
    assert hs.run("wait", str(job["id"]), "--timeout", "120").returncode != 0
    shown = hs.json("show", str(job["id"]))
    assert shown["state"] == "FAILED" and shown["exit_code"] == 3  # type: ignore[index]
    for key in ("id", "name", "state", "reason", "qos", "priority", "user", "gpus", "command", "submit_time",
                "start_time", "end_time", "exit_code", "restarts", "placement", "runs", "events"):
        assert key in shown, key  # type: ignore[operator]
    assert shown["end_time"].endswith("Z")  # type: ignore[index]
    assert hs.run("logs", str(job["id"]), check=True).stdout == "hello\n"


def test_parsable_and_wait_success(hs: Hs, tmp_path: Path) -> None:
    marker = tmp_path / "m"
    jid = hs.run("submit", "--parsable", "--", "touch", str(marker), check=True).stdout.strip()
    assert jid.isdigit()
    assert hs.run("wait", jid, "--timeout", "120").returncode == 0
    assert marker.exists()
    queue = hs.json("queue", "--all")
    assert [j["id"] for j in queue] == [int(jid)]  # type: ignore[index,union-attr]
    assert hs.json("queue") == []


def test_job_environment(hs: Hs, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = (f"import json,os; json.dump({{k: v for k, v in os.environ.items() if k.startswith(('HSCHED', 'CUDA', "
            f"'MY'))}}, open({str(out)!r}, 'w'))")
    jid = hs.run("submit", "--parsable", "--env", "MY_VAR=a b", "--", sys.executable, "-c", code, check=True).stdout
    assert hs.run("wait", jid.strip(), "--timeout", "120").returncode == 0
    env = json.loads(out.read_text())
    assert env["MY_VAR"] == "a b"
    assert env["HSCHED_JOB_ID"] == jid.strip()
    assert env["HSCHED_RUN"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert Path(env["HSCHED_CHECKPOINT_DIR"]).is_dir()


def test_bad_input_exit_2_one_line_and_controller_keeps_serving(hs: Hs, tmp_path: Path) -> None:
    hs.run("daemon", "start", check=True)
    pid = hs.controller_pid()
    cases = {
        "misspelt.toml": 'command = ["true"]\n[resources]\ngpu = 1\n',
        "negative.toml": 'command = ["true"]\n[resources]\ngpus = -1\n',
        "impossible.toml": 'command = ["true"]\n[resources]\ngpus = 64\n',
        "broken.toml": "command = [\n",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        proc = hs.run("submit", str(p))
        assert proc.returncode == 2, (name, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (name, lines)
        assert "Traceback" not in proc.stderr
        assert name in lines[0] or "fleet" in lines[0], lines[0]
    assert "did you mean 'gpus'" in hs.run("submit", str(tmp_path / "misspelt.toml")).stderr
    assert "64 GPU" in hs.run("submit", str(tmp_path / "impossible.toml")).stderr
    assert hs.controller_pid() == pid
    assert hs.run("submit", "--parsable", "--", "true").returncode == 0


def test_cancel_running_job(hs: Hs) -> None:
    jid = hs.run("submit", "--parsable", "--", "sleep", "300", check=True).stdout.strip()
    wait_until(lambda: hs.json("show", jid)["state"] == "RUNNING", f"job {jid} to run")  # type: ignore[index]
    hs.run("cancel", jid, check=True)
    assert hs.run("wait", jid, "--timeout", "120").returncode == 1
    job = hs.json("show", jid)
    assert job["state"] == "CANCELLED"  # type: ignore[index]
    assert hs.run("cancel", "99999").returncode == 2


def test_many_jobs_each_exactly_once(hs: Hs, tmp_path: Path) -> None:
    from hsched.client import Client
    from hsched.paths import Home

    marks = tmp_path / "marks"
    marks.mkdir()
    n = 200
    ids = []
    with Client(Home(hs.home)) as c:
        for i in range(n):
            table = {"command": ["sh", "-c", f'echo $HSCHED_JOB_ID >> {marks}/{i}'], "name": f"j{i}"}
            ids.append(c.call("submit", spec=table, user="t", environ={"PATH": os.environ["PATH"]})["id"])
        reply = c.call("wait", ids=ids, timeout=240)
    assert reply["done"], [j["state"] for j in reply["jobs"] if j["state"] != "COMPLETED"][:5]
    assert all(j["state"] == "COMPLETED" for j in reply["jobs"])
    files = sorted(marks.iterdir(), key=lambda p: int(p.name))
    assert len(files) == n
    for i, f in enumerate(files):
        assert f.read_text() == f"{ids[i]}\n"  # written once, by the right job


def test_kill_9_controller_while_jobs_run(hs: Hs, tmp_path: Path) -> None:
    gates = [tmp_path / "gate0", tmp_path / "gate"]
    counts = tmp_path / "counts"
    counts.mkdir()
    ids = []
    for i in range(3):
        # job 0 ends while the controller is down (its own gate); jobs 1 and 2 end after it is back
        gate = gates[min(i, 1)]
        ids.append(hs.run("submit", "--parsable", "--", "sh", "-c",
                          f"echo run >> {counts}/{i}; while [ ! -e {gate} ]; do sleep 0.1; done; exit {i + 4}",
                          check=True).stdout.strip())

    def running_pids() -> list[int] | None:
        shown = [hs.json("show", j) for j in ids]
        if any(s["state"] != "RUNNING" or not s["runs"] or not s["runs"][-1]["pid"] for s in shown):  # type: ignore
            return None
        return [int(s["runs"][-1]["pid"]) for s in shown]  # type: ignore[index]

    job_pids = wait_until(running_pids, "the three jobs to run")
    pid = hs.controller_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: hs.controller_pid() is None, "the killed controller to let go of its lock")
    gates[0].touch()
    wait_until(lambda: process_gone(job_pids[0]), "job 0 to end while no controller runs")
    assert hs.controller_pid() is None and not process_gone(job_pids[1])
    shown = hs.json("show", ids[0])  # the next CLI call starts the controller again
    assert hs.controller_pid() not in (None, pid)
    gates[1].touch()
    assert hs.run("wait", *ids, "--timeout", "120").returncode == 1
    for i, j in enumerate(ids):
        shown = hs.json("show", j)
        assert shown["state"] == "FAILED" and shown["exit_code"] == i + 4  # type: ignore[index]
        assert len(shown["runs"]) == 1  # type: ignore[index,arg-type]
        assert (counts / str(i)).read_text() == "run\n"  # launched exactly once


def test_socket_is_private_and_other_uids_are_refused() -> None:
    import shutil
    import tempfile

    # pytest's tmp folders are 0700 to other users; this test needs a path another uid can traverse
    base = Path(tempfile.mkdtemp(prefix="hsched-uid-", dir="/tmp"))
    os.chmod(base, 0o711)
    hs = Hs(base / "home")
    try:
        _check_private_socket(hs)
    finally:
        hs.stop()
        shutil.rmtree(base, ignore_errors=True)


def _check_private_socket(hs: Hs) -> None:
    hs.run("daemon", "start", check=True)
    sock = hs.home / "controller.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    # the controller answers a refused peer at once and hangs up: read first, never race a send against it
    client = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1])\n"
        "except PermissionError:\n print('EACCES'); sys.exit(0)\n"
        "s.settimeout(60); print(s.recv(4096).decode())\n"
    )
    py = "/usr/bin/python3"
    if os.getuid() != 0 or not Path(py).exists():
        pytest.skip("needs root (to act as another uid with setpriv) and /usr/bin/python3")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", py, "-c", client, str(sock)]
    os.chmod(hs.home, 0o755)
    try:
        out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "EACCES", out
        # even with the file mode opened up, the controller checks the peer's uid (SO_PEERCRED)
        os.chmod(sock, 0o666)
        out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=120)
        assert "permission denied" in out.stdout and '"ok":false' in out.stdout, out
    finally:
        os.chmod(hs.home, 0o700)
        if sock.exists():
            os.chmod(sock, 0o600)


def test_daemon_status_and_stop(hs: Hs) -> None:
    st = hs.json("daemon", "status")
    assert st == {"running": False, "pid": None, "home": str(hs.home)} or st["running"] is False  # type: ignore[index]
    hs.run("daemon", "start", check=True)
    st = hs.json("daemon", "status")
    assert st["running"] is True and isinstance(st["pid"], int)  # type: ignore[index]
    stopped = hs.json("daemon", "stop")
    assert stopped["running"] is False  # type: ignore[index]
    assert hs.controller_pid() is None


def test_hold_release_priority_requeue(hs: Hs, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    jid = hs.run("submit", "--parsable", "--hold", "--", "sh", "-c", f"echo x >> {marker}", check=True).stdout.strip()
    # proof that the held job did not run: a job submitted after it, that fits as well, was scheduled and
    # ended; the rounds that started it saw the held job pending before it, and left it there
    later = hs.run("submit", "--parsable", "--", "true", check=True).stdout.strip()
    assert hs.run("wait", later, "--timeout", "120").returncode == 0
    job = hs.json("show", jid)
    assert job["state"] == "PENDING" and job["reason"] == "JobHeldUser"  # type: ignore[index]
    assert [e["kind"] for e in job["events"]] == ["submitted"]  # type: ignore[index]
    assert not marker.exists()
    assert hs.json("priority", jid, "7")[0]["priority"] == 7  # type: ignore[index]
    hs.run("release", jid, check=True)
    assert hs.run("wait", jid, "--timeout", "120").returncode == 0
    assert hs.run("hold", jid).returncode == 2  # ended jobs cannot be held
    requeued = hs.json("requeue", jid)[0]  # type: ignore[index]
    assert requeued["state"] == "PENDING" and requeued["restarts"] == 1
    assert hs.run("wait", jid, "--timeout", "120").returncode == 0
    assert marker.read_text() == "x\nx\n"
    assert [e["kind"] for e in hs.json("show", jid)["events"]].count("started") == 2  # type: ignore[index]


def test_a_gpu_job_waits_for_a_node_never_reached_instead_of_being_refused(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    # a node that cannot be reached (nothing listens on port 1), and this machine with no GPUs
    fleet.write_text('[[node]]\nname = "far"\nexecutor = "ssh"\nhost = "127.0.0.1"\nport = 1\n'
                     '[[node]]\nname = "here"\n')
    h = Hs(tmp_path / "home", fleet=fleet)
    try:
        jid = h.run("submit", "--parsable", "--gpus", "2", "--", "true", check=True).stdout.strip()
        job = h.json("show", jid)
        assert job["state"] == "PENDING"  # type: ignore[index]
        assert any(e["kind"] == "waiting" and "far" in e["message"] for e in job["events"])  # type: ignore[index]
        nodes = {n["name"]: n["state"] for n in h.json("nodes")}  # type: ignore[union-attr,index]
        assert nodes["far"] in ("UNREACHABLE", "DOWN") and nodes["here"] == "UP"
        assert h.run("submit", "--gpus", "0", "--parsable", "--", "true").returncode == 0
    finally:
        h.stop()


def test_a_broken_fleet_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "a"\nexecuter = "local"\n')
    h = Hs(tmp_path / "home", fleet=fleet)
    proc = h.run("queue")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hsched: error: {fleet}: node[0].executer: unknown key (did you mean 'executor'?)"]
    assert h.controller_pid() is None
