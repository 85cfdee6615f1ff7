"""The controller process: single-instance lock, control socket, the main loop, a clean stop or restart.

Started on demand by the CLI (`python -m hsched.controller.server HOME`, detached) or by
`hsched daemon start`. One per HSCHED_HOME: an flock on controller.lock decides who runs.

The socket is the controller's one door, so it holds under abuse (hsched.protocol has the numbers): in
personal mode a peer of another uid is refused (in lab mode every local user may connect, or the members of
settings `lab_group`, and each request acts as the peer's uid, which the kernel attests: SO_PEERCRED); a
request line longer than MAX_LINE is answered with one clear error and the connection closed, never buffered
whole; a connection that sends no whole request for settings `idle_timeout_s` is closed; connections,
subscriptions and requests being answered are capped per uid, with a reserve of connections that only root and
the admins may use (Door), so that no member's flood locks out the others; past a cap a newcomer is told so in one
line and closed. Every argument is checked in api.py, every request's size against the settings' bounds.

Restart: when hsched is reinstalled under a running controller (hsched.controller.loops notices, or a client
of another version does), it stops as `daemon stop` stops it (runs go on; probes cancelled, executors closed,
helper processes reaped) and then execs its own command line again; the new code reattaches the runs as after
any restart, and the client that saw "restarting" sends its request again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sqlite3
import stat
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hsched.config import Settings, load_fleet, load_settings
from hsched.controller.api import Api
from hsched.controller.core import Controller, Stopping, installed_fingerprint
from hsched.controller.health import monitor
from hsched.controller.loops import health_loop, installed_now, reconcile, run_loop, start
from hsched.controller.metrics import serve as serve_metrics
from hsched.controller.services import service_loop
from hsched.controller.store import Store, damaged
from hsched.errors import HschedError, PermissionDenied, UserError
from hsched.paths import Home
from hsched.protocol import (
    MAX_LINE,
    OPS_ANY_PROTOCOL,
    PACKAGE_VERSION,
    PROTOCOL,
    Kind,
    encode,
    encode_reply,
    peer_uid,
    stamped,
    too_large,
)

log = logging.getLogger("hsched.controller")

EXIT_RESTART = 75
"""serve()'s answer when the controller should start again on the hsched installed now."""
GRACE_S = 0.2
"""At a stop, how long an idle connection may still deliver a request that was already on its way."""



BIG_REPLY = 2000
"""A reply listing more items than this is encoded off the event loop (100,000 jobs: ~3 s of JSON)."""

class AlreadyRunning(HschedError):
    pass


@dataclass(frozen=True, slots=True)
class Limits:
    """The socket's limits. None: the controller's settings say (hsched.config.Settings, whose defaults are
    hsched.protocol's values); tests shrink them."""

    max_line: int = MAX_LINE
    idle_timeout_s: float | None = None
    max_connections: int | None = None
    drain_s: float = 10.0
    """At a stop, how long requests being answered get to finish."""
    max_connections_per_user: int | None = None
    admin_reserve: int | None = None
    max_subscriptions_per_user: int | None = None
    max_requests_per_user: int | None = None


@dataclass(frozen=True, slots=True)
class Caps:
    """The limits a Door enforces: a Limits with what it leaves open taken from the settings."""

    idle_timeout_s: float
    max_connections: int
    max_connections_per_user: int
    admin_reserve: int
    max_subscriptions_per_user: int
    max_requests_per_user: int

    @classmethod
    def of(cls, limits: Limits, settings: Settings) -> Caps:
        def pick(name: str) -> Any:
            mine = getattr(limits, name)
            return getattr(settings, name) if mine is None else mine

        caps = cls(**{name: pick(name) for name in cls.__slots__})
        # a total cap shrunk under the reserve (tests) leaves the members at least one connection
        return replace(caps, admin_reserve=min(caps.admin_reserve, caps.max_connections - 1))


SUBSCRIPTIONS = frozenset({"subscribe", "wait"})
"""Requests that hold their connection until something happens (a stream, jobs ending): counted per user."""
HANGUP_POLL_S = 1.0
"""How often a subscription looks whether its client hung up (a `wait` of a week for a client long gone)."""
ADMIN_CACHE_S = 10.0
"""How long the door trusts its answer to "is this uid an admin" (a flood of refused connections must not look the
groups up once each)."""


@dataclass(slots=True)
class Peer:
    """What one uid holds of the door (counters the door moves, so not frozen)."""

    connections: int = 0
    subscriptions: int = 0
    requests: asyncio.Semaphore | None = None


def hung_up(sock: Any) -> bool:
    """Whether the client at the other end of `sock` closed it (POLLHUP: a Unix socket's peer closed both ways; one
    that only shut its writing side still reads its replies, and is not hung up)."""
    import select

    try:
        poller = select.poll()
        poller.register(sock.fileno(), 0)
        return any(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, mask in poller.poll(0))
    except (OSError, ValueError):
        return True


LOCK_TRIES = 50
LOCK_RETRY_S = 0.01


def acquire_lock(home: Home) -> int:
    fd = os.open(home.lock, os.O_RDWR | os.O_CREAT, 0o600)
    # `controller_pid` (daemon status, the CLI) tests the lock by taking it shared for an instant: a start that
    # falls in that instant must not take it for a running controller. A controller holds it for good, so a
    # lock still held after half a second is one.
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == LOCK_TRIES - 1:
                os.close(fd)
                raise AlreadyRunning(f"a controller already runs for {home.root}") from None
            time.sleep(LOCK_RETRY_S)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.fsync(fd)
    return fd


def _error(kind: Kind, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "kind": kind.value, "error": message, **extra}


class Door:
    """The socket's connections: who is connected, who is being answered, and the limits on both, per uid (the
    kernel's, SO_PEERCRED): a lab member holds at most `max_connections_per_user` connections, `max_subscriptions_
    per_user` streams and waits, and `max_requests_per_user` requests being answered (the next wait their turn);
    all members together never take the last `admin_reserve` connections, kept for root, the controller's account
    and the admins (who are held to the total only)."""

    def __init__(self, api: Api, limits: Limits) -> None:
        self.api = api
        self.ctl = api.ctl
        self.limits = limits
        self._caps = Caps.of(limits, self.ctl.settings)
        self._caps_of = self.ctl.settings
        self.connections: set[asyncio.Task[Any]] = set()
        self.busy: set[asyncio.Task[Any]] = set()
        """Connections in the middle of a request (a stop lets them finish; the idle ones are closed)."""
        self.peers: dict[int, Peer] = {}
        self._admins: dict[int, tuple[bool, float]] = {}

    @property
    def caps(self) -> Caps:
        """The limits, as the settings say now (`hsched daemon reload` may have changed them)."""
        if self._caps_of is not self.ctl.settings:
            self._caps, self._caps_of = Caps.of(self.limits, self.ctl.settings), self.ctl.settings
        return self._caps

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer: Peer | None = None
        uid = os.getuid()
        try:
            sock = writer.get_extra_info("socket")
            attested = peer_uid(sock) if sock is not None else None
            uid = uid if attested is None else attested
            if uid != os.getuid() and not self.ctl.home.lab:
                await self._send(writer, _error(Kind.FAILED, f"permission denied: this controller serves uid "
                                                             f"{os.getuid()} only"))
                return
            refusal = await self._admit(uid)
            if refusal is not None:
                await self._send(writer, _error(Kind.FAILED, refusal))
                return
            self.connections.add(task)
            peer = self.peers.setdefault(uid, Peer())
            peer.connections += 1
            await self._requests(reader, writer, uid, task)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            return  # the client went away, or stopped reading its replies
        finally:
            self.connections.discard(task)
            self.busy.discard(task)
            if peer is not None:
                peer.connections -= 1
                if peer.connections <= 0:
                    self.peers.pop(uid, None)
            with contextlib.suppress(Exception):
                writer.close()

    async def _admit(self, uid: int) -> str | None:
        """None when `uid` may open one more connection; else the one line that says why not."""
        caps = self.caps
        total = len(self.connections)
        if total >= caps.max_connections:
            return f"too many connections to the controller ({caps.max_connections} open); try again"
        peer = self.peers.get(uid)
        mine = peer.connections if peer is not None else 0
        if mine < caps.max_connections_per_user and total < caps.max_connections - caps.admin_reserve:
            return None
        if await self._privileged(uid):
            return None  # the reserve is theirs
        if mine >= caps.max_connections_per_user:
            return (f"too many connections from {await self.api.user_name(uid)} ({mine} open; settings "
                    f"max_connections_per_user = {caps.max_connections_per_user}): close some and try again")
        return (f"too many connections to the controller ({total} open; the last {caps.admin_reserve} are kept for "
                "admins, settings admin_reserve); try again")

    async def _privileged(self, uid: int) -> bool:
        """Root, the controller's own account and settings `admins`: held to the total cap only."""
        if uid in (0, os.getuid()):
            return True
        now = time.monotonic()
        hit = self._admins.get(uid)
        if hit is not None and now - hit[1] < ADMIN_CACHE_S:
            return hit[0]
        verdict = await self.api.is_admin(uid)
        self._admins[uid] = (verdict, now)
        return verdict

    def _slot(self, uid: int) -> contextlib.AbstractAsyncContextManager[Any]:
        """A turn among `uid`'s requests being answered (root's and the controller account's are not counted)."""
        if uid in (0, os.getuid()):
            return contextlib.nullcontext()
        peer = self.peers.setdefault(uid, Peer())
        if peer.requests is None:
            peer.requests = asyncio.Semaphore(self.caps.max_requests_per_user)
        return peer.requests

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uid: int,
                        task: asyncio.Task[Any]) -> None:
        # a request that reached a stopping controller is still answered (told "restarting" where it restarts);
        # then the connection closes
        idle = self.caps.idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(idle):
                    line = await reader.readuntil(b"\n")
            except TimeoutError:
                log.info("closing a connection idle for %g s", idle)
                return
            except asyncio.IncompleteReadError:
                return  # end of stream (what came without a newline is not a request)
            except asyncio.LimitOverrunError:
                # what is buffered goes with the connection: a huge line never sits in memory whole
                await self._send(writer, _error(Kind.USER, too_large(self.limits.max_line)))
                return
            self.busy.add(task)
            try:
                try:
                    reply = await self._answer(line, uid, writer)
                except (ConnectionError, TimeoutError):
                    raise
                except Exception as e:  # never an uncaught error for one request: it is answered, and logged
                    log.exception("a request failed")
                    reply = _error(Kind.FAILED, f"internal error: {type(e).__name__}: {e}")
                if reply is None:
                    return  # a subscription, over
                await self._send(writer, reply)
            finally:
                self.busy.discard(task)
            if self.ctl.stopping.is_set():
                return

    async def _send(self, writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
        result = reply.get("result")
        if isinstance(result, list) and len(result) > BIG_REPLY:
            # `queue --all` over a long history is tens of MB of JSON: encoded in a thread, not on the event loop
            writer.write(await asyncio.to_thread(encode_reply, stamped(reply)))
        else:
            writer.write(encode_reply(stamped(reply)))
        # a client that stops reading its replies must not hold the controller's memory forever
        async with asyncio.timeout(self.caps.idle_timeout_s):
            await writer.drain()

    async def _answer(self, line: bytes, uid: int, writer: asyncio.StreamWriter) -> dict[str, Any] | None:
        try:
            req = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return _error(Kind.USER, "malformed request: not JSON")
        if not isinstance(req, dict):
            return _error(Kind.USER, "malformed request: expected a JSON object")
        op = req.get("op")
        if not isinstance(op, str) or not op:
            return _error(Kind.USER, "malformed request: `op` must be a non-empty string")
        args = req.get("args")
        args = {} if args is None else args
        if not isinstance(args, dict):
            return _error(Kind.USER, f"args: expected a JSON object, found {type(args).__name__}")
        if self.ctl.restart_reason is not None:
            return self._restarting()
        if op not in OPS_ANY_PROTOCOL:
            skew = await self._skew(req.get("protocol", 1), req.get("hsched"))
            if skew is not None:
                return skew
        if op in SUBSCRIPTIONS:
            return await self._subscription(op, args, uid, writer)
        async with self._slot(uid):
            return await self._handle(op, args, uid)

    async def _subscription(self, op: str, args: dict[str, Any], uid: int,
                            writer: asyncio.StreamWriter) -> dict[str, Any] | None:
        """A stream or a `wait`: counted against `uid`'s subscriptions, and ended when its client hangs up."""
        peer = self.peers.setdefault(uid, Peer())
        cap = self.caps.max_subscriptions_per_user
        if peer.subscriptions >= cap and not await self._privileged(uid):
            return _error(Kind.FAILED, f"too many subscriptions from {await self.api.user_name(uid)} "
                                       f"({peer.subscriptions} streams and waits open; settings "
                                       f"max_subscriptions_per_user = {cap}): end one and try again")
        peer.subscriptions += 1
        try:
            if op == "subscribe":
                try:
                    interval = self.api.number(args, "interval", 1.0, low=0.1, high=3600.0)
                except UserError as e:
                    return _error(Kind.USER, str(e), problems=e.problems)
                await self._while_heard(writer, self._stream(writer, interval))
                return None
            done, reply = await self._while_heard(writer, self._handle(op, args, uid))
            if not done:
                raise ConnectionResetError("the client hung up")  # no one to answer
            return reply
        finally:
            peer.subscriptions -= 1

    async def _while_heard(self, writer: asyncio.StreamWriter, work: Any) -> tuple[bool, Any]:
        """(True, what `work` returned), or (False, None) once its client hung up (then it is cancelled)."""
        sock = writer.get_extra_info("socket")
        task = asyncio.ensure_future(work)
        try:
            while True:
                finished, _ = await asyncio.wait([task], timeout=HANGUP_POLL_S)
                if finished:
                    return True, task.result()
                if sock is not None and hung_up(sock):
                    return False, None
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _handle(self, op: str, args: dict[str, Any], uid: int) -> dict[str, Any]:
        try:
            return {"ok": True, "result": await self.api.handle(op, args, uid)}
        except UserError as e:
            return _error(Kind.USER, str(e), problems=e.problems)
        except Stopping as e:
            return self._restarting() if self.ctl.restart_reason is not None else _error(Kind.FAILED, str(e))
        except PermissionDenied as e:
            return _error(Kind.DENIED, str(e))
        except HschedError as e:
            return _error(Kind.FAILED, str(e))
        except Exception as e:  # a bug in one handler must not take the controller down
            log.exception("request %s failed", op)
            return _error(Kind.FAILED, f"internal error: {type(e).__name__}: {e}")

    def _restarting(self) -> dict[str, Any]:
        return _error(Kind.RESTARTING, f"the controller restarts ({self.ctl.restart_reason}); "
                                       "nothing was done: send the request again")

    async def _skew(self, protocol: Any, version: Any) -> dict[str, Any] | None:
        """A client of another version or protocol: restart on the hsched installed now if it changed under
        this controller; else refuse a client whose protocol differs, and serve one that only differs in
        version (another installation of a compatible hsched)."""
        if protocol == PROTOCOL and version == PACKAGE_VERSION:
            return None
        new = await installed_now(self.ctl)
        if new is not None:
            self.ctl.request_restart(f"hsched was reinstalled under it ({self.ctl.fingerprint} -> {new}); a client "
                                     f"of hsched {version} asked")
            return self._restarting()
        if protocol != PROTOCOL:
            return _error(Kind.VERSION, f"this hsched ({version or 'unknown version'}, protocol {protocol}) and "
                                        f"the controller for {self.ctl.home.root} (hsched {PACKAGE_VERSION}, "
                                        f"protocol {PROTOCOL}) cannot talk: `hsched daemon restart` restarts the "
                                        "controller on this hsched")
        return None

    async def _stream(self, writer: asyncio.StreamWriter, interval: float) -> None:
        """A snapshot now, then one every `interval` (device utilization moves without any job changing)."""
        ctl = self.ctl
        try:
            while not ctl.stopping.is_set():
                snap = await self.api.op_snapshot({}, os.getuid())
                writer.write(encode({"type": "snapshot", **snap}))
                async with asyncio.timeout(self.caps.idle_timeout_s):
                    await writer.drain()
                await ctl.clock.wait(ctl.stopping, max(0.1, interval))
        except (ConnectionError, RuntimeError, TimeoutError):
            return

    async def close(self) -> None:
        """At a stop: a moment for requests already on their way (answered, or told "restarting"), then idle
        connections close; requests being answered get `drain_s` to finish."""
        idle = list(self.connections - self.busy)
        if idle:
            await asyncio.wait(idle, timeout=GRACE_S)
        for task in self.connections - self.busy:
            task.cancel()
        busy = list(self.busy)
        if busy:
            _, late = await asyncio.wait(busy, timeout=self.limits.drain_s)
            for task in late:
                task.cancel()
        rest = list(self.connections)
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=5)


# ------------------------------------------------------------------------------ helper processes at a stop


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    pgrp: int
    session: int
    start: int
    """Start time in clock ticks since boot: with the pid, it names one process for good."""


def read_procs() -> dict[int, Proc]:
    """Every process in /proc (empty where there is none). Blocking: call it from a thread."""
    out: dict[int, Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the name: state ppid pgrp session ... starttime is the 22nd field of the whole line
        out[int(name)] = Proc(int(name), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    return out


def helper_groups(procs: dict[int, Proc], me: int) -> dict[int, int]:
    """Process groups led by this controller's children in sessions of their own (the node helper servers the
    local executor starts), as group -> its leader's start time. Job wrappers are never among them: the helper
    starts each in a session of its own, which is not the helper's."""
    return {p.pid: p.start for p in procs.values() if p.ppid == me and p.pgrp == p.pid and p.session == p.pid}


def strays(procs: dict[int, Proc], me: int, groups: dict[int, int]) -> list[int]:
    """What is left of the controller's helpers once its executors are closed: every process still in one of
    `groups` (its leader gone, or the same leader still there), and the processes of the controller's own group
    (when it leads one) that it started or that were orphaned (a sampler's hung nvidia-smi), never the others of
    a shell pipeline it was started in."""
    out = []
    mine = procs.get(me)
    for p in procs.values():
        if p.pid == me:
            continue
        if p.pgrp in groups:
            leader = procs.get(p.pgrp)
            if leader is None or leader.start == groups[p.pgrp]:
                out.append(p.pid)
        elif mine is not None and mine.pgrp == me and p.pgrp == me:
            parent = procs.get(p.ppid)
            if p.ppid == me or parent is None or parent.pgrp == me or p.ppid != mine.ppid:
                out.append(p.pid)
    return sorted(out)


async def reap_strays(groups: dict[int, int]) -> int:
    """Kill what is left of the helpers (see strays); the number killed."""
    procs = await asyncio.to_thread(read_procs)
    killed = 0
    for pid in strays(procs, os.getpid(), groups):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    if killed:
        log.warning("killed %d helper process(es) left behind at the stop (a hung GPU tool?)", killed)
    return killed


# ----------------------------------------------------------------------------------------------- serving


def lab_socket_dir(sock: Path) -> None:
    """The lab socket's folder (/run/hsched, systemd's RuntimeDirectory): made 0755 if missing, so that every
    user reaches the socket in it; one that another user could write to is refused (they could swap the socket
    for their own and read every request)."""
    folder = sock.parent
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise UserError(f"lab socket folder {folder}: writable by others or owned by uid {st.st_uid}; make it "
                        f"root's (or this account's) and 0755, or set HSCHED_LAB_SOCKET elsewhere")


def open_to_lab(sock: Path, group: str | None) -> None:
    """Every local user may connect (0666), or only the members of `group` (0660, that group's); who each
    peer is, the kernel says per connection."""
    if group is None:
        os.chmod(sock, 0o666)
        return
    import grp

    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserError(f"settings lab_group: no group {group!r} on this machine; create it (`groupadd {group}`) "
                        "or remove the key to let every local user in") from None
    os.chown(sock, -1, gid)
    os.chmod(sock, 0o660)


ACCEPT_BACKLOG = 32
"""Connections the kernel queues for the socket (asyncio also accepts at most this many per turn)."""
NOFILE_WANTED = 8192


def room_for_files() -> None:
    """Raise the soft limit on open files toward the hard one: connections at the cap, the store, node helpers
    and their pipes must never run the controller out of descriptors (1,024 is the usual soft limit)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(NOFILE_WANTED, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError) as e:
        log.info("cannot raise the open files limit: %s", e)


async def serve(home: Home, limits: Limits | None = None, *, lock_fd: int | None = None) -> int:
    """Run the controller until it is stopped: 0, or EXIT_RESTART when it should start again on a reinstalled
    hsched (main() execs it). `lock_fd`: the single-instance lock, already held (main() holds it across a
    restart); without it, taken here and let go at the end."""
    limits = limits or Limits()
    home.secure()
    own_lock = lock_fd is None
    lock_fd = acquire_lock(home) if lock_fd is None else lock_fd
    try:
        settings = load_settings(home.settings)
        fleet_cfg = load_fleet(home.fleet_file())
        store = await asyncio.to_thread(open_store, home)
    except BaseException:
        if own_lock:
            os.close(lock_fd)
        raise
    # the database's -wal and -shm exist now: private, whatever they were before (by path: secure() never opens
    # the store's file, whose closing would drop SQLite's locks; see hsched.paths.Home.secure)
    home.secure()
    ctl = Controller(home, fleet_cfg, settings, store)
    ctl.lock_inode = os.fstat(lock_fd).st_ino
    ctl.fingerprint = await asyncio.to_thread(installed_fingerprint)
    api = Api(ctl)
    door = Door(api, limits)
    if home.lab:
        lab_socket_dir(home.socket)
    with contextlib.suppress(FileNotFoundError):
        home.socket.unlink()
    room_for_files()
    # every node's first probe is under way before the first request is read: a submit that no node known
    # so far can run waits for those probes (api._hear_first_probes) instead of racing their start
    await start(ctl)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
    try:
        # a short backlog: a flood of connections waits in the kernel rather than as open files here
        server = await asyncio.start_unix_server(door.serve, path=str(home.socket), limit=limits.max_line,
                                                 backlog=ACCEPT_BACKLOG)
    except BaseException:
        ctl.cancel_probes()
        await ctl.close_executors()
        raise
    finally:
        os.umask(old_umask)
    if home.lab:
        open_to_lab(home.socket, settings.lab_group)
    else:
        os.chmod(home.socket, 0o600)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctl.stopping.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: ctl.spawn(_reload_on_hangup(ctl)))
    log.info("controller %s (hsched %s, protocol %s, install %s) serving %s with fleet %s", os.getpid(),
             PACKAGE_VERSION, PROTOCOL, ctl.fingerprint, home.root, fleet_cfg.source)
    metrics_server = None
    try:
        if settings.metrics:
            try:
                metrics_server = await asyncio.to_thread(serve_metrics, ctl, settings.metrics, loop)
            except OSError as e:  # a port in use must not keep the queue from running: said, and served without
                log.error("metrics: cannot serve on %s: %s", settings.metrics, e)
        async with asyncio.TaskGroup() as tg:
            reconciling = tg.create_task(reconcile(ctl))
            loop_task = tg.create_task(run_loop(ctl))
            others = [tg.create_task(monitor(ctl, rt)) for rt in ctl.nodes.values() if ctl.wants_monitor(rt)]
            others.append(tg.create_task(health_loop(ctl)))
            others.append(tg.create_task(backup_loop(ctl)))
            others.append(tg.create_task(service_loop(ctl)))  # issue 30: hsched.controller.services
            others.append(reconciling)
            await ctl.stopping.wait()
            server.close()  # no new connections; requests under way are answered (or told "restarting")
            ctl.poke()
            await ctl.notify()  # requests waiting for a change (`wait`) see the stop
            await door.close()
            await loop_task
            for t in others:
                t.cancel()
    finally:
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.close)
        with contextlib.suppress(FileNotFoundError):
            home.socket.unlink()
        ctl.cancel_probes()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.gather(*ctl.probes, return_exceptions=True)
        groups = helper_groups(await asyncio.to_thread(read_procs), os.getpid())
        await ctl.close_executors()
        await reap_strays(groups)
        ctl.close()
        store.close()
        log.info("controller %s %s", os.getpid(), "restarts" if ctl.restart_reason else "stopped")
        if own_lock:
            os.close(lock_fd)
    return EXIT_RESTART if ctl.restart_reason is not None else 0


def open_store(home: Home) -> Store:
    """The home's store, checked (hsched.controller.store.Store), or one line saying why the controller will not
    start on it.
    A zero-length file where a store is expected (the home ran jobs, or has a backup or a write-ahead log) is a
    lost store, never a fresh start: an empty queue in its place would forget every job in silence. Blocking."""
    try:
        empty = home.db.stat().st_size == 0
    except FileNotFoundError:
        empty = False
    if empty and home.has_history():
        raise damaged(home.db, "the file is empty (0 bytes) but this home has held a queue: its run or checkpoint "
                               "folders, write-ahead log or backup")
    t0 = time.monotonic()
    store = Store(home.db)
    log.info("store %s opened and checked in %.2f s", home.db, time.monotonic() - t0)
    return store


BACKUP_EVERY_S = 6 * 3600.0
"""How often the store is copied to its backup (also once at every start, once the store was checked): what a
damaged store is restored from, so at most this much of the queue's history is behind."""


async def backup_loop(ctl: Controller) -> None:
    """Keep the store's backup fresh: at start, then every BACKUP_EVERY_S. A failed copy (a full disk) is said in
    the log and leaves the last good backup in place."""
    while not ctl.stopping.is_set():
        try:
            path = await asyncio.to_thread(ctl.store.backup)
            log.info("store backed up to %s", path)
        except (OSError, HschedError, sqlite3.Error) as e:
            log.warning("cannot back up the store: %s", e)
        await ctl.clock.wait(ctl.stopping, BACKUP_EVERY_S)


async def _reload_on_hangup(ctl: Controller) -> None:
    """SIGHUP (`systemctl reload hsched`): as `hsched daemon reload`; a file with a mistake is logged and changes
    nothing."""
    from hsched.controller.reloading import reload

    try:
        async with ctl.lock:
            await reload(ctl)
    except UserError as e:
        log.error("reload refused, nothing changed: %s", "; ".join(e.problems) or e)


LOCK_FD_ENV = "HSCHED_CONTROLLER_LOCK_FD"
"""Set across a restart's exec: the lock's descriptor, still held, that the new image takes over."""


def inherited_lock(home: Home) -> int | None:
    """The lock descriptor the image before this one handed over (same process, after exec), if it is this
    home's lock file; so that no other controller can start while this one restarts."""
    raw = os.environ.pop(LOCK_FD_ENV, None)
    if raw is None or not raw.isdigit():
        return None
    fd = int(raw)
    try:
        same = os.fstat(fd).st_ino == os.stat(home.lock).st_ino
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: a no-op that proves it
    except OSError:
        return None
    if not same:
        os.close(fd)
        return None
    os.set_inheritable(fd, False)
    return fd


LOG_MAX_BYTES = 10 << 20
LOG_BACKUPS = 5


def setup_logging(home: Home) -> None:
    """Under systemd (its journal is on our stderr: JOURNAL_STREAM) log to stderr, where journald stamps each
    line; otherwise to controller.log, rotated by size (10 MiB, 5 kept) so a long-lived lab controller never
    fills its disk."""
    from logging.handlers import RotatingFileHandler

    handler: logging.Handler
    if os.environ.get("JOURNAL_STREAM"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler = RotatingFileHandler(home.log, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def main(argv: list[str]) -> int:
    home = Home.at(Path(argv[1])) if len(argv) > 1 else Home.from_env()
    try:
        home.secure()
    except UserError as e:
        print(f"hsched: error: {e}", file=sys.stderr)
        return 2
    setup_logging(home)
    try:
        lock_fd = inherited_lock(home)
        if lock_fd is None:
            lock_fd = acquire_lock(home)
    except AlreadyRunning as e:
        print(f"hsched: {e}", file=sys.stderr)
        return 3
    try:
        rc = asyncio.run(serve(home, lock_fd=lock_fd))
    except UserError as e:
        for p in e.problems:
            print(f"hsched: error: {p}", file=sys.stderr)
        log.error("cannot start: %s", e)
        os.close(lock_fd)
        return 2
    except HschedError as e:  # a full disk: one line, not a traceback
        print(f"hsched: error: {e}", file=sys.stderr)
        log.error("cannot start: %s", e)
        os.close(lock_fd)
        return 1
    if rc == EXIT_RESTART:
        # the same command line, now importing the hsched installed on disk, in the same process: the lock is
        # handed over held (no other controller can slip in meanwhile) and the runs are adopted as after any
        # restart
        logging.shutdown()
        os.set_inheritable(lock_fd, True)
        os.environ[LOCK_FD_ENV] = str(lock_fd)
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    os.close(lock_fd)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
