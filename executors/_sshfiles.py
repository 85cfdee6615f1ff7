"""File transfer over SFTP (a Slurm login node's; an SSH node's single files): controller <-> node.

Everything lands under a temporary name beside its target and is renamed into place only when complete, so
a job resuming from a checkpoint never reads half of one. A remote path that is relative (or starts with
`~/`) is taken from the login folder, as scp does.

Data only, never privileges (hsched/node/safefiles.py's rules): regular files and folders cross, with their
permission bits but no setuid, setgid or sticky bit; links, FIFOs, sockets and devices are dropped on either
side, never followed, made or opened. The local side is read and written through safefiles, in a thread (asyncssh's
own local file access opens files on the event loop: a FIFO there would stop the controller until someone wrote
into it). SFTP itself cannot open a remote file without following a link, so an SSH node's folders (checkpoints)
move through its helper's `pack`/`unpack` instead (executors/_confined.py); what goes through here runs with the
login user's own rights only, or is a single file the controller named.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import stat

import asyncssh

from hsched.node import safefiles

from . import _files

CHUNK = 1 << 20


def _rel(remote: str) -> str:
    if remote == "~":
        return "."
    return remote[2:] if remote.startswith("~/") else remote


async def _remove_remote(sftp: asyncssh.SFTPClient, path: str) -> None:
    with contextlib.suppress(asyncssh.SFTPError, OSError):
        attrs = await sftp.lstat(path)
        if attrs.permissions is not None and stat.S_ISDIR(attrs.permissions):
            await sftp.rmtree(path)
        else:
            await sftp.remove(path)


async def _replace_remote(sftp: asyncssh.SFTPClient, tmp: str, path: str) -> None:
    """Rename `tmp` over `path`; a folder already there is moved aside first and removed after."""
    try:
        attrs = await sftp.lstat(path)
        is_dir = attrs.permissions is not None and stat.S_ISDIR(attrs.permissions)
    except asyncssh.SFTPNoSuchFile:
        is_dir = False
    if is_dir:
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


# ------------------------------------------------------------------------------------------------- put


def _local_tree(local: str) -> tuple[bool, list[tuple[str, os.stat_result]], safefiles.Counts]:
    """(is a folder, [(rel, stat)] of its folders and regular files, parents first, counts) of `local`, listed
    through safefiles (what is not a file or folder is dropped there)."""
    counts = safefiles.Counts()
    fd, st = safefiles.open_source(local)
    try:
        if stat.S_ISREG(st.st_mode):
            return False, [("", st)], counts
        return True, [(rel, est) for rel, est, _fd in safefiles.walk(fd, counts)], counts
    finally:
        os.close(fd)


def _open_local(local: str, rel: str, listed: os.stat_result) -> int | None:
    """The local file `rel` below `local` (no link followed on the way or at its end, never a FIFO waited on),
    if it is still the file that was listed; else None (it is dropped)."""
    parts = rel.split("/") if rel else []
    if not parts:
        fd, st = safefiles.open_source(local)
    else:
        top, _st = safefiles.open_source(local)
        try:
            parent = safefiles.descend(top, parts[:-1])
        except OSError:
            return None
        finally:
            os.close(top)
        try:
            fd = os.open(parts[-1], safefiles.FILE_READ, dir_fd=parent)
        except OSError:
            return None
        finally:
            os.close(parent)
        st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino) or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


async def _put_file(sftp: asyncssh.SFTPClient, fd: int, dst: str, mode: int) -> int:
    n = 0
    async with sftp.open(dst, "xb", asyncssh.SFTPAttrs(permissions=0o600)) as fw:
        while True:
            chunk = await asyncio.to_thread(os.read, fd, CHUNK)
            if not chunk:
                break
            await fw.write(chunk)
            n += len(chunk)
    await sftp.chmod(dst, safefiles.file_mode(mode))
    return n


async def put(sftp: asyncssh.SFTPClient, local: str, remote: str) -> int:
    """Copy the local file or folder `local` to `remote` (replacing it whole once complete); the bytes sent."""
    remote = _rel(remote)
    is_dir, entries, _counts = await asyncio.to_thread(_local_tree, local)
    await _make_parent(sftp, remote)
    tmp = f"{remote}.part-{secrets.token_hex(4)}"
    n = 0
    try:
        folders: list[tuple[str, int]] = []
        if is_dir:
            await sftp.mkdir(tmp, asyncssh.SFTPAttrs(permissions=0o700))
        for rel, st in entries:
            dst = posixpath.join(tmp, rel) if rel else tmp
            if stat.S_ISDIR(st.st_mode):
                await sftp.mkdir(dst, asyncssh.SFTPAttrs(permissions=0o700))
                folders.append((dst, st.st_mode))
                continue
            fd = await asyncio.to_thread(_open_local, local, rel, st)
            if fd is None:
                continue  # changed since it was listed: dropped, as a swapped entry is
            try:
                n += await _put_file(sftp, fd, dst, st.st_mode)
            finally:
                os.close(fd)
        for dst, mode in reversed(folders):
            await sftp.chmod(dst, safefiles.folder_mode(mode))
        await _replace_remote(sftp, tmp, remote)
    except BaseException:
        await _remove_remote(sftp, tmp)
        raise
    return n


# ------------------------------------------------------------------------------------------------- get


async def _remote_tree(sftp: asyncssh.SFTPClient, top: str) -> list[tuple[str, asyncssh.SFTPAttrs]]:
    """The folders and regular files below the remote folder `top` (lstat's attributes: a link is not a
    folder here, and is left out with FIFOs, sockets and devices), parents first."""
    out: list[tuple[str, asyncssh.SFTPAttrs]] = []
    todo = [""]
    while todo:
        rel = todo.pop()
        if len(rel.split("/")) > safefiles.MAX_DEPTH:
            raise safefiles.Unsafe(f"folders nest deeper than {safefiles.MAX_DEPTH}", posixpath.join(top, rel))
        for entry in sorted(await sftp.readdir(posixpath.join(top, rel) if rel else top),
                            key=lambda e: str(e.filename)):
            name = str(entry.filename)
            if name in (".", "..") or "/" in name:
                continue
            mode = entry.attrs.permissions
            sub = f"{rel}/{name}" if rel else name
            if mode is not None and stat.S_ISDIR(mode):
                out.append((sub, entry.attrs))
                todo.append(sub)
            elif mode is not None and stat.S_ISREG(mode):
                out.append((sub, entry.attrs))
    out.sort(key=lambda e: e[0].split("/"))
    return out


def _write_local(tmp: str, rel: str, data: list[bytes], mode: int) -> None:
    parts = rel.split("/") if rel else []
    parent_path, name = (os.path.dirname(os.path.abspath(tmp)), os.path.basename(tmp)) if not parts else (tmp, "")
    pfd = os.open(parent_path, os.O_RDONLY | safefiles.O_DIRECTORY | safefiles.O_CLOEXEC)
    try:
        where = safefiles.descend(pfd, parts[:-1]) if parts else os.dup(pfd)
        try:
            fd = safefiles.create_file(where, parts[-1] if parts else name, None)
            try:
                for chunk in data:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                os.fchmod(fd, safefiles.file_mode(mode))
            finally:
                os.close(fd)
        finally:
            os.close(where)
    finally:
        os.close(pfd)


def _make_local_folder(tmp: str, rel: str) -> None:
    parts = rel.split("/") if rel else []
    if not parts:
        os.mkdir(tmp, 0o700)
        return
    top = os.open(tmp, safefiles.DIR_READ)
    try:
        where = safefiles.descend(top, parts[:-1])
        try:
            os.close(safefiles.make_folder(where, parts[-1], None))
        finally:
            os.close(where)
    finally:
        os.close(top)


def _chmod_local(tmp: str, rel: str, mode: int) -> None:
    top = os.open(tmp, safefiles.DIR_READ)
    try:
        fd = safefiles.descend(top, rel.split("/"))
        try:
            os.fchmod(fd, safefiles.folder_mode(mode))
        finally:
            os.close(fd)
    finally:
        os.close(top)


async def _get_file(sftp: asyncssh.SFTPClient, src: str, tmp: str, rel: str, mode: int) -> int:
    # a file is gathered in memory chunk by chunk and written in one thread call per MiB-sized batch
    n = 0
    async with sftp.open(src, "rb") as fr:
        batch: list[bytes] = []
        first = True
        while True:
            chunk = await fr.read(CHUNK)
            assert isinstance(chunk, bytes)  # opened "rb"
            if chunk:
                batch.append(chunk)
                n += len(chunk)
            if not chunk or len(batch) >= 16:
                if first:
                    await asyncio.to_thread(_write_local, tmp, rel, batch, mode)
                    first = False
                else:
                    await asyncio.to_thread(_append_local, tmp, rel, batch)
                batch = []
            if not chunk:
                return n


def _append_local(tmp: str, rel: str, data: list[bytes]) -> None:
    parts = rel.split("/") if rel else []
    if parts:
        top = os.open(tmp, safefiles.DIR_READ)
        try:
            where = safefiles.descend(top, parts[:-1])
        finally:
            os.close(top)
        name = parts[-1]
    else:
        where = os.open(os.path.dirname(os.path.abspath(tmp)), os.O_RDONLY | safefiles.O_DIRECTORY)
        name = os.path.basename(tmp)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | safefiles.O_NOFOLLOW | safefiles.O_CLOEXEC, dir_fd=where)
    finally:
        os.close(where)
    try:
        for chunk in data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)


async def get(sftp: asyncssh.SFTPClient, remote: str, local: str) -> int:
    """Copy the remote file or folder `remote` to `local` (replacing it whole once complete); the bytes."""
    remote = _rel(remote)
    attrs = await sftp.lstat(remote)
    mode = attrs.permissions or 0
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise safefiles.Unsafe(f"a {safefiles.kind(mode)}, not a regular file or folder", remote)
    await asyncio.to_thread(_files.make_parent, local)
    tmp = f"{local}.part-{secrets.token_hex(4)}"
    n = 0
    try:
        if stat.S_ISREG(mode):
            n = await _get_file(sftp, remote, tmp, "", mode)
        else:
            await asyncio.to_thread(_make_local_folder, tmp, "")
            entries = await _remote_tree(sftp, remote)
            for rel, a in entries:
                emode = a.permissions or 0
                if stat.S_ISDIR(emode):
                    await asyncio.to_thread(_make_local_folder, tmp, rel)
                else:
                    n += await _get_file(sftp, posixpath.join(remote, rel), tmp, rel, emode)
            for rel, a in reversed(entries):
                if stat.S_ISDIR(a.permissions or 0):
                    await asyncio.to_thread(_chmod_local, tmp, rel, a.permissions or 0)
            await asyncio.to_thread(os.chmod, tmp, safefiles.folder_mode(mode))
        await asyncio.to_thread(_files.move_into_place, tmp, local)
    except BaseException:
        await asyncio.to_thread(_files.remove, tmp)
        raise
    return n
