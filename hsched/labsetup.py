"""Setting up a lab controller: is this hsched usable by the lab's users, and the systemd unit that runs it.

A lab controller serves every local user; each of them runs the same `hsched` to talk to it, so the
interpreter and the package must be readable and executable by them. An hsched installed in a root-only place
(a virtual environment under /root, a pyenv Python under /root) would start a controller nobody else can use:
`daemon start --lab` and `daemon install` refuse it with one line saying which folder closes the way.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

from hsched.paths import LAB_SOCKET, Home

UNIT_NAME = "hsched.service"
UNIT_PATH = Path("/etc/systemd/system") / UNIT_NAME


def _closed(path: Path, *, need_read: bool) -> str | None:
    """Why `path` cannot be used by a user who is not its owner or in its group ("others"), or None: every
    folder above it must be searchable (o+x), and the file itself readable (and executable if need_read is
    False: an interpreter) or, for a folder, readable and searchable."""
    try:
        st = path.stat()
    except OSError as e:
        return f"{path}: {e.strerror}"
    for parent in reversed(path.parents):
        try:
            mode = parent.stat().st_mode
        except OSError as e:
            return f"{parent}: {e.strerror}"
        if not mode & stat.S_IXOTH:
            return f"folder {parent} is closed to other users (mode {stat.S_IMODE(mode):o})"
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        if mode & (stat.S_IROTH | stat.S_IXOTH) != (stat.S_IROTH | stat.S_IXOTH):
            return f"folder {path} is closed to other users (mode {stat.S_IMODE(mode):o})"
    elif need_read and not mode & stat.S_IROTH:
        return f"{path} is not readable by other users (mode {stat.S_IMODE(mode):o})"
    elif not need_read and not mode & stat.S_IXOTH:
        return f"{path} is not executable by other users (mode {stat.S_IMODE(mode):o})"
    return None


def install_problem(executable: str | None = None) -> str | None:
    """One line saying why the lab's users could not run this hsched, or None when they can: the interpreter
    (and the real file behind its links), the hsched package and the folders holding its dependencies."""
    import hsched

    exe = Path(executable or sys.executable)
    checks: list[tuple[Path, bool]] = [(exe, False), (Path(os.path.realpath(exe)), False),
                                       (Path(hsched.__file__).resolve().parent, True)]
    for mod in ("typer", "rich"):
        try:
            spec = __import__(mod).__file__
        except ImportError:
            continue
        if spec:
            checks.append((Path(spec).resolve().parent, True))
    for path, need_read in checks:
        why = _closed(path, need_read=need_read)
        if why is not None:
            return (f"the lab's users cannot run this hsched ({exe}): {why}; install hsched where every user can "
                    "run it (README: Set up a lab), e.g. python3 -m venv /opt/hsched && /opt/hsched/bin/pip "
                    "install hsched")
    return None


def systemd_unit(home: Home, *, user: str | None = None, executable: str | None = None) -> str:
    """The unit that runs the lab controller under systemd: restarted on failure; KillMode=process so that a
    stop or restart of the controller leaves the jobs running (their wrappers are in sessions of their own,
    and the next controller adopts them); /run/hsched made by systemd for the socket."""
    exe = executable or sys.executable
    lines = [
        "[Unit]",
        "Description=hsched lab controller: one GPU queue for every user of this machine's fleet",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.quote(exe)} -m hsched.controller.server {shlex.quote(str(home.root))}",
        "Restart=on-failure",
        "RestartSec=5",
        "KillMode=process",
        "RuntimeDirectory=hsched",
        "RuntimeDirectoryMode=0755",
        "RuntimeDirectoryPreserve=yes",
        "LimitNOFILE=8192",
    ]
    sock = home.lab_socket or LAB_SOCKET
    if sock != LAB_SOCKET:
        lines.append(f"Environment=HSCHED_LAB_SOCKET={shlex.quote(str(sock))}")
    if user and user != "root":
        lines.append(f"User={user}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
