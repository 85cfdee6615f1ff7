"""The store's side of issue 27 in-process: its locks survive the home being secured and a backup being made (an
admin's read-write query from another process then deletes nothing), a damaged file is refused in one line naming
the backup, and a disk without room refuses a submit whole."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hsched.controller import store as store_mod
from hsched.controller.store import DiskFull, Store, StoreDamaged
from hsched.paths import Home
from hsched.serialize import spec_from_dict

SPEC = spec_from_dict({"command": ["true"], "resources": {"gpus": 1}})


def my_locks(path: Path) -> list[str]:
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return [ln for ln in Path("/proc/locks").read_text().splitlines()
            if " POSIX " in ln and ln.split()[4] == str(os.getpid()) and ln.split()[5] == dev]


def admin_query(db: Path) -> None:
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; d = sqlite3.connect(sys.argv[1]); "
                    "d.execute('SELECT count(*) FROM jobs').fetchone(); d.close()", str(db)], check=True, timeout=60)


@pytest.mark.slow  # the admin's query is another process
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="Linux's /proc/locks")
def test_secure_and_backup_keep_sqlite_locks(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.secure()
    s = Store(home.db)
    try:
        s.submit(SPEC, "u", time.time())
        assert my_locks(home.db)
        home.secure()  # as the controller does once its store is open
        s.backup()
        assert my_locks(home.db), "the store's locks were dropped"
        admin_query(home.db)
        wal = Path(str(home.db) + "-wal")
        assert wal.exists(), "an admin's query deleted the write-ahead log under an open store"
        job = s.submit(SPEC, "u", time.time())
    finally:
        s.close()
    s = Store(home.db)
    try:
        assert s.get_job(job.id) is not None
    finally:
        s.close()
    assert oct(home.db.stat().st_mode & 0o777) == "0o600"
    assert oct(home.db_backup.stat().st_mode & 0o777) == "0o600"


def test_damaged_store_refused_in_one_line_naming_the_backup(tmp_path: Path) -> None:
    path = tmp_path / "hsched.db"
    s = Store(path)
    for _ in range(200):
        s.submit(SPEC, "u", time.time(), {"A": "x" * 300})
    s.backup()
    s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    fd = os.open(path, os.O_WRONLY)
    try:
        for page in (3, 5, 8, 13):
            os.pwrite(fd, os.urandom(4096), page * 4096)
    finally:
        os.close(fd)
    with pytest.raises(StoreDamaged) as e:
        Store(path)
    assert len(e.value.problems) == 1 and "\n" not in str(e.value)
    assert "damaged" in str(e.value) and str(path) + ".backup" in str(e.value)
    restored = Store(store_mod.backup_path(path))
    try:
        assert len(restored.jobs()) == 200
    finally:
        restored.close()


def test_no_room_refuses_a_submit_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Store(tmp_path / "hsched.db")
    try:
        s.submit(SPEC, "u", time.time())
        monkeypatch.setattr(store_mod, "MIN_FREE_BYTES", 1 << 62)
        with pytest.raises(DiskFull) as e:
            s.submit_many([SPEC, SPEC], "u", time.time())
        assert "is full" in str(e.value) and "free space" in str(e.value) and str(tmp_path) in str(e.value)
        assert len(s.jobs()) == 1
        assert not s.db.in_transaction
    finally:
        s.close()


def test_the_check_on_open_is_bounded_in_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hsched.db"
    s = Store(path)
    for _ in range(300):
        s.submit(SPEC, "u", time.time(), {"A": "x" * 300})
    try:
        assert store_mod.quick_check(s.db, 60.0) is None  # whole: no problem
        with caplog.at_level("WARNING", logger="hsched.controller.store"):
            assert store_mod.quick_check(s.db, 0.0) is None  # stopped at its bound: used unchecked, and said
        assert "did not finish within 0 s" in caplog.text
        assert s.db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 300  # the connection works on
    finally:
        s.close()
