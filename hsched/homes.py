"""Where a CLI finds its controller's home, as strings: `hsched.paths.Home.from_env` is built on `locate`, and a quick
path's client connects to `socket_path()` without importing `pathlib` (with the `urllib.parse` and `ipaddress` it
imports, ~3 ms of a 30 ms `hsched queue --json`). The order is `Home.from_env`'s (hsched.paths)."""

from __future__ import annotations

import json
import os
import stat

LAB_HOME = "/var/lib/hsched"
LAB_SOCKET = "/run/hsched/hsched.sock"
LAB_MARKER = "lab.json"


def absolute(path: str) -> str:
    """`Path(path).expanduser().absolute()`'s meaning, as a string: nothing resolved, nothing normalised away that
    changes which file it names."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def lab_socket() -> str:
    """The lab controller's socket: HSCHED_LAB_SOCKET (tests, a second lab on one machine), else the well-known one."""
    env = os.environ.get("HSCHED_LAB_SOCKET")
    return absolute(env) if env else LAB_SOCKET


def lab_home() -> str:
    """The lab's home: HSCHED_LAB_HOME (tests, a second lab on one machine), else the well-known one."""
    env = os.environ.get("HSCHED_LAB_HOME")
    return absolute(env) if env else LAB_HOME


def at(root: str) -> tuple[str, bool, str | None]:
    """The home in `root`: (its folder, a lab's, a lab's socket), in the mode its marker says (none: personal)."""
    root = absolute(root)
    try:
        with open(os.path.join(root, LAB_MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return root, False, None
    sock = marker.get("socket") if isinstance(marker, dict) else None
    return root, True, sock if isinstance(sock, str) and sock else LAB_SOCKET


def locate() -> tuple[str, bool, str | None]:
    """This CLI's home (see hsched.paths): HSCHED_HOME, then the lab's socket if a lab controller made one, then the
    lab's home if one is marked on this machine, then the user's own."""
    env = os.environ.get("HSCHED_HOME")
    if env:
        return at(env)
    sock = lab_socket()
    try:
        served = stat.S_ISSOCK(os.stat(sock).st_mode)
    except OSError:
        served = False
    if served:
        return lab_home(), True, sock
    if os.path.isfile(os.path.join(lab_home(), LAB_MARKER)):
        return at(lab_home())
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(absolute(state), "hsched"), False, None


def socket_of(root: str, lab: bool, lab_socket: str | None) -> str:
    """A home's controller socket: a lab's own, else `controller.sock` in its folder."""
    return lab_socket if lab and lab_socket is not None else os.path.join(root, "controller.sock")


def socket_path() -> str:
    """The socket of this CLI's home (`locate`)."""
    return socket_of(*locate())
