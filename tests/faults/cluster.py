"""The fault matrix's harness: sshd test hosts that can be rebooted, a real controller driven as a user drives it,
and a record of what the test did (for the history invariants and for replayable reports).

    with FaultHosts(tmp / "hosts", 3) as hosts, Cluster(tmp / "lab", hosts=hosts, settings={...}) as lab:
        lab.start()                                  # a controller process for lab's HSCHED_HOME
        jid = lab.submit(["sleep", "5"], gpus=1)     # acknowledged: recorded in lab.record
        lab.kill()                                   # SIGKILL, as the kernel's OOM killer or a power cut would
        hosts.reboot(hosts[0]); hosts[0].restore()   # all its processes die; it returns with a new boot id
        lab.quiesce(); lab.check()                   # every invariant of tests/faults/invariants.py

Controllers are real `hsched.controller.server` processes. They are forked from a zygote: a process that has
imported hsched (and asyncssh) once, so that a test killing the controller 200 times pays for 200 kills and
restarts, not for 200 Python imports. The child runs `hsched.controller.server.main` exactly as `hsched daemon
start` does (own session, stdin/stdout on /dev/null, stderr to HSCHED_HOME/controller.stderr, cwd /).

Boot ids: a test host's sshd runs in a mount namespace of its own in which a file of the host's folder is
bind-mounted over /proc/sys/kernel/random/boot_id, so the node helper on that host (and each run's handle) reads
the host's boot id. hsched.node.records.boot_id() has no override of its own (no environment variable); this is how a
reboot is simulated without one. It needs root (as network namespaces do); elsewhere `can_reboot` is False.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import tests.e2e.ssh.hosts as _hostsmod
from tests.conftest import SAFETY_S, process_gone, wait_until
from tests.e2e.ssh.hosts import TestHost, TestHosts

T = TypeVar("T")

RUN_MARKER = "HSCHED_RUN_DIR"
BOOT_ID = "/proc/sys/kernel/random/boot_id"

_SSHD_WRAPPER = """#!/bin/sh
# Started as `sshd -D -e -f CONF` by tests/e2e/ssh/hosts.py. Runs the real sshd in a mount namespace of its own
# where CONF's folder/boot_id stands for the kernel's boot id, and with CONF's folder/setenv (if any) added to
# sshd's SetEnv line (sshd honours only its first SetEnv line).
for a; do conf=$a; done
dir=$(dirname "$conf")
[ -s "$dir/boot_id" ] || cat /proc/sys/kernel/random/uuid > "$dir/boot_id"
if [ -s "$dir/setenv" ]; then
  extra=$(cat "$dir/setenv")
  sed -i "s|^SetEnv .*|& $extra|" "$conf"
fi
exec unshare -m --propagation private sh -c \
  'mount --bind "$1/boot_id" {boot_id} && shift && exec "$0" "$@"' "{sshd}" "$dir" "$@"
"""


def boot_override_available() -> bool:
    """Root, unshare(1) and a kernel that lets a private mount namespace bind a file over the boot id."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not Path(BOOT_ID).exists():
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"echo x > /tmp/.hsched-bootprobe.$$ && mount --bind /tmp/.hsched-bootprobe.$$ {BOOT_ID} && "
         f"cat {BOOT_ID}; rm -f /tmp/.hsched-bootprobe.$$"], capture_output=True, text=True, timeout=30)
    return probe.returncode == 0 and probe.stdout.strip() == "x"


class FaultHosts(TestHosts):
    """TestHosts that can be rebooted (a new boot id; every process of the host killed; its disk kept), whose
    sessions have a HOME of their own (HOST_DIR/home: no login script of this machine runs there), and may get
    extra environment (`setenv={1: "PATH=/stub:/usr/bin:/bin"}`: host1's sshd sets it)."""

    __test__ = False

    def __init__(self, base: Path, count: int = 3, *, setenv: dict[int, str] | None = None, **kwargs: Any) -> None:
        super().__init__(base, count, **kwargs)
        self.setenv = dict(setenv or {})
        self.can_reboot = self.use_netns and boot_override_available()
        self.reboots = 0

    def start(self) -> None:
        if not self.can_reboot:
            if self.setenv:
                raise RuntimeError("per-host environment needs root (the sshd wrapper's mount namespace)")
            super().start()
            return
        self.base.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            d = self.base / f"{self.prefix}{i}"
            (d / "home").mkdir(parents=True, exist_ok=True)
            # a home of its own, as a real host has: no login script of this machine's runs in its sessions (this
            # machine's ~/.bashrc may run `pyenv rehash`, whose lock a reboot or a teardown can leave behind, and
            # then every login here waits a minute for it)
            (d / "setenv").write_text(" ".join([f"HOME={d / 'home'}", *([self.setenv[i]] if i in self.setenv else [])]))
        wrapper = self.base / "sshd-wrapper"
        wrapper.write_text(_SSHD_WRAPPER.replace("{boot_id}", BOOT_ID).replace("{sshd}", _hostsmod.SSHD))
        wrapper.chmod(0o755)
        real = _hostsmod.SSHD
        _hostsmod.SSHD = str(wrapper)  # read by TestHosts._start_host when it builds the sshd command
        try:
            super().start()
        finally:
            _hostsmod.SSHD = real

    def host(self, name: str) -> TestHost:
        return next(h for h in self.hosts if h.name == name)

    def boot_id(self, h: TestHost) -> str | None:
        f = h.dir / "boot_id"
        return f.read_text().strip() if self.can_reboot and f.exists() else None

    def is_cut(self, h: TestHost) -> bool:
        if h.veth:
            out = subprocess.run(["ip", "link", "show", h.veth], capture_output=True, text=True).stdout
            return "state DOWN" in out or ",UP" not in out.split(">")[0]
        return bool(h.frozen)

    def pids(self, h: TestHost) -> list[int]:
        """Every process of the host but its listening sshd (its sessions, helpers, runs)."""
        if not h.netns:
            return []
        out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout
        keep = h.proc.pid if h.proc is not None else -1
        return [int(p) for p in out.split() if p.isdigit() and int(p) != keep]

    def crash(self, h: TestHost) -> None:
        """Power off: cut off the network, kill every process of the host. Its disk stays."""
        if not self.can_reboot:
            raise RuntimeError("reboots need root (a mount namespace per host for its boot id)")
        if not self.is_cut(h):
            h.cut()
        pids = self.pids(h)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: all(process_gone(p) for p in pids), f"the processes of {h.name} to die")
        self.reboots += 1
        # the same inode (the bind mount follows it): truncate and write in place, never rename
        with open(h.dir / "boot_id", "r+") as f:
            f.truncate(0)
            f.write(str(uuid.uuid4()) + "\n")

    def reboot(self, h: TestHost) -> None:
        """Crash, then come back with a new boot id."""
        self.crash(h)
        h.restore()


def wait_for(cond: Callable[[], T], what: str, limit_s: float = SAFETY_S, every_s: float = 0.05) -> T:
    """tests.conftest.wait_until, polling a little faster (fault scenarios watch short-lived states)."""
    return wait_until(cond, what, limit_s, every_s)


# ---------------------------------------------------------------------------------------------- processes


@dataclasses.dataclass(frozen=True)
class MarkedProc:
    pid: int
    run_dir: str
    """HSCHED_RUN_DIR of the process: the run folder on its node."""
    comm: str
    cuda: str | None
    """CUDA_VISIBLE_DEVICES of the process."""

    @property
    def run_name(self) -> str:
        """The run folder's name: the same on the node as in the store (`<job>-<attempt>-r<rank>-<ms>`)."""
        return self.run_dir.rstrip("/").rsplit("/", 1)[-1]


def marked_processes(roots: Sequence[Path]) -> list[MarkedProc]:
    """Live processes (not zombies) carrying a run marker under one of `roots` (run folders of nodes)."""
    prefixes = [str(r).rstrip("/") + "/" for r in roots]
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if b"HSCHED_RUN_DIR=" not in env:
            continue
        if stat[stat.rfind(")") + 2:].split()[0] == "Z":
            continue
        items = dict(i.split(b"=", 1) for i in env.split(b"\0") if b"=" in i)
        run_dir = items.get(RUN_MARKER.encode(), b"").decode("utf-8", "replace")
        if not any(run_dir.startswith(p) for p in prefixes):
            continue
        cuda = items.get(b"CUDA_VISIBLE_DEVICES")
        out.append(MarkedProc(int(name), run_dir, stat[stat.find("(") + 1:stat.rfind(")")],
                              cuda.decode() if cuda is not None else None))
    return out


# ------------------------------------------------------------------------------------------------- record


@dataclasses.dataclass
class Act:
    """One thing the test did, when it was acknowledged (or given up), and what came back."""

    t: float
    kind: str
    """submit, cancel, preempt, kill, start, cut, restore, crash, reboot, ..."""
    job: int | None = None
    ok: bool | None = None
    """Acknowledged by the controller (None: not a request)."""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


class Record:
    """What the test did and what it saw: acknowledged requests and the job states observed over time."""

    def __init__(self) -> None:
        self.acts: list[Act] = []
        self.first_terminal: dict[int, tuple[str, float]] = {}
        """job -> (its first terminal state observed, when)."""
        self.first_terminal_events: dict[int, tuple[str, float, int]] = {}
        """job -> (its first terminal state observed, when, the newest event id of that read)."""
        self.changed_after_terminal: list[tuple[int, str]] = []
        self.sampled: list[tuple[int, str]] = []
        """(job, what): two attempts of a job seen alive at once in a process sample (invariants.sample_copies)."""
        self._lock = threading.Lock()

    def add(self, kind: str, job: int | None = None, ok: bool | None = None, **detail: Any) -> Act:
        act = Act(time.time(), kind, job, ok, detail)
        with self._lock:
            self.acts.append(act)
        return act

    def observe(self, states: dict[int, str], at: float, max_event: int = 0) -> None:
        """Job states read at `at` (with events up to `max_event`): a terminal state seen once must be seen ever
        after."""
        with self._lock:
            for jid, state in states.items():
                seen = self.first_terminal.get(jid)
                if seen is None:
                    if state in TERMINAL:
                        self.first_terminal[jid] = (state, at)
                        self.first_terminal_events[jid] = (state, at, max_event)
                elif state != seen[0]:
                    self.changed_after_terminal.append(
                        (jid, f"job {jid}: {seen[0]} (seen at {seen[1]:.3f}) became {state} (seen at {at:.3f})"))

    def submits(self) -> list[Act]:
        return [a for a in self.acts if a.kind == "submit"]

    def to_json(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(a) for a in self.acts]


TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "LOST"})
ACTIVE = frozenset({"LAUNCHING", "RUNNING", "PREEMPTING", "COMPLETING"})
LIVE_RUN = frozenset({"LAUNCHING", "RUNNING", "STOPPING"})


# --------------------------------------------------------------------------------------------- the store


@dataclasses.dataclass
class Store:
    """The store's rows as plain dicts (read-only, one read)."""

    jobs: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    events: list[dict[str, Any]]
    integrity: str
    read_at: float

    def job(self, jid: int) -> dict[str, Any]:
        return next(j for j in self.jobs if j["id"] == jid)

    def only(self, jobs: set[int]) -> Store:
        """The rows of these jobs alone (a history's own jobs, in a store that holds earlier histories too)."""
        return Store([j for j in self.jobs if j["id"] in jobs], [r for r in self.runs if r["job_id"] in jobs],
                     [e for e in self.events if e["job_id"] in jobs], self.integrity, self.read_at)

    def runs_of(self, jid: int) -> list[dict[str, Any]]:
        return [r for r in self.runs if r["job_id"] == jid]

    def events_of(self, jid: int, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["job_id"] == jid and (kind is None or e["kind"] == kind)]


def read_store(db: Path, *, integrity: bool = False) -> Store:
    """One consistent read of the store, never a write (a read-only SQLite connection; WAL readers never block
    the controller's writes)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    con.row_factory = sqlite3.Row
    try:
        con.execute("BEGIN")  # one snapshot for the three tables
        at = time.time()
        jobs = [dict(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
        runs = [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY id")]
        events = [dict(r) for r in con.execute("SELECT * FROM events ORDER BY id")]
        con.execute("COMMIT")
        check = "ok"
        if integrity:
            check = "; ".join(str(r[0]) for r in con.execute("PRAGMA integrity_check"))
    finally:
        con.close()
    for j in jobs:
        j["spec"] = json.loads(j["spec"])
        j["placement"] = json.loads(j["placement"])
    for r in runs:
        r["devices"] = json.loads(r["devices"])
        r["handle"] = json.loads(r["handle"]) if r["handle"] else None
    for e in events:
        e["data"] = json.loads(e["data"]) if e["data"] else None
    return Store(jobs, runs, events, check, at)


# ------------------------------------------------------------------------------------------- controllers

_ZYGOTE = r"""
import functools, json, os, signal, sys
import hsched.controller.server as server
import hsched.executors.local, hsched.executors.ssh  # noqa: F401  (what a controller imports on its way up)
home = sys.argv[1]
limits = json.loads(os.environ.pop("HSCHED_FAULTS_LIMITS", "{}"))
if limits and hasattr(server, "Limits"):  # the socket's limits, shrunk for a test ("tests shrink them")
    known = getattr(server.Limits, "__dataclass_fields__", {})
    server.Limits = functools.partial(server.Limits, **{k: v for k, v in limits.items() if k in known})
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the controllers this process forks
sys.stdout.write("ready\n")
sys.stdout.flush()
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            err = os.open(os.path.join(home, "controller.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err, 2)
            os.chdir("/")
            # the command line `hsched daemon start` gives a controller, which a self-restart (on a reinstalled
            # hsched) executes again
            sys.orig_argv = [sys.executable, "-m", "hsched.controller.server", home]
            sys.argv = ["hsched-controller", home]
            code = server.main(["hsched-controller", home])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code or 0)
    sys.stdout.write("%d\n" % pid)
    sys.stdout.flush()
"""


class Zygote:
    """Forks controllers for one HSCHED_HOME from a process that imported hsched once."""

    def __init__(self, home: Path, env: dict[str, str], limits: dict[str, Any] | None = None) -> None:
        env = {**env, "HSCHED_FAULTS_LIMITS": json.dumps(limits or {})}
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(home)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the controller zygote did not start: {line!r}")

    def fork(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("fork\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def known_settings() -> frozenset[str]:
    from hsched.config import Settings

    return frozenset(f.name for f in dataclasses.fields(Settings))


class Cluster:
    """One HSCHED_HOME with its fleet (the SSH hosts', or a fleet file's text), its controller, and a Record."""

    def __init__(self, root: Path, *, hosts: FaultHosts | None = None, fleet_text: str | None = None,
                 settings: dict[str, Any] | None = None, gpus: int = 2, limits: dict[str, Any] | None = None,
                 fail_fast: Sequence[str] = ("round failed", "health check failed")) -> None:
        from tests.conftest import Hs

        self.root = Path(root)
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.hosts = hosts
        self.marks = self.root / "marks"
        self.marks.mkdir(exist_ok=True)
        wanted = {"poll_interval_s": 0.2, "heartbeat_timeout_s": 3, "kill_after_s": 2, **(settings or {})}
        known = known_settings()
        self.unknown_settings = sorted(k for k in wanted if k not in known)
        """Settings this hsched does not know yet (left out of settings.toml: the controller refuses them)."""
        self.settings = {k: v for k, v in wanted.items() if k in known}
        (self.home / "settings.toml").write_text("".join(f"{k} = {_toml(v)}\n" for k, v in self.settings.items()))
        fleet = self.root / "fleet.toml"
        if fleet_text is not None:
            fleet.write_text(fleet_text)
        elif hosts is not None:
            hosts.fleet_toml(fleet, gpus=gpus)
        else:
            raise ValueError("a cluster needs hosts or a fleet")
        self.fleet = fleet
        self.hs = Hs(self.home, fleet=fleet)
        if hosts is not None:
            self.hs.env.update(hosts.env())
        self.db = self.home / "hsched.db"
        self.record = Record()
        self.run_roots = [self.home / "runs"] + ([h.root / "runs" for h in hosts] if hosts is not None else [])
        self._zygote: Zygote | None = None
        self.fail_fast = tuple(fail_fast)
        """Controller log lines that, repeated, mean the controller will never get where a wait waits for."""
        self.limits = limits
        """The control socket's limits for this cluster's controllers (hsched.controller.server.Limits fields)."""
        self.kills = 0
        self.starts = 0

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ controller

    def pid(self) -> int | None:
        from hsched.client import controller_pid
        from hsched.paths import Home

        return controller_pid(Home(self.home))

    def client(self) -> Any:
        from hsched.client import Client
        from hsched.paths import Home

        return Client(Home(self.home), autostart=False)

    def call(self, op: str, **args: Any) -> Any:
        """One request; a controller that does not answer within the safety net is a failure, not a hang."""
        with self.client() as c:
            c.connect().settimeout(SAFETY_S)
            return c.call(op, **args)

    def spawn(self) -> int:
        """Fork a controller (returns its pid at once; it may still be starting, or lose the lock race)."""
        if self._zygote is None or self._zygote.proc.poll() is not None:
            self._zygote = Zygote(self.home, self.hs.env, self.limits)
        self.starts += 1
        return self._zygote.fork()

    def start(self) -> int:
        """A controller that answers requests that need the fleet (its first probe and reconcile done)."""
        pid = self.pid()
        if pid is None:
            child = self.spawn()
            pid = wait_for(lambda: self.pid() or (process_gone(child) and self._failed(child)),
                           "the controller to take its lock")
        wait_for(lambda: self._answers(), "the controller to answer")
        self.record.add("start", pid=pid)
        return int(pid)

    def _failed(self, child: int) -> int | None:
        if self.pid() is not None:
            return self.pid()
        err = (self.home / "controller.stderr").read_text(errors="replace")[-2000:]
        raise AssertionError(f"the controller {child} exited before taking its lock: {err}")

    def _answers(self) -> bool:
        from hsched.errors import ControllerError

        try:
            self.call("queue")
            return True
        except ControllerError:
            return False

    def kill(self) -> int | None:
        """SIGKILL the controller (if one runs) and wait until its lock is free."""
        pid = self.pid()
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: self.pid() is None and process_gone(pid), "the killed controller to let go of its lock")
        self.kills += 1
        self.record.add("kill", pid=pid)
        return pid

    def stop(self) -> None:
        """A clean `hsched daemon stop` (jobs keep running)."""
        if self.pid() is None:
            return
        self.hs.run("daemon", "stop", check=True, timeout=120)
        wait_for(lambda: self.pid() is None, "the controller to stop")
        self.record.add("stop")

    # -------------------------------------------------------------------------------------- requests

    def submit(self, command: Sequence[str] | str, *, gpus: int = 1, qos: str | None = None, name: str | None = None,
               **table: Any) -> int:
        """Submit as the CLI does (same request); acknowledged means the reply came back with an id."""
        spec: dict[str, Any] = {"command": command if isinstance(command, str) else list(command),
                                "resources": {"gpus": gpus, **table.pop("resources", {})}}
        if qos is not None:
            spec["qos"] = qos
        if name is not None:
            spec["name"] = name
        spec.update(table)
        environ = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        environ["PWD"] = str(self.root)
        job = self.call("submit", spec=spec, user="fault", environ=environ)
        self.record.add("submit", int(job["id"]), True, name=name)
        return int(job["id"])

    def cancel(self, jid: int) -> bool:
        """True if the controller accepted the cancel; False if it said the job had already ended."""
        from hsched.errors import ControllerError

        try:
            self.call("cancel", id=jid)
        except ControllerError as e:
            if "already ended" in str(e):
                self.record.add("cancel", jid, False, error=str(e))
                return False
            raise
        self.record.add("cancel", jid, True)
        return True

    # -------------------------------------------------------------------------------------------- store

    def read(self, *, integrity: bool = False) -> Store:
        st = read_store(self.db, integrity=integrity)
        self.record.observe({j["id"]: j["state"] for j in st.jobs}, st.read_at,
                            st.events[-1]["id"] if st.events else 0)
        return st

    def job(self, jid: int) -> dict[str, Any]:
        return self.read().job(jid)

    def loop_failures(self) -> list[str]:
        """The controller log's lines that say it fails (`fail_fast`: a failed round or health check, each a
        bug)."""
        try:
            text = self.hs.home.joinpath("controller.log").read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [ln for ln in text.splitlines() if any(f in ln for f in self.fail_fast)]

    def wait(self, cond: Callable[[], T], what: str) -> T:
        """wait_for, failing at once when the controller keeps failing (a poisoned controller never
        gets there: no need to wait for the safety net)."""
        seen = len(self.loop_failures())

        def got() -> T:
            failures = self.loop_failures()
            if len(failures) >= seen + 3:
                log = self.home.joinpath("controller.log").read_text(errors="replace")
                tail = log[log.find(failures[seen]):][:3000]
                raise AssertionError(f"the controller keeps failing (its log) while waiting for {what}:\n{tail}")
            return cond()

        return wait_for(got, what)

    def wait_job(self, jid: int, cond: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        def got() -> dict[str, Any] | None:
            j = self.job(jid)
            return j if cond(j) else None

        return self.wait(got, f"job {jid}: {what}")

    def wait_state(self, jid: int, *states: str) -> dict[str, Any]:
        return self.wait_job(jid, lambda j: j["state"] in states, " or ".join(states))

    def wait_event(self, jid: int | None, kind: str, count: int = 1) -> list[dict[str, Any]]:
        def got() -> list[dict[str, Any]] | None:
            evs = [e for e in self.read().events if e["kind"] == kind and (jid is None or e["job_id"] == jid)]
            return evs if len(evs) >= count else None

        return wait_for(got, f"{count} {kind!r} event(s) of job {jid}")

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["name"]: n for n in self.call("nodes")}

    def wait_node(self, name: str, *states: str) -> dict[str, Any]:
        def got() -> dict[str, Any] | None:
            n = self.nodes()[name]
            return n if n["state"] in states else None

        return wait_for(got, f"node {name} to be {' or '.join(states)}")

    def processes(self) -> list[MarkedProc]:
        return marked_processes(self.run_roots)

    # ------------------------------------------------------------------------------------- quiescence

    def quiesce(self, *, restore: bool = True) -> Store:
        """Bring the lab to rest: every host back, a controller running, every job ended, every stale copy
        fenced, every node up. Returns the store as it is then."""
        if restore and self.hosts is not None:
            for h in self.hosts:
                if self.hosts.is_cut(h):
                    h.restore()
                    self.record.add("restore", host=h.name)
        self.start()

        def rest() -> Store | None:
            st = self.read()
            if any(j["state"] not in TERMINAL for j in st.jobs):
                return None
            if any(r["state"] in LIVE_RUN or r["state"] == "FENCING" for r in st.runs):
                return None
            return st

        st = wait_for(rest, "every job to end and every stale copy to be fenced", limit_s=SAFETY_S * 2)
        if self.hosts is not None:
            wait_for(lambda: all(n["state"] == "UP" for n in self.nodes().values()), "every node to be UP")
        return st

    def check(self, *, quiescent: bool = True) -> None:
        from tests.faults.invariants import assert_invariants

        assert_invariants(self, quiescent=quiescent)

    # ---------------------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop everything this cluster started: its controller (SIGKILL) and every process of its runs."""
        with contextlib.suppress(Exception):
            self.kill()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        kill_marked(self.run_roots)


def kill_marked(roots: Sequence[Path]) -> None:
    for p in marked_processes(roots):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


@contextlib.contextmanager
def cluster(root: Path, **kwargs: Any) -> Iterator[Cluster]:
    c = Cluster(root, **kwargs)
    try:
        yield c
    finally:
        c.close()
