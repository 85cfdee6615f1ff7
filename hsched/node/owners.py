"""Lab mode: the node's accounts a run starts as, and the folders and files made over to them."""

import os

from . import confine
from .confine import Refused

# A lab's controller runs as root (or as a service account through sudo) and starts each run as the user who
# submitted it, looked up here BY NAME: uids may differ between machines, names are what a lab shares. The
# run's control files (spec, handle, exit record, signals) stay root's in a root-owned folder the user may
# pass through (0711) but not write, so nothing the user controls decides whom the wrapper runs as; the
# output log and the checkpoint folder are the user's (0600 / 0700).


def account(name):
    """The node's account `name` as a dict (uid, gid, groups, home, shell), or None if it has none."""
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        groups = sorted(set(os.getgrouplist(name, pw.pw_gid)))
    except OSError:
        groups = [pw.pw_gid]
    return {"name": name, "uid": pw.pw_uid, "gid": pw.pw_gid, "groups": groups, "home": pw.pw_dir,
            "shell": pw.pw_shell or "/bin/sh"}


def users(req):
    """Which of req['names'] exist on this node: {"present": {name: bool}}."""
    names = req.get("names") or []
    return {"present": dict((str(n), account(str(n)) is not None) for n in names)}


def passable_dirs(base, leaf_parent):
    """Make every folder from `base` down to `leaf_parent` (creating the missing ones) 0711 and ours: a user
    passes through to their own run or checkpoint folder and lists nothing. Only folders under `base`."""
    base = os.path.abspath(base)
    target = os.path.abspath(leaf_parent)
    if target != base and not target.startswith(base.rstrip("/") + "/"):
        raise ValueError("%s is not under %s" % (target, base))
    parts = [base]
    rest = os.path.relpath(target, base)
    if rest != ".":
        for part in rest.split("/"):
            parts.append(os.path.join(parts[-1], part))
    for d in parts:
        try:
            os.mkdir(d, 0o711)
        except FileExistsError:
            pass
        st = os.lstat(d)
        if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid():
            raise ValueError("%s: not a folder of this account's" % d)
        if st.st_mode & 0o777 != 0o711:
            os.chmod(d, 0o711)


def give(path, acct, mode):
    """Create `path` (a file if mode has no x bits, else a folder) owned by the account, with `mode`; an
    existing one is taken over, never followed if it is a link."""
    if mode & 0o111:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
        if os.path.islink(path) or not os.path.isdir(path):
            raise ValueError("%s: not a folder" % path)
        # what a checkpoint copy brought in as root becomes the user's. fwalk works on folder descriptors and
        # never follows a link, so a user who swaps a subfolder for a link to /etc meanwhile gains nothing
        for _top, dirs, files, top_fd in os.fwalk(path, follow_symlinks=False):
            for n in dirs + files:
                try:
                    if os.stat(n, dir_fd=top_fd, follow_symlinks=False).st_uid == os.geteuid():
                        os.chown(n, acct["uid"], acct["gid"], dir_fd=top_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), mode))
    os.chown(path, acct["uid"], acct["gid"], follow_symlinks=False)
    os.chmod(path, mode)


def owner_of(req):
    """The account the run is for: None to run as this helper's own user; a dict to drop to; or an error."""
    name = req.get("user")
    if not name:
        if confine.CONFINE is not None:
            raise Refused("this helper starts runs only as a named user")
        return None, None
    acct = account(name)
    if acct is None:
        return None, {"error": "user %s does not exist on this node" % name, "no_such_user": name}
    if confine.CONFINE is not None and acct["uid"] < confine.MIN_UID:
        # the service account may start jobs as the lab's users, never as root or a system account
        raise Refused("this helper starts no job as %s (uid %d): only as users with a uid of at least %d"
                      % (name, acct["uid"], confine.MIN_UID))
    if acct["uid"] == os.geteuid():
        return None, None
    if os.geteuid() != 0:
        return None, {"error": "this node's helper runs as uid %d and cannot start a job as %s: connect as root "
                               "(or through the service account's sudo rule)" % (os.geteuid(), name)}
    return acct, None
