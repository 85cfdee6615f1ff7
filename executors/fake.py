"""A public in-memory executor for tests: runs are records, and the test decides when they end.

    ex = FakeExecutor(devices=[...])
    handle = await ex.launch(req)
    ex.finish(req.run_dir, exit_code=0)     # the next status() reports it exited
    ex.write_log(req.run_dir, b"step 1\\n")  # what read_log() returns
    ex.unreachable = True                   # every call raises NodeUnreachable (and last_error says so)
    ex.fail_with = NodeRefused("...", Refusal.HOST_KEY_CHANGED)   # or any ExecutorError, until cleared

What the node helper reports about containment (issue 12), played by the test:

    ex.finish(run_dir, 85, end_time=t, oom=True, gpu_left=[GpuHolder("GPU-0", 4242, "python3")])
                                            # the exit record: when the main process ended (None: the
                                            # report carries no end time), an OOM kill, processes still on
                                            # the run's GPUs after it
    ex.lose(run_dir)                        # the wrapper died and nothing of the run is left: LOST
    ex.probe_hangs = True                   # probe() never answers (until the caller cancels it)
    ex.probe_gpu_error = "GPU probe did not answer within 10 s (nvidia-smi pid 7 killed)"
                                            # probe() answers as a node whose GPU discovery timed out
    ex.runs[run_dir].signal_calls           # [FakeSignal(name, all_processes, batch_only, purpose)] per signal
    ex.probe_timeouts                       # the gpu_timeout_s of every probe() call

It implements the whole protocol (executors/base.py) and passes the same conformance suite as the local and
ssh executors (tests/executors/test_conformance.py). Files put on the "node" live in `files`; `clock` and
`sleep` can be replaced by a test's fake clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import posixpath
import signal as signals
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsched.errors import ExecutorError, HelperError, NodeUnreachable, TransferError
from hsched.model import GpuHolder, RunHandle, RunReport, RunStatus
from hsched.node.confine import why
from hsched.node.main import COMMANDS
from hsched.node.version import HELPER_VERSION

from . import _files
from ._contact import recorded
from .base import Executor, LaunchRequest, StatusQuery


@dataclass(frozen=True, slots=True)
class FakeSignal:
    """One signal() call that reached a running fake run."""

    name: str
    """'TERM', 'USR1'... (without SIG)."""
    all_processes: bool = False
    batch_only: bool = False
    purpose: str = "stop"


@dataclass
class FakeRun:
    request: LaunchRequest
    handle: RunHandle
    exit_code: int | None = None
    signals: list[str] = field(default_factory=list)
    """Every signal sent while it ran, in order."""
    signalled_all: list[str] = field(default_factory=list)
    """The signals sent with all_processes=True."""
    signalled_batch: list[str] = field(default_factory=list)
    """The signals sent with batch_only=True (to the batch shell alone)."""
    signal_calls: list[FakeSignal] = field(default_factory=list)
    """Every signal sent while it ran, with how it was to be delivered."""
    log: bytes = b""
    end_time: float | None = None
    """The node's record of when it ended (`finish(..., end_time=)`); None: the report carries none."""
    oom: bool = False
    gpu_oom: str | None = None
    gpu_left: tuple[GpuHolder, ...] = ()
    lost: bool = False
    """Gone without an exit record (`lose`): status says LOST."""
    usage: dict[str, Any] | None = None
    """Its exit record's last reading of what it used (hsched/node/cgroupstats.py), set by a test."""


@dataclass(frozen=True, slots=True)
class FakeFile:
    data: bytes
    mtime: float


class FakeExecutor:
    """The executor protocol in memory.

    Knobs (attributes a test may set at any time): `unreachable`, `fail_with`, `exit_on_signal` (signal ->
    the exit code a run that gets it ends with; others leave it running), `checkpoint_mtimes` (path ->
    what newest_mtime says, before the files put there), `remote_root` (None: the node shares the
    controller's disk, as a local node does; else remote paths live under it), `processes` (GPU processes
    the monitoring samples list), `utilization` (device UUID -> GPU utilization in samples), `gpu_error`
    (the samples' gpu_error), `probe_hangs`
    (probe() waits until cancelled), `probe_gpu_error` (probe() reports no GPUs and this error, as a node
    whose GPU discovery timed out), `clock` (the node's wall clock: samples' and files' times), `monotonic`
    (what `last_contact` reads), `sleep`.
    """

    kind = "fake"
    home_shared = True

    def __init__(self, *, devices: Sequence[dict[str, Any]] = (), cpus: int = 8, memory_total_mib: int = 65536,
                 boot_id: str = "fake-boot", name: str = "fake", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, remote_root: str | None = None) -> None:
        self.name = name
        self.devices = list(devices)
        self.cpus = cpus
        self.memory_total_mib = memory_total_mib
        self.boot_id = boot_id
        self.clock = clock
        self.monotonic = monotonic
        """What `last_contact` is read from: the controller's monotonic clock (a test's fake one)."""
        self.sleep = sleep
        self.remote_root = remote_root
        self.runs: dict[str, FakeRun] = {}
        self.launches = 0
        self.calls: list[str] = []
        """The name of every protocol call made, in order."""
        self.unreachable = False
        self.fail_with: ExecutorError | None = None
        self.exit_on_signal: dict[str, int] = {"TERM": 143, "KILL": 137, "INT": 130}
        self.checkpoint_mtimes: dict[str, float] = {}
        self.files: dict[str, FakeFile] = {}
        """Remote path -> content, one entry per file (a folder is the files under it)."""
        self.processes: list[dict[str, Any]] = []
        self.progress: list[dict[str, Any]] = []
        """Progress reports for the next sample (then gone: a watch sends what is new since its last look)."""
        self.utilization: dict[str, float] = {}
        self.gpu_error: str | None = None
        """What the monitoring samples say in `gpu_error` (a hung nvidia-smi on the node)."""
        self.probe_hangs = False
        self.probe_gpu_error: str | None = None
        self.probe_timeouts: list[float] = []
        """The gpu_timeout_s of every probe() call, in order."""
        self.last_contact: float | None = None
        self.last_error: ExecutorError | None = None
        self.closed = 0
        self.accounts: set[str] | None = None
        """The user names that exist on this fake node (lab mode); None: every name does."""
        self.free_bytes: int | None = None
        """What data("free") answers (a full disk played); None: the real free space of the path's disk."""
        self.data_hook: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None
        """Awaited before each data() request with its op and request (a test acts in the middle of a copy)."""
        self._pids = itertools.count(1000)

    def _check(self, call: str) -> None:
        self.calls.append(call)
        if self.unreachable:
            raise NodeUnreachable("fake node is unreachable")
        if self.fail_with is not None:
            raise self.fail_with
        self.last_contact = self.monotonic()

    @recorded
    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        self._check("probe")
        self.probe_timeouts.append(gpu_timeout_s)
        if self.probe_hangs:
            await asyncio.get_running_loop().create_future()  # never set: only the caller's cancel ends it
        gpus: dict[str, Any] = {"source": "fake", "devices": [dict(d) for d in self.devices]}
        if self.probe_gpu_error is not None:
            gpus = {"source": None, "devices": [], "error": self.probe_gpu_error}
        return {"helper_version": HELPER_VERSION, "hostname": self.name, "boot_id": self.boot_id,
                "python": platform.python_version(), "cpus": self.cpus, "memory_total_mib": self.memory_total_mib,
                "numa": [], "gpus": gpus, "loadavg": 0.0}

    @recorded
    async def launch(self, req: LaunchRequest) -> RunHandle:
        self._check("launch")
        if req.user is not None and self.accounts is not None and req.user not in self.accounts:
            raise HelperError(f"{self.name}: user {req.user} does not exist on this node", "launch")
        if req.run_dir in self.runs:
            return self.runs[req.run_dir].handle
        pid = next(self._pids)
        handle = RunHandle(run_dir=req.run_dir, pid=pid, pgid=pid, start_ticks=pid * 10, boot_id=self.boot_id)
        self.runs[req.run_dir] = FakeRun(request=req, handle=handle)
        self.launches += 1
        return handle

    @recorded
    async def users(self, names: Sequence[str]) -> dict[str, bool]:
        self._check("users")
        return {n: self.accounts is None or n in self.accounts for n in names}

    @recorded
    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        self._check("status")
        out = []
        for q in queries:
            run = self.runs.get(q.run_dir)
            if run is None:
                out.append(RunReport(RunStatus.NOT_STARTED))
            elif run.lost:
                out.append(RunReport(RunStatus.LOST, handle=run.handle))
            elif run.exit_code is None:
                out.append(RunReport(RunStatus.RUNNING, handle=run.handle))
            else:
                sig = run.exit_code - 128 if run.exit_code > 128 else None
                out.append(RunReport(RunStatus.EXITED, exit_code=run.exit_code, signal=sig, handle=run.handle,
                                     end_time=run.end_time, oom=run.oom, gpu_left=run.gpu_left,
                                     gpu_oom=run.gpu_oom, usage=run.usage))
        return out

    @recorded
    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False,
                     batch_only: bool = False, purpose: str = "stop") -> bool:
        self._check("signal")
        name = signal.upper().removeprefix("SIG")
        if not hasattr(signals, f"SIG{name}"):
            raise HelperError(f"node helper 'signal': unknown signal {signal}", "signal")  # as the helper says
        run = self.runs.get(handle.run_dir)
        if run is None or run.exit_code is not None or run.lost or run.handle != handle:
            return False
        run.signals.append(name)
        run.signal_calls.append(FakeSignal(name, all_processes, batch_only, purpose))
        if all_processes:
            run.signalled_all.append(name)
        if batch_only:
            run.signalled_batch.append(name)
        if name in self.exit_on_signal:
            run.exit_code = self.exit_on_signal[name]
        return True

    @recorded
    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        self._check("read_log")
        run = self.runs.get(run_dir)
        return run.log[offset:offset + max_bytes] if run else b""

    @recorded
    async def newest_mtime(self, path: str) -> float | None:
        self._check("newest_mtime")
        if path in self.checkpoint_mtimes:
            return self.checkpoint_mtimes[path]
        times = [f.mtime for p, f in self.files.items() if _under(p, path)]
        return max(times) if times else None

    @recorded
    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        """The node helper's own `data_<op>` on this machine's real files, in a thread (so in-process tests copy
        real trees), with the request and reply passed through JSON as on the wire. `free_bytes`, when set, is
        what `free` answers; `data_hook` runs before each request (a test's way to act mid-copy)."""
        self._check(f"data_{op}")
        command = f"data_{op}"
        fn = COMMANDS.get(command) if op.isidentifier() else None
        if fn is None:
            raise HelperError(f"{self.name}: node helper '{command}': unknown request", command)
        if self.data_hook is not None:
            await self.data_hook(op, req)
        if op == "free" and self.free_bytes is not None:
            return {"free": self.free_bytes}
        wire = json.loads(json.dumps(dict(req)))
        try:
            async with asyncio.timeout(timeout_s):
                reply = await asyncio.to_thread(fn, wire)
        except TimeoutError:
            raise NodeUnreachable(f"{self.name}: node helper '{command}' did not answer within {timeout_s:g} s") \
                from None
        except Exception as e:  # as the helper answers a failed request: one error line, HelperError here
            raise HelperError(f"{self.name}: node helper '{command}': {why(e)}", command) from None
        return dict(json.loads(json.dumps(reply)))

    @recorded
    async def remote_path(self, local_path: str) -> str:
        self._check("remote_path")
        if self.remote_root is None:
            return local_path
        return f"{self.remote_root.rstrip('/')}/files/{local_path.lstrip('/')}"

    @recorded
    async def put(self, local: str | Path, remote: str, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        self._check("put")
        if self.remote_root is None and _same(local, remote):
            return  # the node's path is the local one: nothing to copy
        try:
            files = await asyncio.to_thread(_read_tree, str(local))  # reading files blocks: off the event loop
        except OSError as e:
            raise TransferError(f"{self.name}: put {local} {remote}: {e.strerror or e}") from None
        for p in [p for p in self.files if _under(p, remote)]:
            del self.files[p]  # replaced as a whole, as the real executors do
        for rel, (data, mtime) in files.items():
            self.files[f"{remote}/{rel}" if rel else remote] = FakeFile(data, mtime)

    @recorded
    async def get(self, remote: str, local: str | Path, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        self._check("get")
        if self.remote_root is None and _same(local, remote):
            return
        found = {p: f for p, f in self.files.items() if _under(p, remote)}
        if not found:
            raise TransferError(f"{self.name}: get {remote} {local}: No such file")
        tree = {p[len(remote):].lstrip("/"): (f.data, f.mtime) for p, f in found.items()}
        try:
            await asyncio.to_thread(_write_tree, str(local), tree)
        except OSError as e:
            raise TransferError(f"{self.name}: get {remote} {local}: {e.strerror or e}") from None

    async def watch(self, interval_s: float = 1.0, *, count: int | None = None,
                    stale_after_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        seq = 0
        while count is None or seq < count:
            if seq:
                await self.sleep(interval_s)
            try:
                self._check("watch")
            except ExecutorError as e:
                self.last_error = e
                raise
            self.last_error = None
            yield self.sample(seq)
            seq += 1

    def sample(self, seq: int = 0) -> dict[str, Any]:
        """One monitoring sample of the fake node as it stands (the shape hsched.node.watch sends)."""
        devices = [{"index": i, "uuid": d.get("uuid"),
                    "utilization_gpu": self.utilization.get(d.get("uuid") or "", 0.0), "memory_used_mib": 0,
                    "memory_total_mib": d.get("memory_total_mib"), "temperature_c": None, "power_w": None}
                   for i, d in enumerate(self.devices)]
        processes = [dict(p, job_run_dir=p.get("run_dir")) for p in self.processes]
        out = {"seq": seq, "t": self.clock(), "boot_id": self.boot_id, "node": self.name,
               "cpu": {"util": 0.0, "count": self.cpus, "loadavg": [0.0, 0.0, 0.0]},
               "memory": {"total_mib": self.memory_total_mib, "available_mib": self.memory_total_mib, "used_mib": 0},
               "gpus": {"source": "fake", "devices": devices}, "gpu_error": self.gpu_error, "processes": processes}
        if self.progress:
            out["progress"] = [dict(r, job_run_dir=r.get("run_dir")) for r in self.progress]
            self.progress = []
        return out

    async def close(self) -> None:
        self.closed += 1

    # -- for tests

    def finish(self, run_dir: str, exit_code: int = 0, *, end_time: float | None = None, oom: bool = False,
               gpu_left: Sequence[GpuHolder] = (), gpu_oom: str | None = None) -> None:
        """The run ends: the next status() reports `exit_code`, and the exit record's `end_time`, `oom`, the
        processes still on its GPUs (`gpu_left`) and a GPU out-of-memory line of its log as the helper would."""
        run = self.runs[run_dir]
        run.exit_code, run.end_time, run.oom, run.gpu_left = exit_code, end_time, oom, tuple(gpu_left)
        run.gpu_oom = gpu_oom

    def lose(self, run_dir: str) -> None:
        """The run's wrapper died and nothing of the run is left: the next status() reports it LOST."""
        self.runs[run_dir].lost = True

    def write_log(self, run_dir: str, data: bytes) -> None:
        """Append to a run's output log."""
        self.runs[run_dir].log += data

    def running(self) -> list[str]:
        return [d for d, r in self.runs.items() if r.exit_code is None and not r.lost]


def _same(a: str | Path, b: str | Path) -> bool:
    return posixpath.normpath(str(a)) == posixpath.normpath(str(b))


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def _read_tree(local: str) -> dict[str, tuple[bytes, float]]:
    """Relative path ('' for a single file) -> (content, mtime) of a local file or folder."""
    if os.path.isfile(local):
        return {"": (Path(local).read_bytes(), os.stat(local).st_mtime)}
    if not os.path.isdir(local):
        raise FileNotFoundError(2, "No such file or folder", local)
    out = {}
    for root, _dirs, files in os.walk(local):
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, local)] = (Path(p).read_bytes(), os.stat(p).st_mtime)
    return out


def _write_tree(local: str, tree: dict[str, tuple[bytes, float]]) -> None:
    """Write what _read_tree read to `local`, renamed into place when complete."""
    _files.make_parent(local)
    tmp = _files.temporary_beside(local)
    try:
        for rel, (data, mtime) in tree.items():
            p = Path(tmp) / rel if rel else Path(tmp)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.utime(p, (mtime, mtime))
        _files.move_into_place(tmp, local)
    except BaseException:
        _files.remove(tmp)
        raise


def _conforms(ex: FakeExecutor) -> Executor:
    return ex  # mypy checks FakeExecutor against the protocol here
