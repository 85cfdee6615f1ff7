"""HSCHED_HOME is 0700 and the controller's files 0600, whatever existed before: tightened at every start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hsched.controller.store import Store
from hsched.errors import UserError
from hsched.paths import Home


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_fresh_home_is_private_and_so_is_the_database_sqlite_writes(tmp_path: Path) -> None:
    home = Home(tmp_path / "fresh" / "home")
    old = os.umask(0o022)  # the usual umask: files are born 0644 unless we say otherwise
    try:
        home.secure()
        store = Store(home.db)
        try:
            store.add_event(1.0, "controller", "a write, so that SQLite makes its -wal and -shm files")
            # SQLite gives the files it adds the database's mode: born 0600, no window where they are not
            made = {p.name: mode(p) for p in home.private_files() if p.exists()}
        finally:
            store.close()
    finally:
        os.umask(old)
    assert mode(home.root) == 0o700
    assert set(made) >= {"hsched.db", "hsched.db-wal", "hsched.db-shm", "controller.log"}
    assert made == dict.fromkeys(made, 0o600)


def test_an_existing_loose_home_and_files_are_tightened(tmp_path: Path) -> None:
    root = tmp_path / "home"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    home = Home(root)
    loose = [home.db, home.db.with_name("hsched.db-wal"), home.db.with_name("hsched.db-shm"), home.log,
             home.stderr]
    for p in loose:
        p.write_text("")
        os.chmod(p, 0o644)
    (root / "runs").mkdir(mode=0o755)
    home.secure()
    assert mode(root) == 0o700
    assert {p.name: mode(p) for p in loose} == {p.name: 0o600 for p in loose}


def test_a_shared_folder_is_refused_not_locked_down(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    with pytest.raises(UserError, match="shared folder \\(sticky bit set\\)"):
        Home(shared).ensure()
    assert mode(shared) == 0o1777
