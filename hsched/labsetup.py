"""Setting up a lab controller: is this hsched usable by the lab's users, the systemd unit that runs it, and
the script that prepares a node for a controller running as a service account.

A lab controller serves every local user; each of them runs the same `hsched` to talk to it, so the
interpreter and the package must be readable and executable by them. An hsched installed in a root-only place
(a virtual environment under /root, a pyenv Python under /root) would start a controller nobody else can use:
`daemon start --lab` and `daemon install` refuse it with one line saying which folder closes the way.
"""

from __future__ import annotations

import base64
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
                    "run it (docs/lab.md), e.g. python3 -m venv /opt/hsched && /opt/hsched/bin/pip "
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
        # `systemctl reload hsched`: fleet and settings read again (hsched.controller.reloading)
        "ExecReload=/bin/kill -HUP $MAINPID",
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


# ------------------------------------------------------------------------------ a service account's nodes

HELPER_PREFIX = "/usr/local/libexec/hsched"
LAUNCHER = "hsched-node-helper"
SUDOERS_FILE = "/etc/sudoers.d/hsched"
MIN_UID = 1000
"""login.defs' UID_MIN: the first uid of a person; the confined helper runs no job as anyone below it."""


def launcher_commands() -> tuple[str, ...]:
    """The helper commands the service account may ask for through sudo, one argument each (`sudo -n LAUNCHER
    CMD`, the request on stdin): the helper's requests, its server and its monitoring stream. Never `_wrap`
    or `_probe_gpus` (the helper runs those itself), and never an option: the launcher's are final."""
    from hsched.node.main import COMMANDS

    names = {*COMMANDS, "serve"}
    return tuple(sorted(n for n in names if not n.startswith("_")))


def helper_version() -> int:
    """The protocol of the helper this hsched installs (the executors refuse a node whose helper says less)."""
    from hsched.node.version import HELPER_VERSION

    return HELPER_VERSION


def helper_script(*, account: str = "hsched", prefix: str = HELPER_PREFIX, root: str | None = None,
                  min_uid: int = MIN_UID, sudoers: str = SUDOERS_FILE, public_key: str | None = None,
                  keygen: bool = False) -> str:
    """A POSIX shell script that prepares one node (this machine included) for a lab controller running as
    the service account `account`, run there as root: the account (key-only login, `public_key` authorized),
    the node helper installed root-owned in `prefix` with a launcher that always confines it to `root` (its
    options final, one command of `launcher_commands()` its only argument), and a sudo rule that lets the account
    run exactly that launcher with each of those commands and nothing else (checked with visudo before it takes
    effect). The helper's files are in the script itself: a node needs sh, python3 (>= 3.8) and sudo, nothing else.
    `keygen` (the controller's machine): give the account an SSH key of its own if it has none."""
    from hsched.controller.fleet import LAB_NODE_ROOT
    from hsched.executors.ssh import helper_bundle

    root = root or LAB_NODE_ROOT
    for what, path in (("--prefix", prefix), ("--root", root), ("--sudoers", sudoers)):
        # these land in a sudo rule and a launcher: plain absolute paths only, nothing a shell could reinterpret
        if not path.startswith("/") or not all(c.isalnum() or c in "/._-" for c in path):
            raise ValueError(f"{what} must be an absolute path of letters, digits, '/', '.', '_' or '-', not {path!r}")
    if not account or not all(c.isalnum() or c in "._-" for c in account) or account[0] == "-":
        raise ValueError(f"--account must be a user name, not {account!r}")
    if min_uid < 1:
        raise ValueError(f"--min-uid must be at least 1 (the helper never starts a job as root), not {min_uid}")
    q = shlex.quote
    launcher = f"{prefix.rstrip('/')}/{LAUNCHER}"
    lines = [
        "#!/bin/sh",
        f"# hsched node helper for a lab controller that runs as {account} (not root). Run as root on every node,",
        "# the controller's machine included. Written by `hsched node helper-script`; safe to run again.",
        "set -eu",
        f"ACCOUNT={q(account)}",
        f"PREFIX={q(prefix.rstrip('/') or '/')}",
        f"ROOT={q(root)}",
        f"SUDOERS={q(sudoers)}",
        '[ "$(id -u)" = 0 ] || { echo "hsched: run this as root" >&2; exit 1; }',
        "# the system's python3 first: a root-only one (pyenv under /root) may go away with its owner's shell set-up",
        'PY=$(for p in /usr/bin/python3 /usr/local/bin/python3 "$(command -v python3)"; do [ -x "$p" ] && echo "$p" && '
        'break; done; true)',
        '[ -n "$PY" ] || { echo "hsched: python3 (>= 3.8) is needed on this node" >&2; exit 1; }',
        '"$PY" -c "import sys; sys.exit(sys.version_info < (3, 8))" || '
        '{ echo "hsched: $PY is older than 3.8" >&2; exit 1; }',
        'command -v sudo >/dev/null || { echo "hsched: sudo is needed on this node (apt install sudo)" >&2; exit 1; }',
        'VISUDO=$(command -v visudo || echo /usr/sbin/visudo)',
        "# the account: key-only logins ('*' is no password, and unlike useradd's '!' not a locked account)",
        'if ! id "$ACCOUNT" >/dev/null 2>&1; then',
        '  useradd --system --create-home --shell /bin/sh "$ACCOUNT"',
        '  usermod -p "*" "$ACCOUNT"',
        "fi",
    ]
    if public_key:
        key = public_key.strip()
        if "\n" in key or not key:
            raise ValueError("--key: one public key line (an .pub file)")
        lines += [
            'HOMEDIR=$(getent passwd "$ACCOUNT" | cut -d: -f6)',
            'install -d -o "$ACCOUNT" -m 0700 "$HOMEDIR/.ssh"',
            f"KEY={q(key)}",
            'AK="$HOMEDIR/.ssh/authorized_keys"',
            'touch "$AK"',
            'grep -qxF "$KEY" "$AK" || printf "%s\\n" "$KEY" >> "$AK"',
            'chown "$ACCOUNT" "$AK"; chmod 0600 "$AK"',
        ]
    if keygen:
        lines += [
            "# the controller's SSH key: the account's own, never root's",
            'HOMEDIR=$(getent passwd "$ACCOUNT" | cut -d: -f6)',
            'install -d -o "$ACCOUNT" -m 0700 "$HOMEDIR/.ssh"',
            '[ -f "$HOMEDIR/.ssh/id_ed25519" ] || runuser -u "$ACCOUNT" -- ssh-keygen -q -t ed25519 -N "" '
            '-C "$ACCOUNT@$(hostname)" -f "$HOMEDIR/.ssh/id_ed25519"',
            'echo "hsched: the public key of $ACCOUNT: $HOMEDIR/.ssh/id_ed25519.pub"',
        ]
    lines += [
        "# the helper, root's and read-only to everyone else: the account may run it, never change it",
        'install -d -o root -g root -m 0755 "$PREFIX"',
    ]
    for name, data in helper_bundle().files:
        encoded = base64.b64encode(data).decode("ascii")
        wrapped = "\n".join(encoded[i:i + 76] for i in range(0, len(encoded), 76))
        lines += [
            f'base64 -d > "$PREFIX/.{name}.tmp" <<\'HSCHED_EOF\'',
            wrapped,
            "HSCHED_EOF",
            f'chown root:root "$PREFIX/.{name}.tmp"; chmod 0644 "$PREFIX/.{name}.tmp"',
            f'mv -f "$PREFIX/.{name}.tmp" "$PREFIX/{name}"',
        ]
    commands = launcher_commands()
    lines += [
        "# the launcher: this python, the environment ignored, always confined to $ROOT, one command of a fixed",
        "# list as its only argument (the sudo rule allows no more; an option here would widen the confinement)",
        f'cat > "$PREFIX/.{LAUNCHER}.tmp" <<HSCHED_EOF',
        "#!/bin/sh",
        '[ "\\$#" = 1 ] || { echo \'{"error": "the node helper launcher takes one command and no option"}\'; '
        'exit 2; }',
        'case "\\$1" in',
        f"  {'|'.join(commands)}) ;;",
        '  *) echo \'{"error": "the node helper launcher has no such command"}\'; exit 2 ;;',
        "esac",
        f'exec "$PY" -E -s "$PREFIX/nodehelper.py" --confine "$ROOT" --min-uid {int(min_uid)} "\\$1"',
        "HSCHED_EOF",
        f'chown root:root "$PREFIX/.{LAUNCHER}.tmp"; chmod 0755 "$PREFIX/.{LAUNCHER}.tmp"',
        f'mv -f "$PREFIX/.{LAUNCHER}.tmp" "$PREFIX/{LAUNCHER}"',
        "# the folder runs and checkpoints live in: root's, passable (users reach their own folders under it)",
        'install -d -o root -g root -m 0711 "$ROOT"',
        "# exactly the launcher with one of its commands, as root, without a password (sudo matches a rule's",
        "# arguments exactly: nothing more can be added); checked by visudo before it takes effect",
        'TMP="$(dirname "$SUDOERS")/.hsched-sudoers.tmp"',
        f"for CMD in {' '.join(commands)}; do",
        f'  printf "%s ALL=(root) NOPASSWD: %s %s\\n" "$ACCOUNT" {q(launcher)} "$CMD"',
        'done > "$TMP"',
        'chmod 0440 "$TMP"',
        '"$VISUDO" -cqf "$TMP" || { rm -f "$TMP"; echo "hsched: visudo refused the sudo rule" >&2; exit 1; }',
        'mv -f "$TMP" "$SUDOERS"',
        f'echo "hsched: node helper installed: {launcher} (confined to $ROOT, protocol {helper_version()}); sudo rule '
        f'for $ACCOUNT in $SUDOERS ({len(commands)} commands)"',
        "",
    ]
    return "\n".join(lines)


def give_home(home: Home, user: str) -> None:
    """Hand a lab home made by root to the service account that will run its controller."""
    import pwd

    pw = pwd.getpwnam(user)
    for top, dirs, files in os.walk(home.root):
        for name in dirs + files:
            os.chown(os.path.join(top, name), pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    os.chown(home.root, pw.pw_uid, pw.pw_gid)
