"""The durable store: SQLite in WAL mode with synchronous=FULL, the controller's only source of truth.

Every state transition is one transaction, committed before the controller acts on it or acknowledges it.
Events are append-only (triggers refuse UPDATE and DELETE). The schema carries a version and migrations
run in order on open.

Durable means durable (issue 27):

* The store's file is opened by SQLite only, never by hsched's own code in the controller's process: on Linux
  closing any descriptor of a file drops every POSIX lock the process holds on it, and SQLite's shared lock on
  the database is what tells another process's closing connection (an admin's `sqlite3`) that it is not the
  last one, which would otherwise checkpoint and delete the write-ahead log under the running controller. SQLite
  itself keeps a second connection of the same process (the reader, a backup) from doing this: it defers the
  close of a descriptor while any connection holds a lock on the file. So the controller holds its locks for
  its whole life without holding anything more (a read kept open would stop checkpoints and grow the log).
* A store opened is checked first (`PRAGMA quick_check`, bounded in time): a damaged one is refused in one
  line naming the backup to restore (`Store.backup`, a checked copy made at every start and every few hours),
  never served half-read.
* A full disk fails the transaction (rolled back whole) with `DiskFull`, one line; nothing is acknowledged that
  was not committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hsched.datasets import DataPlace, PlaceOrigin, PlaceState
from hsched.errors import HschedError, UserError
from hsched.learn.fairshare import Ledger, RunUsage, Usage
from hsched.model import (
    LIVE_RUN_STATES,
    EndReason,
    Job,
    JobSpec,
    JobState,
    NodeState,
    Placement,
    Run,
    RunHandle,
    RunState,
)
from hsched.serialize import (
    handle_from_dict,
    handle_to_dict,
    placement_from_list,
    placement_to_list,
    spec_from_dict,
    spec_to_dict,
)
from hsched.spec.service import (  # issue 30
    ServiceRecord,
    ServiceSpec,
    ServiceState,
    service_from_dict,
    service_to_dict,
)

if TYPE_CHECKING:
    from hsched.learn.kinds import KindRate

# Each migration is a list of statements, run in one transaction with the version bump.
_MIGRATIONS: list[tuple[str, ...]] = [
    # 1: the first schema
    (
        """
        CREATE TABLE jobs (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                user TEXT NOT NULL,
                state TEXT NOT NULL,
                reason TEXT NOT NULL DEFAULT '',
                qos TEXT NOT NULL,
                priority INTEGER NOT NULL,
                spec TEXT NOT NULL,
                submit_time REAL NOT NULL,
                start_time REAL,
                end_time REAL,
                exit_code INTEGER,
                restarts INTEGER NOT NULL DEFAULT 0,
                placement TEXT NOT NULL DEFAULT '[]'
            )
        """,
        """
        CREATE INDEX jobs_state ON jobs(state)
        """,
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            attempt INTEGER NOT NULL,
            node TEXT NOT NULL,
            devices TEXT NOT NULL,
            state TEXT NOT NULL,
            run_dir TEXT NOT NULL,
            handle TEXT,
            start_time REAL,
            end_time REAL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT ''
        )
        """,
        """
        CREATE INDEX runs_job ON runs(job_id)
        """,
        """
        CREATE INDEX runs_state ON runs(state)
        """,
        """
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            job_id INTEGER,
            node TEXT,
            kind TEXT NOT NULL,
            message TEXT NOT NULL,
            data TEXT
        )
        """,
        """
        CREATE INDEX events_job ON events(job_id)
        """,
        """
        CREATE TRIGGER events_no_update BEFORE UPDATE ON events
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END
        """,
        """
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END
        """,
        """
        CREATE TABLE nodes (
            name TEXT PRIMARY KEY,
            admin_state TEXT NOT NULL DEFAULT 'UP',
            admin_reason TEXT NOT NULL DEFAULT ''
        )
        """,
    ),
    # 2: gangs: several runs (ranks) per attempt
    (
        "ALTER TABLE runs ADD COLUMN rank INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN world INTEGER NOT NULL DEFAULT 1",
        "CREATE INDEX runs_job_attempt ON runs(job_id, attempt)",
    ),
    # 3: retries (issue 12): retries used, checkpoint exits of its own, a retry's backoff; GPUs left dirty
    (
        "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN checkpoints INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN begin_time REAL",
        """
        CREATE TABLE dirty_devices (
            uuid TEXT PRIMARY KEY,
            node TEXT NOT NULL,
            pids TEXT NOT NULL,
            since REAL NOT NULL,
            message TEXT NOT NULL
        )
        """,
    ),
    # 4: job arrays (issue 16): each task is a job; the array's id is its first task's
    (
        "ALTER TABLE jobs ADD COLUMN array_id INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_task INTEGER",
        "CREATE INDEX jobs_array ON jobs(array_id)",
    ),
    # 5: the submitter's environment in the job's own transaction (issue 18; it was a file written after the
    # job's commit, two more fsyncs a submit), kept once per distinct environment: a user's jobs share theirs
    (
        "CREATE TABLE envs (sha TEXT PRIMARY KEY, body TEXT NOT NULL) WITHOUT ROWID",
        "CREATE TABLE job_envs (job_id INTEGER PRIMARY KEY REFERENCES jobs(id), "
        "sha TEXT NOT NULL REFERENCES envs(sha))",
    ),
    # 6: what the monitoring samples said of each attempt on each node (hsched.learn.efficiency; `hsched eff`)
    (
        "CREATE TABLE run_usage (job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, node TEXT NOT NULL, "
        "body TEXT NOT NULL, PRIMARY KEY (job_id, attempt, node)) WITHOUT ROWID",
    ),
    # 7: what the jobs' progress reports taught: steps per second per kind and placement (hsched.learn.kinds), and
    # each attempt's progress (first and last report, its speed)
    (
        "CREATE TABLE kind_rates (kind TEXT NOT NULL, gpu_type TEXT NOT NULL, gpus INTEGER NOT NULL, "
        "class TEXT NOT NULL, steps_per_s REAL NOT NULL, runs INTEGER NOT NULL, updated REAL NOT NULL, "
        "PRIMARY KEY (kind, gpu_type, gpus, class)) WITHOUT ROWID",
        "CREATE TABLE run_progress (job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, body TEXT NOT NULL, "
        "PRIMARY KEY (job_id, attempt)) WITHOUT ROWID",
    ),
    # 8: how long completed jobs ran, by kind and user, and what was predicted for them (hsched.learn.predict)
    (
        "CREATE TABLE job_durations (job_id INTEGER PRIMARY KEY, kind TEXT NOT NULL, user TEXT NOT NULL, "
        "duration_s REAL NOT NULL, ended REAL NOT NULL, predicted_s REAL, gpu_peak_mib INTEGER, "
        "host_peak_mib INTEGER)",
        "CREATE INDEX job_durations_kind ON job_durations(kind, ended)",
    ),
    # 9: the jobs that ended since a time (`queue` shows the recently ended too) by an index, not a scan of the
    # whole history; and compaction of old events by time (hsched.controller.store.Store.compact)
    (
        "CREATE INDEX jobs_end ON jobs(end_time)",
        "CREATE INDEX events_time ON events(time)",
    ),
    # 10: where datasets are (a scan found them, a copy made them) and how fast copies went between two nodes
    # (hsched.datasets, hsched.controller.data)
    (
        "CREATE TABLE data_places (dataset TEXT NOT NULL, node TEXT NOT NULL, path TEXT NOT NULL, "
        "origin TEXT NOT NULL, state TEXT NOT NULL, bytes INTEGER, done_bytes INTEGER NOT NULL DEFAULT 0, "
        "source TEXT, updated REAL NOT NULL, last_used REAL, message TEXT NOT NULL DEFAULT '', "
        "PRIMARY KEY (dataset, node)) WITHOUT ROWID",
        "CREATE TABLE link_speeds (src TEXT NOT NULL, dst TEXT NOT NULL, bytes_per_s REAL NOT NULL, "
        "samples INTEGER NOT NULL, updated REAL NOT NULL, PRIMARY KEY (src, dst)) WITHOUT ROWID",
    ),
]
_MIGRATIONS.append(
    # services (issue 30; hsched.spec.service, hsched.controller.services): each a row, its spec as JSON; its replicas
    # are jobs whose spec names it
    (
        "CREATE TABLE services (name TEXT PRIMARY KEY, user TEXT NOT NULL, body TEXT NOT NULL, state TEXT NOT NULL, "
        "wanted INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL) WITHOUT ROWID",
    ),
)

SCHEMA_VERSION = len(_MIGRATIONS)

# Runs in these states hold devices and are looked up on restart (as SQL parameters, in a fixed order).
_LIVE = tuple(sorted(LIVE_RUN_STATES))

_RUNS_CHANGED = (
    "CREATE TEMP TABLE IF NOT EXISTS hsched_changed_runs (seq INTEGER PRIMARY KEY, id INTEGER NOT NULL)",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_runs_inserted AFTER INSERT ON runs BEGIN "
    "INSERT INTO hsched_changed_runs(id) VALUES (NEW.id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_runs_updated AFTER UPDATE ON runs BEGIN "
    "INSERT INTO hsched_changed_runs(id) VALUES (NEW.id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_runs_deleted AFTER DELETE ON runs BEGIN "
    "INSERT INTO hsched_changed_runs(id) VALUES (OLD.id); END",
)
"""The notes `runs_changed` reads: each run row written on the store's connection, in the order written."""

_TRIM_NOTES = 4096
"""Notes written between two trims of those every reader has read."""


log = logging.getLogger("hsched.controller.store")
T = TypeVar("T")

MIN_FREE_BYTES = 1 << 20
"""New work (a submit) is refused when the store's disk has less room than this (`Store.disk_full`)."""

CHECK_S = 120.0
"""The longest the check on open (`PRAGMA quick_check`) may take; past it the store is used unchecked (said in
the log): the check reads every page once (seconds for a store of a GB), so only a slow disk gets there, and
refusing a healthy store for its size would stop the queue."""


class DiskFull(HschedError):
    """The disk holding the store is full: the transaction was rolled back whole, nothing was changed."""


class StoreDamaged(UserError):
    """The store's file is damaged (or is not a store): refused, never read in part."""


def backup_path(path: Path) -> Path:
    """Where the store at `path` keeps its last checked copy."""
    return path.with_name(path.name + ".backup")


def free_bytes(path: Path) -> int | None:
    """Bytes free on the disk holding `path` (root may use the blocks reserved for it); None: unknown."""
    try:
        vfs = os.statvfs(path)
    except OSError:
        return None
    return (vfs.f_bfree if os.geteuid() == 0 else vfs.f_bavail) * vfs.f_frsize


def no_room(path: Path) -> bool:
    """Whether the disk holding `path` has less than MIN_FREE_BYTES free. Blocking (statvfs)."""
    free = free_bytes(path)
    return free is not None and free < MIN_FREE_BYTES


def _is_full(e: sqlite3.Error) -> bool:
    return (getattr(e, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL


def _is_damage(e: sqlite3.Error) -> bool:
    return (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def damaged(path: Path, problem: str) -> StoreDamaged:
    """The one line that refuses a damaged store at `path`, naming the backup to restore."""
    backup = backup_path(path)
    try:
        made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(backup.stat().st_mtime))
    except OSError:
        made = None
    if made is not None:
        fix = (f"restore the backup made {made}: move {path.name} aside, then `cp {backup} {path}` and remove "
               f"{path.name}-wal and {path.name}-shm")
    else:
        fix = (f"there is no backup of it ({backup.name}); move it aside and recover what SQLite can "
               f"(`sqlite3 {path} .recover | sqlite3 NEW.db`, then move NEW.db to {path})")
    return StoreDamaged(f"the store {path} is damaged ({' '.join(problem.split())[:200]}); the controller will "
                        f"not start on it: {fix}")


def _create_private(path: Path) -> None:
    """Create the store's file 0600 if there is none, so that it is never born with the umask's mode (the
    environments in it may hold secrets). O_EXCL: an existing file is not opened (see the module's docstring)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def quick_check(db: sqlite3.Connection, limit_s: float) -> str | None:
    """The first problem `PRAGMA quick_check` finds (None: none, or the check ran past `limit_s` and was
    stopped, said in the log). Errors reading the file (not a database, malformed) are problems too."""
    deadline = time.monotonic() + limit_s
    db.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    try:
        rows = db.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.OperationalError as e:
        if time.monotonic() > deadline:
            log.warning("the store's check did not finish within %g s; the store is used unchecked", limit_s)
            return None
        return str(e)
    except sqlite3.DatabaseError as e:
        return str(e)
    finally:
        db.set_progress_handler(None, 0)
    found = [str(r[0]) for r in rows]
    return None if found == ["ok"] else "; ".join(found)


class Store:
    """One connection, used from the controller's thread; every public method is one transaction."""

    def __init__(self, path: Path, *, check_s: float = CHECK_S) -> None:
        self.path = path
        self._batched = False
        """Inside `in_one`: each `tx` is a savepoint of its transaction."""
        _create_private(path)
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a transaction is exactly what we say
            self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise self._failed(e) from None
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA busy_timeout=5000")
            problem = quick_check(self.db, check_s)
            if problem is not None:
                raise self.damaged(problem)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except BaseException as e:
            self.db.close()
            if isinstance(e, sqlite3.Error):
                raise self._failed(e) from None
            raise
        self._ledger: Ledger | None = None
        """Fair share's folded usage (`user_usage`): the history is read once, then only new and running runs."""
        self._run_notes: dict[str, int] = {}
        """Reader -> the last note of a run written it has read (`runs_changed`)."""
        self._notes_trimmed = 0
        self._open_usage: dict[int, RunUsage] = {}
        """Running runs (of one rank per node) as `_usage_rows` read them, kept while their rows are unchanged."""
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()

    def close(self) -> None:
        self.db.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def damaged(self, problem: str) -> StoreDamaged:
        return damaged(self.path, problem)

    def free_bytes(self) -> int | None:
        return free_bytes(self.path.parent)

    def disk_full(self) -> bool:
        """Whether the disk holding the store (and the home's run and checkpoint folders) has no room for new
        work. SQLite can still commit there for a while, into write-ahead log pages it reuses: a job accepted then
        would have no room for its run folder, so new work is refused from MIN_FREE_BYTES on."""
        return no_room(self.path.parent)

    def full(self) -> DiskFull:
        free = self.free_bytes()
        return DiskFull(f"the disk holding {self.path.parent} is full ({'?' if free is None else f'{free:,}'} bytes "
                        "free): nothing was changed; free space there and retry")

    def _need_room(self) -> None:
        if self.disk_full():
            raise self.full()

    def _failed(self, e: sqlite3.Error) -> BaseException:
        """What a SQLite error on opening means to the person starting the controller."""
        if _is_full(e):
            return self.full()
        if _is_damage(e):
            return self.damaged(str(e))
        return e

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed whole, or rolled back whole (a failed COMMIT too: on a full disk SQLite may
        leave the transaction open, and the next one would then commit this one's changes with its own). Inside
        `in_one` (one transaction for several writes), a savepoint of it: undone whole, or kept for its commit."""
        if self._batched:
            self.db.execute("SAVEPOINT hsched_write")
            try:
                yield self.db
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK TO hsched_write")
                    self.db.execute("RELEASE hsched_write")
                raise
            self.db.execute("RELEASE hsched_write")
            return
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            if _is_full(e):
                raise self.full() from e
            raise

    def in_one(self, writes: Sequence[Callable[[], T]]) -> list[T]:
        """Each write (a call of this store's methods), in order, all in one transaction: one commit, where each
        write's own was an fsync (~70 us of CPU each, issue 33: a round's reasons and launches). Their answers, in
        order; a write that fails undoes them all."""
        if self._batched:
            return [w() for w in writes]
        with self.tx():
            self._batched = True
            try:
                return [w() for w in writes]
            finally:
                self._batched = False

    def backup(self, check_s: float = CHECK_S) -> Path:
        """Copy the store as it is now to its backup (`backup_path`), checked, then put in place in one rename:
        the backup is always a whole, checked copy. Blocking, and safe from any thread: it reads through a
        connection of its own (WAL: the controller's writes go on meanwhile)."""
        target = backup_path(self.path)
        tmp = target.with_name(target.name + ".tmp")
        free = self.free_bytes()
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = 0
        if free is not None and free < 2 * size + 16 * MIN_FREE_BYTES:
            # the copy must never be what fills the disk and turns new work away: the last backup stays
            raise DiskFull(f"no room for a backup of {self.path} on its disk ({free:,} bytes free); the last one "
                           "is kept")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        _create_private(tmp)
        try:
            src = sqlite3.connect(str(self.path))
            try:
                dst = sqlite3.connect(str(tmp))
                try:
                    src.backup(dst)
                    problem = quick_check(dst, check_s)
                finally:
                    dst.close()
            finally:
                src.close()
            if problem is not None:
                raise self.damaged(problem)
            fd = os.open(tmp, os.O_RDONLY)  # the copy's file, not the store's: no lock of the store is touched
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            dfd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, sqlite3.Error) and _is_full(e):
                raise self.full() from e
            raise
        return target

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(
                f"{self.path}: schema version {version} is newer than this hsched knows ({SCHEMA_VERSION}); "
                "upgrade hsched or use another HSCHED_HOME"
            )
        for v in range(version, SCHEMA_VERSION):
            with self.tx() as db:
                for stmt in _MIGRATIONS[v]:
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version={v + 1}")

    # ------------------------------------------------------------------------------------------ events

    @staticmethod
    def _event(db: sqlite3.Connection, now: float, kind: str, message: str, *, job_id: int | None = None,
               node: str | None = None, data: dict[str, Any] | None = None) -> None:
        db.execute(
            "INSERT INTO events(time, job_id, node, kind, message, data) VALUES (?,?,?,?,?,?)",
            (now, job_id, node, kind, message, json.dumps(data) if data else None),
        )

    def add_event(self, now: float, kind: str, message: str, *, job_id: int | None = None,
                  node: str | None = None, data: dict[str, Any] | None = None) -> None:
        with self.tx() as db:
            self._event(db, now, kind, message, job_id=job_id, node=node, data=data)

    def events(self, job_id: int | None = None, *, after_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        if job_id is None:
            rows = self.db.execute(
                "SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?", (after_id, limit)
            ).fetchall()
            rows = rows[::-1]
        else:
            rows = self.db.execute(
                "SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?", (job_id, after_id, limit)
            ).fetchall()
        return [
            {"id": r["id"], "time": r["time"], "job_id": r["job_id"], "node": r["node"], "kind": r["kind"],
             "message": r["message"], "data": json.loads(r["data"]) if r["data"] else None}
            for r in rows
        ]

    def last_events(self, kind: str, job_ids: Sequence[int]) -> dict[int, tuple[float, dict[str, Any]]]:
        """Each job's last event of `kind`: (its time, its figures); jobs with none are left out."""
        out: dict[int, tuple[float, dict[str, Any]]] = {}
        for i in range(0, len(job_ids), 500):
            chunk = list(job_ids[i:i + 500])
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT job_id, time, data FROM events WHERE kind = ? AND job_id IN ({marks}) ORDER BY id",
                (kind, *chunk)).fetchall()
            for r in rows:
                out[r["job_id"]] = (r["time"], json.loads(r["data"]) if r["data"] else {})
        return out

    # -------------------------------------------------------------------------------------------- jobs

    def submit(self, spec: JobSpec, user: str, now: float, env: dict[str, str] | None = None) -> Job:
        """Queue one job (with `env`, the submitter's environment, in the same transaction)."""
        return self.submit_many([spec], user, now, env)[0]

    def submit_array(self, spec: JobSpec, user: str, now: float, env: dict[str, str] | None = None) -> list[Job]:
        """One job per index of `spec.array`, all in one transaction (an array is all there or not at all); the
        first task's id is the array's."""
        assert spec.array is not None
        self._need_room()
        with self.tx() as db:
            ids = self._insert(db, spec, user, now, self._put_env(db, env))
        return self._jobs_by_id(ids)

    def submit_many(self, specs: Sequence[JobSpec], user: str, now: float, env: dict[str, str] | None = None,
                    events: Sequence[tuple[int, str, str]] = ()) -> list[Job]:
        """Queue every spec in one transaction: all of them or, on any error, none. Each is one job, or an array
        (its tasks, the first task's id the array's); returned: one job per spec, an array's first task for an
        array. `env` (the submitter's environment) is kept once for all of them; `events`: (index in `specs`,
        kind, message) recorded on that spec's job in the same transaction. Refused whole on a full disk
        (`disk_full`)."""
        self._need_room()
        with self.tx() as db:
            sha = self._put_env(db, env)
            firsts = [self._insert(db, spec, user, now, sha)[0] for spec in specs]
            for i, kind, message in events:
                self._event(db, now, kind, message, job_id=firsts[i])
        return self._jobs_by_id(firsts)

    def _insert(self, db: sqlite3.Connection, spec: JobSpec, user: str, now: float, env_sha: str | None) -> list[int]:
        """Insert one spec's job (or its array's tasks) with its "submitted" event; the ids, first task first."""
        reason = (EndReason.HELD if spec.hold else EndReason.PRIORITY).value
        body = json.dumps(spec_to_dict(spec))
        row = (user, JobState.PENDING.value, reason, spec.qos, spec.priority, body, now)
        if spec.array is None:
            cur = db.execute(
                "INSERT INTO jobs(user, state, reason, qos, priority, spec, submit_time) VALUES (?,?,?,?,?,?,?)", row)
            ids = [int(cur.lastrowid or 0)]
            self._event(db, now, "submitted", f"submitted by {user}", job_id=ids[0])
        else:
            ids = []
            for task in spec.array.indices:
                cur = db.execute(
                    "INSERT INTO jobs(user, state, reason, qos, priority, spec, submit_time, array_id, array_task) "
                    "VALUES (?,?,?,?,?,?,?,?,?)", (*row, ids[0] if ids else None, task))
                ids.append(int(cur.lastrowid or 0))
            db.execute("UPDATE jobs SET array_id = ? WHERE id = ?", (ids[0], ids[0]))
            self._event(db, now, "submitted",
                        f"array of {len(ids)} tasks ({spec.array}) submitted by {user}", job_id=ids[0])
        if env_sha is not None:  # an array's tasks share the environment kept under the array's id
            db.execute("INSERT INTO job_envs(job_id, sha) VALUES (?,?)", (ids[0], env_sha))
        return ids

    @staticmethod
    def _put_env(db: sqlite3.Connection, env: dict[str, str] | None) -> str | None:
        """Keep `env` once (by its content's hash) and return that hash; None for no environment."""
        if env is None:
            return None
        body = json.dumps(env, sort_keys=True, separators=(",", ":"))
        sha = hashlib.sha256(body.encode()).hexdigest()
        db.execute("INSERT OR IGNORE INTO envs(sha, body) VALUES (?,?)", (sha, body))
        return sha

    def _jobs_by_id(self, ids: Sequence[int]) -> list[Job]:
        by_id: dict[int, Job] = {}
        for i in range(0, len(ids), 500):  # SQLite's limit on parameters is 999 in old builds
            chunk = ids[i:i + 500]
            rows = self.db.execute(f"SELECT * FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            by_id.update((r["id"], job_from_row(r)) for r in rows)
        return [by_id[i] for i in ids]

    def set_job_env(self, job_id: int, env: dict[str, str]) -> None:
        """Keep (or replace) the submitter's environment of an existing job."""
        with self.tx() as db:
            sha = self._put_env(db, env)
            db.execute("INSERT OR REPLACE INTO job_envs(job_id, sha) VALUES (?,?)", (job_id, sha))

    def job_env(self, job_id: int) -> dict[str, str] | None:
        """The submitter's environment kept with job `job_id` (an array's: under the array's id), or None. Safe
        from any thread: it reads through a connection of its own (the launcher asks from a worker thread while
        the store's thread writes), which sees only committed jobs."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(str(self.path), check_same_thread=False)
                self._reader.execute("PRAGMA busy_timeout=5000")
            # fetchall: the statement is done (no read snapshot left open to hold back the WAL's checkpoints)
            rows = self._reader.execute(
                "SELECT body FROM envs JOIN job_envs ON envs.sha = job_envs.sha WHERE job_id = ?", (job_id,)).fetchall()
        if not rows:
            return None
        env = json.loads(rows[0][0])
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None

    def array_tasks(self, array_id: int) -> list[Job]:
        return [job_from_row(r) for r in self.db.execute(
            "SELECT * FROM jobs WHERE array_id = ? ORDER BY array_task", (array_id,)).fetchall()]

    def get_job(self, job_id: int) -> Job | None:
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return job_from_row(row) if row else None

    def jobs(self, *, states: Sequence[JobState] | None = None, limit: int | None = None) -> list[Job]:
        sql = "SELECT * FROM jobs"
        args: list[Any] = []
        if states is not None:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args.extend(s.value for s in states)
        sql += " ORDER BY id"
        if limit is not None:
            sql = f"SELECT * FROM ({sql.replace(' ORDER BY id', ' ORDER BY id DESC')} LIMIT {int(limit)}) ORDER BY id"
        return [job_from_row(r) for r in self.db.execute(sql, args).fetchall()]

    def job_rows_by_id(self, ids: Sequence[int]) -> list[sqlite3.Row]:
        """Raw rows of these jobs (those that exist), by id: what `JobCache` reads again after writes."""
        out: list[sqlite3.Row] = []
        for k in range(0, len(ids), 500):
            part = list(ids[k:k + 500])
            out += self.db.execute(f"SELECT * FROM jobs WHERE id IN ({','.join('?' * len(part))})", part).fetchall()
        return sorted(out, key=lambda r: r["id"])

    def job_rows(self, *, active_only: bool, ended_since: float | None = None) -> list[sqlite3.Row]:
        """Raw rows for the fast queue listing (no dataclass round trip); with `ended_since`, also the jobs
        that ended after that time."""
        if active_only:
            # `state IN (the live states)`, not `NOT IN (the ended ones)`: only IN uses the state index, and with
            # 100,000 ended jobs in the history the scan cost 105-145 ms a listing (0.2 ms by the index)
            live = [s.value for s in JobState if not s.is_terminal()]
            marks = ",".join("?" * len(live))
            if ended_since is not None:
                rows = self.db.execute(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id", live).fetchall()
                ended = self.db.execute(
                    f"SELECT * FROM jobs WHERE end_time >= ? AND state NOT IN ({marks}) ORDER BY id",
                    [ended_since, *live]).fetchall()
                return sorted([*rows, *ended], key=lambda r: r["id"]) if ended else rows
            return self.db.execute(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id", live).fetchall()
        return self.db.execute("SELECT * FROM jobs ORDER BY id").fetchall()

    def set_job(self, job_id: int, now: float, *, event: tuple[str, str] | None = None,
                event_data: dict[str, Any] | None = None, **fields: Any) -> Job:
        """One transition of one job (and its event) in one transaction."""
        with self.tx() as db:
            self._set_job(db, job_id, fields)
            if event:
                self._event(db, now, event[0], event[1], job_id=job_id, data=event_data)
        job = self.get_job(job_id)
        assert job is not None
        return job

    def set_reasons(self, reasons: Sequence[tuple[int, str]]) -> None:
        """Waiting jobs' reasons, all in one transaction (a round's waits: one commit, not one per job)."""
        if reasons:
            with self.tx() as db:
                for job_id, reason in reasons:
                    self._set_job(db, job_id, {"reason": reason})

    @staticmethod
    def _set_job(db: sqlite3.Connection, job_id: int, fields: dict[str, Any]) -> None:
        cols, args = [], []
        for k, v in fields.items():
            if k == "placement":
                v = json.dumps(placement_to_list(v))
            elif isinstance(v, JobState):
                v = v.value
            cols.append(f"{k} = ?")
            args.append(v)
        if cols:
            db.execute(f"UPDATE jobs SET {', '.join(cols)} WHERE id = ?", (*args, job_id))

    # -------------------------------------------------------------------------------------------- runs

    def start_runs(self, job: Job, ranks: Sequence[tuple[Placement, str]], now: float,
                   placement: tuple[Placement, ...] | None = None) -> list[Run]:
        """Record the intent to launch before launching: the job is LAUNCHING and its runs (one per rank,
        each with its run folder) exist, all in one transaction."""
        attempt = job.restarts + 1
        ids = []
        with self.tx() as db:
            for rank, (p, run_dir) in enumerate(ranks):
                cur = db.execute(
                    "INSERT INTO runs(job_id, attempt, node, devices, state, run_dir, start_time, rank, world) "
                    "VALUES (?,?,?,?,?,?,?,?,?)",
                    (job.id, attempt, p.node, json.dumps(list(p.devices)), RunState.LAUNCHING.value, run_dir, now, rank,
                     len(ranks)),
                )
                ids.append(int(cur.lastrowid or 0))
            placed = placement if placement is not None else tuple(dict.fromkeys(p for p, _ in ranks))
            self._set_job(db, job.id, {"state": JobState.LAUNCHING, "reason": EndReason.NONE.value,
                                       "placement": placed})
            where = "; ".join(f"{p.node}: {p.explanation}" if p.explanation else p.node for p in placed)
            self._event(db, now, "placed", f"placed on {where}", job_id=job.id,
                        node=placed[0].node if placed else None,
                        data={"placement": placement_to_list(placed), "ranks": len(ranks)})
        return [r for r in (self.get_run(i) for i in ids) if r is not None]

    def resize_in_place(self, job_id: int, placement: tuple[Placement, ...], now: float, event: tuple[str, str],
                        data: dict[str, Any]) -> Job:
        """An elastic job resized without a restart (hsched.controller.resizing): its placement and its live runs'
        devices on each node become the new ones, with its `grow`/`shrink` event, in one transaction."""
        with self.tx() as db:
            self._set_job(db, job_id, {"placement": placement})
            live = [s.value for s in RunState if s.is_live()]
            marks = ",".join("?" * len(live))
            for p in placement:
                db.execute(f"UPDATE runs SET devices = ? WHERE job_id = ? AND node = ? AND state IN ({marks})",
                           (json.dumps(list(p.devices)), job_id, p.node, *live))
            self._event(db, now, event[0], event[1], job_id=job_id, node=placement[0].node if placement else None,
                        data=data)
        job = self.get_job(job_id)
        assert job is not None
        return job

    def start_run(self, job: Job, placement: Placement, run_dir: str, now: float) -> Run:
        return self.start_runs(job, [(placement, run_dir)], now)[0]

    def run_launched(self, run: Run, handle: RunHandle, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE runs SET state = ?, handle = ? WHERE id = ?",
                       (RunState.RUNNING.value, json.dumps(handle_to_dict(handle)), run.id))
            job = db.execute("SELECT start_time, state FROM jobs WHERE id = ?", (run.job_id,)).fetchone()
            waiting = db.execute("SELECT COUNT(*) FROM runs WHERE job_id = ? AND attempt = ? AND state = ?",
                                 (run.job_id, run.attempt, RunState.LAUNCHING.value)).fetchone()[0]
            fields: dict[str, Any] = {}
            if job["state"] == JobState.LAUNCHING.value and waiting == 0:
                fields["state"] = JobState.RUNNING
            if job["start_time"] is None:
                # the job started when its first run did (placed, its GPUs held: sacct's Start), the run's own
                # start on the controller's clock; not when the launch's reply came back, which for a short job
                # can be after the node's record of its end (an end before the start in `hsched acct`)
                fields["start_time"] = run.start_time if run.start_time is not None else now
            self._set_job(db, run.job_id, fields)
            rank = f" rank {run.rank}" if run.world > 1 else ""
            self._event(db, now, "started", f"run {run.attempt}{rank} started on {run.node} (pid {handle.pid})",
                        job_id=run.job_id, node=run.node)

    def end_run(self, run: Run, now: float, *, run_state: RunState, exit_code: int | None, reason: str,
                job_fields: dict[str, Any] | None, event: tuple[str, str] | None,
                event_data: dict[str, Any] | None = None, ended_at: float | None = None) -> None:
        """A run ended: record it, and (for the attempt's last run) the job's next state, together. `ended_at`:
        when it ended by the node's exit record (the run's end time); `now`: when the controller learnt it."""
        with self.tx() as db:
            db.execute("UPDATE runs SET state = ?, end_time = ?, exit_code = ?, reason = ? WHERE id = ?",
                       (run_state, now if ended_at is None else ended_at, exit_code, reason, run.id))
            if job_fields:
                self._set_job(db, run.job_id, job_fields)
            if event:
                data = {"exit_code": exit_code, "run": run.attempt, "rank": run.rank, **(event_data or {})}
                self._event(db, now, event[0], event[1], job_id=run.job_id, node=run.node, data=data)

    def attempt_runs(self, job_id: int, attempt: int) -> list[Run]:
        return [_run(r) for r in self.db.execute(
            "SELECT * FROM runs WHERE job_id = ? AND attempt = ? ORDER BY rank, id", (job_id, attempt))]

    def set_run_state(self, run_id: int, state: RunState) -> None:
        with self.tx() as db:
            db.execute("UPDATE runs SET state = ? WHERE id = ?", (state, run_id))

    def last_nodes(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The node of each job's latest run (where its checkpoint was last written)."""
        if not job_ids:
            return {}
        marks = ",".join("?" * len(job_ids))
        rows = self.db.execute(
            f"SELECT job_id, node FROM runs WHERE id IN (SELECT MAX(id) FROM runs WHERE job_id IN ({marks}) "
            "GROUP BY job_id)", list(job_ids)).fetchall()
        return {r["job_id"]: r["node"] for r in rows}

    def fencing_runs(self, node: str) -> list[Run]:
        """Runs given up for lost on `node` that must be killed there when it answers again."""
        return [_run(r) for r in self.db.execute(
            "SELECT * FROM runs WHERE node = ? AND state = ? ORDER BY id", (node, RunState.FENCING.value))]

    def get_run(self, run_id: int) -> Run | None:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _run(row) if row else None

    def runs(self, job_id: int) -> list[Run]:
        return [_run(r) for r in self.db.execute("SELECT * FROM runs WHERE job_id = ? ORDER BY id", (job_id,))]

    def window_jobs(self, since: float | None, until: float | None) -> list[Job]:
        """Jobs submitted before `until` that had not ended before `since` (accounting's window)."""
        sql, args = "SELECT * FROM jobs WHERE 1=1", []
        if until is not None:
            sql += " AND submit_time <= ?"
            args.append(until)
        if since is not None:
            sql += " AND (end_time IS NULL OR end_time >= ?)"
            args.append(since)
        return [job_from_row(r) for r in self.db.execute(sql + " ORDER BY id", args).fetchall()]

    def runs_of(self, job_ids: Sequence[int]) -> dict[int, list[Run]]:
        out: dict[int, list[Run]] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), 500):  # SQLite's limit on parameters
            chunk = ids[i:i + 500]
            rows = self.db.execute(f"SELECT * FROM runs WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY id",
                                   chunk).fetchall()
            for r in rows:
                out.setdefault(r["job_id"], []).append(_run(r))
        return out

    def save_run_usage(self, rows: Sequence[tuple[int, int, str, dict[str, Any]]]) -> None:
        """Keep the usage tallies (job id, attempt, node, tally as a dict) of attempts that are over."""
        with self.tx() as db:
            db.executemany("INSERT OR REPLACE INTO run_usage(job_id, attempt, node, body) VALUES (?,?,?,?)",
                           [(j, a, n, json.dumps(body)) for j, a, n, body in rows])

    def run_usage(self, job_id: int) -> list[dict[str, Any]]:
        """Job `job_id`'s kept usage tallies, by attempt and node."""
        return [json.loads(r[0]) for r in self.db.execute(
            "SELECT body FROM run_usage WHERE job_id = ? ORDER BY attempt, node", (job_id,))]

    def learn_kind_rate(self, kind: str, gpu_type: str, gpus: int, klass: str, steps_per_s: float,
                        now: float) -> KindRate:
        """One more run of `kind` measured at `steps_per_s`: the kind's moving average, updated and returned."""
        from hsched.learn.kinds import KindRate, PlacementClass, averaged

        with self.tx() as db:
            row = db.execute("SELECT steps_per_s, runs FROM kind_rates WHERE kind = ? AND gpu_type = ? AND gpus = ? "
                             "AND class = ?", (kind, gpu_type, gpus, klass)).fetchone()
            old, runs = (float(row[0]), int(row[1])) if row else (None, 0)
            rate = averaged(old, runs, steps_per_s)
            db.execute("INSERT OR REPLACE INTO kind_rates(kind, gpu_type, gpus, class, steps_per_s, runs, updated) "
                       "VALUES (?,?,?,?,?,?,?)", (kind, gpu_type, gpus, klass, rate, runs + 1, now))
        return KindRate(kind, gpu_type, gpus, PlacementClass(klass), rate, runs + 1, now)

    def kind_rates(self) -> list[KindRate]:
        from hsched.learn.kinds import KindRate, PlacementClass

        return [KindRate(r[0], r[1], int(r[2]), PlacementClass(r[3]), float(r[4]), int(r[5]), float(r[6]))
                for r in self.db.execute("SELECT kind, gpu_type, gpus, class, steps_per_s, runs, updated "
                                         "FROM kind_rates ORDER BY kind, gpu_type, gpus, class")]

    def save_run_progress(self, job_id: int, attempt: int, body: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO run_progress(job_id, attempt, body) VALUES (?,?,?)",
                       (job_id, attempt, json.dumps(body)))

    def run_progress(self, job_id: int) -> list[dict[str, Any]]:
        """Job `job_id`'s kept progress, one dict per attempt."""
        return [json.loads(r[0]) for r in self.db.execute(
            "SELECT body FROM run_progress WHERE job_id = ? ORDER BY attempt", (job_id,))]

    def add_job_duration(self, job_id: int, kind: str, user: str, duration_s: float, ended: float,
                         predicted_s: float | None, gpu_peak_mib: int | None = None,
                         host_peak_mib: int | None = None) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO job_durations(job_id, kind, user, duration_s, ended, predicted_s, "
                       "gpu_peak_mib, host_peak_mib) VALUES (?,?,?,?,?,?,?,?)",
                       (job_id, kind, user, duration_s, ended, predicted_s, gpu_peak_mib, host_peak_mib))

    def checkpointers(self, checkpoint_exit_code: int) -> dict[int, float | None]:
        """The jobs not ended yet that proved they checkpoint: a run of theirs was preempted or checkpointed and
        exited with the checkpoint code. Job id -> the longest its GPUs took to free after a preemption's decision
        (None: never measured), for what a move costs it (hsched.controller.moves)."""
        rows = self.db.execute(
            "SELECT DISTINCT r.job_id FROM runs r JOIN jobs j ON j.id = r.job_id WHERE r.exit_code = ? "
            "AND r.state IN (?, ?) AND j.end_time IS NULL",
            (checkpoint_exit_code, RunState.PREEMPTED.value, RunState.CHECKPOINTED.value)).fetchall()
        ids = [int(r[0]) for r in rows]
        out: dict[int, float | None] = dict.fromkeys(ids)
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            marks = ",".join("?" * len(part))
            for r in self.db.execute(
                    f"SELECT job_id, MAX(json_extract(data, '$.time_to_free_s')) FROM events WHERE kind = 'preempted' "
                    f"AND job_id IN ({marks}) GROUP BY job_id", part):
                out[int(r[0])] = float(r[1]) if r[1] is not None else None
        return out

    def attained(self, job_ids: Sequence[int]) -> dict[int, float]:
        """Seconds each job's ended attempts ran (rank 0's runs, start to end): its service before the attempt
        under way, for the least-attained-service rule."""
        out: dict[int, float] = {}
        ids = list(job_ids)
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            marks = ",".join("?" * len(part))
            for r in self.db.execute(
                    f"SELECT job_id, SUM(MAX(0, end_time - start_time)) FROM runs WHERE job_id IN ({marks}) "
                    "AND rank = 0 AND start_time IS NOT NULL AND end_time IS NOT NULL GROUP BY job_id", part):
                out[int(r[0])] = float(r[1] or 0.0)
        return out

    def memory_peaks(self, kind: str, limit: int = 10) -> list[tuple[int | None, int | None]]:
        """(GPU memory peak, host memory peak) in MiB of the kind's last completed jobs that were measured."""
        rows = self.db.execute("SELECT gpu_peak_mib, host_peak_mib FROM job_durations WHERE kind = ? AND "
                               "(gpu_peak_mib IS NOT NULL OR host_peak_mib IS NOT NULL) ORDER BY ended DESC LIMIT ?",
                               (kind, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def durations(self, kind: str, limit: int = 200) -> list[tuple[str, float]]:
        """(user, running time) of the kind's last completed jobs, oldest first."""
        rows = self.db.execute("SELECT user, duration_s FROM job_durations WHERE kind = ? ORDER BY ended DESC "
                               "LIMIT ?", (kind, limit)).fetchall()
        return [(str(r[0]), float(r[1])) for r in reversed(rows)]

    def compact(self, before: float) -> tuple[int, int]:
        """Forget the detail of what ended before `before`: the events of jobs that ended then and the
        controller's and nodes' own events from then, and the monitoring tallies and progress of those jobs'
        attempts. Jobs and runs stay (accounting, `hsched acct`, fair share read them). Returns (events, tallies
        and progress rows) removed.

        Events are append-only (triggers refuse an update or a delete); compaction is the one deliberate
        exception: its transaction lifts the delete trigger, deletes, and puts the trigger back, so that no other
        statement can ever delete one."""
        ended = "SELECT id FROM jobs WHERE end_time IS NOT NULL AND end_time < ?"
        with self.tx() as db:
            db.execute("DROP TRIGGER events_no_delete")
            gone = db.execute(f"DELETE FROM events WHERE time < ? AND (job_id IS NULL OR job_id IN ({ended}))",
                              (before, before)).rowcount
            db.execute("CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
                       "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END")
            rows = db.execute(f"DELETE FROM run_usage WHERE job_id IN ({ended})", (before,)).rowcount
            rows += db.execute(f"DELETE FROM run_progress WHERE job_id IN ({ended})", (before,)).rowcount
        return gone, rows

    def prediction_errors(self) -> dict[str, tuple[int, int, float | None]]:
        """Per kind: (completed jobs, jobs that had a prediction, their mean absolute error relative to the
        duration)."""
        out: dict[str, tuple[int, int, float | None]] = {}
        for r in self.db.execute(
                "SELECT kind, COUNT(*), COUNT(predicted_s), AVG(CASE WHEN predicted_s IS NOT NULL AND duration_s > 0 "
                "THEN ABS(predicted_s - duration_s) / duration_s END) FROM job_durations GROUP BY kind"):
            out[str(r[0])] = (int(r[1]), int(r[2]), float(r[3]) if r[3] is not None else None)
        return out

    # ---------------------------------------------------------------------------------------------- datasets

    def data_places(self) -> list[DataPlace]:
        rows = self.db.execute("SELECT * FROM data_places ORDER BY dataset, node").fetchall()
        return [DataPlace(dataset=r["dataset"], node=r["node"], path=r["path"], origin=PlaceOrigin(r["origin"]),
                          state=PlaceState(r["state"]), bytes=r["bytes"], done_bytes=r["done_bytes"],
                          source=r["source"], updated=r["updated"], last_used=r["last_used"], message=r["message"])
                for r in rows]

    def set_data_place(self, place: DataPlace, *, event: tuple[str, str, dict[str, Any] | None] | None = None,
                       job_id: int | None = None) -> None:
        """Record where a dataset is (or is being copied to), with its event in the same transaction."""
        with self.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO data_places(dataset, node, path, origin, state, bytes, done_bytes, source, "
                "updated, last_used, message) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (place.dataset, place.node, place.path, place.origin.value, place.state.value, place.bytes,
                 place.done_bytes, place.source, place.updated, place.last_used, place.message))
            if event is not None:
                kind, message, data = event
                self._event(db, place.updated, kind, message, job_id=job_id, node=place.node, data=data)

    def drop_data_place(self, dataset: str, node: str, now: float, *,
                        event: tuple[str, str, dict[str, Any] | None] | None = None) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM data_places WHERE dataset = ? AND node = ?", (dataset, node))
            if event is not None:
                kind, message, data = event
                self._event(db, now, kind, message, node=node, data=data)

    def link_speeds(self) -> dict[tuple[str, str], float]:
        rows = self.db.execute("SELECT src, dst, bytes_per_s FROM link_speeds").fetchall()
        return {(r["src"], r["dst"]): float(r["bytes_per_s"]) for r in rows}

    def learn_link(self, src: str, dst: str, bytes_per_s: float, now: float) -> float:
        """Fold one copy's measured speed into the pair's (an average weighing the last copy half, as links
        change); returns the new figure."""
        with self.tx() as db:
            row = db.execute("SELECT bytes_per_s, samples FROM link_speeds WHERE src = ? AND dst = ?",
                             (src, dst)).fetchone()
            value = bytes_per_s if row is None else 0.5 * float(row["bytes_per_s"]) + 0.5 * bytes_per_s
            db.execute("INSERT OR REPLACE INTO link_speeds(src, dst, bytes_per_s, samples, updated) "
                       "VALUES (?,?,?,?,?)", (src, dst, value, 1 if row is None else row["samples"] + 1, now))
        return value

    def live_runs(self) -> list[Run]:
        return [_run(r) for r in self.live_run_rows()]

    def live_run_rows(self) -> list[sqlite3.Row]:
        """The live runs' rows, by id, undecoded (`run_from_row`): `LiveRuns` decodes only the rows that changed."""
        marks = ",".join("?" * len(_LIVE))
        return self.db.execute(f"SELECT * FROM runs WHERE state IN ({marks}) ORDER BY id", _LIVE).fetchall()

    def run_rows_by_id(self, ids: Sequence[int], *, live_only: bool = False) -> list[sqlite3.Row]:
        """Raw rows of these runs (those that exist; `live_only`: those live), by id: what `LiveRuns` reads again
        after writes."""
        out: list[sqlite3.Row] = []
        live = f" AND state IN ({','.join('?' * len(_LIVE))})" if live_only else ""
        for k in range(0, len(ids), 500):
            part = list(ids[k:k + 500])
            out += self.db.execute(f"SELECT * FROM runs WHERE id IN ({','.join('?' * len(part))}){live}",
                                   [*part, *(_LIVE if live_only else ())]).fetchall()
        return sorted(out, key=lambda r: r["id"])

    def runs_changed(self, reader: str) -> set[int] | None:
        """The ids of the runs written (inserted, updated, deleted) on this connection since `reader` last asked;
        None at its first ask (it reads what it keeps whole). A TEMP table's notes, on this connection only (every
        write of the controller's goes through it), each with a growing number (`seq`): a reader keeps the last it
        read, so asking writes nothing but the occasional trim of the notes every reader has read."""
        if not self._run_notes:
            for statement in _RUNS_CHANGED:
                self.db.execute(statement)
        last = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM temp.hsched_changed_runs").fetchone()[0]
        seen = self._run_notes.get(reader)
        self._run_notes[reader] = last
        if seen is None:
            return None
        ids = {i for (i,) in self.db.execute("SELECT id FROM temp.hsched_changed_runs WHERE seq > ?", (seen,))}
        if last - self._notes_trimmed >= _TRIM_NOTES:
            oldest = min(self._run_notes.values())
            self.db.execute("DELETE FROM temp.hsched_changed_runs WHERE seq < ?", (oldest,))  # (the last one kept)
            self._notes_trimmed = oldest
        return ids

    # -------------------------------------------------------------------------------------- fair share

    def user_usage(self, now: float, half_life_s: float) -> dict[str, Usage]:
        """GPU-seconds per user over every run, raw and decayed by age as of `now` (hsched.learn.fairshare), running
        runs up to `now`. The first call reads the whole history; later ones only runs started since and runs
        that were still going (`Ledger`), so a round pays for what changed, not for the history."""
        led = self._ledger
        if led is None or led.half_life_s != half_life_s:
            led = Ledger(half_life_s)
        self._ledger, usage = led.advance(self._usage_rows(led.upto, led.open), now)
        return usage

    def typical_run_s(self) -> float:
        """How long runs typically hold their GPUs, as of the last `user_usage` (`Ledger.typical_run_s`)."""
        return self._ledger.typical_run_s if self._ledger is not None else 0.0

    def _usage_rows(self, after_id: int, also: frozenset[int]) -> list[RunUsage]:
        # a run's GPUs: its devices (a JSON list of UUIDs, which hold no comma: counted in SQL, where a whole
        # history costs a fraction of decoding it); ranks of one attempt on one node (--tasks-per-node) share
        # that node's devices, so each holds its part
        sql = ("SELECT r.id, r.start_time, r.end_time, j.user, "
               "CASE WHEN r.devices = '[]' THEN 0 "
               "ELSE length(r.devices) - length(replace(r.devices, ',', '')) + 1 END AS gpus, "
               "CASE WHEN r.world > 1 THEN (SELECT COUNT(*) FROM runs p WHERE p.job_id = r.job_id "
               "AND p.attempt = r.attempt AND p.node = r.node) ELSE 1 END AS peers, r.world "
               "FROM runs r JOIN jobs j ON j.id = r.job_id WHERE ")
        rows = self.db.execute(sql + "r.id > ? ORDER BY r.id", (after_id,)).fetchall()
        ids = sorted(i for i in also if i <= after_id)
        # the running runs read before and not written since are as they were (issue 33: reading 512 of them again
        # was ~1.8 ms a round): only a run of one rank per node, whose share of its node's devices no other run's
        # row changes
        kept = self._open_usage
        changed = self.runs_changed("usage")
        if changed is None:
            kept.clear()
        else:
            for i in changed:
                kept.pop(i, None)
        need = [i for i in ids if i not in kept]
        fresh = len(rows)  # (the new runs' rows; those of the running ones asked again follow)
        for k in range(0, len(need), 500):  # SQLite's limit on parameters
            chunk = need[k:k + 500]
            rows += self.db.execute(sql + f"r.id IN ({','.join('?' * len(chunk))}) ORDER BY r.id", chunk).fetchall()
        got = [RunUsage(i, user, gpus / peers if peers > 1 else gpus, start, end)
               for i, start, end, user, gpus, peers, _world in rows]
        for ru, row in zip(got, rows, strict=True):
            if ru.end is None and row["world"] <= 1:
                kept[ru.id] = ru
        if len(need) == len(ids):
            return got
        # (in the order a whole read gives: the new runs by id, then the running ones by id)
        out, fetched = got[:fresh], {ru.id: ru for ru in got[fresh:]}
        for i in ids:
            hit = fetched.get(i) or kept.get(i)
            if hit is not None:
                out.append(hit)
        return out

    def job_users(self) -> list[str]:
        """Users with a job that has not ended (pending or holding devices)."""
        states = [s.value for s in JobState if not s.is_terminal()]
        return [r[0] for r in self.db.execute(
            f"SELECT DISTINCT user FROM jobs WHERE state IN ({','.join('?' * len(states))}) ORDER BY user", states)]

    # ------------------------------------------------------------------------------------------- nodes

    # ------------------------------------------------------------------------------------- dirty GPUs

    def dirty_devices(self) -> dict[str, tuple[str, tuple[int, ...], str]]:
        """GPU UUID -> (node, pids, message): GPUs a process outside any live run still used when a run on
        them ended. They are handed out again only once clean (as Slurm drains a node on an unkillable step)."""
        rows = self.db.execute("SELECT uuid, node, pids, message FROM dirty_devices").fetchall()
        return {r["uuid"]: (r["node"], tuple(json.loads(r["pids"])), r["message"]) for r in rows}

    def mark_dirty(self, node: str, uuid: str, pids: Sequence[int], message: str, now: float,
                   job_id: int | None = None) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO dirty_devices(uuid, node, pids, since, message) VALUES (?,?,?,?,?)",
                       (uuid, node, json.dumps(list(pids)), now, message))
            self._event(db, now, "gpu_dirty", message, job_id=job_id, node=node,
                        data={"uuid": uuid, "pids": list(pids)})

    def clear_dirty(self, uuid: str, message: str, now: float) -> None:
        with self.tx() as db:
            row = db.execute("SELECT node FROM dirty_devices WHERE uuid = ?", (uuid,)).fetchone()
            if row is None:
                return
            db.execute("DELETE FROM dirty_devices WHERE uuid = ?", (uuid,))
            self._event(db, now, "gpu_clean", message, node=row["node"], data={"uuid": uuid})

    def node_admin(self) -> dict[str, tuple[NodeState, str]]:
        return {r["name"]: (NodeState(r["admin_state"]), r["admin_reason"])
                for r in self.db.execute("SELECT * FROM nodes")}

    def set_node_admin(self, name: str, state: NodeState, reason: str, now: float) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO nodes(name, admin_state, admin_reason) VALUES (?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET admin_state = excluded.admin_state, "
                "admin_reason = excluded.admin_reason",
                (name, state.value, reason),
            )
            self._event(db, now, "node", f"{name} {state.value.lower()}" + (f": {reason}" if reason else ""),
                        node=name)


    # ---------------------------------------------------------------------------------------- services

    def add_service(self, spec: ServiceSpec, user: str, now: float, environ: dict[str, str] | None = None
                    ) -> ServiceRecord:
        """Record a new service (ACTIVE, wanting MIN replicas, at least one) with its event; a UserError when one of
        that name is not stopped. A stopped one of the name is replaced (its events stay)."""
        with self.tx() as db:
            row = db.execute("SELECT state, user FROM services WHERE name = ?", (spec.name,)).fetchone()
            if row is not None and row["state"] != ServiceState.STOPPED.value:
                raise UserError(f"a service named {spec.name} already runs ({row['user']}'s); `hsched serve stop "
                                f"{spec.name}` it first or choose another name")
            wanted = max(1, spec.min_replicas)
            db.execute("INSERT OR REPLACE INTO services(name, user, body, state, wanted, created, updated) "
                       "VALUES (?,?,?,?,?,?,?)", (spec.name, user, json.dumps({**service_to_dict(spec),
                                                                                "environ": environ}),
                                                  ServiceState.ACTIVE.value, wanted, now, now))
            self._event(db, now, "service", f"service {spec.name} started by {user}: {spec.min_replicas}-"
                        f"{spec.max_replicas} replicas, p99 target {spec.slo_p99_s * 1000:g} ms",
                        data={"service": spec.name})
        return ServiceRecord(spec, user, ServiceState.ACTIVE, wanted, now, now)

    def services(self, *, stopped: bool = False) -> list[ServiceRecord]:
        """The services (those stopped too with `stopped`), by name."""
        rows = self.db.execute("SELECT * FROM services ORDER BY name").fetchall()
        return [_service(r) for r in rows if stopped or r["state"] != ServiceState.STOPPED.value]

    def get_service(self, name: str) -> ServiceRecord | None:
        row = self.db.execute("SELECT * FROM services WHERE name = ?", (name,)).fetchone()
        return _service(row) if row is not None else None

    def set_service(self, name: str, now: float, *, state: ServiceState | None = None, wanted: int | None = None,
                    spec: ServiceSpec | None = None, event: tuple[str, str, dict[str, Any] | None] | None = None
                    ) -> ServiceRecord:
        """Change a service's state, wanted count or spec, with its event (kind, message, figures) in the same
        transaction."""
        with self.tx() as db:
            fields: dict[str, Any] = {"updated": now}
            if state is not None:
                fields["state"] = state.value
            if wanted is not None:
                fields["wanted"] = wanted
            if spec is not None:
                old = db.execute("SELECT body FROM services WHERE name = ?", (name,)).fetchone()
                environ = json.loads(old["body"]).get("environ") if old is not None else None
                fields["body"] = json.dumps({**service_to_dict(spec), "environ": environ})
            cols = ", ".join(f"{k} = ?" for k in fields)
            db.execute(f"UPDATE services SET {cols} WHERE name = ?", (*fields.values(), name))
            if event is not None:
                kind, message, data = event
                self._event(db, now, kind, message, data={"service": name, **(data or {})})
            row = db.execute("SELECT * FROM services WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UserError(f"no service {name}; `hsched serve list` lists them")
        return _service(row)

    def service_environ(self, name: str) -> dict[str, str] | None:
        """The environment `serve start` was run in: its replicas run in it, as a job runs in its submitter's."""
        row = self.db.execute("SELECT body FROM services WHERE name = ?", (name,)).fetchone()
        env = json.loads(row["body"]).get("environ") if row is not None else None
        return dict(env) if isinstance(env, dict) else None

    def service_events(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """The service's last `limit` events (scaling, replicas ready or replaced), oldest first."""
        rows = self.db.execute(
            "SELECT * FROM events WHERE kind LIKE 'service%' AND json_extract(data, '$.service') = ? "
            "ORDER BY id DESC LIMIT ?", (name, limit)).fetchall()
        return [{"id": r["id"], "time": r["time"], "job_id": r["job_id"], "kind": r["kind"], "message": r["message"],
                 "data": json.loads(r["data"]) if r["data"] else None} for r in rows[::-1]]


def _service(row: sqlite3.Row) -> ServiceRecord:
    return ServiceRecord(spec=service_from_dict(json.loads(row["body"])), user=row["user"],
                         state=ServiceState(row["state"]), wanted=row["wanted"], created=row["created"],
                         updated=row["updated"])


def job_from_row(row: sqlite3.Row, spec: JobSpec | None = None) -> Job:
    """The row's Job; `spec`: the row's spec, decoded already (a job cache's, from the same JSON)."""
    return Job(
        id=row["id"],
        spec=spec if spec is not None else spec_from_dict(json.loads(row["spec"])),
        user=row["user"],
        state=JobState(row["state"]),
        reason=row["reason"],
        submit_time=row["submit_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        exit_code=row["exit_code"],
        restarts=row["restarts"],
        placement=placement_from_list(json.loads(row["placement"])),
        failures=row["failures"],
        checkpoints=row["checkpoints"],
        begin_time=row["begin_time"],
        array_id=row["array_id"],
        array_task=row["array_task"],
    )


def run_from_row(row: sqlite3.Row) -> Run:
    return _run(row)


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row["id"],
        job_id=row["job_id"],
        attempt=row["attempt"],
        node=row["node"],
        devices=tuple(json.loads(row["devices"])),
        state=RunState(row["state"]),
        run_dir=row["run_dir"],
        handle=handle_from_dict(json.loads(row["handle"])) if row["handle"] else None,
        start_time=row["start_time"],
        end_time=row["end_time"],
        exit_code=row["exit_code"],
        reason=row["reason"],
        rank=row["rank"],
        world=row["world"],
    )
