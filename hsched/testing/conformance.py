"""The executor conformance check: what every executor must do to stand behind the executor protocol
(hsched.executors.base), runnable against any of them (local, ssh, slurm, the fake, or a third party's).

    from hsched.testing import ExecutorUnderTest, check_executor

    subject = ExecutorUnderTest(kind="mine", runs=tmp / "runs", make=lambda: MyExecutor(...))
    results = asyncio.run(check_executor(subject, tmp / "scratch"))   # {check: None (passed) or why it did not apply}

A failed check raises ConformanceError (an AssertionError, so any test runner shows it as a failure) naming the
check and what differed. Run one check with `run_check(subject, name, folder)`, the names being CHECKS (in
pytest: parametrize over CHECKS, as tests/executors/test_conformance.py does for the fake, local and ssh
executors and tests/slurm/test_slurm_conformance.py for Slurm).

The subject says what its node can show: `play` stands in for the commands of an executor that runs none (the
fake: the check writes what the command would print and ends it); `same_machine` says the node's processes and
files are this machine's (local, ssh test hosts in network namespaces, a Slurm test cluster), so the check
also looks at them; `make_unreachable` / `make_refused` build an executor for a node nobody answers for / that
turns us away (without them, the checks of those errors say they do not apply); `datasets` False: the node
keeps no datasets (Slurm), so the check asks that every data request is refused instead. Every check waits on
events (a status, a log line), never for a wall-clock deadline: bound the whole run by the caller's timeout.

No test framework is imported here: the checks raise ConformanceError themselves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hsched.errors import HelperError, NodeRefused, NodeUnreachable, Refusal, TransferError
from hsched.executors.base import Executor, LaunchRequest, StatusQuery
from hsched.model import RunHandle, RunReport, RunStatus

if TYPE_CHECKING:
    from hsched.executors.fake import FakeExecutor

E = TypeVar("E", bound=BaseException)

PROBE_KEYS = frozenset({"helper_version", "hostname", "boot_id", "python", "cpus", "memory_total_mib", "numa", "gpus",
                        "loadavg"})
"""What every probe answers (executors/base.py `probe`)."""


class ConformanceError(AssertionError):
    """An executor did not behave as the protocol says: the message names the check and what differed."""


@dataclass
class ExecutorUnderTest:
    """One executor kind under the conformance check: how to make one, where its runs go, what it can show."""

    kind: str
    """What its `kind` attribute says ("local", "ssh", "slurm", "fake", or a third party's)."""
    runs: Path
    """A folder standing for HSCHED_HOME/runs/<node> on the controller: run folders are named under it. Its
    parent must be writable: the dataset check works in a sibling folder `node-data`."""
    make: Callable[[], Executor]
    make_unreachable: Callable[[], Executor] | None = None
    """An executor for a node nobody answers for."""
    make_refused: Callable[[], Executor] | None = None
    """An executor for a node that refuses us in a way only a person can fix."""
    refusal: Refusal | None = None
    """The reason make_refused's node gives."""
    play: Callable[[Executor, str, bytes, int | None], None] | None = None
    """For an executor that runs no command (a fake): make run `run_dir` print `output` and, with an exit code,
    end with it. None: commands really run."""
    same_machine: bool = True
    """The node's processes and files are this machine's (the check also looks at them there)."""
    datasets: bool = True
    """The node keeps datasets (the helper's data requests); False: it refuses every one (Slurm)."""
    python: str = sys.executable
    """A Python the node can run for the check's small jobs (on a node of its own: "python3")."""

    @property
    def real(self) -> bool:
        """Whether commands really run (else the check plays their part with `plays`)."""
        return self.play is None

    @contextlib.asynccontextmanager
    async def executor(self, make: Callable[[], Executor] | None = None) -> AsyncIterator[Executor]:
        ex = (make or self.make)()
        try:
            yield ex
        finally:
            await ex.close()

    def plays(self, ex: Executor, run_dir: str, *, output: bytes = b"", exit_code: int | None = None) -> None:
        """What a real node does by running the command; nothing where commands really run."""
        if self.play is not None:
            self.play(ex, run_dir, output, exit_code)


def fake_subject(runs: Path) -> ExecutorUnderTest:
    """The public FakeExecutor as a subject: a node with a disk of its own (put/get really move the files, in
    memory), whose unreachable and refusing twins are its knobs set."""
    from hsched.executors.fake import FakeExecutor

    def refused() -> Executor:
        ex = FakeExecutor(name="fake")
        ex.fail_with = NodeRefused("fake: HOST KEY CHANGED", Refusal.HOST_KEY_CHANGED)
        return ex

    def unreachable() -> Executor:
        ex = FakeExecutor(name="fake")
        ex.unreachable = True
        return ex

    def play(ex: Executor, run_dir: str, output: bytes, exit_code: int | None) -> None:
        if not isinstance(ex, FakeExecutor):
            raise TypeError(f"a fake subject plays a FakeExecutor's runs, not {type(ex).__name__}'s")
        if output:
            ex.write_log(run_dir, output)
        if exit_code is not None:
            ex.finish(run_dir, exit_code, end_time=time.time())  # the exit record's end time, as a wrapper writes

    def make() -> Executor:
        ex = FakeExecutor(remote_root="/node")
        ex.accounts = {"root"}  # the accounts every node has
        return ex

    return ExecutorUnderTest(kind="fake", runs=runs, make=make,
                             make_unreachable=unreachable, make_refused=refused, refusal=Refusal.HOST_KEY_CHANGED,
                             play=play)


def local_subject(runs: Path, scratch: Path) -> ExecutorUnderTest:
    """The local executor as a subject; `scratch` holds the stand-in interpreters of its unreachable (a helper
    that reads requests and never answers) and refusing (no python3) twins."""
    from hsched.executors.local import LocalExecutor

    silent = scratch / "silent-python"
    silent.write_text("#!/bin/sh\nwhile read -r line; do :; done\n")
    silent.chmod(0o755)
    return ExecutorUnderTest(kind="local", runs=runs, make=lambda: LocalExecutor(node="here"),
                             make_unreachable=lambda: LocalExecutor(node="here", python=str(silent), timeout_s=0.2),
                             make_refused=lambda: LocalExecutor(node="here", python=str(scratch / "no-python3")),
                             refusal=Refusal.PYTHON)


# ------------------------------------------------------------------------------------------------ helpers


def expect(cond: object, what: str) -> None:
    if not cond:
        raise ConformanceError(what)


def equal(got: object, want: object, what: str) -> None:
    if got != want:
        raise ConformanceError(f"{what}: expected {want!r}, got {got!r}")


async def raises(kind: type[E], call: Awaitable[Any], what: str, *, match: str | None = None) -> E:
    """The exception of type `kind` that awaiting `call` raised (its message matching `match`)."""
    try:
        await call
    except kind as e:
        if match is not None and not re.search(match, str(e)):
            raise ConformanceError(f"{what}: {type(e).__name__} {str(e)!r} does not match {match!r}") from e
        return e
    except Exception as e:
        raise ConformanceError(f"{what}: expected {kind.__name__}, got {type(e).__name__}: {e}") from e
    raise ConformanceError(f"{what}: expected {kind.__name__}, nothing was raised")


async def until(cond: Callable[[], bool]) -> None:
    """Until `cond()` holds; the caller's deadline is the only limit."""
    while True:
        if cond():
            return
        await asyncio.sleep(0.02)


async def wait_status(ex: Executor, handle: RunHandle, *, running: bool) -> RunReport:
    """The run's report once it is (or is no longer) running."""
    while True:
        [rep] = await ex.status([StatusQuery(handle.run_dir, handle)])
        if (rep.status is RunStatus.RUNNING) == running:
            return rep
        await asyncio.sleep(0.02)


async def wait_log(ex: Executor, run_dir: str, text: bytes) -> bytes:
    while True:
        log = await ex.read_log(run_dir, 0)
        if text in log:
            return log
        await asyncio.sleep(0.02)


def process_gone(pid: int) -> bool:
    """True once `pid` has exited on this machine (a zombie nobody reaped counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    """Temporary names a transfer left behind (the target itself does not count)."""
    return [p.name for p in folder.iterdir() if ".part-" in p.name or ".old-" in p.name or p.name == "absent"]


TRAINER = """
import signal, sys, time
def save(signum, frame):
    print("saving", flush=True)
    time.sleep(0.5)  # the shell in front of us is long dead by now
    sys.exit(85)
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
while True:
    time.sleep(1)
"""
"""A trainer that saves on SIGUSR1 and exits 85, even when the shell in front of it died of the signal."""

RECORDER = """
import signal, time
def note(signum, frame):
    print("recorder got " + signal.Signals(signum).name, flush=True)
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, note)
print("recorder ready", flush=True)
while True:
    time.sleep(1)
"""
"""Says (in the run's log) every SIGUSR1/SIGUSR2 it gets, once its handlers are set."""


def _fake(ex: Executor) -> FakeExecutor | None:
    """The executor, if it is the public fake (whose records of launches and signals the checks read too)."""
    from hsched.executors.fake import FakeExecutor

    return ex if isinstance(ex, FakeExecutor) else None


def _py(subject: ExecutorUnderTest, program: str) -> str:
    """A shell line running `program` with the node's Python (no file on the node needed)."""
    return f"{shlex.quote(subject.python)} -c {shlex.quote(program)}"


# ------------------------------------------------------------------------------------------------ the checks

Check = Callable[[ExecutorUnderTest, Path], Coroutine[Any, Any, str | None]]
"""A check: the subject and a scratch folder of this machine's; None when it ran, else why it did not apply."""

_CHECKS: dict[str, Check] = {}


def _check(fn: Check) -> Check:
    _CHECKS[fn.__name__] = fn
    return fn


@_check
async def is_an_executor(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        expect(isinstance(ex, Executor), f"{type(ex).__name__} implements the Executor protocol")
        equal(ex.kind, subject.kind, "kind")
        expect(ex.name, "a node name")
        equal((ex.last_contact, ex.last_error), (None, None), "last_contact and last_error before any call")
    return None


@_check
async def probe_shape_and_last_contact(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        before = time.monotonic()  # (last_contact is on the monotonic clock)
        p = await ex.probe(gpu_timeout_s=5.0)
        expect(PROBE_KEYS <= p.keys(), f"the probe's keys: {sorted(PROBE_KEYS - p.keys())} missing")
        expect(isinstance(p["cpus"], int) and p["cpus"] > 0 and p["memory_total_mib"] > 0, f"cpus and memory: {p}")
        expect(p["boot_id"] and isinstance(p["numa"], list), f"boot_id and numa: {p}")
        expect(isinstance(p["gpus"]["devices"], list) and "source" in p["gpus"], f"gpus: {p['gpus']}")
        first = ex.last_contact
        expect(first is not None and before <= first <= time.monotonic(), "last_contact: when the probe answered")
        equal(ex.last_error, None, "last_error after a probe")
        between = time.monotonic()
        await ex.probe(gpu_timeout_s=5.0)
        second = ex.last_contact
        expect(second is not None and first is not None and second >= between >= first,
               "the second answer moved last_contact on")
    return None


@_check
async def launch_is_idempotent_per_run_dir(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    marker = scratch / "launched"
    run_dir = str(subject.runs / "once")
    req = LaunchRequest(run_dir=run_dir, command=("sh", "-c", f"echo x >> {shlex.quote(str(marker))}; echo started; "
                                                               "sleep 60"))
    async with subject.executor() as ex:
        first = await ex.launch(req)
        again = await ex.launch(req)
        equal(again, first, "a second launch of one run folder returns the first run's handle")
        equal(first.run_dir, run_dir, "the handle carries the controller's path")
        subject.plays(ex, run_dir, output=b"started\n")
        await wait_log(ex, run_dir, b"started")
        [rep] = await ex.status([StatusQuery(run_dir, first)])
        equal((rep.status, rep.handle), (RunStatus.RUNNING, first), "the run's status")
        expect(await ex.signal(first, "KILL"), "KILL reaches the running run")
        await wait_status(ex, first, running=False)
    if subject.real and subject.same_machine:
        equal(marker.read_text(), "x\n", "runs started")  # one run, not two
    elif (fake := _fake(ex)) is not None:
        equal(fake.launches, 1, "runs started")
    return None


@_check
async def status_of_unknown_running_and_exited_runs(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        sleeper = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "sleeper"), command=("sleep", "60")))
        quitter = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "quitter"),
                                                command=("sh", "-c", "exit 3")))
        subject.plays(ex, quitter.run_dir, exit_code=3)
        await wait_status(ex, quitter, running=False)
        unknown = StatusQuery(str(subject.runs / "never-launched"))
        reports = await ex.status([unknown, StatusQuery(sleeper.run_dir, sleeper), StatusQuery(quitter.run_dir)])
        equal([r.status for r in reports], [RunStatus.NOT_STARTED, RunStatus.RUNNING, RunStatus.EXITED],
              "unknown, running, exited")
        equal(reports[1].handle, sleeper, "the running run's handle")
        equal((reports[2].exit_code, reports[2].signal, reports[2].handle), (3, None, quitter),
              "the exited run's code, signal and handle (found by its folder alone)")
        equal(await ex.status([]), [], "no query, no report")
        expect(await ex.signal(sleeper, "KILL"), "KILL reaches the sleeper")
    return None


@_check
async def term_ends_a_sleep(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "sleep"), command=("sleep", "60")))
        equal((await wait_status(ex, h, running=True)).status, RunStatus.RUNNING, "status")
        equal(await ex.signal(h, "TERM"), True, "TERM to a running run")
        rep = await wait_status(ex, h, running=False)
        equal((rep.status, rep.exit_code, rep.signal), (RunStatus.EXITED, 143, 15), "a run ended by TERM")
        equal(await ex.signal(h, "TERM"), False, "TERM to a run that has ended")
    return None


@_check
async def kill_all_processes_reaches_children_that_left_the_group(subject: ExecutorUnderTest,
                                                                  scratch: Path) -> str | None:
    # the child starts a session of its own (so the run's process group no longer holds it) and ignores TERM
    script = "setsid sh -c 'trap \"\" TERM; echo child=$$; exec sleep 60' & trap '' TERM; while :; do sleep 1; done"
    async with subject.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "family"), command=("sh", "-c", script)))
        subject.plays(ex, h.run_dir, output=b"child=0\n")
        log = await wait_log(ex, h.run_dir, b"child=")
        child = int(log.split(b"child=")[1].split()[0])
        equal(await ex.signal(h, "KILL", all_processes=True), True, "KILL to every process of the run")
        equal((await wait_status(ex, h, running=False)).exit_code, 137, "the run's exit code")
    if subject.real and subject.same_machine:
        await until(lambda: process_gone(child))
    elif (fake := _fake(ex)) is not None:
        equal(fake.runs[h.run_dir].signalled_all, ["KILL"], "signals sent to every process")
    return None


@_check
async def the_exit_record_comes_once_nothing_of_the_run_is_left(subject: ExecutorUnderTest,
                                                               scratch: Path) -> str | None:
    async with subject.executor() as ex:
        before = time.time()
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "leaves"),
                                          command=("sh", "-c", "sleep 77 & echo bg=$!; exit 3")))
        subject.plays(ex, h.run_dir, output=b"bg=0\n", exit_code=3)
        rep = await wait_status(ex, h, running=False)
        after = time.time()
        equal((rep.status, rep.exit_code, rep.signal, rep.oom, rep.gpu_left), (RunStatus.EXITED, 3, None, False, ()),
              "the exit record")
        expect(rep.end_time is not None and before <= rep.end_time <= after,
               f"the node's record of the end ({rep.end_time}) lies between {before} and {after}")
        if subject.real and subject.same_machine:  # what the run left was killed before its exit was reported
            log = await ex.read_log(h.run_dir, 0)
            pid = int(log.split(b"bg=")[1].split()[0])
            expect(process_gone(pid), f"the run's background process {pid} was gone before its exit was reported")
    return None


@_check
async def a_checkpoint_exit_behind_a_shell_is_the_runs(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        # bash runs the trainer as its child, so the checkpoint signal kills bash too: the trainer's 85 counts
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "ckpt"), checkpoint_exit_code=85,
                                          stop_grace_s=60, command=("bash", "-c", f"{_py(subject, TRAINER)}; true")))
        subject.plays(ex, h.run_dir, output=b"ready\n")
        await wait_log(ex, h.run_dir, b"ready")
        expect(await ex.signal(h, "USR1", all_processes=True), "USR1 to every process of the run")
        subject.plays(ex, h.run_dir, exit_code=85)
        rep = await wait_status(ex, h, running=False)
        equal((rep.exit_code, rep.signal), (85, None), "the checkpoint exit is the run's")
    return None


@_check
async def a_batch_only_signal_reaches_the_batch_shell_alone(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    # the shell notes USR1 and goes on waiting for its child (a batch script's end would end a Slurm job and
    # every process in it); it ignores USR2, which the child handles
    shell = (f"trap 'echo shell got USR1' USR1; trap '' USR2; {_py(subject, RECORDER)} & child=$!; "
             "while kill -0 $child 2>/dev/null; do wait $child; done; exit 3")
    async with subject.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "batch"), command=("bash", "-c", shell),
                                          stop_grace_s=60))
        subject.plays(ex, h.run_dir, output=b"recorder ready\n")
        await wait_log(ex, h.run_dir, b"recorder ready")
        expect(await ex.signal(h, "USR1", batch_only=True), "USR1 to the batch shell")
        subject.plays(ex, h.run_dir, output=b"shell got USR1\n")
        await wait_log(ex, h.run_dir, b"shell got USR1")
        # the shell's child lives on; USR2 to every process reaches it, and USR1 (sent first, lower-numbered)
        # would have been noted before it had it reached the child
        expect(await ex.signal(h, "USR2", all_processes=True), "USR2 to every process of the run")
        subject.plays(ex, h.run_dir, output=b"recorder got SIGUSR2\n")
        log = await wait_log(ex, h.run_dir, b"recorder got SIGUSR2")
        expect(b"recorder got SIGUSR1" not in log, "the batch-only USR1 reached the shell's child")
        if (fake := _fake(ex)) is not None:
            from hsched.executors.fake import FakeSignal

            want = [FakeSignal("USR1", batch_only=True), FakeSignal("USR2", all_processes=True)]
            equal(fake.runs[h.run_dir].signal_calls, want, "how the signals were to be delivered")
        expect(await ex.signal(h, "KILL", all_processes=True), "KILL to every process of the run")
        subject.plays(ex, h.run_dir, exit_code=137)
        rep = await wait_status(ex, h, running=False)
        # (a Slurm job's KILL is its cancel: TERM first, which the shell does not trap)
        expect(rep.status is RunStatus.EXITED and (rep.exit_code or 0) > 128, f"the run ended by a signal: {rep}")
    return None


@_check
async def read_log_offsets(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "log"), command=("printf", "0123456789")))
        subject.plays(ex, h.run_dir, output=b"0123456789", exit_code=0)
        equal((await wait_status(ex, h, running=False)).exit_code, 0, "printf's exit code")
        equal(await ex.read_log(h.run_dir, 0), b"0123456789", "the whole log")
        equal(await ex.read_log(h.run_dir, 3, max_bytes=4), b"3456", "4 bytes from offset 3")
        equal(await ex.read_log(h.run_dir, 10_000), b"", "past the end")
        equal(await ex.read_log(str(subject.runs / "never-launched"), 0), b"", "the log of no run")
    return None


@_check
async def remote_path_put_get_round_trip_and_newest_mtime(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    src = scratch / "ckpt"
    (src / "shards").mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(200_000))
    (src / "shards" / "opt state ü;$(x).pt").write_bytes(b"state" * 1000)
    (src / "step").write_text("1200\n")
    for f, t in ((src / "model.bin", 1_700_000_000), (src / "shards" / "opt state ü;$(x).pt", 1_700_000_100),
                 (src / "step", 1_700_000_050)):
        os.utime(f, (t, t))
    want = tree(src)
    newer = scratch / "ckpt2"
    newer.mkdir()
    (newer / "step").write_text("2400\n")
    async with subject.executor() as ex:
        remote = await ex.remote_path(str(src))
        equal(await ex.remote_path(str(src)), remote, "remote_path is a pure function of the local path")
        await ex.put(src, remote)
        mtime = await ex.newest_mtime(remote)
        expect(mtime is not None and math.isclose(mtime, 1_700_000_100, abs_tol=1.0),
               f"newest_mtime: expected 1700000100, got {mtime}")
        equal(await ex.newest_mtime(f"{remote}/no-such-folder"), None, "newest_mtime of nothing")
        await ex.get(remote, scratch / "back")
        expect(tree(scratch / "back") == want, "what came back is what was put, byte for byte")
        await ex.put(newer, remote)  # replaces the folder as a whole
        await ex.get(remote, scratch / "back")
        equal(tree(scratch / "back"), {"step": b"2400\n"}, "a put replaces the folder as a whole")
        err = await raises(TransferError, ex.get(f"{remote}/absent", scratch / "absent"), "get of nothing",
                           match=r"(?i)no such file")
        expect(ex.last_error is err, "last_error is the TransferError raised")
    equal(leftovers(scratch), [], "temporary names left behind")
    return None


@_check
async def dataset_requests_alike(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    """The node helper's data_* requests: chunks written into a copy, committed, read back, scanned, hashed,
    dropped; a link on the way and an unknown request are the request's HelperError. A node keeping no
    datasets refuses them all."""
    if not subject.datasets:
        async with subject.executor() as ex:
            err = await raises(HelperError, ex.data("scan", {"path": str(subject.runs)}), "a data request")
            expect(ex.last_error is err, "last_error is the HelperError raised")
        return None
    if not subject.same_machine:
        return "the check makes a symbolic link on the node's disk: it needs the node's files on this machine"
    from hsched.controller.datacopy import DATA_MANIFEST

    base = subject.runs.parent / "node-data"  # the real path (a write refuses a link on the way)
    partial, dest = f"{base}/ds.partial", f"{base}/ds"
    blob = os.urandom((2 << 20) + 5)
    async with subject.executor() as ex:
        equal((await ex.data("scan", {"path": dest}))["exists"], False, "scan of nothing")
        for off in range(0, len(blob), 1 << 20):
            r = await ex.data("write", {"path": f"{partial}/data/x.bin", "offset": off,
                                        "data": base64.b64encode(blob[off:off + (1 << 20)]).decode()})
            equal(r["size"], min(off + (1 << 20), len(blob)), "the size after a chunk")
        manifest = {"version": 1, "kind": "dir", "dirs": ["empty"],
                    "files": [{"rel": "x.bin", "size": len(blob), "mtime": 1234.5, "mode": 0o644}]}
        await ex.data("write", {"path": f"{partial}/{DATA_MANIFEST}", "offset": 0,
                                "data": base64.b64encode(json.dumps(manifest).encode()).decode()})
        equal((await ex.data("commit", {"partial": partial, "dest": dest}))["bytes"], len(blob), "bytes committed")
        back, eof = b"", False
        while not eof:
            r = await ex.data("read", {"path": f"{dest}/x.bin", "offset": len(back), "max_bytes": 1 << 20})
            back += base64.b64decode(r["data"])
            eof = r["eof"]
        expect(back == blob, "what was read back is what was written")
        listing = await ex.data("list", {"path": dest})
        equal(listing["dirs"], ["empty"], "listed folders")
        equal([(f["rel"], f["mtime"]) for f in listing["files"]], [("x.bin", 1234.5)], "listed files")
        scanned = await ex.data("scan", {"path": dest})
        equal((scanned["exists"], scanned["bytes"], scanned["files"], scanned["is_dir"]), (True, len(blob), 1, True),
              "scan")
        digest = hashlib.sha256(b"x.bin\0%d\0" % len(blob) + blob).hexdigest()
        equal((await ex.data("hash", {"path": dest}))["sha256"], digest, "hash")
        expect((await ex.data("free", {"path": f"{dest}/not/yet"}))["free"] > 0, "free space")
        equal(await ex.data("root", {}), {"root": None}, "an unconfined helper's root")
        (base / "hop").symlink_to(scratch)
        err = await raises(HelperError, ex.data("write", {"path": f"{base}/hop/x", "offset": 0, "data": ""}),
                           "a write through a link", match="symbolic link")
        equal((ex.last_error is err, err.command), (True, "data_write"), "last_error and the command named")
        err = await raises(HelperError, ex.data("nope", {}), "an unknown request", match="unknown request")
        equal(err.command, "data_nope", "the command named")
        equal(await ex.data("drop", {"path": dest}), {"dropped": True}, "drop")
        equal(ex.last_error, None, "last_error after a request that worked")
        equal(sorted(p.name for p in base.iterdir()), ["hop"], "what is left")
    return None


@_check
async def users_says_which_accounts_exist(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        names = ["root", "hsched-no-such-user"]
        equal(await ex.users(names), {"root": True, "hsched-no-such-user": False}, "which accounts exist")
        equal(await ex.users([]), {}, "no name asked, none answered")
    return None


@_check
async def watch_yields_samples(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        before = time.monotonic()  # (last_contact is on the monotonic clock)
        samples = [s async for s in ex.watch(0.05, count=3)]
        equal([s["seq"] for s in samples], [0, 1, 2], "sample numbers")
        last = samples[-1]
        expect(last["node"] == ex.name and last["boot_id"], "a sample names its node and boot")
        expect({"cpu", "memory", "gpus", "gpu_error", "processes"} <= last.keys(), f"a sample's keys: {sorted(last)}")
        expect(isinstance(last["gpus"]["devices"], list) and isinstance(last["processes"], list), "devices, processes")
        expect(ex.last_contact is not None and ex.last_contact >= before, "samples move last_contact on")
        equal(ex.last_error, None, "last_error while samples come")
    return None


@_check
async def a_helper_error_fails_one_request_only(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        h = await ex.launch(LaunchRequest(run_dir=str(subject.runs / "sleep"), command=("sleep", "60")))
        before = ex.last_contact
        err = await raises(HelperError, ex.signal(h, "NO-SUCH-SIGNAL"), "an unknown signal", match="unknown signal")
        equal((ex.last_error is err, err.command), (True, "signal"), "last_error and the command named")
        # the node is fine: its last answer (this one, where the node was asked) still counts
        expect(ex.last_contact is not None and before is not None and ex.last_contact >= before,
               "last_contact after a request the node refused")
        [rep] = await ex.status([StatusQuery(h.run_dir, h)])
        equal((rep.status, ex.last_error), (RunStatus.RUNNING, None), "the next call works and clears last_error")
        expect(await ex.signal(h, "KILL"), "KILL reaches the run")
    return None


@_check
async def an_unreachable_node_raises_NodeUnreachable(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    if subject.make_unreachable is None:
        return "the subject has no unreachable node (make_unreachable)"
    async with subject.executor(subject.make_unreachable) as ex:
        err = await raises(NodeUnreachable, ex.probe(), "a probe of a node nobody answers for")
        expect(ex.last_error is err and err.retryable, "last_error is the retryable NodeUnreachable")
        equal(ex.last_contact, None, "last_contact of a node that never answered")
    return None


@_check
async def a_refusing_node_raises_NodeRefused(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    if subject.make_refused is None:
        return "the subject has no refusing node (make_refused)"
    async with subject.executor(subject.make_refused) as ex:
        err = await raises(NodeRefused, ex.probe(), "a probe of a node that refuses us")
        equal((err.reason, err.retryable), (subject.refusal, False), "the reason, not retryable")
        expect(ex.last_error is err, "last_error is the NodeRefused")
        # a person must act: the next call is refused too (a launch: one every executor must take to the node)
        await raises(NodeRefused, ex.launch(LaunchRequest(run_dir=str(subject.runs / "x"), command=("true",))),
                     "the next call")
        expect(isinstance(ex.last_error, NodeRefused), "last_error stays a NodeRefused")
    return None


@_check
async def usable_again_after_close(subject: ExecutorUnderTest, scratch: Path) -> str | None:
    async with subject.executor() as ex:
        first = (await ex.probe())["boot_id"]
        await ex.close()
        equal((await ex.probe())["boot_id"], first, "the boot id after close and a new call")
    return None


CHECKS: tuple[str, ...] = tuple(_CHECKS)
"""Every check's name, in the order check_executor runs them."""


def _folders(*paths: Path) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)


async def run_check(subject: ExecutorUnderTest, name: str, scratch: Path) -> str | None:
    """Run one check; None when it ran and passed, else why it does not apply to the subject. A failure raises
    ConformanceError naming the check; an ExecutorError where none was expected goes up as it is."""
    if name not in _CHECKS:
        raise ValueError(f"no conformance check {name!r}; the checks: {', '.join(CHECKS)}")
    _folders(scratch, subject.runs)
    try:
        return await _CHECKS[name](subject, scratch)
    except ConformanceError as e:
        raise ConformanceError(f"{subject.kind} executor, check {name}: {e}") from e


async def check_executor(subject: ExecutorUnderTest, scratch: Path,
                         names: Iterable[str] = CHECKS) -> dict[str, str | None]:
    """Run the checks in turn (each in a folder of its own under `scratch`, its runs under its own folder
    beside `subject.runs`); {name: None (passed) or why it did not apply}. Stops at the first failure."""
    out: dict[str, str | None] = {}
    for name in names:
        out[name] = await run_check(replace(subject, runs=subject.runs / name), name, scratch / name)
    return out


__all__ = ["CHECKS", "PROBE_KEYS", "ConformanceError", "ExecutorUnderTest", "check_executor", "fake_subject",
           "local_subject", "run_check"]
