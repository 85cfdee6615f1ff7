"""A Slurm group reached over SSH: Slurm's client commands run on a login node, run folders live there.

    [[node]]
    name = "cluster-a100"
    executor = "slurm"
    partition = "gpu"
    login = "me@login.cluster.example"   # user@host, host, or an ~/.ssh/config alias
    port = 22                            # optional, as for an ssh node
    identity_file = "~/.ssh/id_ed25519"  # optional
    known_hosts = "~/.ssh/known_hosts"   # optional
    login_dir = "/scratch/$USER/hsched"  # optional: hsched's folder there ($HOME, $USER, ~ expanded there)

The connection is the SSH executor's own (executors/ssh.py): one asyncssh connection, the host key always
verified against known_hosts (never switched off), connects and commands bounded, failed connects backed off,
every error one line of the class that says what happened. Nothing is shipped to the login node (no helper, no
Python): first contact only asks where hsched's folder is there: the entry's `login_dir` (its `~`, `$HOME` and
`$USER` replaced by the login user's, as the login node says them; made 0700 if missing, or the group is refused
in one line naming the key), else `$HSCHED_NODE_ROOT` there, else `~/.cache/hsched`. It must be on the
filesystem the cluster's nodes share (a scratch or project filesystem, or a home): a job reads its run folder
there.

Each Slurm command is one exec request whose words are each `shlex.quote`d, prefixed by `env NAME=VALUE ...`
(SLURM_TIME_FORMAT, and the executor's `env`): the login shell splits it back into the argv exactly. Run folders
are `<root>/runs/<hash of the controller's parent folder>/<name>` (the SSH nodes' mapping), written over SFTP
(temporary name, then rename), so the batch script is uploaded before `sbatch` names it; slurm.json lives
there too, so a restarted controller finds its runs as it does locally. A checkpoint folder is mapped to
`<root>/files/...` and moved with SFTP, as an SSH node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import secrets
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncssh

from hsched.config import NodeConfig
from hsched.errors import NodeRefused, NodeUnreachable, Refusal

from .. import _confined, _sshfiles
from ..ssh import Remote, SSHExecutor, classify, shell_command, transfer_error
from .site import LOG, SIGNALS, Account, Result
from .text import expand_login_dir

ROOT_COMMAND = 'printf "%s\\n%s\\n%s\\n" "${HSCHED_NODE_ROOT:-$HOME/.cache/hsched}" "$HOME" "$(id -un)"'
"""The one line of shell hsched sends that is not quoted word by word: a constant, expanded by the login shell
(where hsched's folder is by default, the login user's home and name: what `login_dir` is expanded with), as the
SSH executor's first contact asks it. `login_dir` itself never reaches a shell."""
NOT_FOUND = 127
"""A shell's exit status for a command it cannot find."""


class _LoginConnection(SSHExecutor):
    """The SSH executor's connection (host keys, timeouts, backoff, typed errors) to a login node, whose first
    contact ships nothing: it only learns where hsched's folder is (and makes `login_dir` if it is missing)."""

    login_dir: str | None = None

    async def _bootstrap(self, conn: asyncssh.SSHClientConnection) -> Remote:
        rc, out, err = await self._run(conn, ROOT_COMMAND, b"")
        lines = out.decode(errors="surrogateescape").split("\n")
        default, home, user = [*lines, "", "", ""][:3]
        if rc != 0 or not default.startswith("/") or not home.startswith("/") or not user:
            raise NodeRefused(f"{self.name}: the login node did not say where its home is "
                              f"({err.decode(errors='replace').strip()[:200] or f'exit status {rc}'})", Refusal.CONFIG)
        if self.login_dir is None:
            return Remote(root=default, helper="", python=())
        root = expand_login_dir(self.login_dir, home, user)
        if not root.startswith("/"):
            raise NodeRefused(f"{self.name}: login_dir {self.login_dir!r} is {root!r} on the login node, not an "
                              "absolute folder: change login_dir in the fleet file", Refusal.CONFIG)
        try:
            async with asyncio.timeout(self.command_timeout_s), conn.start_sftp_client() as sftp:
                await _makedirs(sftp, root)
                usable = await sftp.isdir(root)
        except (asyncssh.SFTPError, TimeoutError) as e:
            why = "no answer" if isinstance(e, TimeoutError) else _one(e)
            raise NodeRefused(f"{self.name}: login_dir {self.login_dir!r} ({root} on the login node) cannot be made "
                              f"there ({why}): make it, or change login_dir in the fleet file",
                              Refusal.CONFIG) from None
        if not usable:
            raise NodeRefused(f"{self.name}: login_dir {self.login_dir!r} ({root} on the login node) is not a "
                              "folder: change login_dir in the fleet file", Refusal.CONFIG)
        return Remote(root=root, helper="", python=())


class LoginSite:
    """The Site (executors/slurm/site.py) of a login node reached over SSH."""

    def __init__(self, name: str, login: NodeConfig, env: Mapping[str, str], *,
                 ssh_config: str | Path | None = None, login_dir: str | None = None, **ssh: Any) -> None:
        self.name = name
        self.env = dict(env)
        self.ssh = _LoginConnection(login, ssh_config=ssh_config, **ssh)
        self.ssh.login_dir = login_dir
        self.where = f"login node {login.user + '@' if login.user else ''}{login.host}"
        self._files: tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient] | None = None
        """One SFTP session for the run folders' small files, kept while its connection lives: a session per
        call costs a channel round trip each (a status call reads two files per run)."""
        self._files_lock = asyncio.Lock()

    async def _root(self) -> str:
        _, remote = await self.ssh._connection()
        return remote.root

    async def exec(self, argv: Sequence[str], timeout_s: float) -> Result:
        conn, _ = await self.ssh._connection()
        words = ["env", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        rc, out, err = await self.ssh._run(conn, shell_command(*words), b"", timeout_s)
        if rc == NOT_FOUND:
            raise NodeRefused(f"{self.name}: cannot run {argv[0]} on the {self.where} ({_first(err)}): install "
                              "Slurm's client commands there, or check the login user's PATH", Refusal.CONFIG)
        return Result(-1 if rc is None else rc, out.decode(errors="replace"), err.decode(errors="replace"))

    async def user(self) -> str:
        await self.ssh._connection()
        target = self.ssh.target
        if target is None:  # pragma: no cover - _connection resolves it first
            raise NodeRefused(f"{self.name}: no login user", Refusal.CONFIG)
        return target.username

    async def run_dir(self, local_run_dir: str) -> str:
        return _confined.mapped(await self._root(), "runs", local_run_dir)

    async def path(self, local_path: str) -> str:
        return _confined.mapped(await self._root(), "files", local_path)

    async def _session(self, conn: asyncssh.SSHClientConnection) -> asyncssh.SFTPClient:
        """The kept SFTP session on `conn`, started if there is none (or it was on a connection now gone). It
        holds one channel for good, beside the connection's max_channels (8 of sshd's 10 by default)."""
        async with self._files_lock:
            if self._files is not None and self._files[0] is conn:
                return self._files[1]
            self._drop()
            sftp = await conn.start_sftp_client()
            self._files = (conn, sftp)
            return sftp

    def _drop(self) -> None:
        if self._files is not None:
            self._files[1].exit()
            self._files = None

    async def _sftp(self, what: str, fn: Any, *args: Any) -> Any:
        """A small file operation on the kept session, bounded and its errors typed as the SSH executor's."""
        conn, _ = await self.ssh._connection()
        timeout_s = self.ssh.command_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                result = await fn(await self._session(conn), *args)
        except TimeoutError:
            self._drop()
            raise NodeUnreachable(f"{self.name}: {what} did not finish within {timeout_s:g} s") from None
        except (asyncssh.SFTPError, OSError) as e:
            if isinstance(e, asyncssh.SFTPConnectionLost | asyncssh.SFTPNoConnection | OSError):
                self._drop()  # the session went: the next call starts another
            raise transfer_error(e, f"{self.name}: {what} {args[0] if args else ''}: {_one(e)}") from None
        except asyncssh.Error as e:
            self._drop()
            raise classify(e, f"{self.name}: {what} failed: {_one(e)}") from None
        self.ssh.last_contact = time.monotonic()
        return result

    async def _transfer(self, what: str, fn: Any, src: str, dst: str, timeout_s: float) -> None:
        """A checkpoint folder, on a session of its own (it may take long; small calls go on meanwhile)."""
        conn, _ = await self.ssh._connection()
        await self.ssh._sftp_call(conn, timeout_s, what, fn, src, dst)

    async def make_run_dir(self, path: str) -> bool:
        return bool(await self._sftp("make run folder", _make_run_dir, path))

    async def make_dirs(self, path: str) -> None:
        await self._sftp("make folder", _makedirs, path)

    async def write_file(self, path: str, data: str, mode: int) -> None:
        await self._sftp("write", _write, path, data.encode(errors="surrogateescape"), mode)

    async def read_json(self, path: str) -> Any:
        data: bytes | None = await self._sftp("read", _read_whole, path)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    async def write_json(self, path: str, value: Any) -> None:
        await self._sftp("write", _write, path, json.dumps(value).encode(), 0o600)

    async def append(self, path: str, data: bytes) -> None:
        await self._sftp("append", _append, path, data)

    async def read_at(self, path: str, offset: int, max_bytes: int) -> bytes:
        return bytes(await self._sftp("read", _read_at, path, offset, max_bytes))

    async def isdir(self, path: str) -> bool:
        return bool(await self._sftp("stat", _isdir, path))

    async def newest(self, path: str) -> float | None:
        found: float | None = await self._sftp("stat", _newest, path)
        return found

    async def put(self, local: str, remote: str, timeout_s: float) -> None:
        await self._transfer("put", _sshfiles.put, local, remote, timeout_s)

    async def get(self, remote: str, local: str, timeout_s: float) -> None:
        await self._transfer("get", _sshfiles.get, remote, local, timeout_s)

    async def account(self, name: str) -> Account | None:
        res = await self.exec(["getent", "passwd", name], self.ssh.command_timeout_s)
        fields = res.out.strip().split(":") if res.rc == 0 else []
        if len(fields) < 7 or fields[0] != name or not fields[2].isdigit() or not fields[3].isdigit():
            return None
        return Account(name, int(fields[2]), int(fields[3]), fields[5])

    async def passable(self, base: str | None, leaf: str) -> None:
        root = base or await self._root()
        await self._sftp("make passable", _passable, root, leaf)

    async def give(self, path: str, acct: Account, mode: int) -> None:
        await self._sftp("give", _give, path, acct.uid, acct.gid, mode)

    async def close(self) -> None:
        self._drop()
        await self.ssh.close()


def _one(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _first(err: bytes) -> str:
    return next((ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()), "not found")[:200]


# ----------------------------------------------------------------------------- files over SFTP


def _bytes(data: bytes | str) -> bytes:
    return data if isinstance(data, bytes) else data.encode(errors="surrogateescape")  # files opened "b": bytes


def _missing(e: asyncssh.SFTPError) -> bool:
    return e.code == asyncssh.FX_NO_SUCH_FILE


async def _make_run_dir(sftp: asyncssh.SFTPClient, path: str) -> bool:
    parent = posixpath.dirname(path.rstrip("/"))
    if parent:
        await _makedirs(sftp, parent)
    try:
        await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=0o700))
    except asyncssh.SFTPError:
        if await sftp.isdir(path):
            return False  # launched before: the folder is the launch lock, as on this machine
        raise
    await sftp.chmod(path, 0o700)  # whatever the umask
    for name in (LOG, SIGNALS):
        async with sftp.open(posixpath.join(path, name), "ab", asyncssh.SFTPAttrs(permissions=0o600)):
            pass
    return True


async def _makedirs(sftp: asyncssh.SFTPClient, path: str) -> None:
    """Like `mkdir -p`, each new folder 0700 (a user's runs are theirs)."""
    if not path or await sftp.isdir(path):
        return
    await _makedirs(sftp, posixpath.dirname(path.rstrip("/")))
    with contextlib.suppress(asyncssh.SFTPFailure):  # made meanwhile by a concurrent launch
        await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=0o700))


async def _write(sftp: asyncssh.SFTPClient, path: str, data: bytes, mode: int) -> None:
    """The whole file under a temporary name beside it, then renamed over it (a reader sees one or the other)."""
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    try:
        async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode)) as f:
            await f.write(data)
            with contextlib.suppress(asyncssh.SFTPError):  # fsync@openssh.com: not every server has it
                await f.fsync()
        await sftp.chmod(tmp, mode)
        await sftp.posix_rename(tmp, path)
    except BaseException:
        with contextlib.suppress(asyncssh.SFTPError, OSError):
            await sftp.remove(tmp)
        raise


async def _read_whole(sftp: asyncssh.SFTPClient, path: str) -> bytes | None:
    try:
        async with sftp.open(path, "rb") as f:
            return _bytes(await f.read())
    except asyncssh.SFTPError as e:
        if _missing(e):
            return None
        raise


async def _append(sftp: asyncssh.SFTPClient, path: str, data: bytes) -> None:
    try:
        async with sftp.open(path, "ab", asyncssh.SFTPAttrs(permissions=0o600)) as f:
            await f.write(data)
    except asyncssh.SFTPError as e:
        if not _missing(e):  # the run folder is gone: nothing to record in
            raise


async def _read_at(sftp: asyncssh.SFTPClient, path: str, offset: int, max_bytes: int) -> bytes:
    try:
        async with sftp.open(path, "rb") as f:
            return _bytes(await f.read(max_bytes, offset))
    except asyncssh.SFTPError as e:
        if _missing(e):
            return b""
        raise


async def _isdir(sftp: asyncssh.SFTPClient, path: str) -> bool:
    return bool(await sftp.isdir(path))


async def _newest(sftp: asyncssh.SFTPClient, path: str) -> float | None:
    """The newest modification time of any file under `path` (links not followed), None if none."""
    try:
        entries = await sftp.readdir(path)
    except asyncssh.SFTPError as e:
        if _missing(e) or e.code == asyncssh.FX_FAILURE:
            return None
        raise
    best: float | None = None
    for entry in entries:
        name = str(entry.filename)
        if name in (".", ".."):
            continue
        mode = entry.attrs.permissions
        if mode is not None and stat.S_ISDIR(mode):
            t = await _newest(sftp, posixpath.join(path, name))
        elif mode is not None and stat.S_ISREG(mode):
            t = float(entry.attrs.mtime) if entry.attrs.mtime is not None else None
        else:
            t = None
        if t is not None and (best is None or t > best):
            best = t
    return best


# ----------------------------------------------------------------------- lab mode (the login user is root)


async def _passable(sftp: asyncssh.SFTPClient, base: str, leaf: str) -> None:
    """As the node helper's _passable_dirs, over SFTP: every folder from `base` down to `leaf` 0711, made if
    missing; a link or a file on the way is refused (never followed)."""
    base, leaf = posixpath.normpath(base), posixpath.normpath(leaf)
    if leaf != base and not leaf.startswith(base.rstrip("/") + "/"):
        raise asyncssh.SFTPFailure(f"{leaf} is not under {base}")
    parts = [base]
    rest = posixpath.relpath(leaf, base)
    if rest != ".":
        for part in rest.split("/"):
            parts.append(posixpath.join(parts[-1], part))
    for d in parts:
        if not await sftp.exists(d):
            with contextlib.suppress(asyncssh.SFTPFailure):  # made meanwhile by a concurrent launch
                await sftp.mkdir(d, asyncssh.SFTPAttrs(permissions=0o711))
        attrs = await sftp.lstat(d)
        if attrs.permissions is None or not stat.S_ISDIR(attrs.permissions):
            raise asyncssh.SFTPFailure(f"{d}: not a folder")
        await sftp.chmod(d, 0o711, follow_symlinks=False)


async def _give(sftp: asyncssh.SFTPClient, path: str, uid: int, gid: int, mode: int) -> None:
    """As the node helper's _give, over SFTP: `path` made if missing (a folder when `mode` has x bits), the
    account's with `mode`; in a folder, what root put there (a checkpoint copied in) becomes theirs too."""
    folder = bool(mode & 0o111)
    if not await sftp.exists(path):
        if folder:
            with contextlib.suppress(asyncssh.SFTPFailure):
                await sftp.mkdir(path, asyncssh.SFTPAttrs(permissions=mode))
        else:
            async with sftp.open(path, "ab", asyncssh.SFTPAttrs(permissions=mode)):
                pass
    attrs = await sftp.lstat(path)
    kind = attrs.permissions or 0
    if stat.S_ISLNK(kind) or (stat.S_ISDIR(kind) != folder):
        raise asyncssh.SFTPFailure(f"{path}: not a {'folder' if folder else 'file'}")
    if folder:
        await _chown_tree(sftp, path, uid, gid)
    await sftp.chown(path, uid=uid, gid=gid, follow_symlinks=False)
    await sftp.chmod(path, mode, follow_symlinks=False)


async def _chown_tree(sftp: asyncssh.SFTPClient, path: str, uid: int, gid: int) -> None:
    for entry in await sftp.readdir(path):
        name = str(entry.filename)
        if name in (".", ".."):
            continue
        child = posixpath.join(path, name)
        kind = entry.attrs.permissions or 0
        if stat.S_ISDIR(kind):
            await _chown_tree(sftp, child, uid, gid)
        if entry.attrs.uid == 0:  # root's (a copy): the user's; a link the user planted is changed, not followed
            await sftp.chown(child, uid=uid, gid=gid, follow_symlinks=False)
