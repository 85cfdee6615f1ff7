"""CUDA MPS for a GPU shared by several runs (issue 15, item 4), on the node: the run wrapper starts one MPS
control daemon per GPU before a shared run's job starts, with the GPU's UUID and the pipe and log folders of
the controller's contract, never two for one GPU when shared runs start at once, and stops it when the GPU's
last shared run has ended; a node without nvidia-cuda-mps-control runs the job anyway and records that. Real
helper, wrappers and jobs; `nvidia-cuda-mps-control` is tests/executors/fake_mps_control.py on PATH."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hsched.executors.base import LaunchRequest
from hsched.executors.local import LocalExecutor

from hsched.model import RunHandle
from hsched.node import mps as node_mps
from hsched.node import procfs
from tests.executors.waits import wait_exited
from tests.labusers import LabUsers, lab_python, world_folder

pytestmark = pytest.mark.slow  # real helper, wrapper, daemon and job processes

GPU_A = "GPU-8c5b2e1a-3f7d-4b9e-a1c2-0d4e5f6a7b8c"
GPU_B = "GPU-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"
FAKE = Path(__file__).with_name("fake_mps_control.py")


@dataclass(frozen=True, slots=True)
class Node:
    base: Path
    """HSCHED_MPS_BASE: short, under /tmp (a UNIX socket's path has at most 107 bytes)."""
    bin: Path
    """Where the fake nvidia-cuda-mps-control is, when the node has it."""
    work: Path

    def pipe(self, uuid: str) -> Path:
        return self.base / ("nvidia-mps-" + uuid)

    def log(self, uuid: str) -> Path:
        return self.base / ("nvidia-mps-log-" + uuid)

    def started(self, uuid: str) -> list[dict]:
        """The daemons the fake started for this GPU (each writes one record into its log folder)."""
        return [json.loads(p.read_text()) for p in sorted(self.log(uuid).glob("started-*.json"))]

    def env(self, uuid: str, percentage: int = 25) -> dict[str, str]:
        """What the controller gives a shared run (the contract)."""
        return {"CUDA_VISIBLE_DEVICES": uuid, "HSCHED_SHARED_GPU": uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(uuid)), "CUDA_MPS_LOG_DIRECTORY": str(self.log(uuid)),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percentage)}

    def request(self, name: str, uuid: str, **kw: object) -> LaunchRequest:
        """A run that prints its MPS variables and waits until the file `go-NAME` is there."""
        go = self.work / ("go-" + name)
        script = f'env | grep ^CUDA_ | sort; while [ ! -e "{go}" ]; do sleep 0.02; done'
        env = dict(self.env(uuid), **kw.pop("env", {}))  # type: ignore[arg-type]
        return LaunchRequest(run_dir=str(self.work / "runs" / name), command=("sh", "-c", script), env=env,
                             inherit_env=True, devices=(uuid,), **kw)  # type: ignore[arg-type]

    def go(self, name: str) -> None:
        (self.work / ("go-" + name)).touch()


def _daemon_pid(pipe: Path) -> int | None:
    return node_mps.mps_daemon_pid(str(pipe))


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="hm", dir="/tmp")) / "mps"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / node_mps.MPS_CONTROL
    exe.write_text(f"#!{sys.executable}\n{FAKE.read_text()}")
    exe.chmod(0o755)
    monkeypatch.setenv(node_mps.MPS_BASE_ENV, str(base))
    n = Node(base=base, bin=bin_dir, work=tmp_path)
    try:
        yield n
    finally:
        # a daemon a failing test left behind must not outlive it
        for pid_file in base.glob("nvidia-mps-*/" + node_mps.MPS_PID_FILE):
            pid = _daemon_pid(pid_file.parent)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base.parent, ignore_errors=True)


def _with_mps(monkeypatch: pytest.MonkeyPatch, node: Node) -> None:
    monkeypatch.setenv("PATH", f"{node.bin}:{os.environ['PATH']}")


def _exists(path: str) -> bool:
    return Path(path).exists()


def _handle_json(h: RunHandle) -> dict:
    return json.loads((Path(h.run_dir) / "handle.json").read_text())


def _exit_json(h: RunHandle) -> dict:
    return json.loads((Path(h.run_dir) / "exit.json").read_text())


async def test_one_daemon_per_gpu_started_once_stopped_after_the_last_run(node: Node,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    # the daemon takes a while to come up: two runs starting at once would both start one without the lock
    (node.bin / "fake-mps.json").write_text(json.dumps({"ready_delay_s": 0.3}))
    ex = LocalExecutor()
    try:
        a1, a2, b = await asyncio.gather(ex.launch(node.request("a1", GPU_A)), ex.launch(node.request("a2", GPU_A)),
                                         ex.launch(node.request("b", GPU_B, env={
                                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})))
        # one daemon for GPU A, however the two starts interleaved; it was up before either job started
        [started_a] = node.started(GPU_A)
        states = sorted(_handle_json(h)["mps"]["state"] for h in (a1, a2))
        assert states == ["joined", "started"]
        pid_a = _daemon_pid(node.pipe(GPU_A))
        assert pid_a == started_a["pid"] and all(_handle_json(h)["mps"]["daemon"] == pid_a for h in (a1, a2))
        # the daemon serves exactly that GPU through the contract's folders, with nothing of the job's env
        env = started_a["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == GPU_A
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(node.pipe(GPU_A))
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(node.log(GPU_A))
        assert "HSCHED_RUN_DIR" not in env and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
        assert started_a["uid"] == os.geteuid()
        # the helper's account's daemon (root here); its folders are passable for every user's clients when
        # it is root's, this account's alone when not
        mode = 0o755 if os.geteuid() == 0 else 0o700
        for d in (node.base, node.pipe(GPU_A), node.log(GPU_A)):
            assert d.stat().st_mode & 0o777 == mode and d.stat().st_uid == os.geteuid()
        # not a process of either run: not the wrappers' child, in none of their sessions nor the jobs'
        stat = procfs.proc_stat(pid_a)
        assert stat is not None
        _state, ppid, _pgrp, session, _ticks = stat
        assert ppid not in (a1.pid, a2.pid) and session not in (a1.pid, a2.pid, a1.pgid, a2.pgid)
        # another GPU, another daemon; each job sees the variables it was given
        [started_b] = node.started(GPU_B)
        assert started_b["env"]["CUDA_VISIBLE_DEVICES"] == GPU_B and started_b["pid"] != pid_a
        assert _handle_json(b)["mps"]["state"] == "started"
        log_b = await _wait_log(ex, b.run_dir, b"CUDA_VISIBLE_DEVICES")
        assert b"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n" in log_b
        assert f"CUDA_MPS_PIPE_DIRECTORY={node.pipe(GPU_B)}\n".encode() in log_b

        # the first of A's runs ends: the other still runs on A's daemon
        node.go("a1")
        await wait_exited(ex, a1)
        assert _exit_json(a1)["mps"] == {"gpu": GPU_A, "runs_left": 1}
        assert _daemon_pid(node.pipe(GPU_A)) == pid_a
        # the last one ends: its exit is reported only once the daemon is gone (an exclusive job may follow)
        node.go("a2")
        rep = await wait_exited(ex, a2)
        assert rep.exit_code == 0
        assert _exit_json(a2)["mps"] == {"gpu": GPU_A, "runs_left": 0, "stopped": pid_a}
        assert _daemon_pid(node.pipe(GPU_A)) is None and not procfs.is_live(pid_a)
        assert not (node.pipe(GPU_A) / node_mps.MPS_PID_FILE).exists()
        assert "Command 'quit'" in (node.log(GPU_A) / "control.log").read_text()
        # B's daemon was never A's business
        assert _daemon_pid(node.pipe(GPU_B)) == started_b["pid"]
        node.go("b")
        await wait_exited(ex, b)
        assert _daemon_pid(node.pipe(GPU_B)) is None
        # a later shared run on A starts a fresh daemon
        again = await ex.launch(node.request("a3", GPU_A))
        assert _handle_json(again)["mps"]["state"] == "started" and len(node.started(GPU_A)) == 2
        node.go("a3")
        await wait_exited(ex, again)
        assert _daemon_pid(node.pipe(GPU_A)) is None
    finally:
        await ex.close()


async def test_a_run_whose_wrapper_died_does_not_keep_the_daemon(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    ex = LocalExecutor()
    try:
        a1 = await ex.launch(node.request("a1", GPU_A))
        a2 = await ex.launch(node.request("a2", GPU_A))
        pid_a = _daemon_pid(node.pipe(GPU_A))
        assert pid_a is not None
        # a1's wrapper is killed outright (it cannot uncount itself); its job goes with the run
        os.kill(a1.pid, signal.SIGKILL)
        node.go("a1")
        node.go("a2")
        await wait_exited(ex, a2)
        # the last live run stops the daemon: the dead wrapper's entry does not count
        assert _exit_json(a2)["mps"]["stopped"] == pid_a
        assert _daemon_pid(node.pipe(GPU_A)) is None
    finally:
        await ex.close()


async def test_an_exclusive_run_stops_a_daemon_no_shared_run_counts_on(node: Node,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    ex = LocalExecutor()
    try:
        a1 = await ex.launch(node.request("a1", GPU_A))
        pid_a = _daemon_pid(node.pipe(GPU_A))
        assert pid_a is not None
        # the shared run's wrapper dies without uncounting it (a kill, the node's helper going down): the
        # daemon is left behind, counted on by nobody
        os.kill(a1.pid, signal.SIGKILL)
        node.go("a1")
        await wait_exited(ex, a1)
        assert _daemon_pid(node.pipe(GPU_A)) == pid_a
        # an exclusive run on that GPU: the daemon is stopped before its job starts
        pid_file = node.pipe(GPU_A) / node_mps.MPS_PID_FILE
        x = await ex.launch(LaunchRequest(
            run_dir=str(node.work / "runs" / "x"), command=("sh", "-c", f'test -e "{pid_file}" || echo no-mps'),
            env={"CUDA_VISIBLE_DEVICES": GPU_A}, inherit_env=True, devices=(GPU_A, GPU_B)))
        await wait_exited(ex, x)
        assert _handle_json(x)["mps_swept"] == [{"gpu": GPU_A, "stopped": pid_a}]  # B never had one
        assert (Path(x.run_dir) / "output.log").read_text() == "no-mps\n"
        assert not procfs.is_live(pid_a)
    finally:
        await ex.close()


async def test_an_exclusive_run_leaves_a_daemon_live_shared_runs_use(node: Node,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    ex = LocalExecutor()
    try:
        a1 = await ex.launch(node.request("a1", GPU_A))
        pid_a = _daemon_pid(node.pipe(GPU_A))
        x = await ex.launch(LaunchRequest(run_dir=str(node.work / "runs" / "x"), command=("true",),
                                          env={"CUDA_VISIBLE_DEVICES": GPU_A}, inherit_env=True, devices=(GPU_A,)))
        await wait_exited(ex, x)
        assert "mps_swept" not in _handle_json(x) and _daemon_pid(node.pipe(GPU_A)) == pid_a
        node.go("a1")
        await wait_exited(ex, a1)
    finally:
        await ex.close()


async def test_without_mps_control_the_runs_run_time_sliced_and_say_so(node: Node) -> None:
    assert shutil.which(node_mps.MPS_CONTROL) is None  # this machine has no NVIDIA driver tools
    ex = LocalExecutor()
    try:
        a1, a2 = await asyncio.gather(ex.launch(node.request("a1", GPU_A)), ex.launch(node.request("a2", GPU_A)))
        for h in (a1, a2):
            mps = _handle_json(h)["mps"]
            assert mps["state"] == "absent" and mps["gpu"] == GPU_A
            assert "no nvidia-cuda-mps-control on this node" in mps["detail"] and "time-sliced" in mps["detail"]
        node.go("a1")
        node.go("a2")
        for h in (a1, a2):
            rep = await wait_exited(ex, h)
            assert rep.exit_code == 0
            assert "mps" not in _exit_json(h)
        log = await ex.read_log(a1.run_dir, 0)
        assert f"CUDA_MPS_PIPE_DIRECTORY={node.pipe(GPU_A)}\n".encode() in log  # as the controller gave it
        assert not node.base.exists()  # nothing made for a daemon that cannot be
    finally:
        await ex.close()


async def test_an_exclusive_run_touches_no_daemon(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(node.work / "runs" / "x"), command=("true",),
                                          env={"CUDA_VISIBLE_DEVICES": GPU_A}, inherit_env=True, devices=(GPU_A,)))
        await wait_exited(ex, h)
        assert "mps" not in _handle_json(h) and "mps" not in _exit_json(h)
        assert not node.base.exists()
    finally:
        await ex.close()


async def test_folders_come_from_the_uuid_never_from_the_request(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    ex = LocalExecutor()
    try:
        elsewhere = str(node.work / "elsewhere")
        h = await ex.launch(node.request("a1", GPU_A, env={"CUDA_MPS_PIPE_DIRECTORY": elsewhere}))
        mps = _handle_json(h)["mps"]
        assert mps["state"] == "refused" and elsewhere in mps["detail"]
        assert node.started(GPU_A) == [] and not _exists(elsewhere)
        node.go("a1")
        assert (await wait_exited(ex, h)).exit_code == 0  # the job runs, without MPS
        bad = await ex.launch(node.request("a2", "GPU-../../etc", env={"CUDA_VISIBLE_DEVICES": GPU_A}))
        assert _handle_json(bad)["mps"]["state"] == "refused"
        node.go("a2")
        await wait_exited(ex, bad)
    finally:
        await ex.close()


async def test_a_folder_someone_else_made_is_refused(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_mps(monkeypatch, node)
    node.base.mkdir(parents=True)
    os.symlink(str(node.work), str(node.pipe(GPU_A)))  # laid in /tmp before the helper came
    ex = LocalExecutor()
    try:
        h = await ex.launch(node.request("a1", GPU_A))
        mps = _handle_json(h)["mps"]
        assert mps["state"] == "failed" and "is not a folder of uid" in mps["detail"]
        assert node.started(GPU_A) == []
        node.go("a1")
        assert (await wait_exited(ex, h)).exit_code == 0
    finally:
        await ex.close()


async def _wait_log(ex: LocalExecutor, run_dir: str, text: bytes) -> bytes:
    while True:
        log = await ex.read_log(run_dir, 0)
        if text in log:
            return log
        await asyncio.sleep(0.02)


def test_after_a_shared_run_the_gpus_other_runs_are_not_left_behind(tmp_path: Path) -> None:
    """The GPU check after a shared run ends: the GPU's other runs (their marker names another run folder) and
    the MPS daemon or server hold it by right; a process of no run does not."""
    import subprocess

    mine, other = str(tmp_path / "runs" / "a1"), str(tmp_path / "runs" / "a2")
    env = dict(os.environ)
    env.pop(procfs.RUN_MARKER, None)
    procs = [subprocess.Popen(["sleep", "60"], env=dict(env, **{procfs.RUN_MARKER: other})),
             subprocess.Popen(["sleep", "60"], env=env),
             subprocess.Popen(["sleep", "60"], env=dict(env, **{procfs.RUN_MARKER: mine}))]
    try:
        holders = [{"uuid": GPU_A, "pid": p.pid, "name": "python3"} for p in procs]
        holders.append({"uuid": GPU_A, "pid": procs[1].pid, "name": "/usr/bin/nvidia-cuda-mps-server"})
        left = node_mps.others_on_shared_gpu(holders, mine)
        # a stranger, and a process of this very run (it should be gone: it is left behind)
        assert [h["pid"] for h in left] == [procs[1].pid, procs[2].pid]
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ------------------------------------------------------------------------------------------------ lab mode


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


async def test_two_users_clients_reach_the_one_root_daemon(users: LabUsers, node: Node,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab: the helper is root, the shared runs are two users'. One daemon, root's; each user's job, as its
    user, talks to it through the folders hsched made (as a CUDA client's first contact does)."""
    lab = world_folder("hsched-mps-lab-")
    try:
        os.chmod(node.base.parent, 0o711)  # what /tmp is to /tmp/hsched-mps: a folder anyone passes through
        bin_dir = lab / "bin"
        bin_dir.mkdir(mode=0o755)
        exe = bin_dir / node_mps.MPS_CONTROL  # one the users may run too
        exe.write_text(f"#!{lab_python(lab)}\n{FAKE.read_text()}")
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        script = "id -un; echo get_server_list | nvidia-cuda-mps-control && echo reached"
        ex = LocalExecutor()
        try:
            hs = await asyncio.gather(*(
                ex.launch(LaunchRequest(run_dir=str(lab / "runs" / user), command=("sh", "-c", script),
                                        env=node.env(GPU_A), user=user, base_dir=str(lab), devices=(GPU_A,)))
                for user in ("hslab1", "hslab2")))
            reps = [await wait_exited(ex, h) for h in hs]
        finally:
            await ex.close()
        for user, h, rep in zip(("hslab1", "hslab2"), hs, reps, strict=True):
            log = (Path(h.run_dir) / "output.log").read_text()
            assert rep.exit_code == 0 and log.startswith(f"{user}\n") and log.endswith("reached\n"), log
        [started] = node.started(GPU_A)
        assert started["uid"] == 0  # root's, as NVIDIA's multi-user setup has it: it serves every uid
        control_log = (node.log(GPU_A) / "control.log").read_text()
        assert control_log.count("Command 'get_server_list'") == 2 and "Command 'quit'" in control_log
        assert _daemon_pid(node.pipe(GPU_A)) is None  # stopped after the last of the two
    finally:
        shutil.rmtree(lab, ignore_errors=True)
