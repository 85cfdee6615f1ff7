"""The rules for every copy hsched makes with more rights than the files' owner (root, or a service account's
root helper): a copy carries data, never privileges (issue #27).

Stdlib only, Python >= 3.8: a module of the node helper (hsched/node/, shipped to the nodes as one bundle:
executors/ssh.py `helper_bundle()`, `hsched node helper-script`), which the executors import as
`hsched.node.safefiles`. Every copy path goes through it: the helpers' `pack`/`unpack` (checkpoints over SSH and
through a confined helper), the controller's tar files (executors/_confined.py), local copies
(executors/_files.py) and the node helper's dataset reads.

What crosses, and what does not:

- Regular files and folders only. Symbolic links, FIFOs, sockets and device nodes are dropped (left out and
  counted), not refused: none of them carries a checkpoint's or a dataset's bytes, and a stray socket or a
  "latest" link in a checkpoint folder must not stop a job from moving. What is dropped is the user's loss only;
  following or recreating it is what would give them someone else's rights.
- Permission bits only: setuid, setgid and sticky bits never arrive; a folder keeps its owner's rwx.
- No link is ever followed, on either side. Reading walks from a held folder descriptor, `lstat`s each name,
  opens it relative to its folder with O_NOFOLLOW and O_NONBLOCK (a FIFO laid there after the look never blocks
  the open) and checks with `fstat` that what it opened is what it looked at (same device and inode, still a
  regular file or a folder): a folder swapped for a link mid-copy is caught, never entered. Writing goes into a
  fresh folder only this process can enter (0700), each file made O_EXCL|O_NOFOLLOW 0600.
- Owned by the job's user from the first byte: running as root for a named user, every folder and file made is
  `fchown`ed to that user before any byte is written into it. And only what that user could have put there is
  read: a file of theirs, or one of ours (root's, from an earlier copy) that has no other hard link; another
  user's file (a hard link to it where protected_hardlinks is off) is dropped.
- Nothing here runs on an event loop: every function blocks (the executors call them in a thread).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the node's Python 3.8 never evaluates them
    from typing import TypeAlias

    Owner: TypeAlias = tuple[int, int]

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
FILE_READ = os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC
"""How a file is opened for reading: no link at its end, and no wait for a writer if it became a FIFO."""
DIR_READ = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC
FILE_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
MAX_DEPTH = 200
"""Folders deeper than this are refused: a copy holds one descriptor per level, and no checkpoint or dataset
nests that deep (a tree made to exhaust descriptors is what would)."""
CHUNK = 1 << 20
DROPPED_SHOWN = 20
"""How many dropped entries a copy remembers by name (all are counted)."""


class Unsafe(OSError):
    """A copy refused: the source is not a regular file or folder, a tar member lies outside its folder, a tree
    nests too deep. (An OSError: the executors' callers already turn those into a TransferError.)"""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(errno.EPERM, message)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}" if self.path else str(self.strerror)


class Counts:
    """What a copy did: files and folders copied, bytes, and what it dropped (kind by path, the first few)."""

    __slots__ = ("bytes", "dirs", "dropped", "dropped_named", "files")

    def __init__(self) -> None:
        self.files = 0
        self.dirs = 0
        self.bytes = 0
        self.dropped = 0
        self.dropped_named: list[tuple[str, str]] = []

    def drop(self, rel: str, why: str) -> None:
        self.dropped += 1
        if len(self.dropped_named) < DROPPED_SHOWN:
            self.dropped_named.append((rel, why))

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "dirs": self.dirs, "bytes": self.bytes, "dropped": self.dropped,
                "dropped_named": [list(d) for d in self.dropped_named]}


def kind(mode: int) -> str:
    """A file type in words: what a dropped entry was."""
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def file_mode(mode: int) -> int:
    """The bits a copied file gets: its permission bits, never setuid, setgid or sticky."""
    return stat.S_IMODE(mode) & 0o777


def folder_mode(mode: int) -> int:
    """The bits a copied folder gets: its permission bits (no setgid, no sticky), always rwx for its owner."""
    return (stat.S_IMODE(mode) & 0o777) | 0o700


def owner_of(user: str | None) -> Owner | None:
    """(uid, gid) of the account `user` here when this process is root (None for no user, and for any user when
    it is not: an unprivileged copy is its own, see `acting_for`); Unsafe for a name this machine lacks (a copy
    for someone unknown is refused: it would otherwise land as root's)."""
    if not user or os.geteuid() != 0:
        return None
    import pwd

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise Unsafe(f"no user {user} on this machine") from None
    return pw.pw_uid, pw.pw_gid


def acting_for(owner: Owner | None) -> Owner | None:
    """`owner` when this process is root copying for another account (then files are given to it and only what
    it owns is read); None otherwise: an unprivileged process's copies carry no one's rights but its own."""
    if owner is None or os.geteuid() != 0 or owner[0] == 0:
        return None
    return owner


def _may_read(st: os.stat_result, owner: Owner | None) -> bool:
    """Whether root may read this entry for `owner`: theirs, or ours with no second hard link (our own earlier
    copy, never a link to a file elsewhere)."""
    if owner is None or st.st_uid == owner[0]:
        return True
    return st.st_uid == os.geteuid() and (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# ---------------------------------------------------------------------------------------------------- reading


def open_source(path: str, follow_top: bool = False) -> tuple[int, os.stat_result]:
    """A descriptor of `path`, a regular file or a folder (no link at its end unless `follow_top`; never a FIFO
    waited on), and its stat. Unsafe for anything else."""
    flags = os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC | (0 if follow_top else O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Unsafe("a symbolic link, not a file or folder (name the real path)", path) from None
        if e.errno == errno.ENXIO:  # a socket
            raise Unsafe("not a regular file or folder", path) from None
        raise
    st = os.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        os.close(fd)
        raise Unsafe(f"a {kind(st.st_mode)}, not a regular file or folder", path)
    return fd, st


def _open_entry(dir_fd: int, name: str, looked: os.stat_result) -> tuple[int, os.stat_result] | None:
    """Open what `lstat` saw as `looked` under `dir_fd`; None if it is gone or is no longer that (swapped)."""
    is_dir = stat.S_ISDIR(looked.st_mode)
    try:
        fd = os.open(name, DIR_READ if is_dir else FILE_READ, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EACCES, errno.EPERM):
            return None
        raise
    st = os.fstat(fd)
    if not _same(st, looked) or (stat.S_ISDIR(st.st_mode) != is_dir) or not (
            stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        os.close(fd)
        return None
    return fd, st


def walk(top_fd: int, counts: Counts, owner: Owner | None = None,
         max_depth: int = MAX_DEPTH) -> Iterator[tuple[str, os.stat_result, int | None]]:
    """Every folder and regular file below the folder `top_fd` (left open), sorted, parents first: (rel, stat,
    fd), fd an open descriptor of the file (closed when the caller asks for the next) or None for a folder.
    What is not a regular file or folder, not `owner`'s to give (see `_may_read`), or swapped between the look
    and the open is dropped into `counts`. Unsafe: a tree deeper than `max_depth`."""
    stack = [(os.dup(top_fd), "", iter(sorted(os.listdir(top_fd))))]
    try:
        while stack:
            dfd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dfd)
                stack.pop()
                continue
            rel = prefix + name
            try:
                looked = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not (stat.S_ISREG(looked.st_mode) or stat.S_ISDIR(looked.st_mode)):
                counts.drop(rel, kind(looked.st_mode))
                continue
            if not _may_read(looked, owner):
                counts.drop(rel, f"owned by uid {looked.st_uid}")
                continue
            opened = _open_entry(dfd, name, looked)
            if opened is None:
                counts.drop(rel, "changed while copied")
                continue
            fd, st = opened
            if stat.S_ISDIR(st.st_mode):
                if len(stack) > max_depth:
                    os.close(fd)
                    raise Unsafe(f"folders nest deeper than {max_depth}", rel)
                try:
                    listed = iter(sorted(os.listdir(fd)))
                except OSError:
                    os.close(fd)
                    raise
                stack.append((fd, rel + "/", listed))
                counts.dirs += 1
                yield rel, st, None
            else:
                try:
                    yield rel, st, fd
                finally:
                    os.close(fd)
                counts.files += 1
    finally:
        for dfd, _prefix, _names in stack:
            os.close(dfd)


# ---------------------------------------------------------------------------------------------------- writing


def make_folder(dir_fd: int, name: str, owner: Owner | None) -> int:
    """Make the folder `name` under `dir_fd` (0700, `owner`'s before anything is in it); its descriptor."""
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = os.open(name, DIR_READ, dir_fd=dir_fd)
    if owner is not None:
        os.fchown(fd, owner[0], owner[1])
    return fd


def create_file(dir_fd: int, name: str, owner: Owner | None) -> int:
    """Make the file `name` under `dir_fd` (never there before, never through a link), 0600 and `owner`'s
    before its first byte; its descriptor, open for writing."""
    fd = os.open(name, FILE_CREATE, 0o600, dir_fd=dir_fd)
    if owner is not None:
        try:
            os.fchown(fd, owner[0], owner[1])
        except BaseException:
            os.close(fd)
            raise
    return fd


def _pump(read: Any, fd: int) -> int:
    n = 0
    while True:
        chunk = read(CHUNK)
        if not chunk:
            return n
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
        n += len(chunk)


def copy_file_fd(src_fd: int, dst_fd: int) -> int:
    """Bytes from one descriptor to the other (from the source's start); how many."""
    os.lseek(src_fd, 0, os.SEEK_SET)
    return _pump(lambda n: os.read(src_fd, n), dst_fd)


def finish_file(fd: int, mode: int, mtime: float) -> None:
    os.fchmod(fd, file_mode(mode))
    os.utime(fd, (mtime, mtime))


def _finish_folders(top_fd: int, folders: list[tuple[list[str], int, float]]) -> None:
    """Give each made folder (parts below `top_fd`) its mode and mtime, deepest first (a read-only folder is
    made so only once nothing more goes into it)."""
    for parts, mode, mtime in sorted(folders, key=lambda f: -len(f[0])):
        fd = descend(top_fd, parts)
        try:
            os.fchmod(fd, folder_mode(mode))
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def descend(top_fd: int, parts: list[str], make: Any = None) -> int:
    """A new descriptor of the folder `parts` below `top_fd`, one name at a time, no link followed; `make(dir_fd,
    name)` (a new folder's descriptor) where one is missing, else FileNotFoundError."""
    cur = os.dup(top_fd)
    try:
        for part in parts:
            try:
                nfd = os.open(part, DIR_READ, dir_fd=cur)
            except FileNotFoundError:
                if make is None:
                    raise
                nfd = make(cur, part)
            os.close(cur)
            cur = nfd
        return cur
    except BaseException:
        os.close(cur)
        raise


def copy_into(src: str, parent: str, name: str, owner: Owner | None = None,
              given_up: Any = None) -> Counts:
    """Copy the file or folder `src` to `parent/name`, which must not exist (a staging name: the caller renames it
    into place). `owner` ((uid, gid), applied when this process is root): who the copy is for. `given_up`: an
    object with is_set() (a threading.Event) checked between files: set, the copy stops (TimeoutError)."""
    owner = acting_for(owner)
    counts = Counts()
    src_fd, st = open_source(src)
    try:
        pfd = os.open(parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        try:
            if stat.S_ISREG(st.st_mode):
                if not _may_read(st, owner):
                    raise Unsafe(f"owned by uid {st.st_uid}, not the job's user", src)
                out = create_file(pfd, name, owner)
                try:
                    counts.bytes += copy_file_fd(src_fd, out)
                    finish_file(out, st.st_mode, st.st_mtime)
                finally:
                    os.close(out)
                counts.files += 1
                return counts
            top = make_folder(pfd, name, owner)
            try:
                _copy_tree_fd(src_fd, top, owner, counts, given_up)
                os.fchmod(top, folder_mode(st.st_mode))
                os.utime(top, (st.st_mtime, st.st_mtime))
            finally:
                os.close(top)
        finally:
            os.close(pfd)
    finally:
        os.close(src_fd)
    return counts


def _copy_tree_fd(src_fd: int, dst_fd: int, owner: Owner | None, counts: Counts, given_up: Any = None) -> None:
    folders: list[tuple[list[str], int, float]] = []
    for rel, st, fd in walk(src_fd, counts, owner):
        if given_up is not None and given_up.is_set():
            raise TimeoutError("the copy was given up")
        parts = rel.split("/")
        parent = descend(dst_fd, parts[:-1])
        try:
            if fd is None:
                os.close(make_folder(parent, parts[-1], owner))
                folders.append((parts, st.st_mode, st.st_mtime))
            else:
                out = create_file(parent, parts[-1], owner)
                try:
                    counts.bytes += copy_file_fd(fd, out)
                    finish_file(out, st.st_mode, st.st_mtime)
                finally:
                    os.close(out)
        finally:
            os.close(parent)
    _finish_folders(dst_fd, folders)


# ------------------------------------------------------------------------------------------------ tar files


def pack(src: str, out: IO[bytes], owner: Owner | None = None) -> Counts:
    """The folder `src` (no link at its end) as a tar file written to `out`: see `pack_fd`."""
    fd, _st = open_source(src)
    try:
        return pack_fd(fd, out, owner, shown=src)
    finally:
        os.close(fd)


def pack_fd(fd: int, out: IO[bytes], owner: Owner | None = None, shown: str = "") -> Counts:
    """The folder held by `fd` as a tar file written to `out`: its folders and regular files (see `walk`),
    permission bits only. `owner`: the account root packs for (only what it may give is read)."""
    import tarfile

    owner = acting_for(owner)
    counts = Counts()
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise Unsafe(f"a {kind(st.st_mode)}, not a folder", shown)
    tar = tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)
    try:
        for rel, est, ffd in walk(fd, counts, owner):
            info = tarfile.TarInfo(rel)
            info.mtime = est.st_mtime
            if ffd is None:
                info.type, info.mode = tarfile.DIRTYPE, folder_mode(est.st_mode)
                tar.addfile(info)
            else:
                info.mode, info.size = file_mode(est.st_mode), est.st_size
                with os.fdopen(os.dup(ffd), "rb") as data:
                    tar.addfile(info, _Exactly(data, est.st_size))
                counts.bytes += est.st_size
    finally:
        tar.close()
    return counts


class _Exactly:
    """A file's bytes cut or padded to the size its tar header announced (a file that grew or shrank while it
    was packed must not shift every member after it)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n) or b"\0" * n
        self.left -= len(data)
        return data


def _member_parts(name: str) -> list[str]:
    """A tar member's path as names below the folder; Unsafe for one outside it."""
    norm = os.path.normpath(name)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in name:
        raise Unsafe(f"{name!r} lies outside the folder")
    return [] if norm == "." else norm.split("/")


def unpack(tar_in: IO[bytes], parent: str, name: str, owner: Owner | None = None) -> Counts:
    """A tar file (`tar_in`) unpacked into the new folder `parent/name` (which must not exist): regular files and
    folders only (links, hard links, devices, FIFOs dropped), permission bits only, each made `owner`'s before its
    first byte when this process is root. Unsafe: a member outside the folder."""
    import tarfile

    owner = acting_for(owner)
    counts = Counts()
    pfd = os.open(parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        top = make_folder(pfd, name, owner)
    finally:
        os.close(pfd)
    folders: list[tuple[list[str], int, float]] = []
    try:
        with tarfile.open(fileobj=tar_in, mode="r:") as tar:
            for m in tar:
                parts = _member_parts(m.name)
                if not parts:
                    continue
                if not (m.isdir() or m.isreg()):
                    counts.drop("/".join(parts), f"tar member of type {m.type!r}")
                    continue
                where = _make_parents(top, parts[:-1], owner, counts)
                try:
                    if m.isdir():
                        try:
                            os.close(make_folder(where, parts[-1], owner))
                            counts.dirs += 1
                        except FileExistsError:
                            pass
                        folders.append((parts, m.mode, m.mtime))
                        continue
                    try:
                        out = create_file(where, parts[-1], owner)
                    except FileExistsError:
                        counts.drop("/".join(parts), "named twice")
                        continue
                    try:
                        src = tar.extractfile(m)
                        if src is not None:
                            counts.bytes += _pump(src.read, out)
                        finish_file(out, m.mode, m.mtime)
                    finally:
                        os.close(out)
                    counts.files += 1
                finally:
                    os.close(where)
        _finish_folders(top, folders)
    finally:
        os.close(top)
    return counts


def _make_parents(top_fd: int, parts: list[str], owner: Owner | None, counts: Counts) -> int:
    """The folder `parts` below `top_fd` (made as needed, `owner`'s), never through a link: a descriptor."""
    if len(parts) > MAX_DEPTH:
        raise Unsafe(f"folders nest deeper than {MAX_DEPTH}", "/".join(parts))

    def made(dir_fd: int, name: str) -> int:
        fd = make_folder(dir_fd, name, owner)
        counts.dirs += 1
        return fd

    return descend(top_fd, parts, made)


def remove_tree(parent: str, name: str) -> None:
    """Remove `parent/name` (a file, a folder, a link: never followed), if it is there."""
    import shutil

    path = os.path.join(parent, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # descriptor-based where it can be: a link inside is removed
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
