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

from hsched.errors import HelperError, NodeRefused, NodeUnreachable, Refusal
from hsched.node import safefiles
from hsched.node.version import HELPER_VERSION

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
        "`hsched node helper-script` (docs/lab.md: a service account)", Refusal.AUTH)


def helper_too_old(node: str, launcher: str, version: object) -> NodeRefused:
    """What to tell when the installed helper speaks an older protocol than this hsched's: the account cannot
    replace a root-owned helper, so the node is refused (never used with requests the helper would half do,
    as one before protocol 3 dropped sbatch's -o/-e output) until root installs the new one."""
    said = f"protocol {version}" if isinstance(version, int) and not isinstance(version, bool) else "no protocol"
    # short enough for the node's shown reason (200 characters) with the default launcher's path
    return NodeRefused(
        f"{node}: node helper {launcher} speaks {said}, this hsched needs {HELPER_VERSION}: reinstall it "
        "there as root with `hsched node helper-script --install`", Refusal.CONFIG)


async def whoami(call: Call, node: str, launcher: str) -> str:
    """The confined helper's folder (its first answer proves the sudo rule and the launcher are there), once
    its protocol is known to be this hsched's or newer."""
    try:
        info = await call("whoami", {})
    except HelperError as e:
        raise sudo_refused(node, launcher, str(e)) from None
    version = info.get("helper_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < HELPER_VERSION:
        raise helper_too_old(node, launcher, version)
    root = info.get("confine")
    if not isinstance(root, str) or not root.startswith("/"):
        # an unconfined helper as root would give the service account root's powers on the node
        raise NodeRefused(f"{node}: the helper {launcher} is not confined to a folder (its launcher must pass "
                          "--confine); reinstall it with `hsched node helper-script`", Refusal.CONFIG)
    return root


# --------------------------------------------------------------------------------------------- transfer


async def get_tree(call: Call, remote: str, local: Path, *, node: str, timeout_s: float,
                   user: str | None = None) -> int:
    """Copy the node's folder `remote` to `local` (replacing it whole once complete) within `timeout_s`; returns
    its bytes. Whatever fails is an ExecutorError naming `node` (a tar file that does not read included). Data
    only, both ends (hsched/node/safefiles.py); `user`: whose folder it is (the node's helper packs only what they
    may give, and here it is theirs from the first byte when we are root)."""
    return await _bounded(_get_tree(call, remote, local, user), f"{node}: get {remote}", timeout_s)


async def put_tree(call: Call, local: Path, remote: str, *, node: str, timeout_s: float,
                   user: str | None = None) -> int:
    """Copy the local folder `local` to the node's `remote` (replacing it whole once complete) within
    `timeout_s`; returns the bytes sent. `user`: as `get_tree`'s (the node's helper makes every file theirs)."""
    return await _bounded(_put_tree(call, local, remote, user), f"{node}: put {remote}", timeout_s)


async def copy_tree(src: Call, src_path: str, dst: Call, dst_path: str, *, what: str, timeout_s: float,
                    user: str | None = None) -> int:
    """Copy the folder `src_path` of one node to `dst_path` of another, through the controller's memory (the
    source helper's tar file read back in chunks, appended to the destination helper's): the bytes of its
    files."""
    return await _bounded(_copy_tree(src, src_path, dst, dst_path, user), what, timeout_s)


async def _bounded(work: Awaitable[int], what: str, timeout_s: float) -> int:
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise NodeUnreachable(f"{what} did not finish within {timeout_s:g} s") from None
    except tarfile.TarError as e:  # a transfer that arrived broken: the caller's ExecutorError, not a crash
        raise HelperError(f"{what}: the transfer does not read as a tar file ({e})", "read") from None
    except safefiles.Unsafe as e:
        raise HelperError(f"{what}: {e}", "read") from None


async def get_file(call: Call, remote: str, local: Path, *, node: str, timeout_s: float,
                   user: str | None = None) -> int:
    """Copy the node's regular file `remote` to `local` (renamed into place when complete) within `timeout_s`,
    read by its helper (`data_read`: no link followed anywhere on the path, never a FIFO waited on) and written
    here as `user`'s from the first byte when we are root; its bytes."""
    return await _bounded(_get_file(call, remote, local, user), f"{node}: get {remote}", timeout_s)


async def _get_file(call: Call, remote: str, local: Path, user: str | None) -> int:
    owner = await asyncio.to_thread(safefiles.owner_of, user)
    await asyncio.to_thread(_make_parent, local)
    from hsched.executors._files import move_into_place, remove, temporary_beside

    tmp = temporary_beside(str(local))
    fd = await asyncio.to_thread(_create_beside, tmp, owner)
    try:
        try:
            offset = 0
            while True:
                reply = await call("data_read", {"path": remote, "offset": offset, "max_bytes": CHUNK})
                data = base64.b64decode(reply.get("data") or "")
                if data:
                    await asyncio.to_thread(os.pwrite, fd, data, offset)
                    offset += len(data)
                if reply.get("eof") or not data:
                    break
        finally:
            await asyncio.to_thread(os.close, fd)
        await asyncio.to_thread(move_into_place, tmp, str(local))
    except BaseException:
        await asyncio.to_thread(remove, tmp)
        raise
    return offset


def _create_beside(tmp: str, owner: safefiles.Owner | None) -> int:
    parent = os.open(os.path.dirname(os.path.abspath(tmp)), os.O_RDONLY | safefiles.O_DIRECTORY)
    try:
        return safefiles.create_file(parent, os.path.basename(tmp), safefiles.acting_for(owner))
    finally:
        os.close(parent)


def _who(user: str | None) -> dict[str, Any]:
    return {"user": user} if user else {}


async def _get_tree(call: Call, remote: str, local: Path, user: str | None) -> int:
    packed = await call("pack", {"path": remote, **_who(user)})
    token, path, size = str(packed["token"]), str(packed["path"]), int(packed["size"])
    tar_path = Path(f"{local}.get-{token}.tar")
    try:
        await asyncio.to_thread(_make_parent, local)
        with await asyncio.to_thread(open, tar_path, "wb") as f:

            async def chunk_at(at: int) -> dict[str, Any]:
                return await call("read", {"path": path, "offset": at, "max_bytes": CHUNK})

            offset = 0
            # the next chunk is asked for while this one is written: the round trips overlap the disk
            reading = asyncio.ensure_future(chunk_at(0)) if size else None
            try:
                while reading is not None:
                    reply = await reading
                    n = _b64_length(str(reply.get("data") or ""))
                    if not n:
                        raise HelperError(f"transfer of {remote} ended at {offset} of {size} bytes", "read")
                    reading = asyncio.ensure_future(chunk_at(offset + n)) if offset + n < size else None
                    await asyncio.to_thread(_write_b64, f, str(reply["data"]))
                    offset += n
            finally:
                if reading is not None:
                    reading.cancel()
                    with contextlib.suppress(BaseException):
                        await reading
        await asyncio.to_thread(_untar_replacing, tar_path, local, user)
    finally:
        await asyncio.to_thread(_unlink, tar_path)
        with contextlib.suppress(HelperError):  # else the helper's transfer folder keeps a stray file, no more
            await call("drop", {"token": token})
    return size


def _b64_length(data: str) -> int:
    return len(data) // 4 * 3 - (data[-1:] == "=") - (data[-2:] == "==")


def _write_b64(f: Any, data: str) -> None:
    f.write(base64.b64decode(data))


def _read_b64(f: Any) -> tuple[str, int]:
    data = f.read(CHUNK)
    return base64.b64encode(data).decode("ascii"), len(data)


async def _put_tree(call: Call, local: Path, remote: str, user: str | None) -> int:
    tar_path = Path(f"{local}.put-{os.urandom(4).hex()}.tar")
    token: str | None = None
    try:
        size = await asyncio.to_thread(_tar, local, tar_path, user)
        with await asyncio.to_thread(open, tar_path, "rb") as f:
            offset = 0
            data, n = await asyncio.to_thread(_read_b64, f)
            while True:
                sending = asyncio.ensure_future(call("append", {"token": token, "offset": offset, "data": data}))
                try:
                    # the next chunk is read (and encoded) while this one travels
                    following = await asyncio.to_thread(_read_b64, f) if n else ("", 0)
                    reply = await sending
                finally:
                    if not sending.done():
                        sending.cancel()
                token = str(reply["token"])
                offset += n
                data, n = following
                if not n:
                    break
        await call("unpack", {"token": token, "dest": remote, **_who(user)})
        token = None
    finally:
        await asyncio.to_thread(_unlink, tar_path)
        if token is not None:
            with contextlib.suppress(HelperError):
                await call("drop", {"token": token})
    return size


async def _copy_tree(src: Call, src_path: str, dst: Call, dst_path: str, user: str | None) -> int:
    packed = await src("pack", {"path": src_path, **_who(user)})
    token, path, size = str(packed["token"]), str(packed["path"]), int(packed["size"])
    out: str | None = None
    try:
        offset = 0
        while offset < size:
            reply = await src("read", {"path": path, "offset": offset, "max_bytes": CHUNK})
            data = str(reply.get("data") or "")
            if not data:
                raise HelperError(f"transfer of {src_path} ended at {offset} of {size} bytes", "read")
            got = await dst("append", {"token": out, "offset": offset, "data": data})
            out = str(got["token"])
            offset = int(got["size"])
        if out is None:  # an empty tar file cannot be: tarfile always writes its end blocks
            raise HelperError(f"transfer of {src_path} is empty", "read")
        await dst("unpack", {"token": out, "dest": dst_path, **_who(user)})
        out = None
    finally:
        with contextlib.suppress(HelperError):
            await src("drop", {"token": token})
        if out is not None:
            with contextlib.suppress(HelperError):
                await dst("drop", {"token": out})
    return int(packed.get("bytes", size))


def _make_parent(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _tar(folder: Path, tar_path: Path, user: str | None = None) -> int:
    """`folder` as a tar file (its folders and regular files, data only: hsched/node/safefiles.py; an absent folder is
    an empty one); its size. `user`: whose folder it is (read for them when we are root)."""
    owner = safefiles.owner_of(user)
    fd = os.open(tar_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        try:
            safefiles.pack(str(folder), f, owner)
        except FileNotFoundError:
            tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT).close()
    return tar_path.stat().st_size


def _untar_replacing(tar_path: Path, dest: Path, user: str | None = None) -> None:
    """Unpack into a folder beside `dest`, then rename it into place (the old one removed after). Regular
    files and folders only, each under that folder, with their permission bits but no setuid: whatever a
    node sent cannot lay a link or a device on the controller (hsched/node/safefiles.py). `user`: whose folder it
    is (theirs from the first byte when we are root)."""
    from hsched.executors._files import move_into_place, remove, temporary_beside

    owner = safefiles.owner_of(user)
    tmp = temporary_beside(str(dest))
    try:
        with open(tar_path, "rb") as tar_in:
            safefiles.unpack(tar_in, os.path.dirname(os.path.abspath(tmp)), os.path.basename(tmp), owner)
        move_into_place(tmp, str(dest))
    except BaseException:
        remove(tmp)
        raise
