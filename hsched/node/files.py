"""`read`, `newest` and the transfer folder: a run's log read without SFTP, a checkpoint's age, and a checkpoint
moved between a service account's nodes as one tar file (`pack`, `append`, `unpack`, `drop`; safefiles.py's
rules)."""

import os
import re
import shutil

from . import confine, safefiles
from .confine import Refused, inside, open_inside, own
from .owners import account, passable_dirs
from .records import new_token, unlink_quietly

# Reading a run's log without SFTP (the SSH executor, a service account's helper); under --confine only a run's
# output.log or a transfer file of its own.


_TOKEN_TAR = re.compile(r"^[0-9a-f]{32}\.tar$")


def _readable(path):
    """Under --confine, what `read` may give the service account (docs/lab.md: a user's logs and checkpoints stay
    theirs): a run's log, to serve `hsched logs`, from a run folder this helper made (ROOT/runs/A/B, root's),
    or a transfer file a `pack` left in ROOT/xfer (named as `_xfer_path` names them). Nothing else of a user's:
    not a file of a checkpoint folder, not a run's progress or signals (a dataset is `data_read`'s)."""
    p = inside(path)
    if confine.CONFINE is None:
        return p
    rel = os.path.relpath(p, confine.CONFINE).split("/")
    if len(rel) == 2 and rel[0] == "xfer" and _TOKEN_TAR.match(rel[1]):
        return p
    if len(rel) == 4 and rel[0] == "runs" and rel[3] == "output.log":
        try:
            own(os.path.dirname(p))  # only the helper writes under ROOT/runs: root's, 0711
        except FileNotFoundError:
            pass  # no such run (yet): the open says so (no log)
        return p
    raise Refused("%s: this helper reads only a run's output.log and its own transfer files" % path)


def read_file(req):
    """Up to max_bytes of req['path'] from req['offset'], base64 (logs are bytes, not always UTF-8); under
    --confine only what `_readable` allows."""
    import base64

    path = _readable(req["path"])
    offset = max(0, int(req.get("offset", 0)))
    max_bytes = max(0, min(int(req.get("max_bytes", 1 << 20)), 16 << 20))
    try:
        # O_NONBLOCK, then a regular file only: a FIFO laid where a log was must not hang this helper, which serves
        # every request of its node (issue 27)
        with os.fdopen(open_inside(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_mode & 0o170000) != 0o100000:  # S_ISREG (this module imports `stat` only where it needs it)
                raise Refused("%s is not a regular file" % path)
            size = st.st_size
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return {"data": "", "size": None}
    return {"data": base64.b64encode(data).decode("ascii"), "size": size}


def newest(req):
    """The newest modification time of any file under req["path"] (None if there is none)."""
    best = None
    for root, _dirs, files in os.walk(inside(req["path"])):
        for name in files:
            try:
                # confined: never a link's target (a user's folder may hold one to anywhere)
                t = os.stat(os.path.join(root, name), follow_symlinks=confine.CONFINE is None).st_mtime
            except OSError:
                continue
            if best is None or t > best:
                best = t
    return {"newest": best}


# A checkpoint moving between nodes of a service account's lab: the folder is the user's (0700), so neither
# the account nor SFTP in its name can read or write it. The helper (root) packs it into a tar file under
# ROOT/xfer, the controller reads that back with `read`, sends it to the other node's helper with `append`,
# and `unpack` puts it in place there: regular files and folders only, no link, no device, no setuid bit.

XFER_CHUNK_MAX = 16 << 20


def _xfer_dir(req):
    root = confine.CONFINE or req.get("root")
    if not root:
        raise Refused("a transfer needs the node's hsched folder (root)")
    d = os.path.join(inside(root), "xfer")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid():
        raise Refused("%s: not a folder of this account's" % d)
    return d


def _xfer_path(req, token=None):
    token = str(req.get("token") if token is None else token)
    if len(token) != 32 or any(c not in "0123456789abcdef" for c in token):
        raise Refused("not a transfer: %r" % token)
    return os.path.join(_xfer_dir(req), token + ".tar")


def copy_owner(req):
    """(uid, gid) of req['user'], the account a transfer is for (its files are read and written as its), or
    None for none; a user this node lacks, or under --confine one below --min-uid, is refused."""
    name = req.get("user")
    if not name:
        return None
    acct = account(str(name))
    if acct is None:
        raise Refused("user %s does not exist on this node" % name)
    if confine.CONFINE is not None and acct["uid"] < confine.MIN_UID:
        raise Refused("this helper copies nothing for %s (uid %d): only for users with a uid of at least %d"
                      % (name, acct["uid"], confine.MIN_UID))
    return acct["uid"], acct["gid"]


def pack(req):
    """The folder req['path'] as a tar file in the transfer folder: {"token", "path", "size", "files", "bytes",
    "dropped"}. Only its folders and regular files, with their permission bits (safefiles.py: no link followed,
    no FIFO opened to wait on, setuid and the like left out); with req['user'], only what that user may give."""
    src = inside(req["path"])
    owner = copy_owner(req)
    token = new_token()
    path = _xfer_path(req, token)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            src_fd = open_inside(src, os.O_RDONLY | os.O_NONBLOCK)
            try:
                counts = safefiles.pack_fd(src_fd, f, owner, shown=src)
            finally:
                os.close(src_fd)
    except FileNotFoundError:
        unlink_quietly(path)
        raise Refused("%s: no such folder" % src) from None
    except safefiles.Unsafe as e:
        unlink_quietly(path)
        raise Refused(str(e)) from None
    except BaseException:
        unlink_quietly(path)
        raise
    return {"token": token, "path": path, "size": os.path.getsize(path), "files": counts.files,
            "bytes": counts.bytes, "dropped": counts.dropped}


def append(req):
    """Bytes (base64 `data`) onto transfer `token` at `offset` (a new transfer when there is no token):
    {"token", "size"}. An offset other than the file's size is refused: a retried chunk never lands twice."""
    import base64

    data = base64.b64decode(req.get("data") or "")
    if len(data) > XFER_CHUNK_MAX:
        raise Refused("a transfer chunk is at most %d bytes" % XFER_CHUNK_MAX)
    token = req.get("token")
    if not token:
        token = new_token()
        fd = os.open(_xfer_path(req, token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        fd = os.open(_xfer_path(req, token), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if int(req.get("offset") or 0) != size:
            raise Refused("transfer %s has %d bytes, not %s" % (token, size, req.get("offset")))
        os.lseek(fd, size, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        return {"token": token, "size": size + len(data)}
    finally:
        os.close(fd)


def unpack(req):
    """Transfer `token` into the folder req['dest'], which it replaces whole (renamed into place: a reader
    never sees half of it); then the transfer file is gone. Only regular files and folders come out, with
    their permission bits (no setuid, no link, no device: safefiles.py), each owned by req['user'] before its
    first byte when there is one (else by this helper, until a launch gives them to the run's user)."""
    dest = inside(req["dest"])
    owner = copy_owner(req)
    path = _xfer_path(req)
    parent = os.path.dirname(dest)
    if confine.CONFINE is not None:
        passable_dirs(confine.CONFINE, parent)
    else:
        os.makedirs(parent, 0o700, exist_ok=True)
    stage = path[:-4] + ".d"
    try:
        try:
            with open(path, "rb") as tar_in:
                counts = safefiles.unpack(tar_in, os.path.dirname(stage), os.path.basename(stage), owner)
        except safefiles.Unsafe as e:
            raise Refused("%s: %s" % (req["dest"], e)) from None
        if os.path.lexists(dest):
            old = path[:-4] + ".old"
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(stage, dest)
    finally:
        if os.path.lexists(stage):
            shutil.rmtree(stage, ignore_errors=True)
        unlink_quietly(path)
    return {"dest": dest, "files": counts.files, "bytes": counts.bytes, "dropped": counts.dropped}


def drop(req):
    """Forget transfer `token` (what is left of a failed or finished one)."""
    unlink_quietly(_xfer_path(req))
    return {"dropped": True}
