"""Confinement: what a service account's helper (root, run through sudo with `--confine ROOT [--min-uid N]`)
may touch, the options that set it (final: the installed launcher passes them first), and the error a refusal
becomes.

Options before the command: `--confine ROOT [--min-uid N]`, each at most once (a second one, an unknown option
or an argument after the command is one JSON error, exit status 2). A lab whose controller runs as a service
account (not root) installs this helper root-owned on every node with a sudo rule that lets the account run
exactly its launcher with one command (`hsched node helper-script`); the installed launcher always passes
`--confine` and `--min-uid` first, so they are final, and then the helper does nothing the account could
turn into root's powers: every path it reads, makes, packs or unpacks lies under ROOT (no symbolic link on the
way; `read` gives only a run's output.log or a transfer file), a run starts only as a named user with a uid of
at least N (default 1000: never root, never a system account), and the handles that `status` and `signal` act
on are the ones this helper wrote (handle.json in a root-owned run folder), never what a request says."""

import os
import sys

from .version import HELPER_VERSION

CONFINE = None
"""`--confine ROOT`: the one folder this helper may touch (a service account's helper, run through sudo)."""
MIN_UID = 1000
"""`--min-uid N`: under --confine, the lowest uid a run may start as (login.defs' UID_MIN)."""
ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodehelper.py")
"""The script that runs this helper (beside this module, in hsched/node/ and in a node's bundle alike)."""


# A service account's helper runs as root through sudo: whatever the account asks, the helper must not do
# anything with root's powers that the account could not do by running a job as a lab user.

class Refused(Exception):
    """What a confined helper will not do (a path outside its folder, a run as root): an error reply."""


class BadOptions(Exception):
    """The helper's command line is refused as a whole (one JSON error line, exit status 2)."""


def parse_options(argv):
    """argv without its leading options (`--confine ROOT`, `--min-uid N`), which set CONFINE and MIN_UID.

    Each option is final: the installed launcher passes both before whatever its caller adds, so a second
    one (`sudo LAUNCHER --confine / --min-uid 0 ...`) would widen the confinement the launcher set; it is
    refused, as is any option after the command (nothing but `_wrap RUN_DIR` takes an argument)."""
    global CONFINE, MIN_UID
    args = list(argv)
    seen = set()
    while len(args) >= 2 and args[1].startswith("--"):
        opt = args[1]
        if opt not in ("--confine", "--min-uid"):
            raise BadOptions("unknown option %s (options: --confine ROOT, --min-uid N, before the command)" % opt)
        if opt in seen:
            raise BadOptions("%s given twice: the first one (the launcher's) is final" % opt)
        seen.add(opt)
        if len(args) < 3:
            raise BadOptions("%s needs a value" % opt)
        if opt == "--confine":
            if not args[2].startswith("/"):
                raise BadOptions("--confine takes an absolute folder, not %r" % args[2])
            CONFINE = os.path.normpath(args[2])
        else:
            try:
                MIN_UID = int(args[2])
            except ValueError:
                raise BadOptions("--min-uid takes a number, not %r" % args[2]) from None
        del args[1:3]
    extra = args[3:] if len(args) >= 2 and args[1] == "_wrap" else args[2:]
    if extra:
        raise BadOptions("%s takes no arguments after it (its request goes on stdin), not %s"
                         % (args[1], " ".join(extra)[:200]))
    return args


def helper_argv(*args):
    """This helper run again (the run's wrapper), confined as this one is: its launcher's isolation from the
    environment and user site included."""
    if CONFINE is None:
        return [sys.executable, ENTRY, *args]
    return [sys.executable, "-E", "-s", ENTRY, "--confine", CONFINE,
            "--min-uid", str(MIN_UID), *args]


def inside(path):
    """`path` made absolute, when this helper may touch it: anything when unconfined; under --confine, only a
    path under ROOT with no symbolic link between ROOT and it (a user's own folder under ROOT may hold links
    laid to lead a root helper elsewhere)."""
    p = os.path.normpath(os.path.abspath(str(path)))
    if CONFINE is None:
        return p
    if p != CONFINE and not p.startswith(CONFINE.rstrip("/") + "/"):
        raise Refused("%s is outside this helper's folder %s" % (path, CONFINE))
    walked = CONFINE
    for part in os.path.relpath(p, CONFINE).split("/"):
        if part == ".":
            break
        walked = os.path.join(walked, part)
        if os.path.islink(walked):
            raise Refused("%s: %s is a symbolic link" % (path, walked))
    return p


def open_inside(path, flags):
    """A descriptor of `path` (never following a link at its end); under --confine, the file it opened must
    still lie under ROOT (a folder on the way swapped for a link after _inside looked is caught here)."""
    fd = os.open(inside(path), flags | getattr(os, "O_NOFOLLOW", 0))
    if CONFINE is None:
        return fd
    try:
        real = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        real = ""
    root = os.path.realpath(CONFINE)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        os.close(fd)
        raise Refused("%s leads outside this helper's folder" % path)
    return fd


def own(path):
    """Under --confine: `path` must be this helper's own (root's, writable by no one else), as every run
    folder and spec it makes are; a folder a user or the account made is never taken for a run's."""
    if CONFINE is None:
        return
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise Refused("%s is not this helper's own" % path)


def why(e):
    """An exception as an error reply's one line (a refusal says only why)."""
    return str(e) if isinstance(e, Refused) else "%s: %s" % (type(e).__name__, e)


def whoami(req):
    """Who runs this helper and how it is confined: the executors' first contact through sudo."""
    return {"uid": os.geteuid(), "confine": CONFINE, "min_uid": MIN_UID, "root": CONFINE,
            "python": list(sys.version_info[:3]), "helper_version": HELPER_VERSION}
