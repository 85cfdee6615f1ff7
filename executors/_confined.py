"""Nodes reached through a service account's installed helper (a lab whose controller is not root).

Such a lab installs the node helper root-owned on every node, with a launcher that confines it to one folder
(`--confine ROOT`), and a sudo rule that lets the service account run exactly that launcher
(`hsched node helper-script`). The executors then run `sudo -n LAUNCHER CMD` instead of shipping a helper of
their own; the helper says where its folder is (`whoami`), and everything of the node's lives there, mapped
from the controller's paths as an SSH node's are. A user's checkpoint folder is theirs (0700): the account
cannot read or write it, so a checkpoint moves as a tar file the helpers pack and unpack (`get_tree`,
`put_tree`), through the controller, in chunks of the helpers' JSON protocol.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import tarfile
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Any

from hsched import nodehelper
from hsched.errors import HelperError, NodeRefused, NodeUnreachable, Refusal

SERVICE_HELPER = "/usr/local/libexec/hsched/hsched-node-helper"
"""Where `hsched node helper-script` installs the launcher by default (fleet file: `helper` per node)."""
SUDO = ("sudo", "-n")
"""Never a password prompt: a missing rule fails at once, with sudo's own one line."""
CHUNK = 1 << 20
"""Bytes per transfer request: well under the helper's own limit and the local pipe's line limit."""

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def helper_argv(launcher: str) -> tuple[str, ...]:
    return (*SUDO, launcher)


def mapped(root: str, kind: str, local: str) -> str:
    """The node's path for a path the controller names: `ROOT/KIND/<hash of its folder>/<its name>`."""
    p = PurePosixPath(local)
    digest = hashlib.sha256(str(p.parent).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    name = p.name if p.name not in ("", ".", "..") else hashlib.sha256(local.encode()).hexdigest()[:12]
    return f"{root}/{kind}/{digest}/{name}"


def sudo_refused(node: str, launcher: str, detail: str) -> NodeRefused:
    """What to tell when the launcher cannot be run through sudo (no rule, no launcher, no sudo)."""
    return NodeRefused(
        f"{node}: cannot run the node helper {launcher} through sudo ({detail}); install it there as root with "
        "`hsched node helper-script` (README: Set up a lab, service account)", Refusal.AUTH)


def helper_too_old(node: str, launcher: str, version: object) -> NodeRefused:
    """What to tell when the installed helper speaks an older protocol than this hsched's: the account cannot
    replace a root-owned helper, so the node is refused (never used with requests the helper would half do,
    as one before protocol 3 dropped sbatch's -o/-e output) until root installs the new one."""
    said = f"protocol {version}" if isinstance(version, int) and not isinstance(version, bool) else "no protocol"
    # short enough for the node's shown reason (200 characters) with the default launcher's path
    return NodeRefused(
        f"{node}: node helper {launcher} speaks {said}, this hsched needs {nodehelper.HELPER_VERSION}: reinstall it "
        "there as root with `hsched node helper-script --install`", Refusal.CONFIG)


async def whoami(call: Call, node: str, launcher: str) -> str:
    """The confined helper's folder (its first answer proves the sudo rule and the launcher are there), once
    its protocol is known to be this hsched's or newer."""
    try:
        info = await call("whoami", {})
    except HelperError as e:
        raise sudo_refused(node, launcher, str(e)) from None
    version = info.get("helper_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < nodehelper.HELPER_VERSION:
        raise helper_too_old(node, launcher, version)
    root = info.get("confine")
    if not isinstance(root, str) or not root.startswith("/"):
        # an unconfined helper as root would give the service account root's powers on the node
        raise NodeRefused(f"{node}: the helper {launcher} is not confined to a folder (its launcher must pass "
                          "--confine); reinstall it with `hsched node helper-script`", Refusal.CONFIG)
    return root


# --------------------------------------------------------------------------------------------- transfer


async def get_tree(call: Call, remote: str, local: Path, *, node: str, timeout_s: float) -> int:
    """Copy the node's folder `remote` to `local` (replacing it whole once complete) within `timeout_s`; returns
    its bytes. Whatever fails is an ExecutorError naming `node` (a tar file that does not read included)."""
    return await _bounded(_get_tree(call, remote, local), f"{node}: get {remote}", timeout_s)


async def put_tree(call: Call, local: Path, remote: str, *, node: str, timeout_s: float) -> int:
    """Copy the local folder `local` to the node's `remote` (replacing it whole once complete) within
    `timeout_s`; returns the bytes sent."""
    return await _bounded(_put_tree(call, local, remote), f"{node}: put {remote}", timeout_s)


async def _bounded(work: Awaitable[int], what: str, timeout_s: float) -> int:
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise NodeUnreachable(f"{what} did not finish within {timeout_s:g} s") from None
    except tarfile.TarError as e:  # a transfer that arrived broken: the caller's ExecutorError, not a crash
        raise HelperError(f"{what}: the transfer does not read as a tar file ({e})", "read") from None


async def _get_tree(call: Call, remote: str, local: Path) -> int:
    packed = await call("pack", {"path": remote})
    token, path, size = str(packed["token"]), str(packed["path"]), int(packed["size"])
    tar_path = Path(f"{local}.get-{token}.tar")
    try:
        await asyncio.to_thread(_make_parent, local)
        with await asyncio.to_thread(open, tar_path, "wb") as f:
            offset = 0
            while offset < size:
                reply = await call("read", {"path": path, "offset": offset, "max_bytes": CHUNK})
                data = base64.b64decode(reply.get("data") or "")
                if not data:
                    raise HelperError(f"transfer of {remote} ended at {offset} of {size} bytes", "read")
                await asyncio.to_thread(f.write, data)
                offset += len(data)
        await asyncio.to_thread(_untar_replacing, tar_path, local)
    finally:
        await asyncio.to_thread(_unlink, tar_path)
        with contextlib.suppress(HelperError):  # else the helper's transfer folder keeps a stray file, no more
            await call("drop", {"token": token})
    return size


async def _put_tree(call: Call, local: Path, remote: str) -> int:
    tar_path = Path(f"{local}.put-{os.urandom(4).hex()}.tar")
    token: str | None = None
    try:
        size = await asyncio.to_thread(_tar, local, tar_path)
        with await asyncio.to_thread(open, tar_path, "rb") as f:
            offset = 0
            while True:
                data = await asyncio.to_thread(f.read, CHUNK)
                if not data and token is not None:
                    break
                reply = await call("append", {"token": token, "offset": offset,
                                              "data": base64.b64encode(data).decode("ascii")})
                token = str(reply["token"])
                offset += len(data)
                if not data:
                    break
        await call("unpack", {"token": token, "dest": remote})
        token = None
    finally:
        await asyncio.to_thread(_unlink, tar_path)
        if token is not None:
            with contextlib.suppress(HelperError):
                await call("drop", {"token": token})
    return size


def _make_parent(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _tar(folder: Path, tar_path: Path) -> int:
    """`folder` as a tar file (regular files and folders; an absent folder is an empty one); its size."""
    fd = os.open(tar_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if folder.is_dir():
            for top, dirs, files in os.walk(folder):
                for name in sorted(dirs) + sorted(files):
                    p = Path(top) / name
                    if p.is_symlink() or not (p.is_dir() or p.is_file()):
                        continue
                    tar.add(p, arcname=str(p.relative_to(folder)), recursive=False)
    return tar_path.stat().st_size


def _untar_replacing(tar_path: Path, dest: Path) -> None:
    """Unpack into a folder beside `dest`, then rename it into place (the old one removed after). Regular
    files and folders only, each under that folder, with their permission bits but no setuid: whatever a
    node sent cannot lay a link or a device on the controller (tarfile's "data" filter, which not every
    Python 3.11 has)."""
    from hsched.executors._files import move_into_place, remove, temporary_beside

    tmp = Path(temporary_beside(str(dest)))
    tmp.mkdir(mode=0o700)
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for m in tar:
                name = os.path.normpath(m.name)
                if name.startswith("/") or name == ".." or name.startswith("../"):
                    raise HelperError(f"a transfer for {dest} holds {m.name!r}, outside its folder", "read")
                target = tmp / name
                if m.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                elif m.isfile():
                    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    src = tar.extractfile(m)
                    assert src is not None  # a regular file always has its data
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        while chunk := src.read(CHUNK):
                            out.write(chunk)
                    os.chmod(target, (m.mode & 0o777) or 0o600)
                    os.utime(target, (m.mtime, m.mtime))
        move_into_place(str(tmp), str(dest))
    except BaseException:
        remove(str(tmp))
        raise
