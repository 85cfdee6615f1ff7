"""Where an installation keeps its state: one HSCHED_HOME per independent installation (CONTRACT.md).

The folder is private (0700) and so is every file of the controller's in it (0600): the database holds every
job's environment, which may hold secrets. Both are tightened at every controller start, whatever existed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hsched.errors import UserError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


@dataclass(frozen=True, slots=True)
class Home:
    root: Path

    @classmethod
    def from_env(cls) -> Home:
        env = os.environ.get("HSCHED_HOME")
        if env:
            return cls(Path(env).expanduser().absolute())
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return cls(Path(state).expanduser().absolute() / "hsched")

    @property
    def db(self) -> Path:
        return self.root / "hsched.db"

    @property
    def socket(self) -> Path:
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
        return (self.db, self.db.with_name(self.db.name + "-wal"), self.db.with_name(self.db.name + "-shm"),
                self.log, self.socket, self.lock, self.stderr)

    def ensure(self) -> None:
        """Create the folder, or make an existing one private (0700; run folders hold users' logs too)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
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
            if stat.S_IMODE(st.st_mode) != PRIVATE_DIR:
                os.chmod(self.root, PRIVATE_DIR)
            for sub in (self.runs, self.checkpoints):
                sub.mkdir(exist_ok=True, mode=PRIVATE_DIR)
        except OSError as e:
            raise UserError(f"HSCHED_HOME {self.root}: not writable ({e.strerror}); set HSCHED_HOME to a folder "
                            "you can write, e.g. ~/.local/state/hsched") from None

    def secure(self) -> None:
        """Make the folder 0700 and every controller file in it 0600; create the database and the log 0600
        first, so that neither is ever born with the umask's mode (0644 lets any local user read them)."""
        self.ensure()
        for path in (self.db, self.log):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE))
        for path in self.private_files():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
                os.chmod(path, PRIVATE_FILE)
