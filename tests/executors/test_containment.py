"""Runs are contained (issue 12): what a run leaves behind is killed when its main process ends and the exit
record comes only after; a run whose wrapper died is ended before it is called lost; memory and CPU limits
hold and an OOM kill is reported; a checkpoint exit behind a shell is the run's; a batch-only signal reaches
the batch shell alone; the processes left on the run's GPUs are in the exit record.

Each containment test runs twice: with the run's own cgroups (this machine and CI run the tests as root, so
they are made and the test checks they were), and with the fallback (HSCHED_CONTAINMENT=pgroup: the process
group, the wrapper's descendants and the run's marker).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.local import LocalExecutor

from hsched.model import GpuHolder, RunStatus
from hsched.node import cgroups, nodehelper, signals, wrap
from tests.conftest import process_gone, wait_until
from tests.executors.jobs import RECORDER, TRAINER
from tests.executors.waits import wait_exited

pytestmark = pytest.mark.slow  # real processes

HELPER = str(Path(nodehelper.__file__).resolve())


def call(cmd: str, req: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, HELPER, cmd], input=json.dumps(req), capture_output=True, text=True,
                         timeout=120)
    reply: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return reply


def launch(run_dir: Path, command: list[str], **extra: Any) -> dict[str, Any]:
    reply = call("launch", {"run_dir": str(run_dir), "command": command, **extra})
    assert "handle" in reply, reply
    handle: dict[str, Any] = reply["handle"]
    return handle


def exit_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "exit.json"
    wait_until(path.exists, f"{path}")
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def status(run_dir: Path) -> dict[str, Any]:
    st: dict[str, Any] = call("status", {"runs": [{"run_dir": str(run_dir)}]})["runs"][0]
    return st


def signal_run(handle: dict[str, Any], sig: str, **how: bool) -> bool:
    return bool(call("signal", {"handle": handle, "signal": sig, **how})["sent"])


def pid_in(path: Path) -> int:
    """The pid a job wrote to `path` (written to a temporary name and renamed: never half a number)."""
    wait_until(path.exists, f"{path}")
    return int(path.read_text())


def cgroups_usable() -> bool:
    return "v2" in cgroups.cgroup_places() and (os.geteuid() == 0 or bool(os.environ.get("HSCHED_CGROUP_ROOT")))


@pytest.fixture(params=["cgroup", "pgroup"])
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How runs are contained in this test; the helpers it starts inherit the choice from the environment."""
    if request.param == "pgroup":
        monkeypatch.setenv("HSCHED_CONTAINMENT", "pgroup")
    else:
        monkeypatch.delenv("HSCHED_CONTAINMENT", raising=False)
        if not cgroups_usable():
            pytest.skip("no writable cgroup v2 here (not root, and HSCHED_CGROUP_ROOT names no delegated folder)")
    return str(request.param)


def assert_contained(handle: dict[str, Any], containment: str) -> None:
    info = json.loads((Path(handle["run_dir"]) / "handle.json").read_text())
    assert info["containment"] == containment
    if containment == "cgroup":
        assert info["cgroups"]["v2"] and info["subreaper"] is True


def test_what_a_run_leaves_is_killed_within_2s_of_its_end(containment: str, tmp_path: Path) -> None:
    # a background child, a setsid'd escapee, and one that also dropped the run's marker variable
    script = (
        f"sleep 77 & echo $! > {tmp_path}/bg.t && mv {tmp_path}/bg.t {tmp_path}/bg; "
        f"setsid sh -c 'echo $$ > {tmp_path}/esc.t && mv {tmp_path}/esc.t {tmp_path}/esc; exec sleep 78' & "
        f"env -u HSCHED_RUN_DIR setsid sh -c 'echo $$ > {tmp_path}/nomark.t && mv {tmp_path}/nomark.t "
        f"{tmp_path}/nomark; exec sleep 79' & "
        f"while [ ! -e {tmp_path}/esc ] || [ ! -e {tmp_path}/nomark ]; do sleep 0.01; done; exit 0"
    )
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["sh", "-c", script])
    assert_contained(handle, containment)
    record = exit_record(run_dir)
    written = (run_dir / "exit.json").stat().st_mtime
    leftovers = [pid_in(tmp_path / name) for name in ("bg", "esc", "nomark")]
    # the exit record is written only once nothing of the run is left: at that moment all three are gone
    assert [process_gone(pid) for pid in leftovers] == [True, True, True]
    assert record["exit_code"] == 0 and record["signal"] is None and record["oom"] is False
    assert record["leftovers_killed"] == 3 and record["stuck_pids"] == [] and record["gpu_left"] == []
    assert written - record["end_time"] < 2.0  # from the main process's end to nothing left
    info = json.loads((run_dir / "handle.json").read_text())
    assert [p for p in info["cgroups"].values() if os.path.exists(p)] == []  # its cgroups are removed


def test_runs_go_under_a_delegated_cgroup_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    places = cgroups.cgroup_places()
    if "v2" not in places or os.geteuid() != 0:
        pytest.skip("making a folder to delegate needs root and cgroup v2")
    delegated = Path(places["v2"]["mount"]) / f"hsched-test-{os.getpid()}"
    delegated.mkdir()
    monkeypatch.setenv("HSCHED_CGROUP_ROOT", str(delegated))
    monkeypatch.delenv("HSCHED_CONTAINMENT", raising=False)
    try:
        run_dir = tmp_path / "run"
        handle = launch(run_dir, ["sh", "-c", f"sleep 77 & echo $! > {tmp_path}/bg.t && mv {tmp_path}/bg.t "
                                              f"{tmp_path}/bg; exit 0"])
        info = json.loads((run_dir / "handle.json").read_text())
        assert Path(info["cgroups"]["v2"]).parent == delegated
        assert exit_record(run_dir)["leftovers_killed"] == 1 and process_gone(pid_in(tmp_path / "bg"))
        assert list(delegated.glob("run-*")) == [] and handle["pid"] == info["pid"]
    finally:
        for p in delegated.glob("run-*"):
            p.rmdir()
        delegated.rmdir()


def test_a_run_whose_wrapper_was_killed_is_ended_before_it_is_lost(containment: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["sh", "-c", f"sleep 77 & echo $! > {tmp_path}/bg.t && mv {tmp_path}/bg.t "
                                          f"{tmp_path}/bg; wait"])
    assert_contained(handle, containment)
    bg = pid_in(tmp_path / "bg")
    os.kill(handle["pid"], signal.SIGKILL)
    wait_until(lambda: process_gone(handle["pid"]), "the wrapper to die")
    st = wait_until(lambda: (s := status(run_dir))["status"] == "lost" and s, "the run to be reported lost")
    # never lost while a process of the run still runs: both were gone when it said so
    assert process_gone(bg) and process_gone(handle["pgid"])
    assert st["detail"] == "process gone without an exit code"


def test_an_oom_kill_is_in_the_exit_record(tmp_path: Path) -> None:
    if not cgroups_usable():
        pytest.skip("no writable cgroup here")
    run_dir = tmp_path / "run"
    handle = launch(run_dir, [sys.executable, "-c", "x = b'a' * (300 << 20); print('survived', len(x))"],
                    memory_mib=64)
    info = json.loads((run_dir / "handle.json").read_text())
    assert "memory" in info["enforced"], info
    record = exit_record(run_dir)
    assert record["oom"] is True and record["exit_code"] == 128 + signal.SIGKILL
    assert "survived" not in (run_dir / "output.log").read_text()
    st = status(run_dir)
    assert st["status"] == "exited" and st["oom"] is True and st["handle"]["pid"] == handle["pid"]


def test_the_cpu_quota_is_applied(tmp_path: Path) -> None:
    if not cgroups_usable():
        pytest.skip("no writable cgroup here")
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["sleep", "60"], cpu_limit=0.5)
    info = json.loads((run_dir / "handle.json").read_text())
    assert "cpu" in info["enforced"], info
    v2 = info["cgroups"]["v2"]
    if "cpu" in Path(v2, "cgroup.controllers").read_text().split():
        where = v2
        assert Path(v2, "cpu.max").read_text().split() == ["50000", "100000"]
    else:  # a hybrid machine whose cpu controller is on cgroup v1
        where = info["cgroups"]["cpu"]
        assert Path(where, "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert Path(where, "cpu.cfs_period_us").read_text().strip() == "100000"
    assert str(handle["pgid"]) in Path(where, "cgroup.procs").read_text().split()  # the job is under it
    assert signal_run(handle, "KILL", all_processes=True)
    assert exit_record(run_dir)["exit_code"] == 128 + signal.SIGKILL
    assert not os.path.exists(where)


def test_a_checkpoint_exit_behind_a_shell_is_the_runs(containment: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAINER)
    run_dir = tmp_path / "run"
    # bash runs the trainer as a child (a command follows it), so the checkpoint signal kills bash itself
    handle = launch(run_dir, ["bash", "-c", f"{sys.executable} {tmp_path}/train.py; true"],
                    checkpoint_exit_code=85, stop_grace_s=60)
    assert_contained(handle, containment)
    wait_until(lambda: "ready" in (run_dir / "output.log").read_text(), "the trainer to start")
    assert signal_run(handle, "USR1", all_processes=True)
    record = exit_record(run_dir)
    assert (record["exit_code"], record["signal"]) == (85, None)
    assert record["main_exit"] == {"exit_code": 128 + signal.SIGUSR1, "signal": signal.SIGUSR1}
    assert (run_dir / "output.log").read_text() == "ready\nsaving\n"  # one signal, one checkpoint
    [sent] = [json.loads(line) for line in (run_dir / "signals.log").read_text().splitlines()]
    assert (sent["signal"], sent["all_processes"], sent["batch_only"]) == ("USR1", True, False)


def test_a_signalled_runs_rest_gets_the_stop_grace_then_is_killed(containment: str, tmp_path: Path) -> None:
    # the main shell dies of SIGTERM; its child ignores SIGTERM and would run on for ever
    run_dir = tmp_path / "run"
    script = (f"sh -c 'trap \"\" TERM; echo $$ > {tmp_path}/c.t && mv {tmp_path}/c.t {tmp_path}/c; exec sleep 300' "
              "& wait")
    handle = launch(run_dir, ["sh", "-c", script], stop_grace_s=1)
    assert_contained(handle, containment)
    child = pid_in(tmp_path / "c")
    assert signal_run(handle, "TERM")
    record = exit_record(run_dir)
    waited = (run_dir / "exit.json").stat().st_mtime - record["end_time"]
    assert process_gone(child) and record["leftovers_killed"] == 1
    assert (record["exit_code"], record["signal"]) == (128 + signal.SIGTERM, signal.SIGTERM)
    # the rest had its grace and the margin (the controller's SIGKILL normally comes first), then no more
    assert 1 + wrap.STOP_MARGIN_S <= waited < 1 + wrap.STOP_MARGIN_S + 10


def test_without_a_signal_from_hsched_the_shell_code_stands(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAINER)
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["bash", "-c", f"{sys.executable} {tmp_path}/train.py; true"],
                    checkpoint_exit_code=85)
    wait_until(lambda: "ready" in (run_dir / "output.log").read_text(), "the trainer to start")
    os.killpg(handle["pgid"], signal.SIGUSR1)  # someone else's signal: not a stop hsched asked for
    record = exit_record(run_dir)
    assert (record["exit_code"], record["signal"]) == (128 + signal.SIGUSR1, signal.SIGUSR1)


def test_batch_only_reaches_only_the_batch_shell(containment: str, tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    got = tmp_path / "got"
    run_dir = tmp_path / "run"
    shell = f"trap 'echo shell got USR1; exit 3' USR1; {sys.executable} {tmp_path}/recorder.py {got} & wait"
    handle = launch(run_dir, ["bash", "-c", shell], stop_grace_s=60)
    assert_contained(handle, containment)
    wait_until(Path(f"{got}.ready").exists, "the child to start")
    assert signal_run(handle, "USR1", batch_only=True)
    wait_until(lambda: "shell got USR1" in (run_dir / "output.log").read_text(), "the shell's trap")
    # the child is still there (a signalled run's rest may finish): USR2 to everyone now reaches it, and
    # USR1, sent before and lower-numbered, would have been noted first had it reached it
    assert signal_run(handle, "USR2", all_processes=True)
    wait_until(lambda: got.exists() and "SIGUSR2" in got.read_text(), "the child to get USR2")
    assert got.read_text() == "SIGUSR2\n"
    assert signal_run(handle, "KILL", all_processes=True)
    assert exit_record(run_dir)["exit_code"] == 3


def test_each_process_of_the_run_gets_a_signal_once(containment: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # two deliveries close together often merge into one pending signal, so count the sends themselves
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["sh", "-c", f"sleep 60 & setsid sh -c 'echo $$ > {tmp_path}/esc.t && "
                                          f"mv {tmp_path}/esc.t {tmp_path}/esc; exec sleep 61' & wait"])
    assert_contained(handle, containment)
    escapee = pid_in(tmp_path / "esc")
    sends: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, _sig: sends.append(("kill", pid)))
    monkeypatch.setattr(os, "killpg", lambda pgid, _sig: sends.append(("killpg", pgid)))
    try:
        reply = signals.send_signal({"handle": handle, "signal": "USR1", "all_processes": True})
    finally:
        monkeypatch.undo()
    assert reply == {"sent": True}
    assert sorted(sends) == [("kill", escapee), ("killpg", handle["pgid"])]  # not the group's members again
    assert signal_run(handle, "KILL", all_processes=True)
    exit_record(run_dir)
    assert process_gone(escapee)


STUB_SMI = """#!/bin/sh
case "$*" in
  *--query-compute-apps=gpu_uuid,pid,process_name,used_memory*)
    echo "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59, 4242, /usr/bin/python3, 1024"
    echo "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59, 4243, /opt/my app/serve,v2, [N/A]"
    echo "GPU-9c2e7d11-0000-4c6b-9a8e-2d1f0c3b4a59, 77, /usr/bin/Xorg, 10"
    ;;
  *) exit 9 ;;
esac
"""


def test_the_processes_left_on_the_runs_gpus_are_in_the_exit_record(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STUB_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ours = ("GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59", "GPU-5e0f2a44-1111-4c6b-9a8e-2d1f0c3b4a59")
    record = exit_record(Path(launch(tmp_path / "run", ["true"], devices=list(ours))["run_dir"]))
    assert record["gpu_left"] == [{"uuid": ours[0], "pid": 4242, "name": "/usr/bin/python3"},
                                  {"uuid": ours[0], "pid": 4243, "name": "/opt/my app/serve,v2"}]
    assert "gpu_check_error" not in record
    assert exit_record(Path(launch(tmp_path / "none", ["true"])["run_dir"]))["gpu_left"] == []  # no GPUs, no check


async def test_the_local_executor_reports_the_exit_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STUB_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    uuid = "GPU-1b7a3e2c-5f0d-4c6b-9a8e-2d1f0c3b4a59"
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(tmp_path / "run"), command=("sh", "-c", "exit 4"),
                                          devices=(uuid,)))
        rep = await wait_exited(ex, h)
        record = json.loads((tmp_path / "run" / "exit.json").read_text())
        assert rep.status is RunStatus.EXITED and rep.exit_code == 4 and rep.oom is False
        assert rep.end_time == record["end_time"]
        assert rep.gpu_left == (GpuHolder(uuid, 4242, "/usr/bin/python3"),
                                GpuHolder(uuid, 4243, "/opt/my app/serve,v2"))
        [again] = await ex.status([StatusQuery(h.run_dir, h)])
        assert again == rep
    finally:
        await ex.close()


def test_the_run_folder_is_private_whatever_the_umask(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    req = json.dumps({"run_dir": str(run_dir), "command": ["sh", "-c", "echo secret"]})
    out = subprocess.run(["sh", "-c", f'umask 000; exec "$0" {HELPER} launch', sys.executable], input=req,
                         capture_output=True, text=True, timeout=120)
    handle = json.loads(out.stdout)["handle"]
    exit_record(run_dir)
    assert signal_run(handle, "TERM") is False  # ended: nothing to signal, and nothing recorded
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert set(modes) == {"spec.json", "handle.json", "output.log", "wrapper.log", "exit.json"}
    assert set(modes.values()) == {0o600}


def test_signals_log_is_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    handle = launch(run_dir, ["sleep", "60"])
    assert signal_run(handle, "KILL")
    exit_record(run_dir)
    assert stat.S_IMODE((run_dir / "signals.log").stat().st_mode) == 0o600
