"""The dataset requests that write (`data_claim`, `data_write`, `data_write_many`, `data_commit`, `data_drop`):
the destination side of a copy between nodes (hsched/controller/datacopy.py), into a partial folder beside the
destination that is committed whole."""

import json
import os
import shutil

from . import confine
from .confine import Refused
from .datapaths import (
    DATA_CHUNK_MAX,
    DATA_MANIFEST,
    DATA_TREE,
    DIR_FLAGS,
    batch,
    claim_fd,
    claim_token,
    data_writable,
    descend,
    folder_fd,
    open_below,
    rel_parts,
    sync_folder,
    write_below,
)
from .libc import exchange
from .records import new_token, unlink_quietly


def data_claim(req):
    """Make req['partial'] (made if missing) the copy of attempt req['token']: once this answers, a data_write
    carrying another attempt's claim is refused, and none is still under way. A request of an earlier attempt
    can reach the node late (a helper still working through what a lost connection had sent it); it must not
    land in the files this attempt resumes. {claimed}."""
    import fcntl

    partial = data_writable(req["partial"])
    token = claim_token(req.get("token"))
    fd = claim_fd(partial, True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the writes under way (each holds it shared)
        os.ftruncate(fd, 0)
        os.pwrite(fd, token.encode("ascii"), 0)
        os.fsync(fd)
    finally:
        os.close(fd)  # and the lock with it
    return {"claimed": token}


def data_write(req):
    """Base64 `data` into the file req['path'] at req['offset']: a longer file is cut there first (a resumed
    chunk lands exactly), a shorter one refused (no hole); missing folders are made 0755; a link anywhere on
    the path is refused. With `claim` ({partial, token}), only while that partial folder is still that
    attempt's (data_claim). {size}: the file's size after."""
    import base64

    path = data_writable(req["path"])
    offset = int(req.get("offset") or 0)
    data = base64.b64decode(req.get("data") or "")
    if len(data) > DATA_CHUNK_MAX:
        raise Refused("a data_write takes at most %d bytes" % DATA_CHUNK_MAX)
    if offset < 0:
        raise Refused("offset %d is negative" % offset)
    claim = req.get("claim")
    if claim is None:
        return _write_at(path, offset, data)
    import fcntl

    partial = data_writable(claim.get("partial") if isinstance(claim, dict) else None)
    token = claim_token(claim.get("token"))
    try:
        cfd = claim_fd(partial, False)
    except FileNotFoundError:
        raise Refused("%s is no copy's now (claim %s)" % (partial, token)) from None
    try:
        fcntl.flock(cfd, fcntl.LOCK_SH)
        held = os.pread(cfd, 128, 0).decode("ascii", "replace")
        if held != token:
            raise Refused("%s is another attempt's copy now (%s, not %s)" % (partial, held, token))
        return _write_at(path, offset, data)
    finally:
        os.close(cfd)


def _write_at(path, offset, data):
    top = folder_fd(os.path.dirname(path), create=True)
    try:
        return {"size": write_below(top, [os.path.basename(path)], offset, data, path)}
    finally:
        os.close(top)


def data_write_many(req):
    """Several files into the claimed partial folder at once: req['claim'] ({partial, token}, as data_write's),
    req['files'] ([{rel, offset, data}]: base64 `data` into PARTIAL/data/rel at offset, as data_write writes one:
    cut there first, no hole, missing folders made 0755, no link followed; rel "" is PARTIAL/data itself, a
    dataset of one file). At most DATA_CHUNK_MAX bytes in all. Every file is fsynced before the reply, as
    data_write's is: a resumed copy trusts the lengths it finds. (One after another: the controller keeps
    several batches under way, so that as many fsyncs as the per-file path had are in flight for the file system
    to commit together; threads of the request's own measured slower where an fsync costs nothing, a tmpfs,
    contending for the interpreter.) While it runs the claim is held: a data_claim waits for it, and once another
    attempt claimed the folder the request is refused whole. {sizes}: each file's size after, in order; a file
    that fails stops the batch there (the files before it stay written, as a batch cut short by a lost node
    leaves them)."""
    import base64
    import fcntl

    items = batch(req, "files")
    claim = req.get("claim")
    if not isinstance(claim, dict):
        raise Refused("a data_write_many needs the copy's claim {partial, token}")
    partial = data_writable(claim.get("partial"))
    token = claim_token(claim.get("token"))
    writes = []
    total = 0
    for item in items:
        rel = str(item.get("rel") or "")
        offset = int(item.get("offset") or 0)
        if offset < 0:
            raise Refused("offset %d is negative" % offset)
        data = base64.b64decode(item.get("data") or "")
        total += len(data)
        if total > DATA_CHUNK_MAX:
            raise Refused("a data_write_many takes at most %d bytes" % DATA_CHUNK_MAX)
        writes.append(([DATA_TREE, *rel_parts(rel)], offset, data))
    try:
        cfd = claim_fd(partial, False)
    except FileNotFoundError:
        raise Refused("%s is no copy's now (claim %s)" % (partial, token)) from None
    try:
        fcntl.flock(cfd, fcntl.LOCK_SH)
        held = os.pread(cfd, 128, 0).decode("ascii", "replace")
        if held != token:
            raise Refused("%s is another attempt's copy now (%s, not %s)" % (partial, held, token))
        top = folder_fd(partial)
        try:
            sizes = [write_below(top, parts, offset, data, "%s/%s" % (partial, "/".join(parts)))
                     for parts, offset, data in writes]
        finally:
            os.close(top)
    finally:
        os.close(cfd)
    return {"sizes": sizes}


def _read_manifest(part_fd, shown):
    """The partial folder's manifest, None if it has none; a manifest that does not read is refused."""
    try:
        fd = os.open(DATA_MANIFEST, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=part_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            m = json.loads(f.read().decode("utf-8", "surrogateescape"))
        except ValueError:
            m = None
    if not isinstance(m, dict) or m.get("kind") not in ("file", "dir") or not isinstance(m.get("files"), list):
        raise Refused("%s: its manifest does not read; drop it and copy again" % shown)
    return m


def _finish(part_fd, manifest, shown):
    """Check the partial tree against its manifest (every file there, at its size) and give files the modes and
    mtimes the source had (no setuid; under --confine no write for others either). (files, bytes)."""
    import stat as stat_

    mask = 0o755 if confine.CONFINE is not None else 0o777
    total = 0
    if manifest["kind"] == "dir":
        os.close(descend(part_fd, [DATA_TREE], True, shown))  # an empty source folder has no file to make it
        for rel in manifest.get("dirs") or []:
            os.close(descend(part_fd, [DATA_TREE, *rel_parts(rel)], True, shown))
    for entry in manifest["files"]:
        rel = entry.get("rel", "") if isinstance(entry, dict) else None
        if rel is None or (manifest["kind"] == "file") != (rel == ""):
            raise Refused("%s: its manifest names %r" % (shown, entry))
        parts = [DATA_TREE, *rel_parts(rel)]
        try:
            fd = open_below(part_fd, parts, os.O_RDONLY | os.O_NONBLOCK, "%s/%s" % (shown, "/".join(parts)))
        except FileNotFoundError:
            raise Refused("%s: %s is missing: the copy is not finished" % (shown, rel or DATA_TREE)) from None
        try:
            st = os.fstat(fd)
            size = int(entry.get("size", -1))
            if not stat_.S_ISREG(st.st_mode) or st.st_size != size:
                raise Refused("%s: %s has %d of %d bytes: the copy is not finished"
                              % (shown, rel or DATA_TREE, st.st_size, size))
            os.fchmod(fd, int(entry.get("mode", 0o644)) & mask)
            mtime = entry.get("mtime")
            if isinstance(mtime, (int, float)):
                os.utime(fd, (mtime, mtime))
            total += size
        finally:
            os.close(fd)
    return len(manifest["files"]), total


def data_commit(req):
    """Put the finished copy req['partial'] at req['dest'] at once: with a manifest (a copy by the controller),
    its `data` checked against it, given its modes and mtimes, the manifest removed, and then swapped with
    what `dest` held (renameat2 RENAME_EXCHANGE: a reader sees the old tree or the new one, never none; where
    the file system cannot, the old one is renamed aside first, as `unpack` does); without one, `partial`
    itself. The partial folder (then holding the old tree) is removed after. {dest, files, bytes}."""
    import stat as stat_

    partial = data_writable(req["partial"])
    dest = data_writable(req["dest"])
    if partial == dest or dest.startswith(partial + "/") or partial.startswith(dest + "/"):
        raise Refused("%s and %s: one lies in the other" % (partial, dest))
    files, size, part_fd, aside = 0, 0, None, None
    try:
        pfd = folder_fd(os.path.dirname(partial))
    except FileNotFoundError:
        raise Refused("%s: no such copy to commit" % partial) from None
    try:
        dfd = folder_fd(os.path.dirname(dest), create=True)
        try:
            pname, dname = os.path.basename(partial), os.path.basename(dest)
            try:
                pst = os.stat(pname, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                raise Refused("%s: no such copy to commit" % partial) from None
            src_fd, src_name = pfd, pname
            if stat_.S_ISDIR(pst.st_mode):
                part_fd = os.open(pname, DIR_FLAGS, dir_fd=pfd)
                manifest = _read_manifest(part_fd, partial)
                if manifest is not None:
                    files, size = _finish(part_fd, manifest, partial)
                    # gone before the swap: a partial folder left holding the old tree must never pass for a copy
                    os.unlink(DATA_MANIFEST, dir_fd=part_fd)
                    os.fsync(part_fd)
                    src_fd, src_name = part_fd, DATA_TREE
            elif not stat_.S_ISREG(pst.st_mode):
                raise Refused("%s is neither a file nor a folder" % partial)
            try:
                dst = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                dst = None
            if dst is None:
                os.rename(src_name, dname, src_dir_fd=src_fd, dst_dir_fd=dfd)
            elif not exchange(src_fd, src_name, dfd, dname):
                both_files = not stat_.S_ISDIR(dst.st_mode) and not stat_.S_ISDIR(
                    os.stat(src_name, dir_fd=src_fd, follow_symlinks=False).st_mode)
                if not both_files:  # a folder cannot be replaced by one rename: the old one goes aside first
                    aside = "%s.old-%s" % (dname, new_token()[:8])
                    os.rename(dname, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
                os.rename(src_name, dname, src_dir_fd=src_fd, dst_dir_fd=dfd)
            sync_folder(dfd)
        finally:
            if part_fd is not None:
                os.close(part_fd)
            os.close(dfd)
    finally:
        os.close(pfd)
    # what is left: the partial folder (with the old tree after a swap), the old tree set aside
    for left in ([partial] if os.path.lexists(partial) else []) + ([os.path.join(os.path.dirname(dest), aside)]
                                                                 if aside else []):
        if os.path.isdir(left) and not os.path.islink(left):
            shutil.rmtree(left, ignore_errors=True)
        else:
            unlink_quietly(left)
    return {"dest": dest, "files": files, "bytes": size}


def data_drop(req):
    """Remove the file or folder req['path'] (a dataset evicted, a copy abandoned); a link is removed, never
    followed. {dropped}: whether there was something."""
    import stat as stat_

    path = data_writable(req["path"])
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"dropped": False}
    if stat_.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # descriptor-based: a link inside is removed, not followed
    else:
        os.unlink(path)
    return {"dropped": True}
