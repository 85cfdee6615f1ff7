"""File transfer over SFTP for the SSH executor: controller <-> node, and node -> node through the controller.

Everything lands under a temporary name beside its target and is renamed into place only when complete, so
a job resuming from a checkpoint never reads half of one. A remote path that is relative (or starts with
`~/`) is taken from the login folder, as scp does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import stat

import asyncssh

from . import _files

CHUNK = 1 << 20


def _rel(remote: str) -> str:
    if remote == "~":
        return "."
    return remote[2:] if remote.startswith("~/") else remote


async def _remove_remote(sftp: asyncssh.SFTPClient, path: str) -> None:
    with contextlib.suppress(asyncssh.SFTPError, OSError):
        if await sftp.isdir(path):
            await sftp.rmtree(path)
        else:
            await sftp.remove(path)


async def _replace_remote(sftp: asyncssh.SFTPClient, tmp: str, path: str) -> None:
    """Rename `tmp` over `path`; a folder already there is moved aside first and removed after."""
    if await sftp.isdir(path):
        old = f"{path}.old-{secrets.token_hex(4)}"
        await sftp.rename(path, old)
        await sftp.rename(tmp, path)
        await _remove_remote(sftp, old)
    else:
        await sftp.posix_rename(tmp, path)  # atomic over an existing file (OpenSSH's extension)


async def _make_parent(sftp: asyncssh.SFTPClient, path: str) -> None:
    parent = posixpath.dirname(path)
    if parent and parent not in (".", "/"):
        await sftp.makedirs(parent, exist_ok=True)


async def put(sftp: asyncssh.SFTPClient, local: str, remote: str) -> None:
    remote = _rel(remote)
    is_dir = await asyncio.to_thread(os.path.isdir, local)
    if not is_dir and not await asyncio.to_thread(os.path.isfile, local):
        raise FileNotFoundError(2, "No such file or folder", local)
    await _make_parent(sftp, remote)
    tmp = f"{remote}.part-{secrets.token_hex(4)}"
    try:
        await sftp.put(local, tmp, recurse=is_dir, preserve=True)
        await _replace_remote(sftp, tmp, remote)
    except BaseException:
        await _remove_remote(sftp, tmp)
        raise


async def get(sftp: asyncssh.SFTPClient, remote: str, local: str) -> None:
    remote = _rel(remote)
    is_dir = await sftp.isdir(remote)
    await asyncio.to_thread(_files.make_parent, local)
    tmp = f"{local}.part-{secrets.token_hex(4)}"
    try:
        await sftp.get(remote, tmp, recurse=is_dir, preserve=True)
        await asyncio.to_thread(_files.move_into_place, tmp, local)
    except BaseException:
        await asyncio.to_thread(_files.remove, tmp)
        raise


async def _copy_file(a: asyncssh.SFTPClient, src: str, b: asyncssh.SFTPClient, dst: str, mode: int | None) -> int:
    n = 0
    async with a.open(src, "rb") as fr, b.open(dst, "wb") as fw:
        while True:
            chunk = await fr.read(CHUNK)
            if not chunk:
                break
            await fw.write(chunk)
            n += len(chunk)
    if mode is not None:
        await b.chmod(dst, stat.S_IMODE(mode))
    return n


async def _copy_tree(a: asyncssh.SFTPClient, src: str, b: asyncssh.SFTPClient, dst: str) -> int:
    await b.makedirs(dst, exist_ok=True)
    n = 0
    for entry in await a.readdir(src):
        name = str(entry.filename)
        if name in (".", ".."):
            continue
        s, d = posixpath.join(src, name), posixpath.join(dst, name)
        mode = entry.attrs.permissions
        if mode is not None and stat.S_ISDIR(mode):
            n += await _copy_tree(a, s, b, d)
        elif mode is not None and stat.S_ISLNK(mode):
            await b.symlink(await a.readlink(s), d)
        else:
            n += await _copy_file(a, s, b, d, mode)
    return n


async def copy(a: asyncssh.SFTPClient, src: str, b: asyncssh.SFTPClient, dst: str) -> int:
    """Stream `src` on one node to `dst` on another; returns the bytes copied."""
    src, dst = _rel(src), _rel(dst)
    await _make_parent(b, dst)
    tmp = f"{dst}.part-{secrets.token_hex(4)}"
    try:
        if await a.isdir(src):
            n = await _copy_tree(a, src, b, tmp)
        else:
            n = await _copy_file(a, src, b, tmp, (await a.stat(src)).permissions)
        await _replace_remote(b, tmp, dst)
    except BaseException:
        await _remove_remote(b, tmp)
        raise
    return n
