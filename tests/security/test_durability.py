"""Issue 27, "durable means durable": an acknowledged job survives an admin's `sqlite3` query and a SIGKILL, a full
disk refuses new work in one line and loses nothing acknowledged, and a damaged or emptied store is refused at start
in one line (naming the backup), never served as an empty queue nor a hang.

Real controllers (forked as `hsched daemon start` runs them: tests/faults/cluster.py), real SQLite, a real tmpfs
filled to the last byte for the full disk."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SAFETY_S
from tests.faults.cluster import Cluster, wait_for
from tests.faults.history import KILL_LOOP_FLEET

pytestmark = pytest.mark.slow  # real controllers, real processes

ADMIN_QUERY = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])  # read-write, as the sqlite3 shell opens it
print(db.execute("SELECT count(*) FROM jobs").fetchone()[0])
db.close()
"""


def admin_query(db: Path) -> int:
    """An admin looks into the store with a read-write connection of their own, in another process, and closes
    it (the last connection to close a WAL database checkpoints it and deletes the log)."""
    out = subprocess.run([sys.executable, "-c", ADMIN_QUERY, str(db)], capture_output=True, text=True, check=True,
                         timeout=SAFETY_S)
    return int(out.stdout)


def held(lab: Cluster, name: str) -> int:
    """An acknowledged submit that stays queued (held): nothing but the store knows it."""
    return lab.submit(["true"], gpus=1, name=name, hold=True)


def posix_locks(pid: int, path: Path) -> list[str]:
    """The POSIX locks `pid` holds on `path`'s inode (/proc/locks)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return [ln for ln in Path("/proc/locks").read_text().splitlines()
            if " POSIX " in ln and ln.split()[4] == str(pid) and ln.split()[5] == dev]


def test_admin_query_then_sigkill_loses_no_acknowledged_job(tmp_path: Path) -> None:
    with Cluster(tmp_path / "lab", fleet_text=KILL_LOOP_FLEET) as lab:
        lab.start()
        before = [held(lab, f"before-{i}") for i in range(3)]
        assert admin_query(lab.db) >= 3
        after = [held(lab, f"after-{i}") for i in range(3)]
        admin_query(lab.db)  # (before the fix it saw 3: the commits since went to a deleted log)
        lab.kill()
        pid = lab.start()
        ids = {j["id"] for j in lab.read().jobs}
        lost = [j for j in before + after if j not in ids]
        assert not lost, f"acknowledged jobs lost after an admin's query and a SIGKILL: {lost}"
        # the controller holds SQLite's shared lock on its database for its whole life (closing any descriptor of
        # the file in its process drops it: issue 27)
        assert posix_locks(pid, lab.db), "the controller holds no lock on its store"


# ------------------------------------------------------------------------------------------------ full disk


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs root (a tmpfs of its own)")
    where.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True,
                       capture_output=True)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot mount a tmpfs: {e.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Fill the file system holding `where` to its last byte; returns the filler (remove it to free the space)."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def test_full_disk_refuses_in_one_line_and_loses_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "16m") as disk, Cluster(disk, fleet_text=KILL_LOOP_FLEET) as lab:
        lab.start()
        queued = [held(lab, f"held-{i}") for i in range(3)]
        # a store in use: its write-ahead log has wrapped, so SQLite can still commit into pages it reuses once the
        # disk is full (how the job was acknowledged, then ended LOST: its run folder had no room)
        done = [lab.submit(["true"], gpus=1, name=f"warm-{i}") for i in range(40)]
        for j in done:
            lab.wait_state(j, "COMPLETED")
        # acknowledged, held until the disk is full, then released: it is launched on the full disk
        waiting = held(lab, "waiting")
        # an admin's checkpoint: the log's next commits go to its start, into pages it has (no new blocks needed)
        con = sqlite3.connect(lab.db, timeout=SAFETY_S)
        try:
            con.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        finally:
            con.close()
        filler = fill(disk)
        # new work: one line, exit 1, nothing half-done
        for i in range(3):
            res = lab.hs.run("submit", "--gpus", "1", "--name", f"full-{i}", "--", "true", timeout=SAFETY_S)
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            assert res.returncode == 1, f"a submit on a full disk: exit {res.returncode}: {res.stdout}{res.stderr}"
            assert len(lines) == 1 and "is full" in lines[0] and "free space" in lines[0], res.stderr
        lab.call("hold", id=waiting, hold=False)
        # its launch fails (no room for its run folder): no fault of the job, which waits
        lab.wait_event(waiting, "launch_failed")
        assert lab.job(waiting)["state"] != "LOST", lab.read().events_of(waiting)
        filler.unlink()
        # room again: it runs, new work is taken, and every acknowledged job is there, none LOST
        lab.wait_state(waiting, "COMPLETED")
        after = lab.submit(["true"], gpus=1, name="after")
        lab.wait_state(after, "COMPLETED")
        lab.kill()
        lab.start()
        st = lab.read(integrity=True)
        assert st.integrity == "ok", st.integrity
        ids = {j["id"]: j for j in st.jobs}
        acked = [a.job for a in lab.record.submits() if a.ok]
        assert all(j in ids for j in [*queued, *done, waiting, after, *acked]), "an acknowledged job was lost"
        assert [j["state"] for j in st.jobs].count("LOST") == 0
        assert ids[waiting]["failures"] == 0  # no retry spent on the disk's fault


# ------------------------------------------------------------------------------------------ damaged stores


def start_controller(lab: Cluster) -> subprocess.CompletedProcess[str]:
    """`python -m hsched.controller.server HOME` as `daemon start` runs it; a controller that still runs after the
    safety net is a hang (killed, and the test fails on its return code)."""
    try:
        return subprocess.run([sys.executable, "-m", "hsched.controller.server", str(lab.home)], env=lab.hs.env,
                              capture_output=True, text=True, timeout=SAFETY_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the controller neither refused nor failed within {SAFETY_S:g} s: "
                             f"{(e.stderr or b'')[-2000:]!r}") from None


def backed_up_jobs(lab: Cluster) -> int:
    """Jobs in the store's backup (-1: none yet, or being replaced)."""
    backup = lab.home / "hsched.db.backup"
    try:
        con = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
        try:
            assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            return int(con.execute("SELECT count(*) FROM jobs").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return -1


def a_store_with_jobs(lab: Cluster, n: int = 200) -> list[int]:
    """A store with `n` jobs, and its backup made at the next start (a start backs the checked store up)."""
    lab.start()
    ids = [held(lab, f"j{i}") for i in range(n)]
    lab.stop()
    lab.start()
    wait_for(lambda: backed_up_jobs(lab) == n, f"the backup to hold the {n} jobs")
    lab.stop()
    return ids


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_corrupted_pages_refused_at_start_in_one_line(tmp_path: Path, seed: int) -> None:
    import random

    with Cluster(tmp_path / "lab", fleet_text=KILL_LOOP_FLEET) as lab:
        a_store_with_jobs(lab)
        con = sqlite3.connect(lab.db)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = con.execute("PRAGMA page_size").fetchone()[0]
        con.close()
        pages = lab.db.stat().st_size // page
        rng = random.Random(seed)
        fd = os.open(lab.db, os.O_WRONLY)
        try:
            for p in rng.sample(range(1, pages), 4):  # four pages, never the header's
                os.pwrite(fd, rng.randbytes(page), p * page)
        finally:
            os.close(fd)
        t0 = time.monotonic()
        res = start_controller(lab)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2, res.stderr[-3000:]
        assert len(lines) == 1 and "damaged" in lines[0] and str(lab.db) in lines[0], res.stderr[-3000:]
        assert "hsched.db.backup" in lines[0], lines[0]  # the backup to restore, named
        assert lab.pid() is None
        print(f"seed {seed}: refused in {time.monotonic() - t0:.2f} s: {lines[0]}")
        # the backup it names is whole and holds the queue: restored as the line says, the controller starts on it
        assert backed_up_jobs(lab) == 200
        shutil.copyfile(lab.home / "hsched.db.backup", lab.db)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(lab.db) + suffix).unlink()
        lab.start()
        assert len(lab.call("queue")) == 200


def test_zero_length_store_refused_but_fresh_home_starts(tmp_path: Path) -> None:
    with Cluster(tmp_path / "lab", fleet_text=KILL_LOOP_FLEET) as lab:
        done = lab.submit(["true"], gpus=1, name="ran") if lab.start() else 0
        lab.wait_state(done, "COMPLETED")
        lab.stop()
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(lab.db) + suffix).unlink()
        os.truncate(lab.db, 0)
        res = start_controller(lab)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2, res.stderr[-3000:]
        assert len(lines) == 1 and "empty" in lines[0] and str(lab.db) in lines[0], res.stderr[-3000:]
        assert lab.db.stat().st_size == 0  # nothing was written over it
    # a truly fresh home (a zero-length file left by an older hsched's first start is one too) starts
    with Cluster(tmp_path / "fresh", fleet_text=KILL_LOOP_FLEET) as fresh:
        fresh.db.touch(mode=0o600)
        fresh.start()
        j = fresh.submit(["true"], gpus=1, name="first")
        fresh.wait_state(j, "COMPLETED")


ADMIN_KILLS = int(os.environ.get("HSCHED_ADMIN_KILLS", "20"))
"""Kill-loop rounds with an admin's query in each (`python -m tests.faults.history --kills 50 --admin-query`)."""


def test_kill_loop_with_admin_queries_loses_nothing(tmp_path: Path) -> None:
    from tests.faults.history import kill_loop

    with Cluster(tmp_path / "lab", fleet_text=KILL_LOOP_FLEET) as lab:
        figures = kill_loop(lab, ADMIN_KILLS, seed=27, admin=True, max_delay_s=0.6)
    print(figures.line())
    assert figures.kills == ADMIN_KILLS and figures.acknowledged > 0
    assert figures.lost == 0 and figures.duplicates == 0 and figures.ran_twice == 0, figures.line()
    assert not figures.violations, "\n".join(figures.violations)
