"""One executor protocol, three transports: the fake, the local and the ssh executor behave the same.

Each test runs against every kind (the `node` fixture in conftest.py): the fake in memory, the local one with
real processes on this machine, the ssh one against a real sshd test host. Where the fake cannot run a
command, the test plays the command's part for it (`node.plays`); everything else is asserted alike.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hsched.executors.base import Executor, LaunchRequest, StatusQuery
from hsched.executors.fake import FakeSignal

from hsched.errors import HelperError, NodeRefused, NodeUnreachable, TransferError
from hsched.model import RunStatus
from hsched.node import datapaths
from tests.conftest import process_gone
from tests.executors.conftest import Node
from tests.executors.jobs import RECORDER, TRAINER
from tests.executors.waits import wait_exited, wait_gone, wait_log, wait_status

PROBE_KEYS = {"helper_version", "hostname", "boot_id", "python", "cpus", "memory_total_mib", "numa", "gpus", "loadavg"}


def leftovers(folder: Path) -> list[str]:
    """Temporary names a transfer left behind (the target itself does not count)."""
    return [p.name for p in folder.iterdir() if ".part-" in p.name or ".old-" in p.name or p.name == "absent"]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def until(cond: Callable[[], bool]) -> None:
    """Until `cond()` holds; the test's own deadline is the only limit."""
    while True:
        if cond():
            return
        await asyncio.sleep(0.02)


async def test_is_an_executor(node: Node) -> None:
    async with node.executor() as ex:
        assert isinstance(ex, Executor)
        assert ex.kind == node.kind and ex.name
        assert ex.last_contact is None and ex.last_error is None


async def test_probe_shape_and_last_contact(node: Node) -> None:
    async with node.executor() as ex:
        before = time.monotonic()  # (last_contact is on the monotonic clock)
        p = await ex.probe(gpu_timeout_s=5.0)
        assert PROBE_KEYS <= p.keys()
        assert isinstance(p["cpus"], int) and p["cpus"] > 0 and p["memory_total_mib"] > 0
        assert p["boot_id"] and isinstance(p["numa"], list)
        assert isinstance(p["gpus"]["devices"], list) and "source" in p["gpus"]
        first = ex.last_contact
        assert first is not None and before <= first <= time.monotonic() and ex.last_error is None
        between = time.monotonic()
        assert await ex.status([StatusQuery(str(node.runs / "never"))])
        second = ex.last_contact
        assert second is not None and second >= between >= first  # the second answer moved it on


async def test_launch_is_idempotent_per_run_dir(node: Node, tmp_path: Path) -> None:
    marker = tmp_path / "launched"
    run_dir = str(node.runs / "once")
    req = LaunchRequest(run_dir=run_dir, command=("sh", "-c", f"echo x >> '{marker}'; echo started; sleep 60"))
    async with node.executor() as ex:
        first = await ex.launch(req)
        again = await ex.launch(req)
        assert again == first and first.run_dir == run_dir  # the handle carries the controller's path
        node.plays(ex, run_dir, output=b"started\n")
        await wait_log(ex, run_dir, b"started")
        [rep] = await ex.status([StatusQuery(run_dir, first)])
        assert rep.status is RunStatus.RUNNING and rep.handle == first
        assert await ex.signal(first, "KILL")
        await wait_status(ex, first, running=False)
    if node.real:
        assert marker.read_text() == "x\n"  # one run, not two
    else:
        assert ex.launches == 1  # type: ignore[attr-defined]


async def test_status_of_unknown_running_and_exited_runs(node: Node) -> None:
    async with node.executor() as ex:
        sleeper = await ex.launch(LaunchRequest(run_dir=str(node.runs / "sleeper"), command=("sleep", "60")))
        quitter = await ex.launch(LaunchRequest(run_dir=str(node.runs / "quitter"), command=("sh", "-c", "exit 3")))
        node.plays(ex, quitter.run_dir, exit_code=3)
        await wait_status(ex, quitter, running=False)
        unknown = StatusQuery(str(node.runs / "never-launched"))
        reports = await ex.status([unknown, StatusQuery(sleeper.run_dir, sleeper), StatusQuery(quitter.run_dir)])
        assert [r.status for r in reports] == [RunStatus.NOT_STARTED, RunStatus.RUNNING, RunStatus.EXITED]
        assert reports[1].handle == sleeper
        assert reports[2].exit_code == 3 and reports[2].signal is None and reports[2].handle == quitter
        assert await ex.status([]) == []
        assert await ex.signal(sleeper, "KILL")


async def test_term_ends_a_sleep(node: Node) -> None:
    async with node.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "sleep"), command=("sleep", "60")))
        assert (await wait_status(ex, h, running=True)).status is RunStatus.RUNNING
        assert await ex.signal(h, "TERM") is True
        rep = await wait_status(ex, h, running=False)
        assert rep.status is RunStatus.EXITED and rep.exit_code == 143 and rep.signal == 15
        assert await ex.signal(h, "TERM") is False  # it has ended: nothing is signalled


async def test_kill_all_processes_reaches_children_that_left_the_group(node: Node) -> None:
    # the child starts a session of its own (so the run's process group no longer holds it) and ignores TERM
    script = "setsid sh -c 'trap \"\" TERM; echo child=$$; exec sleep 60' & trap '' TERM; while :; do sleep 1; done"
    async with node.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "family"), command=("sh", "-c", script)))
        node.plays(ex, h.run_dir, output=b"child=0\n")
        log = await wait_log(ex, h.run_dir, b"child=")
        child = int(log.split(b"child=")[1].split()[0])
        assert await ex.signal(h, "KILL", all_processes=True) is True
        rep = await wait_status(ex, h, running=False)
        assert rep.exit_code == 137
    if node.real:
        await wait_gone(child)
    else:
        assert ex.runs[h.run_dir].signalled_all == ["KILL"]  # type: ignore[attr-defined]


async def test_the_exit_record_comes_once_nothing_of_the_run_is_left(node: Node) -> None:
    async with node.executor() as ex:
        before = time.time()
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "leaves"),
                                          command=("sh", "-c", "sleep 77 & echo bg=$!; exit 3")))
        node.plays(ex, h.run_dir, output=b"bg=0\n", exit_code=3)
        rep = await wait_exited(ex, h)
        after = time.time()
        assert (rep.status, rep.exit_code, rep.signal, rep.oom, rep.gpu_left) == (RunStatus.EXITED, 3, None, False, ())
        assert rep.end_time is not None and before <= rep.end_time <= after  # the node's record of the end
        if node.real:  # what the run left was killed before its exit was reported
            log = await ex.read_log(h.run_dir, 0)
            assert process_gone(int(log.split(b"bg=")[1].split()[0]))


async def test_a_checkpoint_exit_behind_a_shell_is_the_runs(node: Node, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAINER)
    async with node.executor() as ex:
        # bash runs the trainer as its child, so the checkpoint signal kills bash too: the trainer's 85 counts
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "ckpt"), checkpoint_exit_code=85, stop_grace_s=60,
                                          command=("bash", "-c", f"{sys.executable} {tmp_path}/train.py; true")))
        node.plays(ex, h.run_dir, output=b"ready\n")
        await wait_log(ex, h.run_dir, b"ready")
        assert await ex.signal(h, "USR1", all_processes=True)
        node.plays(ex, h.run_dir, exit_code=85)
        rep = await wait_exited(ex, h)
        assert (rep.exit_code, rep.signal) == (85, None)
    if not node.real:
        assert ex.runs[h.run_dir].signal_calls == [FakeSignal("USR1", all_processes=True)]  # type: ignore[attr-defined]


async def test_a_batch_only_signal_reaches_the_batch_shell_alone(node: Node, tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    got = tmp_path / "got"
    shell = f"trap 'echo shell got USR1; exit 3' USR1; {sys.executable} {tmp_path}/recorder.py {got} & wait"
    async with node.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "batch"), command=("bash", "-c", shell),
                                          stop_grace_s=60))
        if node.real:
            await until(Path(f"{got}.ready").exists)
        assert await ex.signal(h, "USR1", batch_only=True)
        node.plays(ex, h.run_dir, output=b"shell got USR1\n")
        await wait_log(ex, h.run_dir, b"shell got USR1")
        # the shell's child lives on; USR2 to every process reaches it, and USR1 (sent first, lower-numbered)
        # would have been noted before it had it reached the child
        assert await ex.signal(h, "USR2", all_processes=True)
        if node.real:
            await until(lambda: got.exists() and "SIGUSR2" in got.read_text())
            assert got.read_text() == "SIGUSR2\n"
        else:
            assert ex.runs[h.run_dir].signal_calls == [  # type: ignore[attr-defined]
                FakeSignal("USR1", batch_only=True), FakeSignal("USR2", all_processes=True)]
        assert await ex.signal(h, "KILL", all_processes=True)
        node.plays(ex, h.run_dir, exit_code=3)
        assert (await wait_exited(ex, h)).exit_code == 3  # the batch shell's own exit code


async def test_read_log_offsets(node: Node) -> None:
    async with node.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "log"), command=("printf", "0123456789")))
        node.plays(ex, h.run_dir, output=b"0123456789", exit_code=0)
        assert (await wait_status(ex, h, running=False)).exit_code == 0
        assert await ex.read_log(h.run_dir, 0) == b"0123456789"
        assert await ex.read_log(h.run_dir, 3, max_bytes=4) == b"3456"
        assert await ex.read_log(h.run_dir, 10_000) == b""
        assert await ex.read_log(str(node.runs / "never-launched"), 0) == b""


async def test_remote_path_put_get_round_trip_and_newest_mtime(node: Node, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    (src / "shards").mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(200_000))
    (src / "shards" / "opt state ü;$(x).pt").write_bytes(b"state" * 1000)
    (src / "step").write_text("1200\n")
    for f, t in ((src / "model.bin", 1_700_000_000), (src / "shards" / "opt state ü;$(x).pt", 1_700_000_100),
                 (src / "step", 1_700_000_050)):
        os.utime(f, (t, t))
    want = tree(src)
    newer = tmp_path / "ckpt2"
    newer.mkdir()
    (newer / "step").write_text("2400\n")
    async with node.executor() as ex:
        remote = await ex.remote_path(str(src))
        assert await ex.remote_path(str(src)) == remote  # a pure function of the local path
        await ex.put(src, remote)
        assert await ex.newest_mtime(remote) == pytest.approx(1_700_000_100)
        assert await ex.newest_mtime(f"{remote}/no-such-folder") is None
        await ex.get(remote, tmp_path / "back")
        assert tree(tmp_path / "back") == want
        await ex.put(newer, remote)  # replaces the folder as a whole
        await ex.get(remote, tmp_path / "back")
        assert tree(tmp_path / "back") == {"step": b"2400\n"}
        with pytest.raises(TransferError, match=r"(?i)no such file") as err:
            await ex.get(f"{remote}/absent", tmp_path / "absent")
        assert ex.last_error is err.value
    assert leftovers(tmp_path) == []


async def test_dataset_requests_alike(node: Node, tmp_path: Path) -> None:
    """The node helper's data_* requests through each transport (the node's paths: the test's folder, which the
    ssh test host shares): chunks written into a copy, committed, read back, scanned, hashed, dropped; a link on
    the way and an unknown request are the request's HelperError."""
    base = node.runs.parent / "node-data"  # the real path (a write refuses a link on the way)
    partial, dest = f"{base}/ds.partial", f"{base}/ds"
    blob = os.urandom((2 << 20) + 5)
    async with node.executor() as ex:
        assert (await ex.data("scan", {"path": dest}))["exists"] is False
        for off in range(0, len(blob), 1 << 20):
            r = await ex.data("write", {"path": f"{partial}/data/x.bin", "offset": off,
                                        "data": base64.b64encode(blob[off:off + (1 << 20)]).decode()})
            assert r["size"] == min(off + (1 << 20), len(blob))
        manifest = {"version": 1, "kind": "dir", "dirs": ["empty"],
                    "files": [{"rel": "x.bin", "size": len(blob), "mtime": 1234.5, "mode": 0o644}]}
        await ex.data("write", {"path": f"{partial}/{datapaths.DATA_MANIFEST}", "offset": 0,
                                "data": base64.b64encode(json.dumps(manifest).encode()).decode()})
        assert (await ex.data("commit", {"partial": partial, "dest": dest}))["bytes"] == len(blob)
        back, eof = b"", False
        while not eof:
            r = await ex.data("read", {"path": f"{dest}/x.bin", "offset": len(back), "max_bytes": 1 << 20})
            back += base64.b64decode(r["data"])
            eof = r["eof"]
        assert back == blob
        listing = await ex.data("list", {"path": dest})
        assert listing["dirs"] == ["empty"]
        assert [(f["rel"], f["mtime"]) for f in listing["files"]] == [("x.bin", 1234.5)]
        scanned = await ex.data("scan", {"path": dest})
        assert (scanned["exists"], scanned["bytes"], scanned["files"], scanned["is_dir"]) == (True, len(blob), 1, True)
        digest = hashlib.sha256(b"x.bin\0%d\0" % len(blob) + blob).hexdigest()
        assert (await ex.data("hash", {"path": dest}))["sha256"] == digest
        assert (await ex.data("free", {"path": f"{dest}/not/yet"}))["free"] > 0
        assert (await ex.data("root", {})) == {"root": None}  # no confined helper: datasets anywhere
        (base / "hop").symlink_to(tmp_path)
        with pytest.raises(HelperError, match="symbolic link") as err:
            await ex.data("write", {"path": f"{base}/hop/x", "offset": 0, "data": ""})
        assert ex.last_error is err.value and err.value.command == "data_write"
        with pytest.raises(HelperError, match="unknown request") as err:
            await ex.data("nope", {})
        assert err.value.command == "data_nope"
        assert (await ex.data("drop", {"path": dest})) == {"dropped": True} and ex.last_error is None
        assert sorted(p.name for p in base.iterdir()) == ["hop"]


async def test_watch_yields_samples(node: Node) -> None:
    async with node.executor() as ex:
        before = time.monotonic()  # (last_contact is on the monotonic clock)
        samples = [s async for s in ex.watch(0.05, count=3)]
        assert [s["seq"] for s in samples] == [0, 1, 2]
        last = samples[-1]
        assert last["node"] == ex.name and last["boot_id"]
        assert {"cpu", "memory", "gpus", "gpu_error", "processes"} <= last.keys()
        assert isinstance(last["gpus"]["devices"], list) and isinstance(last["processes"], list)
        assert ex.last_contact is not None and ex.last_contact >= before and ex.last_error is None


async def test_a_helper_error_fails_one_request_only(node: Node) -> None:
    async with node.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(node.runs / "sleep"), command=("sleep", "60")))
        before = time.monotonic()  # (last_contact is on the monotonic clock)
        with pytest.raises(HelperError, match="unknown signal") as err:
            await ex.signal(h, "NO-SUCH-SIGNAL")
        assert ex.last_error is err.value and err.value.command == "signal"
        assert ex.last_contact is not None and ex.last_contact >= before  # the node did answer
        [rep] = await ex.status([StatusQuery(h.run_dir, h)])
        assert rep.status is RunStatus.RUNNING and ex.last_error is None  # the next call works and clears it
        assert await ex.signal(h, "KILL")


async def test_an_unreachable_node_raises_NodeUnreachable(node: Node) -> None:
    async with node.executor(node.make_unreachable) as ex:
        with pytest.raises(NodeUnreachable) as err:
            await ex.probe()
        assert ex.last_error is err.value and err.value.retryable
        assert ex.last_contact is None


async def test_a_refusing_node_raises_NodeRefused(node: Node) -> None:
    async with node.executor(node.make_refused) as ex:
        with pytest.raises(NodeRefused) as err:
            await ex.probe()
        assert err.value.reason is node.refusal and not err.value.retryable
        assert ex.last_error is err.value
        with pytest.raises(NodeRefused):  # a person must act: the next call is refused too
            await ex.status([StatusQuery(str(node.runs / "x"))])
        assert isinstance(ex.last_error, NodeRefused)


async def test_usable_again_after_close(node: Node) -> None:
    async with node.executor() as ex:
        first = (await ex.probe())["boot_id"]
        await ex.close()
        assert (await ex.probe())["boot_id"] == first
