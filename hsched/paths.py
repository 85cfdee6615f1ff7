"""Where an installation keeps its state: one HSCHED_HOME per independent installation (CONTRACT.md).

Two modes, one layout:

* **personal** (the default for a user): `~/.local/state/hsched` (or HSCHED_HOME), the folder private (0700)
  and every file of the controller's in it 0600: the database holds every job's environment, which may hold
  secrets. Only the owner's processes may talk to its socket.
* **lab** (`hsched daemon start --lab`, as root or a service account): `/var/lib/hsched` (or HSCHED_HOME),
  marked by `lab.json` in it, which names the socket every local user talks to (`/run/hsched/hsched.sock`, or
  HSCHED_LAB_SOCKET when it was started). The folder is 0711: users may pass through it to their own run and
  checkpoint folders (each theirs, 0700) but list nothing; the database and log stay 0600.

Both are tightened at every controller start, whatever existed. A CLI finds its controller in this order:
HSCHED_HOME (its mode from its marker), then the lab's socket if a lab controller made one, then the lab's home if
one is marked on this machine (its controller is down: every command says so, none starts a private one), then the
user's own personal home.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hsched import homes
from hsched.errors import UserError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
LAB_DIR = 0o711
"""A lab home and its runs/checkpoints folders: users pass through to their own folders, and list nothing."""
LAB_HOME = Path(homes.LAB_HOME)
LAB_SOCKET = Path(homes.LAB_SOCKET)
LAB_MARKER = homes.LAB_MARKER


def lab_socket() -> Path:
    """The lab controller's socket: HSCHED_LAB_SOCKET (tests, a second lab on one machine), else the
    well-known /run/hsched/hsched.sock."""
    return Path(homes.lab_socket())


def lab_home() -> Path:
    """Where this machine's lab keeps its state: HSCHED_LAB_HOME (tests, a second lab on one machine), else the
    well-known /var/lib/hsched."""
    return Path(homes.lab_home())


class Home:
    """An installation's folder. Immutable, compared by value. Written out rather than a frozen dataclass:
    every CLI start imports this module, and `dataclasses` (with the inspect and ast it imports) was a fifth of
    a quick `hsched submit`'s CPU."""

    __slots__ = ("lab", "lab_socket", "root")
    root: Path
    lab: bool
    """A lab controller's home: every local user's jobs, run as their owners."""
    lab_socket: Path | None
    """Where a lab controller listens (None: the home's own controller.sock)."""

    def __init__(self, root: Path, lab: bool = False, lab_socket: Path | None = None) -> None:
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "lab", lab)
        object.__setattr__(self, "lab_socket", lab_socket)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Home is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Home is immutable: cannot delete {name!r}")

    def _key(self) -> tuple[Path, bool, Path | None]:
        return (self.root, self.lab, self.lab_socket)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Home) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Home(root={self.root!r}, lab={self.lab!r}, lab_socket={self.lab_socket!r})"

    @classmethod
    def _of(cls, found: tuple[str, bool, str | None]) -> Home:
        root, lab, sock = found
        return cls(Path(root), lab=lab, lab_socket=Path(sock) if sock is not None else None)

    @classmethod
    def at(cls, root: Path) -> Home:
        """The home in `root`, in the mode its marker says (no marker: personal)."""
        return cls._of(homes.at(str(root)))

    @classmethod
    def from_env(cls) -> Home:
        """HSCHED_HOME; else the lab's, when a lab controller serves this machine (its queue is everyone's) or when a
        lab is marked here and its controller is down (every command says so, and none starts a private controller
        nobody else sees: a lab that silently splits in two); else the user's own (`homes.locate`)."""
        return cls._of(homes.locate())

    @classmethod
    def for_lab(cls) -> Home:
        """The home `daemon start --lab` makes: HSCHED_HOME or /var/lib/hsched, listening on lab_socket()."""
        env = os.environ.get("HSCHED_HOME")
        return cls(Path(homes.absolute(env) if env else homes.lab_home()), lab=True, lab_socket=lab_socket())

    @property
    def mode(self) -> str:
        return "lab" if self.lab else "personal"

    @property
    def marker(self) -> Path:
        return self.root / LAB_MARKER

    def mark_lab(self) -> None:
        """Record that this home is a lab's (and where its socket is), so that every later start, restart or
        systemd start of its controller serves the lab again. Readable by all: clients with HSCHED_HOME read it."""
        self.ensure()
        tmp = self.marker.with_name(LAB_MARKER + ".tmp")
        tmp.write_text(json.dumps({"socket": str(self.lab_socket or lab_socket())}) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.marker)

    @property
    def db(self) -> Path:
        return self.root / "hsched.db"

    @property
    def socket(self) -> Path:
        if self.lab and self.lab_socket is not None:
            return self.lab_socket
        return self.root / "controller.sock"

    @property
    def lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def log(self) -> Path:
        return self.root / "controller.log"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def settings(self) -> Path:
        return self.root / "settings.toml"

    def fleet_file(self) -> Path | None:
        """HSCHED_FLEET, else $HSCHED_HOME/fleet.toml, else None (this machine alone)."""
        env = os.environ.get("HSCHED_FLEET")
        if env:
            return Path(env).expanduser().absolute()
        default = self.root / "fleet.toml"
        return default if default.exists() else None

    @property
    def stderr(self) -> Path:
        """Where a controller started on demand writes what it prints before its log is open."""
        return self.root / "controller.stderr"

    def private_files(self) -> tuple[Path, ...]:
        """The controller's files that must be 0600: the database with its WAL and shared-memory files (SQLite
        gives those the database's mode when it creates them, but not when they already exist), the log, the
        socket, the lock and the captured stderr."""
        own_socket = () if self.lab else (self.socket,)  # a lab's socket is everyone's door (0666 or a group's)
        return (self.db, self.db.with_name(self.db.name + "-wal"), self.db.with_name(self.db.name + "-shm"),
                self.db_backup, self.log, *own_socket, self.lock, self.stderr)

    @property
    def dir_mode(self) -> int:
        return LAB_DIR if self.lab else PRIVATE_DIR

    def ensure(self) -> None:
        """Create the folder, or make an existing one private (0700; run folders hold users' logs too; a lab's
        0711, see the module's docstring)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=self.dir_mode)
            st = self.root.stat()
        except OSError as e:
            raise UserError(f"HSCHED_HOME {self.root}: cannot create or open it ({e.strerror}); set HSCHED_HOME "
                            "to a folder you can write, e.g. ~/.local/state/hsched") from None
        if st.st_mode & stat.S_ISVTX:
            # /tmp and its like: making them 0700 would lock every other user out of them
            raise UserError(f"HSCHED_HOME {self.root} is a shared folder (sticky bit set); "
                            "choose a folder of its own, e.g. ~/.local/state/hsched")
        if st.st_uid != os.geteuid():
            raise UserError(f"HSCHED_HOME {self.root} belongs to uid {st.st_uid}, not to this user "
                            f"(uid {os.geteuid()}); choose a folder of your own")
        try:
            if stat.S_IMODE(st.st_mode) != self.dir_mode:
                os.chmod(self.root, self.dir_mode)
            for sub in (self.runs, self.checkpoints):
                sub.mkdir(exist_ok=True, mode=self.dir_mode)
                if stat.S_IMODE(sub.stat().st_mode) != self.dir_mode:
                    os.chmod(sub, self.dir_mode)
        except OSError as e:
            raise UserError(f"HSCHED_HOME {self.root}: not writable ({e.strerror}); set HSCHED_HOME to a folder "
                            "you can write, e.g. ~/.local/state/hsched") from None

    @property
    def db_backup(self) -> Path:
        """The store's last good copy (hsched.controller.store.Store.backup): what a damaged store is restored from."""
        return self.root / "hsched.db.backup"

    def has_history(self) -> bool:
        """Whether a store is expected here: a controller launched jobs (their run or checkpoint folders), the
        store left a write-ahead log, or a backup of it was made. A zero-length hsched.db in such a home is a
        store that was lost, never a fresh start."""
        for sub in (self.runs, self.checkpoints):
            try:
                with os.scandir(sub) as it:
                    if any(True for _ in it):
                        return True
            except OSError:
                pass
        for path in (self.db.with_name(self.db.name + "-wal"), self.db_backup):
            try:
                if os.stat(path).st_size > 0:
                    return True
            except OSError:
                pass
        return False

    def secure(self) -> None:
        """Make the folder 0700 and every controller file in it 0600; create the log 0600 first, so that it is
        never born with the umask's mode (0644 lets any local user read it).

        The database is never opened here, only changed by path (chmod): on Linux closing *any* descriptor of a
        file drops every POSIX lock the process holds on it, SQLite's included, and with the controller's shared
        lock gone the next client to close the database (an admin's `sqlite3` query) takes it for the last one
        and deletes the write-ahead log under the running controller, with every commit since. The store
        creates its own file 0600 (hsched.controller.store.Store)."""
        self.ensure()
        os.close(os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE))
        for path in self.private_files():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
                os.chmod(path, PRIVATE_FILE)
