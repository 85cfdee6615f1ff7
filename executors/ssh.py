"""The SSH executor: the node helper run on a remote machine over one asyncssh connection per node.

Nothing is installed on a node but sshd and python3 (>= 3.8): on first contact the helper (and its NVML
sibling) is uploaded to `<root>/helper-<hash>/`, where `<root>` is `$HSCHED_NODE_ROOT` on the node or
`~/.cache/hsched`; a new hsched version ships a new folder, an unchanged one is never sent twice. Each call
is a request to one long-lived `python3 <helper> serve` on its own channel (the same client the local
executor uses with its subprocess, executors/_rpc.py), or `python3 <helper> CMD` with the JSON request on
stdin and the reply on stdout while no server can be had. Every word of every remote command goes through
`shlex.quote`; job data (names, arguments, environment, folders) travels inside the JSON, never through a
shell.

Run folders: the controller names runs by a local path under HSCHED_HOME; on a node the same run lives in
`<root>/runs/<hash of the local parent>/<basename>`. The mapping is a pure function of the local path, so
it holds across reconnects and controller restarts, and handles going out carry the local path again.

Failure handling: host keys are always verified (see `_sshconfig`); connects and commands are bounded by
`asyncio.timeout`; keepalives notice a dead peer; a failed connect is retried with exponential backoff
(calls in between fail at once with the last error); a semaphore keeps concurrent channels below sshd's
default MaxSessions (10). Every asyncssh or OS error reaches the caller as one line in an ExecutorError of
the class that says what happened (`classify` below: from exception classes and disconnect codes, never
from message text): NodeUnreachable, NodeRefused (with its Refusal), HelperError or TransferError.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import random
import shlex
import stat
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncssh

from hsched.config import NodeConfig
from hsched.errors import (
    ExecutorError,
    HelperError,
    NodeRefused,
    NodeUnreachable,
    Refusal,
    TransferError,
)
from hsched.model import RunHandle, RunReport
from hsched.node import nodehelper, safefiles
from hsched.serialize import handle_from_dict, handle_to_dict

from . import _confined, _sshconfig, _sshfiles
from ._contact import recorded
from ._rpc import (
    NETWORK_ERRNOS,
    HelperClient,
    check_reply,
    launch_request,
    network_error,
    parse_oneshot,
    report_from_dict,
)
from .base import Executor, LaunchRequest, StatusQuery

log = logging.getLogger("hsched.ssh")

HELPER_DIR = Path(nodehelper.__file__).resolve().parent
"""hsched/node: the helper's modules, shipped as they are (nodehelper.py is the script a node runs)."""
HELPER_ENTRY = "nodehelper.py"
NVML_PROBE_PATH = HELPER_DIR.parent / "topo" / "nvml_probe.py"
MAX_SESSIONS = 10
"""sshd's default MaxSessions: channels open at once on one connection."""


# --------------------------------------------------------------------------------------- remote scripts

def _one_line(script: str) -> str:
    """A Python script as one shell-safe line: no newline or quote for a non-POSIX login shell to mangle."""
    return f"import base64;exec(base64.b64decode({base64.b64encode(script.encode()).decode()!r}))"


# `digest`: the bundle found there (the files named after the folder and root, in the bundle's order), hashed as
# bundle_digest hashes it; one that is not the bundle's (a file missing, changed or half-written) is shipped again
# rather than used
_BOOTSTRAP = _one_line("""
import hashlib, json, os, sys
root = ((sys.argv[2] if len(sys.argv) > 2 else "") or os.environ.get("HSCHED_NODE_ROOT")
        or os.path.join(os.path.expanduser("~"), ".cache", "hsched"))
d = os.path.join(root, sys.argv[1])
digest = None
if os.path.isfile(os.path.join(d, "nodehelper.py")):
    h = hashlib.sha256()
    try:
        for name in sys.argv[3:]:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            h.update(b"%s\\0%d\\0" % (name.encode(), len(data)))
            h.update(data)
        digest = h.hexdigest()
    except OSError:
        digest = "incomplete"
print(json.dumps({"root": os.path.abspath(root), "python": list(sys.version_info[:3]),
                  "present": digest is not None, "digest": digest}))
""")

# files arrive in order and the helper comes last, so its presence means the folder is complete
_UPLOAD = _one_line("""
import base64, json, os, sys
req = json.loads(sys.stdin.read())
root, d = req["root"], os.path.join(req["root"], req["dir"])
if not os.path.isdir(root):
    os.makedirs(root, req.get("root_mode", 0o700))
if not os.path.isdir(d):
    os.makedirs(d, 0o755)
for name, data in req["files"]:
    tmp = os.path.join(d, ".%s.%d.tmp" % (name, os.getpid()))
    with open(tmp, "wb") as f:
        f.write(base64.b64decode(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, name))
print(json.dumps({"ok": True}))
""")


@dataclass(frozen=True, slots=True)
class HelperBundle:
    dirname: str
    files: tuple[tuple[str, bytes], ...]
    """(name, bytes) in the order they are written on a node: the helper's script last."""
    digest: str
    """bundle_digest(files): the folder is named after it, and a node's copy must hash to it."""


def bundle_digest(files: Sequence[tuple[str, bytes]]) -> str:
    """sha256 over the files in order, each as its name, its size and its bytes: any module changed, added or
    removed changes it (and so the folder a node runs the helper from)."""
    h = hashlib.sha256()
    for name, data in files:
        h.update(b"%s\0%d\0" % (name.encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def _pynvml_path() -> Path | None:
    """nvidia-ml-py's pynvml.py as installed here (a dependency of hsched), if it is one file."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.name == "pynvml.py" and origin.is_file() else None


@functools.cache
def helper_bundle() -> HelperBundle:
    """The files shipped to nodes and the folder named by their hash (read once per process)."""
    files: list[tuple[str, bytes]] = []
    if NVML_PROBE_PATH.is_file():
        files.append(("nvml_probe.py", NVML_PROBE_PATH.read_bytes()))
    pynvml = _pynvml_path()
    if pynvml is not None:
        # nvidia-ml-py's single ctypes-only file (BSD-3, its licence in its header): a node gets the same NVML
        # readings as this machine without installing anything; nvidia-smi stays the fallback. It is the
        # helper folder's own, so it comes first on the helper's sys.path.
        files.append(("pynvml.py", pynvml.read_bytes()))
    # the helper's package (safefiles.py, the rules for copies as root, among them), its script last
    files += [(p.name, p.read_bytes()) for p in sorted(HELPER_DIR.glob("*.py"))
              if p.name != HELPER_ENTRY and not p.name.startswith(".")]
    files.append((HELPER_ENTRY, (HELPER_DIR / HELPER_ENTRY).read_bytes()))
    digest = bundle_digest(files)
    return HelperBundle(dirname=f"helper-{digest[:16]}", files=tuple(files), digest=digest)


def shell_command(*words: str) -> str:
    """One remote command line with every word quoted."""
    return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True, slots=True)
class Remote:
    """What first contact learned about a node."""

    root: str
    helper: str
    python: tuple[int, ...]
    argv: tuple[str, ...] = ()
    """How to run the helper there: `python3 HELPER` (shipped), or `sudo -n LAUNCHER` (installed)."""


_mapped = _confined.mapped


class _Client(asyncssh.SSHClient):
    """Remembers the host key the server offered when known_hosts did not trust it (for the message)."""

    def __init__(self, owner: SSHExecutor, conn_id: int) -> None:
        self.owner = owner
        self.conn_id = conn_id

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.owner._offered = (addr, key)
        return False  # only known_hosts decides; `hsched node trust` is how a key gets there

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._on_lost(self.conn_id, exc)


# ------------------------------------------------------------------------------------------ executor

class SSHExecutor:
    """The executor protocol over SSH, plus watch (a monitoring stream), put/get (SFTP) and path mapping.

    Args:
        cfg: the node as the fleet file describes it (host may be an ~/.ssh/config alias).
        ssh_config: an ssh config file to read instead of ~/.ssh/config ($HSCHED_SSH_CONFIG also works).
        connect_timeout_s: TCP connect, key exchange and authentication, together.
        command_timeout_s: one helper call (probe, launch, status, signal, read).
        keepalive_interval_s, keepalive_count_max: a peer silent for their product is taken as gone.
        max_channels: channels open at once (watch and SFTP hold one each); below sshd's MaxSessions.
        backoff_initial_s, backoff_max_s: waits between failed connects, doubling from the first to the cap.
        python: the interpreter to run on the node.
        node_root: hsched's folder on the node; None: $HSCHED_NODE_ROOT there, else ~/.cache/hsched. A lab
            controller gives LAB_NODE_ROOT: its users' jobs must reach their folders under it, and root's home
            is closed to them.
    """

    kind = "ssh"
    home_shared = False

    def __init__(self, cfg: NodeConfig, *, ssh_config: str | Path | None = None, connect_timeout_s: float = 10.0,
                 command_timeout_s: float = 60.0, keepalive_interval_s: float = 5.0, keepalive_count_max: int = 3,
                 max_channels: int = 8, backoff_initial_s: float = 0.5, backoff_max_s: float = 10.0,
                 python: str = "python3", node_root: str | None = None, helper: str | None = None) -> None:
        if not cfg.host:
            raise NodeRefused(f"{cfg.name}: an ssh node needs a host", Refusal.CONFIG)
        if not 1 <= max_channels < MAX_SESSIONS:
            raise ValueError(f"max_channels must be 1..{MAX_SESSIONS - 1}")
        self.cfg = cfg
        self.name = cfg.name
        self.ssh_config = ssh_config
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self.keepalive_interval_s = keepalive_interval_s
        self.keepalive_count_max = keepalive_count_max
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.python = python
        self.node_root = node_root
        self.helper = helper
        """An installed helper's launcher, run through `sudo -n` (a service account's lab); None: ship one."""
        self.last_contact: float | None = None
        """time.monotonic() of the last exchange the node answered; the controller's heartbeat reads it."""
        self.last_error: ExecutorError | None = None
        """What the last call raised (None once one succeeded since)."""
        self._connect_error: ExecutorError | None = None
        """Why the last connect failed, repeated to calls inside the backoff window."""
        self.target: _sshconfig.Target | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_id = 0
        self._remote: Remote | None = None
        self._lock = asyncio.Lock()
        self._channels = asyncio.Semaphore(max_channels)
        self._failures = 0
        self._retry_at = 0.0
        self._offered: tuple[str, asyncssh.SSHKey] | None = None
        self._server: HelperClient | None = None
        self._server_conn: asyncssh.SSHClientConnection | None = None
        self._server_lock = asyncio.Lock()
        self._server_retry_at = 0.0
        self._local_of: dict[str, str] = {}
        """remote run folder -> local run folder, for the runs this executor has seen (watch owners)."""
        asyncssh_log = logging.getLogger("asyncssh")
        if asyncssh_log.level == logging.NOTSET:
            # asyncssh logs five INFO lines per channel: at one status call a second that drowns the controller log
            asyncssh_log.setLevel(logging.WARNING)

    # ----------------------------------------------------------------------------------- connection

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def _on_lost(self, conn_id: int, exc: Exception | None) -> None:
        if conn_id == self._conn_id and self._conn is not None:
            log.info("%s: connection lost: %s", self.name, exc or "closed")
            self._conn = None

    async def _resolve(self) -> _sshconfig.Target:
        try:
            target = await asyncio.to_thread(_sshconfig.resolve, self.cfg, self.ssh_config)
        except (ValueError, OSError, asyncssh.Error) as e:  # a bad ssh config line, an unreadable file
            raise NodeRefused(f"{self.name}: cannot read the ssh config: {_one(e)}", Refusal.CONFIG) from None
        self.target = target
        return target

    async def _open(self) -> asyncssh.SSHClientConnection:
        target = await self._resolve()
        try:
            known = await asyncio.to_thread(_sshconfig.load_known_hosts, target)
        except ValueError as e:
            raise NodeRefused(f"{self.name}: {e}", Refusal.CONFIG) from None
        self._offered = None
        self._conn_id += 1
        conn_id = self._conn_id
        kwargs: dict[str, Any] = {}
        if self.cfg.identity_file:
            kwargs["client_keys"] = [await asyncio.to_thread(_expand, self.cfg.identity_file)]
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                conn = await asyncssh.connect(
                    self.cfg.host, port=self.cfg.port or (), username=self.cfg.user or (),
                    config=_sshconfig.config_paths(self.ssh_config) or (),
                    known_hosts=known,  # always an object: verification can never be switched off
                    keepalive_interval=self.keepalive_interval_s, keepalive_count_max=self.keepalive_count_max,
                    connect_timeout=self.connect_timeout_s, login_timeout=self.connect_timeout_s,
                    client_factory=lambda: _Client(self, conn_id), **kwargs,
                )
        except asyncssh.HostKeyNotVerifiable:
            raise self._host_key_error(target, known) from None
        except TimeoutError:
            raise NodeUnreachable(
                f"{self.name}: cannot connect to {target.destination}: no answer within {self.connect_timeout_s:g} s"
            ) from None
        except asyncssh.PermissionDenied:
            raise NodeRefused(
                f"{self.name}: {target.destination} refused our keys (permission denied); check the node's user "
                "and identity_file, or the IdentityFile in ~/.ssh/config", Refusal.AUTH
            ) from None
        except (asyncssh.Error, OSError) as e:
            raise classify(e, f"{self.name}: cannot connect to {target.destination}: {_one(e)}") from None
        except ValueError as e:  # a key file that does not parse (asyncssh.KeyImportError), a bad config value
            raise NodeRefused(f"{self.name}: cannot connect to {target.destination}: {_one(e)}",
                              Refusal.CONFIG) from None
        return conn

    def _host_key_error(self, target: _sshconfig.Target, known: asyncssh.SSHKnownHosts) -> NodeRefused:
        if self._offered is None:
            return NodeRefused(f"{self.name}: the host key of {target.known_hosts_name} could not be verified; "
                               f"run: hsched node trust {self.name}", Refusal.HOST_KEY_UNKNOWN)
        addr, key = self._offered
        old = _sshconfig.known_keys(known, target, addr)
        files = ", ".join(str(f) for f in target.known_hosts_files)
        if old:
            return NodeRefused(
                f"{self.name}: HOST KEY CHANGED for {target.known_hosts_name}: it now offers "
                f"{_sshconfig.fingerprint(key)}, not the key in {files} (was it reinstalled, or is someone "
                f"in between?); if the change is expected: ssh-keygen -R {shlex.quote(target.known_hosts_name)}"
                f" -f {shlex.quote(str(target.trust_file))}, then hsched node trust {self.name}",
                Refusal.HOST_KEY_CHANGED)
        return NodeRefused(
            f"{self.name}: unknown host key for {target.known_hosts_name}: {_sshconfig.fingerprint(key)} "
            f"(not in {files}); if that fingerprint is right, run: hsched node trust {self.name}",
            Refusal.HOST_KEY_UNKNOWN)

    async def _connection(self) -> tuple[asyncssh.SSHClientConnection, Remote]:
        """The node's one connection, opened (and the helper shipped) if needed; backs off after failures."""
        conn, remote = self._conn, self._remote
        if conn is not None and remote is not None and not conn.is_closed():
            return conn, remote
        async with self._lock:
            if self._conn is not None and self._conn.is_closed():
                # lost without our hearing of it (it closed while it was being set up, before it was ours to
                # forget): never keep a dead connection, or every call after fails the same way for ever
                log.info("%s: connection found closed: opening a new one", self.name)
                self._conn = None
            if self._conn is not None and self._remote is not None:
                return self._conn, self._remote
            wait = self._retry_at - time.monotonic()
            if wait > 0 and self._connect_error is not None:
                raise _retold(self._connect_error, f"{self._connect_error} (next try in {wait:.1f} s)")
            try:
                conn = await self._open()
                try:
                    remote = await self._bootstrap(conn)
                except BaseException:
                    conn.close()
                    raise
            except ExecutorError as e:
                self._failures += 1
                delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (self._failures - 1))
                self._retry_at = time.monotonic() + delay * random.uniform(0.8, 1.0)
                self._connect_error = e
                raise
            if conn.is_closed():
                # it went during the first contact (the node rebooting, say): a failure like any other
                self._failures += 1
                self._retry_at = time.monotonic() + self.backoff_initial_s
                self._connect_error = NodeUnreachable(f"{self.name}: the connection closed during first contact")
                raise self._connect_error
            self._failures, self._retry_at, self._connect_error = 0, 0.0, None
            self._conn, self._remote = conn, remote
            self.last_contact = time.monotonic()
            return conn, remote

    def reset_backoff(self) -> None:
        """Let the next call try to connect at once (after `hsched node trust`, or a node known to be back)."""
        self._retry_at = 0.0

    async def _bootstrap(self, conn: asyncssh.SSHClientConnection) -> Remote:
        if self.helper is not None:
            return await self._installed(conn, self.helper)
        bundle = await asyncio.to_thread(helper_bundle)
        rc, out, err = await self._run(conn, shell_command(self.python, "-c", _BOOTSTRAP, bundle.dirname,
                                                           self.node_root or "", *(n for n, _ in bundle.files)), b"")
        info = self._parse(out, err, rc, "first contact")
        version = tuple(int(v) for v in info["python"])
        if version < (3, 8):
            raise NodeRefused(f"{self.name}: {self.python} there is {'.'.join(map(str, version))}; "
                              "hsched's node helper needs Python 3.8 or newer", Refusal.PYTHON)
        root = str(info["root"])
        want = bundle.digest
        if info["present"] and info.get("digest") != want:
            log.warning("%s: the node helper in %s/%s is not this hsched's (an older or damaged one): shipping it "
                        "again", self.name, root, bundle.dirname)
        if info.get("digest") != want:
            # a lab's node root is passable (0711): its users reach their run and checkpoint folders under it
            payload = json.dumps({"root": root, "dir": bundle.dirname, "root_mode": 0o711 if self.node_root else 0o700,
                                  "files": [
                [name, base64.b64encode(data).decode()] for name, data in bundle.files]}).encode()
            rc, out, err = await self._run(conn, shell_command(self.python, "-c", _UPLOAD), payload)
            self._parse(out, err, rc, "helper upload")
            log.info("%s: node helper shipped to %s/%s", self.name, root, bundle.dirname)
        helper = f"{root}/{bundle.dirname}/{HELPER_ENTRY}"
        return Remote(root=root, helper=helper, python=version, argv=(self.python, helper))

    async def _installed(self, conn: asyncssh.SSHClientConnection, launcher: str) -> Remote:
        """First contact with a node whose helper is installed (root's, confined) and run through sudo."""
        argv = _confined.helper_argv(launcher)

        async def call(command: str, request: dict[str, Any]) -> dict[str, Any]:
            rc, out, err = await self._run(conn, shell_command(*argv, command), json.dumps(request).encode())
            return self._parse(out, err, rc, command)

        root = await _confined.whoami(call, self.name, launcher)
        return Remote(root=root, helper=launcher, python=(), argv=argv)

    async def _run(self, conn: asyncssh.SSHClientConnection, command: str, stdin: bytes,
                   timeout_s: float | None = None) -> tuple[int | None, bytes, bytes]:
        """One channel: run `command`, feed `stdin`, collect output; the channel is closed whatever happens."""
        timeout_s = self.command_timeout_s if timeout_s is None else timeout_s
        try:
            async with self._channels, asyncio.timeout(timeout_s), _channel(conn, command) as proc:
                out, err = await proc.communicate(stdin)
                await proc.wait()
                rc = proc.exit_status
        except TimeoutError:
            raise NodeUnreachable(f"{self.name}: no answer within {timeout_s:g} s") from None
        except asyncssh.ChannelOpenError as e:
            raise classify(e, f"{self.name}: cannot open a channel: {_one(e)}") from None
        except (asyncssh.Error, OSError) as e:
            raise classify(e, f"{self.name}: connection failed: {_one(e)}") from None
        self.last_contact = time.monotonic()
        return rc, bytes(out or b""), bytes(err or b"")

    def _parse(self, out: bytes, err: bytes, rc: int | None, what: str) -> dict[str, Any]:
        return parse_oneshot(out, err, rc, label=self.name, what=what, python=self.python)

    async def _server_for(self, conn: asyncssh.SSHClientConnection, remote: Remote) -> HelperClient | None:
        """This connection's helper server, started on first use; None while one cannot be had."""
        srv = self._server
        if srv is not None and srv.dead is None and self._server_conn is conn:
            return srv
        if time.monotonic() < self._server_retry_at:
            return None  # it failed a moment ago: a channel per request for a while
        async with self._server_lock:  # many first calls at once must start one server, not one each
            return await self._start_server(conn, remote)

    async def _start_server(self, conn: asyncssh.SSHClientConnection, remote: Remote) -> HelperClient | None:
        srv = self._server
        if srv is not None and srv.dead is None and self._server_conn is conn:
            return srv
        if srv is not None:
            srv.close()
            self._server = None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._channels.acquire()
                try:
                    proc = await conn.create_process(shell_command(*remote.argv, "serve"),
                                                     encoding=None)
                except BaseException:
                    self._channels.release()
                    raise
        except (TimeoutError, asyncssh.Error, OSError) as e:
            log.info("%s: no helper server (%s); one channel per request", self.name, e)
            self._server_retry_at = time.monotonic() + 60.0
            return None
        srv = HelperClient(self.name, _SSHChannel(proc))
        srv.reader.add_done_callback(lambda _t: self._channels.release())
        self._server, self._server_conn = srv, conn
        return srv

    async def _helper(self, command: str, request: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Run a helper command: on the node's helper server when it has one, else on a channel of its own;
        if the cached helper vanished from the node (a cleaned cache), ship it again."""
        conn, remote = await self._connection()
        srv = await self._server_for(conn, remote)
        if srv is not None:
            try:
                reply = await srv.call(command, request, self.command_timeout_s if timeout_s is None else timeout_s)
            except NodeUnreachable:
                if not srv.dead or srv.closed:
                    # no answer in time: the node is slow or gone, a second try would only wait again; or
                    # the executor was closed meanwhile: nothing may start on the node after close
                    raise
                # the server died (say, its cached helper was cleaned away): one channel instead, for a while
                self._server_retry_at = time.monotonic() + 60.0
                reply = None
            if reply is not None:
                self.last_contact = time.monotonic()
                return check_reply(reply, self.name, command)
        for attempt in (1, 2):
            conn, remote = await self._connection()
            rc, out, err = await self._run(conn, shell_command(*remote.argv, command),
                                           json.dumps(request).encode(), timeout_s)
            if attempt == 1 and rc == 2 and not out and b"can't open file" in err and self.helper is None:
                log.warning("%s: node helper missing from %s; shipping it again", self.name, remote.helper)
                async with self._lock:
                    self._remote = await self._bootstrap(conn)
                continue
            return self._parse(out, err, rc, command)
        raise AssertionError("the loop returns or raises on its second pass")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        conn, self._conn, self._remote = self._conn, None, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
                async with asyncio.timeout(5):
                    await conn.wait_closed()

    # ----------------------------------------------------------------------------------- path mapping

    @recorded
    async def remote_root(self) -> str:
        """Where hsched keeps its files on the node ($HSCHED_NODE_ROOT there, else ~/.cache/hsched)."""
        _, remote = await self._connection()
        return remote.root

    @recorded
    async def remote_run_dir(self, local_run_dir: str) -> str:
        """The node's folder for a run the controller names by a local path (a pure function of it)."""
        return _mapped(await self.remote_root(), "runs", local_run_dir)

    @recorded
    async def remote_path(self, local_path: str) -> str:
        """A node folder for any other local path (e.g. a job's checkpoint folder), mapped like run folders."""
        return _mapped(await self.remote_root(), "files", local_path)

    def _to_remote(self, remote: Remote, local_run_dir: str) -> str:
        rdir = _mapped(remote.root, "runs", local_run_dir)
        self._local_of[rdir] = local_run_dir
        return rdir

    def _handle_out(self, d: Any, local_run_dir: str) -> RunHandle | None:
        handle = handle_from_dict(d)
        return replace(handle, run_dir=local_run_dir) if handle is not None else None

    # ----------------------------------------------------------------------------------- the protocol

    @recorded
    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        request: dict[str, Any] = {"gpu_timeout_s": gpu_timeout_s}
        if self.cfg.discover is not None:
            request["discover"] = self.cfg.discover  # the node's discovery plugin, run by its helper's probe
        reply = await self._helper("probe", request)
        reply["remote_root"] = self._remote.root if self._remote else None
        return reply

    @recorded
    async def launch(self, req: LaunchRequest) -> RunHandle:
        _, remote = await self._connection()
        rdir = self._to_remote(remote, req.run_dir)
        # a lab's run and checkpoint folders are made passable from the node's hsched root, its own base
        mapped = replace(req, base_dir=remote.root) if req.user else req
        reply = await self._helper("launch", launch_request(mapped, rdir))
        handle = self._handle_out(reply.get("handle"), req.run_dir)
        if handle is None:
            raise HelperError(f"{self.name}: launch of {req.run_dir} returned no handle", "launch")
        return handle

    @recorded
    async def users(self, names: Sequence[str]) -> dict[str, bool]:
        reply = await self._helper("users", {"names": list(names)})
        return {str(k): bool(v) for k, v in (reply.get("present") or {}).items()}

    @recorded
    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        if not queries:
            return []
        _, remote = await self._connection()
        runs = []
        for q in queries:
            rdir = self._to_remote(remote, q.run_dir)
            h = handle_to_dict(replace(q.handle, run_dir=rdir)) if q.handle is not None else None
            runs.append({"run_dir": rdir, "handle": h})
        reply = await self._helper("status", {"runs": runs})
        out = []
        for q, r in zip(queries, reply["runs"], strict=True):
            rep = report_from_dict(r)
            out.append(replace(rep, handle=self._handle_out(r.get("handle"), q.run_dir)))
        return out

    @recorded
    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False,
                     batch_only: bool = False, purpose: str = "stop") -> bool:
        _, remote = await self._connection()
        rhandle = replace(handle, run_dir=self._to_remote(remote, handle.run_dir))
        reply = await self._helper("signal", {"handle": handle_to_dict(rhandle), "signal": signal,
                                              "all_processes": all_processes,
                                              "batch_only": batch_only,
                                              "purpose": purpose})
        return bool(reply.get("sent"))

    @recorded
    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        _, remote = await self._connection()
        path = f"{self._to_remote(remote, run_dir)}/output.log"
        reply = await self._helper("read", {"path": path, "offset": offset, "max_bytes": max_bytes})
        return base64.b64decode(reply.get("data") or "")

    @recorded
    async def newest_mtime(self, path: str) -> float | None:
        """When a file under the remote `path` last changed (a job's last checkpoint); None if none."""
        reply = await self._helper("newest", {"path": path})
        newest = reply.get("newest")
        return float(newest) if newest is not None else None

    @recorded
    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        """A dataset request through the node's helper (its server, else a channel of its own)."""
        return await self._helper(f"data_{op}", dict(req), timeout_s)

    # ----------------------------------------------------------------------------------- monitoring

    async def watch(self, interval_s: float = 1.0, *, count: int | None = None,
                    stale_after_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Samples from the node every `interval_s` (see nodehelper.watch for their shape), one channel.

        Each sample gains `node`, and each GPU process `job_run_dir`: the local run folder of the hsched run
        it belongs to (None: not one of ours). The stream ends after `count` samples; it raises
        NodeUnreachable when the connection fails or no sample came for `stale_after_s` (default: 3
        intervals, at least 5 s), so a silent network cut is noticed long before TCP or keepalives give up;
        HelperError when the helper at the other end fails.
        """
        try:
            # closed as soon as our consumer stops, so its channel goes back at once, not when collected
            async with contextlib.aclosing(self._watch(interval_s, count, stale_after_s)) as samples:
                async for sample in samples:
                    self.last_error = None
                    yield sample
        except ExecutorError as e:
            self.last_error = e
            raise

    async def _watch(self, interval_s: float, count: int | None,
                     stale_after_s: float | None) -> AsyncGenerator[dict[str, Any], None]:
        stale = stale_after_s if stale_after_s is not None else max(5.0, 3 * interval_s)
        conn, remote = await self._connection()
        request: dict[str, Any] = {"interval_s": interval_s, "count": count, "simulate": self._simulated()}
        command = shell_command(*remote.argv, "watch")
        try:
            async with self._channels, _channel(conn, command) as proc:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.write_eof()
                while True:
                    try:
                        async with asyncio.timeout(stale):
                            line = await proc.stdout.readline()
                    except TimeoutError:
                        raise NodeUnreachable(f"{self.name}: no monitoring sample for {stale:g} s") from None
                    if not line:
                        err = (await proc.stderr.read()).decode("utf-8", "replace").strip()[-300:]
                        if count is not None:
                            return
                        message = f"{self.name}: the watch stream ended{': ' + err if err else ''}"
                        # what the helper wrote on its way out says it failed; silence is a lost channel
                        raise HelperError(message, "watch") if err else NodeUnreachable(message)
                    sample = json.loads(line)
                    if "seq" not in sample:
                        if "error" in sample:
                            raise HelperError(f"{self.name}: node helper 'watch': {sample['error']}", "watch")
                        return
                    self.last_contact = time.monotonic()
                    sample["node"] = self.name
                    for p in sample.get("processes") or ():
                        p["job_run_dir"] = self._local_of.get(p.get("run_dir") or "")
                    for r in [*(sample.get("progress") or ()), *(sample.get("run_usage") or ())]:
                        r["job_run_dir"] = self._local_of.get(r.get("run_dir") or "")
                    yield sample
        except (asyncssh.Error, OSError) as e:
            raise classify(e, f"{self.name}: watch failed: {_one(e)}") from None
        except ValueError as e:
            raise HelperError(f"{self.name}: watch sent a line that is not JSON: {e}", "watch") from None

    def _simulated(self) -> dict[str, Any] | None:
        sim = self.cfg.simulate
        if sim is None:
            return None
        from hsched.simulated import simulated_uuid  # the very UUIDs the controller hands out

        return {"uuids": [simulated_uuid(self.name, i) for i in range(sim.count)], "memory_mib": sim.memory_mib}

    # ----------------------------------------------------------------------------------- file transfer

    @recorded
    async def put(self, local: str | Path, remote: str, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        """Copy a local file or folder to `remote` on the node (relative: to the login folder).

        It lands under a temporary name and is renamed into place, so a reader never sees half a checkpoint;
        an existing folder there is replaced. Data only (hsched/node/safefiles.py): a folder goes through the node's
        helper (`unpack`: no link, device or setuid bit made; every file `user`'s from its first byte), a single
        file over SFTP (its permission bits only, read here without following a link or waiting on a FIFO).
        """
        if self.helper is not None:  # the user's folder: only the node's own helper may write it
            await _confined.put_tree(self._transfers(None, timeout_s), Path(local), remote, node=self.name,
                                     timeout_s=timeout_s,
                                     user=user)
            return
        try:
            is_dir = await asyncio.to_thread(_is_folder, str(local))
        except OSError as e:
            raise TransferError(f"{self.name}: put {local} {remote}: {e.strerror or e}") from None
        conn, info = await self._connection()
        if is_dir:
            target = await self._absolute(conn, remote, timeout_s)
            await _confined.put_tree(self._transfers(info.root, timeout_s), Path(local), target, node=self.name,
                                     timeout_s=timeout_s, user=user)
            return
        await self._sftp_call(conn, timeout_s, "put", _sshfiles.put, str(local), remote)

    @recorded
    async def get(self, remote: str, local: str | Path, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        """Copy a file or folder from the node to `local`, renamed into place when complete: read by the node's
        helper (`pack`, `data_read`: no link followed, no FIFO waited on, only what `user` may give), written here
        as data only, `user`'s from the first byte when the controller is root."""
        if self.helper is not None:
            await _confined.get_tree(self._transfers(None, timeout_s), remote, Path(local), node=self.name,
                                     timeout_s=timeout_s,
                                     user=user)
            return
        conn, info = await self._connection()
        source = await self._absolute(conn, remote, timeout_s)
        mode = await self._sftp_call(conn, timeout_s, "get", _lstat_mode, source, str(local))
        call = self._transfers(info.root, timeout_s)
        if stat.S_ISDIR(mode):
            await _confined.get_tree(call, source, Path(local), node=self.name, timeout_s=timeout_s, user=user)
        elif stat.S_ISREG(mode):
            # its own call: data_read takes a `root` for the dataset the file lies in, not the transfer folder's
            await _confined.get_file(self._helper, source, Path(local), node=self.name, timeout_s=timeout_s,
                                     user=user)
        else:
            raise TransferError(f"{self.name}: get {remote}: a {safefiles.kind(mode)}, not a regular file or folder")

    def _transfers(self, root: str | None, timeout_s: float) -> _confined.Call:
        """The helper's calls for a transfer: an unconfined helper is told where its transfer folder is (`root`),
        and packing or unpacking a whole folder may take the transfer's time, not one command's."""
        async def call(command: str, request: dict[str, Any]) -> dict[str, Any]:
            req = {**request, "root": root} if root is not None else request
            return await self._helper(command, req, timeout_s if command in ("pack", "unpack") else None)

        return call

    async def _absolute(self, conn: asyncssh.SSHClientConnection, remote: str, timeout_s: float) -> str:
        """`remote` as an absolute path on the node (a relative one, or `~/...`, from the login folder)."""
        if remote.startswith("/"):
            return remote
        return str(await self._sftp_call(conn, timeout_s, "realpath", _realpath, remote))

    async def _sftp_call(self, conn: asyncssh.SSHClientConnection, timeout_s: float, what: str, fn: Any,
                         *args: Any) -> Any:
        try:
            async with self._channels, asyncio.timeout(timeout_s), conn.start_sftp_client() as sftp:
                result = await fn(sftp, *args)
        except TimeoutError:
            raise NodeUnreachable(f"{self.name}: {what} did not finish within {timeout_s:g} s") from None
        except (asyncssh.SFTPError, OSError) as e:
            raise transfer_error(e, f"{self.name}: {what} {' '.join(map(str, args))}: {_one(e)}") from None
        except asyncssh.Error as e:
            raise classify(e, f"{self.name}: {what} failed: {_one(e)}") from None
        self.last_contact = time.monotonic()
        return result

    async def open_sftp(self) -> contextlib.AbstractAsyncContextManager[asyncssh.SFTPClient]:
        """An SFTP session on the node's connection, counted against its channels (for node-to-node copies)."""
        conn, _ = await self._connection()
        return _counted_sftp(self._channels, conn)


@contextlib.asynccontextmanager
async def _channel(conn: asyncssh.SSHClientConnection, command: str) -> AsyncIterator[asyncssh.SSHClientProcess]:
    """A process channel that is closed on the way out without waiting for the peer's acknowledgement:
    asyncssh's own context manager waits for it, which on a cut-off link lasts until keepalives give up."""
    proc = await conn.create_process(command, encoding=None)
    try:
        yield proc
    finally:
        proc.close()


@contextlib.asynccontextmanager
async def _counted_sftp(sem: asyncio.Semaphore, conn: asyncssh.SSHClientConnection) -> AsyncIterator[
        asyncssh.SFTPClient]:
    async with sem, conn.start_sftp_client() as sftp:
        yield sftp


async def copy_between(src: SSHExecutor, src_path: str, dst: SSHExecutor, dst_path: str, *,
                       timeout_s: float = 3600.0, user: str | None = None) -> int:
    """Copy a folder from one node to another through the controller (the source helper's `pack`, read back in
    chunks and appended to the destination helper's transfer, then `unpack`ed: data only, see
    hsched/node/safefiles.py; nothing is written on the controller's disk). Returns the bytes of its files."""
    what = f"copy {src.name}:{src_path} -> {dst.name}:{dst_path}"
    calls: list[_confined.Call] = []
    for ex in (src, dst):
        if ex.helper is not None:
            calls.append(ex._transfers(None, timeout_s))
        else:
            _, info = await ex._connection()
            calls.append(ex._transfers(info.root, timeout_s))
    n = await _confined.copy_tree(calls[0], src_path, calls[1], dst_path, what=what, timeout_s=timeout_s, user=user)
    src.last_contact = dst.last_contact = time.monotonic()
    return n


async def _lstat_mode(sftp: asyncssh.SFTPClient, path: str, _local: str) -> int:
    return int((await sftp.lstat(path)).permissions or 0)


async def _realpath(sftp: asyncssh.SFTPClient, path: str) -> str:
    return str(await sftp.realpath(_sshfiles._rel(path)))


def _is_folder(path: str) -> bool:
    """Whether `path` is a folder (not through a link at its end); OSError when it is not there."""
    return stat.S_ISDIR(os.lstat(path).st_mode)


class _SSHChannel:
    """A helper server's channel as a LineChannel (executors/_rpc.py): asyncssh errors become OSError."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.proc = proc

    async def readline(self) -> bytes:
        try:
            return await self.proc.stdout.readline()
        except asyncssh.Error as e:
            raise ConnectionError(_one(e)) from e

    async def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
        except asyncssh.Error as e:
            raise ConnectionError(_one(e)) from e

    def close(self) -> None:
        self.proc.close()


# ------------------------------------------------------------------------------------- errors, typed

_REFUSING_DISCONNECTS = {
    asyncssh.DISC_HOST_KEY_NOT_VERIFIABLE: Refusal.HOST_KEY_UNKNOWN,
    asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE: Refusal.AUTH,
    asyncssh.DISC_ILLEGAL_USER_NAME: Refusal.AUTH,
    asyncssh.DISC_AUTH_CANCELLED_BY_USER: Refusal.AUTH,
    asyncssh.DISC_HOST_NOT_ALLOWED_TO_CONNECT: Refusal.AUTH,
    asyncssh.DISC_KEY_EXCHANGE_FAILED: Refusal.INCOMPATIBLE,
    asyncssh.DISC_PROTOCOL_VERSION_NOT_SUPPORTED: Refusal.INCOMPATIBLE,
    asyncssh.DISC_SERVICE_NOT_AVAILABLE: Refusal.INCOMPATIBLE,
    asyncssh.DISC_COMPRESSION_ERROR: Refusal.INCOMPATIBLE,
}
"""Disconnect codes (RFC 4253 11.1) that no retry gets past. The others (connection lost, closed by the
peer, too many connections, protocol and MAC errors on a noisy link) may pass: NodeUnreachable."""


def classify(e: asyncssh.Error | OSError, message: str) -> ExecutorError:
    """The ExecutorError for an asyncssh or OS error met while talking to a node, from its class and its
    disconnect or channel-open code (never its text)."""
    if isinstance(e, OSError):
        return network_error(e, message)
    if isinstance(e, asyncssh.HostKeyNotVerifiable):
        return NodeRefused(message, Refusal.HOST_KEY_UNKNOWN)
    if isinstance(e, asyncssh.PermissionDenied | asyncssh.IllegalUserName):
        return NodeRefused(message, Refusal.AUTH)
    if isinstance(e, asyncssh.ProtocolNotSupported):  # its code is the generic protocol error's
        return NodeRefused(message, Refusal.INCOMPATIBLE)
    if isinstance(e, asyncssh.DisconnectError) and e.code in _REFUSING_DISCONNECTS:
        return NodeRefused(message, _REFUSING_DISCONNECTS[e.code])
    if isinstance(e, asyncssh.ChannelOpenError) and e.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
        return NodeRefused(message, Refusal.AUTH)  # sshd lets us log in but not run anything
    return NodeUnreachable(message)


def transfer_error(e: asyncssh.SFTPError | OSError, message: str) -> ExecutorError:
    """A failed file transfer: the file's fault (TransferError: no such file, no space, no permission)
    unless the connection itself went (NodeUnreachable)."""
    if isinstance(e, asyncssh.SFTPConnectionLost | asyncssh.SFTPNoConnection):
        return NodeUnreachable(message)
    if isinstance(e, ConnectionError | TimeoutError) or (isinstance(e, OSError) and e.errno in NETWORK_ERRNOS):
        return NodeUnreachable(message)
    return TransferError(message)


def _retold(e: ExecutorError, message: str) -> ExecutorError:
    """The same error (class, refusal reason) with another message."""
    again = copy.copy(e)
    again.args = (message, *e.args[1:])
    return again


def _expand(path: str) -> str:
    return str(Path(path).expanduser())  # reads the password database for ~user: not on the event loop


def _one(e: BaseException) -> str:
    """An exception as one line: asyncssh's reason, else the OS's words, else the type."""
    text = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------------------ host keys

@dataclass(frozen=True, slots=True)
class HostKeyScan:
    """What a node's sshd offers, against what known_hosts holds for it (for `hsched node trust`)."""

    target: _sshconfig.Target
    key: asyncssh.SSHKey
    trusted: bool
    """known_hosts already holds this very key."""
    changed: bool
    """known_hosts holds a different key of the same kind for this host."""


async def scan_host_key(cfg: NodeConfig, *, ssh_config: str | Path | None = None,
                        timeout_s: float = 15.0) -> HostKeyScan:
    """Fetch the node's host key (no login; through ProxyJump if the ssh config says so) and compare."""
    try:
        target = await asyncio.to_thread(_sshconfig.resolve, cfg, ssh_config)
        known = await asyncio.to_thread(_sshconfig.load_known_hosts, target)
    except (ValueError, OSError, asyncssh.Error) as e:
        raise NodeRefused(f"{cfg.name}: {_one(e)}", Refusal.CONFIG) from None
    old = _sshconfig.known_keys(known, target, None)
    # ask for a key of a kind known_hosts holds, as a real connection would: a host that also has an
    # ed25519 key is not "changed" because known_hosts only has its rsa key
    algs: Any = [a.decode() for k in old for a in k.sig_algorithms] or ()
    try:
        async with asyncio.timeout(timeout_s):
            key = await asyncssh.get_server_host_key(
                cfg.host or "", port=cfg.port or (), config=_sshconfig.config_paths(ssh_config) or (),
                server_host_key_algs=algs)
    except TimeoutError:
        raise NodeUnreachable(f"{cfg.name}: no answer from {target.destination} within {timeout_s:g} s") from None
    except (asyncssh.Error, OSError) as e:
        raise classify(e, f"{cfg.name}: cannot reach {target.destination}: {_one(e)}") from None
    if key is None:
        raise NodeRefused(f"{cfg.name}: {target.destination} presented no host key", Refusal.INCOMPATIBLE)
    return HostKeyScan(target=target, key=key, trusted=key in old, changed=bool(old) and key not in old)


def _conforms(ex: SSHExecutor) -> Executor:
    return ex  # mypy checks SSHExecutor against the protocol here
