"""The node helper's own defences, against a fake /proc: a run's pid reused by a stranger (or by anyone after a
reboot) is never reported running and never signalled; a torn or garbage exit record is never taken as an exit
code. The helper finds a run again by pid + process start time (field 22 of /proc/PID/stat) + boot id."""

from __future__ import annotations

import builtins
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from hsched.node import procfs, records, signals
from hsched.node import status as node_status

pytestmark = pytest.mark.slow  # the fault matrix (these start no process, but belong with it)

PID = 424242
TICKS = 1000
MAIN = PID + 1
MAIN_TICKS = TICKS + 7
BOOT = "0e5f1a62-0000-4000-8000-000000000001"


def stat_line(pid: int, ticks: int, state: str = "S", comm: str = "sleep", session: int = 1) -> str:
    fields = ["1"] * 50  # fields 4.. (ppid, pgrp, session, ...); field 22 is the start time
    fields[5 - 4] = fields[6 - 4] = str(session)
    fields[22 - 4] = str(ticks)
    return f"{pid} ({comm}) {state} " + " ".join(fields) + "\n"


class FakeProc:
    """/proc as the test says: a boot id and the stat line of some pids; every other path is the real file."""

    def __init__(self, boot: str) -> None:
        self.boot = boot
        self.stat: dict[int, str] = {}

    def open(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        p = str(path)
        if p == "/proc/sys/kernel/random/boot_id":
            return io.StringIO(self.boot + "\n")
        m = re.fullmatch(r"/proc/(\d+)/stat", p)
        if m and int(m[1]) in self.stat:
            data = self.stat[int(m[1])]
            return io.BytesIO(data.encode()) if "b" in mode else io.StringIO(data)
        if m and int(m[1]) in (PID, MAIN):
            raise FileNotFoundError(p)
        return builtins.open(path, mode, *args, **kwargs)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeProc, list[tuple[str, int, int]]]:
    proc = FakeProc(BOOT)
    for module in (records, procfs):  # the modules that read /proc: their `open` before builtins'
        monkeypatch.setattr(module, "open", proc.open, raising=False)
    sent: list[tuple[str, int, int]] = []

    def killpg(pgid: int, sig: int) -> None:
        sent.append(("killpg", pgid, sig))

    def kill(pid: int, sig: int) -> None:
        sent.append(("kill", pid, sig))

    monkeypatch.setattr(os, "killpg", killpg)
    monkeypatch.setattr(os, "kill", kill)
    return proc, sent


def make_run(tmp_path: Path, name: str = "run") -> tuple[str, dict[str, Any]]:
    run_dir = tmp_path / name
    run_dir.mkdir()
    # the wrapper (pid) and the job's main process (pgid, which leads its own session)
    handle = {"run_dir": str(run_dir), "pid": PID, "pgid": MAIN, "start_ticks": TICKS, "boot_id": BOOT,
              "child_start_ticks": MAIN_TICKS}
    (run_dir / "handle.json").write_text(json.dumps(handle))
    return str(run_dir), handle


def status(run_dir: str, handle: dict[str, Any]) -> dict[str, Any]:
    return node_status.run_status({"run_dir": run_dir, "handle": handle})


def signal_run(handle: dict[str, Any]) -> dict[str, Any]:
    return signals.send_signal({"handle": handle, "signal": "TERM", "all_processes": True})


# ------------------------------------------------------------------------------------------------- PID reuse


def test_the_run_itself_is_running_and_signalled(tmp_path: Path, fake: tuple[FakeProc, list[Any]]) -> None:
    proc, sent = fake
    run_dir, handle = make_run(tmp_path)
    proc.stat[PID] = stat_line(PID, TICKS, comm="python3")
    proc.stat[MAIN] = stat_line(MAIN, MAIN_TICKS, session=MAIN)
    assert status(run_dir, handle)["status"] == "running"
    assert signal_run(handle)["sent"] is True and ("killpg", MAIN, 15) in sent  # the control case


def test_a_reused_pid_of_the_main_process_is_not_signalled(tmp_path: Path, fake: tuple[FakeProc, list[Any]]) -> None:
    """The wrapper lives on (waiting for the rest of the run) after reaping the job's main process, whose pid a
    stranger then got: the stranger's process group must not get the run's signal."""
    proc, sent = fake
    _run_dir, handle = make_run(tmp_path)
    proc.stat[PID] = stat_line(PID, TICKS, comm="python3")
    proc.stat[MAIN] = stat_line(MAIN, MAIN_TICKS + 999, comm="stranger", session=MAIN)
    signal_run(handle)
    assert not [s for s in sent if s[1] == MAIN], sent


@pytest.mark.parametrize("why, boot, stat", [
    ("a stranger got the pid", BOOT, stat_line(PID, TICKS + 4711, comm="stranger")),
    ("a reboot, and the pid started at the same tick", "0e5f1a62-0000-4000-8000-0000000000ff", stat_line(PID, TICKS)),
    ("a zombie: the run ended, its parent has not reaped it", BOOT, stat_line(PID, TICKS, state="Z")),
    ("no such process", BOOT, None),
    ("a stat line cut short", BOOT, f"{PID} (sleep) S 1 1 1\n"),
])
def test_a_reused_pid_is_never_reported_running_nor_signalled(
        tmp_path: Path, fake: tuple[FakeProc, list[Any]], why: str, boot: str, stat: str | None) -> None:
    proc, sent = fake
    run_dir, handle = make_run(tmp_path)
    proc.boot = boot
    if stat is not None:
        proc.stat[PID] = stat
    rep = status(run_dir, handle)
    assert rep["status"] == "lost" and rep.get("exit_code") is None, (why, rep)
    reply = signal_run(handle)
    assert reply.get("sent") is False and sent == [], (why, reply, sent)


# -------------------------------------------------------------------------------------- exit-record integrity


GARBAGE = [
    ("torn (a writer died mid-write, no rename)", '{"exit_code": 3, "signal": nu'),
    ("empty", ""),
    ("binary garbage", "\x00\x00\x7f\x01"),
    ("JSON but not an object", "[3]"),
    ("JSON null", "null"),
    ("no exit code", '{"signal": null, "end_time": 1800000000.0}'),
    ("an exit code that is a string", '{"exit_code": "3", "signal": null}'),
    ("an exit code that is a boolean", '{"exit_code": true, "signal": null}'),
    ("an exit code that is a float", '{"exit_code": 3.5, "signal": null}'),
    ("an exit code out of range", '{"exit_code": 300, "signal": null}'),
    ("a negative exit code", '{"exit_code": -9, "signal": null}'),
]


@pytest.mark.parametrize("why, text", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_a_garbage_exit_record_is_not_an_exit_code(tmp_path: Path, fake: tuple[FakeProc, list[Any]],
                                                    why: str, text: str) -> None:
    _proc, _sent = fake
    run_dir, handle = make_run(tmp_path)  # its wrapper is gone (no such pid in the fake /proc)
    Path(run_dir, "exit.json").write_text(text)
    rep = status(run_dir, handle)  # must not raise: one bad record must not fail the node's whole status reply
    assert rep["status"] == "lost" and rep.get("exit_code") is None, (why, rep)


def test_a_garbage_exit_record_of_a_live_wrapper_leaves_the_run_running(
        tmp_path: Path, fake: tuple[FakeProc, list[Any]]) -> None:
    proc, _sent = fake
    run_dir, handle = make_run(tmp_path)
    proc.stat[PID] = stat_line(PID, TICKS)
    Path(run_dir, "exit.json").write_text('{"exit_code": "0"')
    assert status(run_dir, handle)["status"] == "running"


def test_a_sound_exit_record_with_a_garbage_end_time_keeps_its_code_but_not_the_time(
        tmp_path: Path, fake: tuple[FakeProc, list[Any]]) -> None:
    run_dir, handle = make_run(tmp_path)
    Path(run_dir, "exit.json").write_text('{"exit_code": 3, "signal": null, "end_time": "soon"}')
    rep = status(run_dir, handle)
    assert rep["status"] == "exited" and rep["exit_code"] == 3
    assert rep.get("end_time") is None or isinstance(rep["end_time"], float), rep


def test_a_whole_status_reply_survives_one_bad_record(tmp_path: Path, fake: tuple[FakeProc, list[Any]]) -> None:
    good_dir, good = make_run(tmp_path, "good")
    Path(good_dir, "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "end_time": 1.8e9}))
    bad_dir, bad = make_run(tmp_path, "bad")
    Path(bad_dir, "exit.json").write_text("[]")
    reply = node_status.status({"runs": [{"run_dir": good_dir, "handle": good}, {"run_dir": bad_dir, "handle": bad}]})
    assert [r["status"] for r in reply["runs"]] == ["exited", "lost"], reply
    assert os.path.exists(good_dir)
