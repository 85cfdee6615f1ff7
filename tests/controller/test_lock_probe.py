"""A controller starting while `controller_pid` (daemon status, the CLI) tests the lock does not take the
test's instant shared lock for a running controller; a lock held for good still means one runs."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from hsched.controller.server import AlreadyRunning, acquire_lock
from hsched.paths import Home


def test_an_instant_probe_does_not_stop_a_start_but_a_holder_does(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.ensure()
    probe = os.open(home.lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # what controller_pid does, caught in the act
    releaser = threading.Timer(0.05, lambda: fcntl.flock(probe, fcntl.LOCK_UN))
    releaser.start()
    fd = acquire_lock(home)  # failed before: "a controller already runs"
    releaser.join()
    os.close(probe)
    try:
        with pytest.raises(AlreadyRunning, match="a controller already runs"):
            acquire_lock(home)
    finally:
        os.close(fd)
