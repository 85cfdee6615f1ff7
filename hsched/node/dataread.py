"""The dataset requests that read (`data_scan`, `data_list`, `data_free`, `data_root`, `data_read`,
`data_read_many`, `data_hash`): the source side of a copy between nodes (hsched/controller/datacopy.py)."""

import hashlib
import os

from . import confine
from .confine import Refused, open_inside
from .datapaths import (
    DATA_CHUNK_MAX,
    DATA_FOLDER,
    DIR_FLAGS,
    batch,
    data_path,
    data_root_of,
    folder_fd,
    open_below,
    rel_parts,
    tree,
)


def data_scan(req):
    """The size of the file or folder req['path']: {exists, bytes, files, newest, is_dir} (regular files only;
    `newest` the latest mtime of one, None for none)."""
    kind, files, _dirs = tree(req["path"])
    return {"exists": kind is not None, "bytes": sum(st.st_size for _rel, st in files), "files": len(files),
            "newest": max((st.st_mtime for _rel, st in files), default=None), "is_dir": kind == "dir"}


def data_list(req):
    """Every regular file of req['path'] ({rel, size, mtime, mode}; a file alone has rel "") and every folder
    below it (rel), sorted; `is_dir` tells an empty folder from nothing. With `limit`, one page: the files from
    index `start` (`total_files` says how many there are; the folders come with the first page only), so that a
    tree of a million files does not make one reply line of a hundred MB."""
    kind, files, dirs = tree(req["path"])
    start = max(0, int(req.get("start") or 0))
    limit = req.get("limit")
    page = files[start:start + int(limit)] if limit is not None else files[start:]
    return {"exists": kind is not None, "is_dir": kind == "dir", "dirs": dirs if start == 0 else [],
            "total_files": len(files),
            "files": [{"rel": rel, "size": st.st_size, "mtime": st.st_mtime, "mode": st.st_mode & 0o7777}
                      for rel, st in page]}


def data_root(req):
    """Where this helper writes datasets: ROOT/data under --confine, None (anywhere) otherwise. {root}."""
    return {"root": os.path.join(confine.CONFINE, DATA_FOLDER) if confine.CONFINE is not None else None}


def data_free(req):
    """Bytes free to this helper's user where req['path'] is (or would be made): its nearest existing folder."""
    p = data_path(req["path"])
    while not os.path.isdir(p) and p != "/":
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return {"free": st.f_bavail * st.f_frsize, "at": p}


def _data_file_fd(req):
    """(descriptor, shown) of the file a data_read names: req['root'] and req['rel'] below it (a link at the root
    followed as `_tree` does, none below it: a folder of the dataset swapped for a link mid-copy is refused,
    never entered), or req['path'] alone, no link followed anywhere on it. Opened O_NONBLOCK: a pipe laid where
    a file was never hangs the helper."""
    if req.get("root") is not None:
        root = data_root_of(req["root"])
        parts = rel_parts(req.get("rel") or "")
        if not parts:
            return open_inside(root, os.O_RDONLY | os.O_NONBLOCK), root
        shown = os.path.join(root, *parts)
        top = open_inside(root, DIR_FLAGS)
        try:
            return open_below(top, parts, os.O_RDONLY | os.O_NONBLOCK, shown), shown
        finally:
            os.close(top)
    path = data_path(req["path"])
    if path == "/":
        raise Refused("/ is not a file")
    top = folder_fd(os.path.dirname(path))
    try:
        return open_below(top, [os.path.basename(path)], os.O_RDONLY | os.O_NONBLOCK, path), path
    finally:
        os.close(top)


def data_read(req):
    """Up to max_bytes (at most 4 MiB) of a file from req['offset'], base64: {data, eof}. The file: req['rel']
    below the dataset req['root'], or req['path'] (`_data_file_fd`: no link followed below the root)."""
    import base64
    import stat as stat_

    offset = max(0, int(req.get("offset") or 0))
    max_bytes = max(0, min(int(req.get("max_bytes", DATA_CHUNK_MAX)), DATA_CHUNK_MAX))
    fd, shown = _data_file_fd(req)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat_.S_ISREG(st.st_mode):
            raise Refused("%s is not a regular file" % shown)
        f.seek(offset)
        data = f.read(max_bytes)
    return {"data": base64.b64encode(data).decode("ascii"), "eof": offset + len(data) >= st.st_size}


def data_read_many(req):
    """Several files of the tree req['root'] at once: for each of req['files'] ({rel, offset, max_bytes}; rel ""
    names the root itself, a file), up to max_bytes from offset, base64, and the file's size now (a file that
    changed since it was listed shows it). At most DATA_CHUNK_MAX bytes asked in all. The root is taken as
    data_list takes it (a link at the root followed, unconfined); below it no link is followed (data_list leaves
    links out: none is asked for). {files: [{data, size}]}, in the order asked."""
    import base64
    import stat as stat_

    items = batch(req, "files")
    wanted = [max(0, int(i.get("max_bytes") or 0)) for i in items]
    if sum(wanted) > DATA_CHUNK_MAX:
        raise Refused("a data_read_many answers at most %d bytes" % DATA_CHUNK_MAX)
    root = data_root_of(req.get("root"))
    top = None
    out = []
    try:
        for i, item in enumerate(items):  # no zip(strict=): Python 3.8
            want = wanted[i]
            rel = str(item.get("rel") or "")
            offset = max(0, int(item.get("offset") or 0))
            parts = rel_parts(rel)
            shown = os.path.join(root, rel) if rel else root
            if not parts:  # the dataset is this one file
                fd = open_inside(root, os.O_RDONLY | os.O_NONBLOCK)
            else:
                if top is None:
                    top = open_inside(root, DIR_FLAGS)
                fd = open_below(top, parts, os.O_RDONLY | os.O_NONBLOCK, shown)
            try:
                st = os.fstat(fd)
                if not stat_.S_ISREG(st.st_mode):  # O_NONBLOCK: a pipe laid where a file was does not hang
                    raise Refused("%s is not a regular file" % shown)
                data = os.pread(fd, want, offset) if want else b""
            finally:
                os.close(fd)
            out.append({"data": base64.b64encode(data).decode("ascii"), "size": st.st_size})
    finally:
        if top is not None:
            os.close(top)
    return {"files": out}


def data_hash(req):
    """sha256 over the tree req['path']: for each regular file in the order of its relative path (a file
    alone: ""), the path (UTF-8), NUL, its size in decimal, NUL, its bytes. {sha256, files, bytes}. Each file is
    opened below the tree's folder as `_tree` listed it, no link followed (one laid meanwhile is refused)."""
    import stat as stat_

    kind, files, _dirs = tree(req["path"])
    if kind is None:
        raise Refused("%s: no such file or folder" % req["path"])
    base = data_root_of(req["path"])
    h = hashlib.sha256()
    total = 0
    top = open_inside(base, DIR_FLAGS) if kind == "dir" else None
    try:
        for rel, _st in files:
            path = os.path.join(base, rel) if rel else base
            if top is None:
                fd = open_inside(base, os.O_RDONLY | os.O_NONBLOCK)
            else:
                fd = open_below(top, rel_parts(rel), os.O_RDONLY | os.O_NONBLOCK, path)
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                if not stat_.S_ISREG(fst.st_mode):
                    raise Refused("%s is not a regular file" % path)
                h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(fst.st_size).encode() + b"\0")
                n = 0
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    n += len(chunk)
                    h.update(chunk)
                if n != fst.st_size:
                    raise Refused("%s changed while it was hashed" % path)
            total += n
    finally:
        if top is not None:
            os.close(top)
    return {"sha256": h.hexdigest(), "files": len(files), "bytes": total}
