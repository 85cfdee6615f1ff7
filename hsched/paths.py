"""Where an installation keeps its state: one HSCHED_HOME per independent installation (CONTRACT.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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

    def ensure(self) -> None:
        # 0700: the socket's 0600 is the real guard, but run folders hold users' logs too
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.runs.mkdir(exist_ok=True, mode=0o700)
        self.checkpoints.mkdir(exist_ok=True, mode=0o700)
