"""The local executor: the node helper on this machine, as one long-lived subprocess of the controller.

It is the same helper file the SSH executor ships to remote nodes, spoken to with the same client
(executors/_rpc.py): one `nodehelper.py serve` answers every probe, launch, status and signal over its
stdin/stdout, so a status call costs a round trip instead of a Python start (about 65 ms of CPU). If the
server dies it is started again on the next call; while none can be started, each call runs
`nodehelper.py CMD` once, as every call did before. Monitoring (`watch`) is a stream of its own, one more
helper process for as long as it runs.

Every local node of a fleet is this one machine, so they share that helper server (one per interpreter and
event loop, `_Shared`): a fleet of 64 simulated local nodes runs one helper, not 64 (which cost 9 s of CPU to
start and probe, and 64 Pythons' memory). What the nodes ask at the same moment is asked once: the status of
every node's runs in one request (the watch loop asks all nodes together), and one probe of the machine for
all the nodes probing it (a probe's answer is the machine's, whichever node asks).

This machine shares the controller's disk: `remote_path` is the path itself and `put`/`get` are local
copies (nothing to do when both sides are the same path). Except in a lab whose controller runs as a service
account (`helper`: an installed, confined helper run through `sudo -n`): then this machine is a node like a
remote one, its runs and checkpoint folders under the helper's folder, named as an SSH node names them, read
and moved through the helper (executors/_confined.py), because the users' folders are closed to the account.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import sys
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsched.errors import ExecutorError, HelperError, NodeRefused, NodeUnreachable, Refusal
from hsched.model import RunHandle, RunReport
from hsched.node import nodehelper
from hsched.serialize import handle_from_dict, handle_to_dict

from . import _confined
from ._contact import recorded
from ._files import copy_off_loop
from ._rpc import HelperClient, check_reply, launch_request, parse_oneshot, report_from_dict
from .base import Executor, LaunchRequest, StatusQuery

if TYPE_CHECKING:
    from hsched.config import SimulatedDevices

log = logging.getLogger("hsched.local")

HELPER_PATH = Path(nodehelper.__file__).resolve()
SERVER_BACKOFF_MAX_S = 60.0
"""After helper servers died one after another: the longest wait before trying another (one-shot meanwhile)."""
WATCH_STOP_S = 3.0
"""How long a watch helper has to end its nvidia-smi and exit after SIGTERM before it is killed."""
STATUS_BATCH_MAX = 1024
"""Runs in one status request to the shared helper (more go as several requests, answered in parallel)."""
PIPE_LIMIT = 1 << 26
"""The longest reply line read from the helper: the status of every local run at once is one line."""


class _PipeChannel:
    """The helper server's stdin/stdout as a LineChannel."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.stdin = proc.stdin
        self.stdout = proc.stdout

    async def readline(self) -> bytes:
        return await self.stdout.readline()

    async def send(self, data: bytes) -> None:
        self.stdin.write(data)
        await self.stdin.drain()

    def close(self) -> None:
        self.stdin.close()


class _Shared:
    """One helper server for every LocalExecutor of one interpreter on one event loop (see the module's
    docstring): started on the first call, started again when it dies (after doubling waits when servers die
    one after another; meanwhile None: each call runs a helper of its own), ended when its last executor
    closes. Status requests made at the same moment are sent as one; a probe in flight is shared."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv = argv
        self.users: set[LocalExecutor] = set()
        self.server: HelperClient | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()  # many first calls at once must start one server, not one each
        self.failures = 0
        self.retry_at = 0.0
        self.statuses: list[tuple[list[dict[str, Any]], asyncio.Future[dict[str, Any]]]] = []
        """Status requests waiting for this loop iteration's batch."""
        self.statuses_timeout_s = 0.0
        """The batch's time limit: the longest of its callers' (each caller's own is its executor's)."""
        self.probing: dict[tuple[float, str | None], asyncio.Task[dict[str, Any]]] = {}
        """Probes in flight by GPU timeout: a node that probes meanwhile gets the same answer."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.dropped: weakref.WeakSet[HelperClient] = weakref.WeakSet()
        """Servers let go of because they died (closed, yet not by an executor's close())."""

    @property
    def pid(self) -> int | None:
        if self.server is None or self.server.dead is not None or self.proc is None:
            return None
        return self.proc.pid

    async def get(self, name: str) -> HelperClient | None:
        srv = self.server
        if srv is not None and srv.dead is None:
            return srv
        async with self.lock:
            srv = self.server
            if srv is not None and srv.dead is None:
                return srv
            if srv is not None:  # it died between calls
                log.warning("%s: the helper server died (%s); starting another", name, srv.dead)
                self.drop(srv)
            if time.monotonic() < self.retry_at:
                return None  # servers died one after another: a helper per call for a while
            return await self._start(name)

    async def _start(self, name: str) -> HelperClient | None:
        try:
            # its own session: a Ctrl-C meant for a controller in a terminal must not kill the helper mid-request
            proc = await asyncio.create_subprocess_exec(
                *self.argv, "serve", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
                limit=PIPE_LIMIT)
        except OSError as e:
            log.info("%s: no helper server (%s); one helper per call", name, e)
            self.failed()
            return None
        self.proc = proc
        self.server = HelperClient("", _PipeChannel(proc))
        return self.server

    def failed(self) -> None:
        """A server could not start or died: the next one at once the first time, then after doubling waits."""
        self.failures += 1
        n = self.failures
        delay = 0.0 if n == 1 else min(SERVER_BACKOFF_MAX_S, 2.0 ** (n - 2))
        self.retry_at = time.monotonic() + delay

    def drop(self, srv: HelperClient) -> None:
        """Let go of a dead server (unless another call did already) and count the failure."""
        if self.server is not srv:
            return
        proc = self.proc
        self.server = self.proc = None
        self.dropped.add(srv)
        srv.close()
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # its stdout closed but it lives on: nothing more will come from it
        self.failed()

    # ---------------------------------------------------------------------------- asked together

    async def status(self, srv: HelperClient, runs: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
        """`srv`'s status reply for `runs`, asked together with every other status request of this moment (the
        watch loop asks each node's at once): one request, one thread in the helper, one reply line."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        if not self.statuses:
            # sent once the other callers of this moment, already scheduled on the loop, have added theirs
            loop.call_soon(self._send_statuses, srv)
            self.statuses_timeout_s = 0.0
        self.statuses.append((runs, fut))
        self.statuses_timeout_s = max(self.statuses_timeout_s, timeout_s)
        return await fut

    def _send_statuses(self, srv: HelperClient) -> None:
        batch, self.statuses = self.statuses, []
        task = asyncio.get_running_loop().create_task(self._statuses(srv, batch, self.statuses_timeout_s))
        self.tasks.add(task)  # kept until done: a task nobody holds may be collected midway
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _statuses(srv: HelperClient, batch: list[tuple[list[dict[str, Any]], asyncio.Future[dict[str, Any]]]],
                        timeout_s: float) -> None:
        everything = [r for runs, _fut in batch for r in runs]
        chunks = [everything[i:i + STATUS_BATCH_MAX] for i in range(0, len(everything), STATUS_BATCH_MAX)]
        try:
            replies = await asyncio.gather(*(srv.call("status", {"runs": c}, timeout_s) for c in chunks))
        except asyncio.CancelledError:
            for _runs, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # every caller gets what the one request got (NodeUnreachable: each decides)
            for _runs, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        error = next((r for r in replies if "error" in r), None)
        reports = [rep for r in replies for rep in (r.get("runs") or [])]
        if error is None and len(reports) != len(everything):
            error = {"error": f"status: {len(reports)} reports for {len(everything)} runs"}
        at = 0
        for runs, fut in batch:
            part = error if error is not None else {"runs": reports[at:at + len(runs)]}
            at += len(runs)
            if not fut.done():  # a caller that gave up (its own timeout) is not answered
                fut.set_result(part)

    async def probe(self, srv: HelperClient, gpu_timeout_s: float, timeout_s: float,
                    discover: str | None = None) -> dict[str, Any]:
        """The machine's probe: one in flight at a time per GPU timeout (and discovery plugin), its answer every
        asking node's."""
        key = (gpu_timeout_s, discover)
        task = self.probing.get(key)
        if task is None or task.done():
            request: dict[str, Any] = {"gpu_timeout_s": gpu_timeout_s}
            if discover is not None:
                request["discover"] = discover
            task = asyncio.get_running_loop().create_task(srv.call("probe", request, timeout_s))
            self.probing[key] = task

            def done(t: asyncio.Task[dict[str, Any]]) -> None:
                if self.probing.get(key) is t:
                    del self.probing[key]
                if not t.cancelled():
                    t.exception()  # retrieved here too: all its callers may have given up on it

            task.add_done_callback(done)
        # shielded: one node's caller giving up must not cancel the others' probe; a copy each, as each node
        # keeps its own
        return copy.deepcopy(await asyncio.shield(task))

    # ------------------------------------------------------------------------------------ ending

    async def close(self) -> None:
        """The last executor let go: close the server's stdin (it kills its probe children at once, answers the
        rest, then exits), killed if it has not gone after 5 s."""
        srv, proc = self.server, self.proc
        self.server = self.proc = None
        if srv is not None:
            srv.close()
        if proc is not None and proc.returncode is None:
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def abandon(self) -> None:
        """Its loop is gone (a script with one asyncio.run per call): its pipes cannot be used from another
        loop, so close the server's stdin by hand; it then exits by itself."""
        proc = self.proc
        self.server = self.proc = None
        if proc is not None and proc.stdin is not None:
            pipe = proc.stdin.transport.get_extra_info("pipe")
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], _Shared]] = (
    weakref.WeakKeyDictionary())


def _shared(argv: tuple[str, ...]) -> _Shared:
    """This loop's helper server run as `argv` (made on first use)."""
    loop = asyncio.get_running_loop()
    by_argv = _SHARED.setdefault(loop, {})
    shared = by_argv.get(argv)
    if shared is None:
        shared = by_argv[argv] = _Shared(argv)
    return shared


class LocalExecutor:
    """The executor protocol on this machine (see executors/base.py).

    Args:
        node: the node's name in the fleet.
        simulate: simulated devices this node reports in its monitoring samples.
        timeout_s: one helper request.
        python: the interpreter that runs the helper (and so the runs' wrappers).
        serve: use the helper server (shared by the local nodes); False runs a helper per call (slower; for
            comparisons).
        helper: an installed helper's launcher, run through `sudo -n` (a service account's lab): runs and
            checkpoints then live under its folder, not on the controller's disk.
    """

    kind = "local"

    def __init__(self, *, node: str = "local", simulate: SimulatedDevices | None = None, timeout_s: float = 60.0,
                 python: str = sys.executable, serve: bool = True, helper: str | None = None,
                 discover: str | None = None) -> None:
        self.node = node
        self.discover = discover
        """The node's discovery plugin (the fleet file's `discover`), run by the helper's probe."""
        self.name = node
        self.simulate = simulate
        self.timeout_s = timeout_s
        self.python = python
        self.serve = serve
        self.helper = helper
        self.argv: tuple[str, ...] = _confined.helper_argv(helper) if helper else (python, str(HELPER_PATH))
        self._root: str | None = None
        """The installed helper's folder (what `whoami` said), once asked."""
        self._local_of: dict[str, str] = {}
        """The helper's run folder -> the controller's name for it (an installed helper's runs)."""
        self.last_contact: float | None = None
        self.last_error: ExecutorError | None = None
        self._shared: _Shared | None = None
        """The helper server this executor uses, on the loop it was last called from."""

    # ----------------------------------------------------------------------------------- the helper

    @property
    def server_pid(self) -> int | None:
        """The helper server's pid while one is up (None: none yet, or calls are one-shot for now)."""
        return self._shared.pid if self._shared is not None else None

    @property
    def _proc(self) -> asyncio.subprocess.Process | None:
        return self._shared.proc if self._shared is not None else None

    def _attach(self) -> _Shared:
        """This loop's shared server, let go of another loop's (a script with one asyncio.run per call)."""
        shared = _shared(self.argv)
        old = self._shared
        if old is not shared:
            if old is not None:
                old.users.discard(self)
                if not old.users:
                    old.abandon()
            shared.users.add(self)
            self._shared = shared
        return shared

    async def _server_or_none(self) -> tuple[_Shared, HelperClient] | None:
        shared = self._attach()
        if not self.serve:
            return None
        srv = await shared.get(self.name)
        return None if srv is None else (shared, srv)

    async def _call(self, command: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """The helper's reply within `timeout_s` (default: the executor's own)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        got = await self._server_or_none()
        if got is not None:
            shared, srv = got
            try:
                if command == "status":
                    reply = await shared.status(srv, request["runs"], limit)
                elif command == "probe":
                    reply = await shared.probe(srv, request["gpu_timeout_s"], limit, request.get("discover"))
                else:
                    reply = await srv.call(command, request, limit)
            except NodeUnreachable:
                if srv.dead is None:  # alive but silent: a second helper would only wait as long
                    raise NodeUnreachable(
                        f"node helper '{command}' did not answer within {limit:g} s") from None
                if srv.closed and srv not in shared.dropped:  # close() while it waited: no helper after close
                    raise NodeUnreachable(f"node helper '{command}': the executor was closed") from None
                # the server died under this request: once more on a helper of its own (launch is
                # idempotent per run folder, and so is a data_write: it lands at its offset, the file cut there
                # first; the rest only read, or signal a run that is still there)
                log.warning("%s: the helper server died (%s); starting another", self.name, srv.dead)
                shared.drop(srv)
            else:
                shared.failures = 0
                self.last_contact = time.monotonic()
                return check_reply(reply, "", command)
        return await self._oneshot(command, request, limit)

    async def _oneshot(self, command: str, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s):
                proc = await asyncio.create_subprocess_exec(
                    *self.argv, command,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
                try:
                    out, err = await proc.communicate(json.dumps(request).encode())
                finally:
                    if proc.returncode is None:  # timed out: the helper must not outlive the call
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        await proc.wait()
        except TimeoutError:
            raise NodeUnreachable(f"node helper '{command}' did not answer within {timeout_s:g} s") from None
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            raise NodeRefused(f"cannot run the node helper: {e}", Refusal.PYTHON) from None
        except OSError as e:  # out of processes or memory: this machine may recover
            raise NodeUnreachable(f"cannot run the node helper: {e}") from None
        reply = parse_oneshot(out, err, proc.returncode, label="", what=command, python=self.python)
        self.last_contact = time.monotonic()
        return reply

    # ----------------------------------------------------------------------------------- the protocol

    @recorded
    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        if self.helper is not None:
            # first contact with an installed helper: its sudo rule, its confinement and its protocol, before
            # anything is asked of it (an older one would half do what a newer controller asks)
            await self._node_root()
        request: dict[str, Any] = {"gpu_timeout_s": gpu_timeout_s}
        if self.discover is not None:
            request["discover"] = self.discover
        return await self._call("probe", request)

    @property
    def home_shared(self) -> bool:
        """Whether this node's folders are the controller's own (False through an installed helper)."""
        return self.helper is None

    async def _node_root(self) -> str:
        if self._root is None:
            assert self.helper is not None
            self._root = await _confined.whoami(self._call, self.name, self.helper)
        return self._root

    async def _run_dir(self, local_run_dir: str) -> str:
        """The helper's folder for a run the controller names by `local_run_dir`."""
        if self.helper is None:
            return local_run_dir
        rdir = _confined.mapped(await self._node_root(), "runs", local_run_dir)
        self._local_of[rdir] = local_run_dir
        return rdir

    @staticmethod
    def _handle_out(d: Any, local_run_dir: str) -> RunHandle | None:
        handle = handle_from_dict(d)
        return replace(handle, run_dir=local_run_dir) if handle is not None else None

    @recorded
    async def launch(self, req: LaunchRequest) -> RunHandle:
        rdir = await self._run_dir(req.run_dir)
        if self.helper is not None:  # folders passable from the helper's own, not from the controller's home
            req = replace(req, base_dir=await self._node_root())
        reply = await self._call("launch", launch_request(req, rdir))
        handle = self._handle_out(reply.get("handle"), req.run_dir)
        if handle is None:
            raise HelperError(f"launch of {req.run_dir} returned no handle", "launch")
        return handle

    @recorded
    async def users(self, names: Sequence[str]) -> dict[str, bool]:
        reply = await self._call("users", {"names": list(names)})
        return {str(k): bool(v) for k, v in (reply.get("present") or {}).items()}

    @recorded
    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        if not queries:
            return []
        runs = []
        for q in queries:
            rdir = await self._run_dir(q.run_dir)
            runs.append({"run_dir": rdir, "handle": handle_to_dict(replace(q.handle, run_dir=rdir))
                         if q.handle is not None else None})
        reply = await self._call("status", {"runs": runs})
        if self.helper is None:
            return [report_from_dict(r) for r in reply["runs"]]
        return [replace(report_from_dict(r), handle=self._handle_out(r.get("handle"), q.run_dir))
                for q, r in zip(queries, reply["runs"], strict=True)]

    @recorded
    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False,
                     batch_only: bool = False, purpose: str = "stop") -> bool:
        handle = replace(handle, run_dir=await self._run_dir(handle.run_dir))
        reply = await self._call("signal", {"handle": handle_to_dict(handle), "signal": signal,
                                            "all_processes": all_processes, "batch_only": batch_only,
                                            "purpose": purpose})
        return bool(reply.get("sent"))

    @recorded
    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        if self.helper is not None:  # the user's file: only the helper (root) may read it
            reply = await self._call("read", {"path": f"{await self._run_dir(run_dir)}/output.log",
                                              "offset": offset, "max_bytes": max_bytes})
            return base64.b64decode(reply.get("data") or "")
        # the run folder is on this machine's disk: read it here, no helper needed
        try:
            data = await asyncio.to_thread(_read_at, Path(run_dir) / "output.log", offset, max_bytes)
        except OSError as e:
            raise HelperError(f"cannot read the log of {run_dir}: {e}", "read") from None
        self.last_contact = time.monotonic()
        return data

    @recorded
    async def newest_mtime(self, path: str) -> float | None:
        """When a file under `path` last changed (a job's last checkpoint), None if there is none."""
        reply = await self._call("newest", {"path": path})
        newest = reply.get("newest")
        return float(newest) if newest is not None else None

    @recorded
    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        """A dataset request through the helper (an installed one too: then only under its folder's `data`)."""
        return await self._call(f"data_{op}", dict(req), timeout_s)

    @recorded
    async def remote_path(self, local_path: str) -> str:
        if self.helper is not None:
            return _confined.mapped(await self._node_root(), "files", local_path)
        return local_path  # this machine: the controller's own disk

    @recorded
    async def put(self, local: str | Path, remote: str, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        if self.helper is not None:
            await _confined.put_tree(self._call, Path(local), remote, node=self.name, timeout_s=timeout_s,
                                     user=user)
            return
        await self._copy("put", str(local), remote, timeout_s, user)

    @recorded
    async def get(self, remote: str, local: str | Path, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        if self.helper is not None:
            await _confined.get_tree(self._call, remote, Path(local), node=self.name, timeout_s=timeout_s,
                                     user=user)
            return
        await self._copy("get", remote, str(local), timeout_s, user)

    async def _copy(self, what: str, src: str, dst: str, timeout_s: float, user: str | None) -> None:
        await copy_off_loop(self.name, what, src, dst, timeout_s, user)
        self.last_contact = time.monotonic()

    async def watch(self, interval_s: float = 1.0, *, count: int | None = None,
                    stale_after_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Monitoring samples from this machine every `interval_s` (see hsched.node.watch for the shape)."""
        stale = stale_after_s if stale_after_s is not None else max(5.0, 3 * interval_s)
        simulate = None
        if self.simulate is not None:
            from hsched.simulated import simulated_uuid

            simulate = {"uuids": [simulated_uuid(self.node, i) for i in range(self.simulate.count)],
                        "memory_mib": self.simulate.memory_mib}
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, "watch", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            raise self._failed(NodeRefused(f"cannot run the node helper: {e}", Refusal.PYTHON)) from None
        except OSError as e:
            raise self._failed(NodeUnreachable(f"cannot run the node helper: {e}")) from None
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"interval_s": interval_s, "count": count, "simulate": simulate}).encode())
            await proc.stdin.drain()
            proc.stdin.close()
            while True:
                try:
                    async with asyncio.timeout(stale):
                        line = await proc.stdout.readline()
                except TimeoutError:
                    raise self._failed(NodeUnreachable(f"node helper 'watch' sent nothing for {stale:g} s")) from None
                if not line:
                    if count is not None:
                        return
                    raise self._failed(HelperError("node helper 'watch' ended", "watch"))
                try:
                    sample = json.loads(line)
                except ValueError:
                    raise self._failed(HelperError(
                        f"node helper 'watch' sent a line that is not JSON: {line[:200]!r}", "watch")) from None
                if "seq" not in sample:
                    if "error" in sample:
                        raise self._failed(HelperError(f"node helper 'watch': {sample['error']}", "watch"))
                    return
                self.last_contact = time.monotonic()
                self.last_error = None
                sample["node"] = self.node
                for p in sample.get("processes") or ():
                    # local run folders are the controller's own, but an installed helper's
                    p["job_run_dir"] = self._local_of.get(p.get("run_dir") or "", p.get("run_dir"))
                for r in [*(sample.get("progress") or ()), *(sample.get("run_usage") or ())]:
                    r["job_run_dir"] = self._local_of.get(r.get("run_dir") or "", r.get("run_dir"))
                yield sample
        except (BrokenPipeError, ConnectionResetError) as e:  # the helper died before it read its request
            raise self._failed(HelperError(f"node helper 'watch' ended: {e}", "watch")) from None
        finally:
            await _end_watch(proc)

    def _failed(self, e: ExecutorError) -> ExecutorError:
        self.last_error = e
        return e

    async def close(self) -> None:
        """Let go of the helper server; the last local node to close it ends it (see _Shared.close)."""
        shared = self._attach()
        self._shared = None
        shared.users.discard(self)
        if not shared.users:
            await shared.close()


async def _end_watch(proc: asyncio.subprocess.Process) -> None:
    """Stop a watch helper: SIGTERM first, so that it ends its nvidia-smi itself (a hung one included), then
    SIGKILL if it does not go (its nvidia-smi then die with it: the helper starts them with PR_SET_PDEATHSIG)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            async with asyncio.timeout(WATCH_STOP_S):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await proc.wait()


def _read_at(path: Path, offset: int, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""


def _conforms(ex: LocalExecutor) -> Executor:
    return ex  # mypy checks LocalExecutor against the protocol here
