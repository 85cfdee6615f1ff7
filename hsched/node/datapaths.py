"""Where the dataset requests read and write: a dataset's path (under ROOT/data when confined), and folders
walked one name at a time with O_NOFOLLOW from / (from ROOT under --confine), so a link laid anywhere on the way
cannot send bytes elsewhere."""

import os

from . import confine
from .confine import Refused, inside

# A dataset (one file or a folder tree) copied from node to node by the controller (hsched/controller/datacopy.py): it
# reads chunks from one node's helper and writes them through another's into a partial folder beside the
# destination, `DEST.partial/` = the copy's manifest (`.hsched-copy.json`: the source's files, sizes, mtimes
# and modes, written by the controller before any byte), its claim (`.hsched-claim`: the attempt it is now) and
# `data` (the tree, or the file, so far). A copy that stopped resumes from there; `data_commit` checks it against
# its manifest and renames it into place whole.
#
# Writing never follows a link: every folder on the way is opened by name with O_NOFOLLOW from / (from ROOT
# under --confine), so a link laid anywhere on the path cannot send bytes elsewhere. Under --confine, reading
# may name anything under ROOT (as `read` and `pack` may), but writing, committing and dropping only folders
# under ROOT/data: the run folders beside it are root's own, and a handle.json the service account could
# write would be one this helper signals as root.

DATA_CHUNK_MAX = 4 << 20
"""The most bytes one data_read answers or one data_write takes."""
DATA_MANIFEST = ".hsched-copy.json"
"""In a partial folder: what the copy is of (the controller writes it, data_commit reads and removes it)."""
DATA_TREE = "data"
"""In a partial folder: the tree (or the file) being copied."""
DATA_CLAIM = ".hsched-claim"
"""In a partial folder: the attempt whose copy it is now (data_claim), fencing off late writes of earlier ones."""
DATA_FOLDER = "data"
"""Under --confine: ROOT/data holds every dataset this helper writes."""
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
# O_PATH: passing through a folder needs only its x bit, as a path does (a lab's /scratch may be 0711)
WALK_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def data_path(path):
    """An absolute path a data request names, normalized; relative ones and `..` are refused (under --confine
    also anything outside ROOT/data or through a link, as `_inside` refuses them)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise Refused("%r is not an absolute path" % (path,))
    if ".." in path.split("/"):
        raise Refused("%s: a path with '..' is refused" % path)
    p = inside(path)
    if confine.CONFINE is not None:
        # under --confine datasets live in ROOT/data alone: elsewhere under ROOT are the members' checkpoints and
        # runs, which a data request must not read back for the service account (`read` serves only run logs)
        base = os.path.join(confine.CONFINE, DATA_FOLDER)
        if p != base and not p.startswith(base + "/"):
            raise Refused("%s: this helper reads and writes datasets only under %s" % (path, base))
    return p


def data_writable(path):
    """`_data_path`, and under --confine only a path below ROOT/data."""
    p = data_path(path)
    if confine.CONFINE is not None:
        base = os.path.join(confine.CONFINE, DATA_FOLDER)
        if not p.startswith(base + "/"):
            raise Refused("%s: this helper writes datasets only under %s" % (path, base))
    if p == "/":
        raise Refused("/ is not a dataset")
    return p


def rel_parts(rel):
    """The names of a relative path from a manifest (the controller's word, so checked): no '', '.' or '..'."""
    parts = str(rel).split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts) or "\0" in str(rel):
        raise Refused("%r is not a path inside the copy" % (rel,))
    return parts


def descend(fd, parts, create, shown, start=""):
    """A new descriptor of the folder `parts` below the folder `fd` (left open), opened one name at a time
    without following links; a missing folder is made 0755 when `create`. `shown` names the path in errors,
    `start` the folder `fd` is."""
    import errno
    import stat as stat_

    cur = os.dup(fd)
    try:
        for i, part in enumerate(parts):
            made = False
            try:
                nfd = os.open(part, WALK_FLAGS, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=cur)
                    made = True
                except FileExistsError:
                    pass
                nfd = os.open(part, WALK_FLAGS, dir_fd=cur)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    try:
                        link = stat_.S_ISLNK(os.stat(part, dir_fd=cur, follow_symlinks=False).st_mode)
                    except OSError:
                        link = False
                    if link:
                        raise Refused("%s: %s is a symbolic link (name the real path)"
                                      % (shown, os.path.join(start, *parts[:i + 1]))) from None
                raise
            if made:  # 0755 whatever the helper's umask: a job of any user reads a dataset
                ours = os.open(part, DIR_FLAGS, dir_fd=cur)
                try:
                    os.fchmod(ours, 0o755)
                finally:
                    os.close(ours)
            os.close(cur)
            cur = nfd
        return cur
    except BaseException:
        os.close(cur)
        raise


def folder_fd(path, create=False):
    """A descriptor of the folder `path` (absolute, normalized), opened from / (from ROOT under --confine,
    which its launcher names) without following any link on the way: a path through a link is refused."""
    start = "/"
    if confine.CONFINE is not None and (path == confine.CONFINE or path.startswith(confine.CONFINE.rstrip("/") + "/")):
        start = confine.CONFINE
    rest = os.path.relpath(path, start)
    top = os.open(start, getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0))
    try:
        return descend(top, [] if rest == "." else rest.split("/"), create, path, start)
    finally:
        os.close(top)


def sync_folder(fd):
    """fsync a folder held as a path (O_PATH) where it can be read: the names renamed in it are on the disk."""
    try:
        readable = os.open(".", os.O_RDONLY, dir_fd=fd)
    except OSError:
        return  # a folder we may write but not read: the rename stands, its durability is the file system's
    try:
        os.fsync(readable)
    finally:
        os.close(readable)


def open_below(fd, parts, flags, shown, mode=0o600):
    """A descriptor of the file `parts` below the folder `fd`, no link followed on the way or at its end."""
    import errno

    parent = descend(fd, parts[:-1], flags & os.O_CREAT, shown)
    try:
        return os.open(parts[-1], flags | getattr(os, "O_NOFOLLOW", 0), mode, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("%s is a symbolic link" % shown) from None
        raise
    finally:
        os.close(parent)


def tree(path):
    """What is at `path`: (None, [], []) for nothing, ("file", [("", stat)], []) for a file, ("dir", files, dirs)
    for a folder: its regular files as [(rel, stat)] and its folders as [rel], sorted. Links below `path` are
    not followed and are left out, as are devices, sockets and pipes; a link at `path` itself is followed
    (unconfined: a dataset folder may be a link to a big disk; under --confine `_inside` refuses it)."""
    import stat as stat_

    p = data_path(path)
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None, [], []
    if stat_.S_ISREG(st.st_mode):
        return "file", [("", st)], []
    if not stat_.S_ISDIR(st.st_mode):
        return None, [], []
    files, dirs = [], []

    def walk(fd, prefix):
        for name in os.listdir(fd):
            try:
                est = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone meanwhile
            rel = prefix + name
            if stat_.S_ISREG(est.st_mode):
                files.append((rel, est))
            elif stat_.S_ISDIR(est.st_mode):
                dirs.append(rel)
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    walk(sub, rel + "/")
                finally:
                    os.close(sub)

    top = os.open(os.path.realpath(p) if confine.CONFINE is None else p, DIR_FLAGS)
    try:
        walk(top, "")
    finally:
        os.close(top)
    files.sort(key=lambda f: f[0])
    dirs.sort()
    return "dir", files, dirs


def data_root_of(root):
    """The dataset `root` as `_tree` takes it: a link at the root itself followed when unconfined (a dataset
    folder may be a link to a big disk), nothing below it."""
    p = data_path(root)
    return os.path.realpath(p) if confine.CONFINE is None else p


def claim_fd(partial, create):
    """A descriptor of the partial folder's claim file (made, with the folder, when `create`)."""
    top = folder_fd(partial, create=create)
    try:
        return open_below(top, [DATA_CLAIM], os.O_RDWR | (os.O_CREAT if create else 0),
                           "%s/%s" % (partial, DATA_CLAIM))
    finally:
        os.close(top)


def claim_token(value):
    token = str(value or "")
    if not 8 <= len(token) <= 64 or any(c not in "0123456789abcdef" for c in token):
        raise Refused("%r is not a copy's claim" % (value,))
    return token


# Many small files in one request each way (issue #15: a tree of 10,000 files of 4 KiB cost two round trips a
# file). The controller batches files it would read in one chunk anyway; big files keep data_read/data_write.
DATA_BATCH_FILES = 4096
"""The most files one data_read_many answers or one data_write_many takes (bytes: DATA_CHUNK_MAX in all)."""


def batch(req, key):
    items = req.get(key)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise Refused("%s must be a list of objects" % key)
    if len(items) > DATA_BATCH_FILES:
        raise Refused("one request takes at most %d files, not %d" % (DATA_BATCH_FILES, len(items)))
    return items


def write_below(top, parts, offset, data, shown):
    """data_write's write of one file, below the folder `top`: cut at `offset`, written, fsynced. Its size."""
    import stat as stat_

    fd = open_below(top, parts, os.O_WRONLY | os.O_CREAT, shown)
    try:
        st = os.fstat(fd)
        if not stat_.S_ISREG(st.st_mode) or (confine.CONFINE is not None and st.st_nlink > 1):
            raise Refused("%s is not a file of its own" % shown)
        if st.st_size < offset:
            raise Refused("%s has %d bytes: a write at %d would leave a hole" % (shown, st.st_size, offset))
        if st.st_size > offset:
            os.ftruncate(fd, offset)
        view = memoryview(data)
        at = offset
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
        os.fsync(fd)  # a resumed copy trusts the partial file's length: what it counts must be on the disk
        return offset + len(data)
    finally:
        os.close(fd)
