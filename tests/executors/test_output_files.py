"""sbatch's -o/-e on a real node (issue 16): the run wrapper writes the job's output live to the user's file as
well as to the run folder's log, appends (or empties the file when asked), fails the run as sbatch does when the
file cannot be opened, and, in a lab, opens it as the job's user: never with root's rights."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.executors.local import LocalExecutor

from tests.executors.waits import wait_status
from tests.labusers import LabUsers, world_folder

pytestmark = pytest.mark.slow  # real helper, wrapper and job processes


async def _run(tmp_path: Path, name: str, script: str, **kw: Any) -> tuple[int | None, Path]:
    """Run `sh -c script` to its end through the real helper; (exit code, run folder)."""
    run_dir = tmp_path / "runs" / name
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(run_dir), command=("sh", "-c", script), inherit_env=True,
                                          **kw))
        rep = await wait_status(ex, h, running=False)
    finally:
        await ex.close()
    return rep.exit_code, run_dir


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _file_has(path: Path, text: str) -> None:
    while True:
        if text in _text(path):
            return
        await asyncio.sleep(0.02)


async def test_output_reaches_the_file_and_the_log_in_order(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = "echo one; echo two >&2; echo three"
    code, run_dir = await _run(tmp_path, "a", script, workdir=str(work), output="slurm-7.out")
    assert code == 0
    # relative to the working folder; stderr with stdout through one pipe, so the order holds
    assert (work / "slurm-7.out").read_text() == "one\ntwo\nthree\n"
    assert (run_dir / "output.log").read_text() == "one\ntwo\nthree\n"  # `hsched logs` reads this one


async def test_a_separate_error_file(tmp_path: Path) -> None:
    out, err = tmp_path / "o.out", tmp_path / "e.err"
    code, run_dir = await _run(tmp_path, "b", "echo out; echo err >&2; exit 3", output=str(out), error=str(err))
    assert code == 3
    assert out.read_text() == "out\n" and err.read_text() == "err\n"
    assert sorted((run_dir / "output.log").read_text().splitlines()) == ["err", "out"]


async def test_an_error_file_alone_leaves_stdout_to_the_log(tmp_path: Path) -> None:
    err = tmp_path / "e.err"
    code, run_dir = await _run(tmp_path, "c", "echo out; echo err >&2", error=str(err))
    assert code == 0 and err.read_text() == "err\n"
    assert sorted((run_dir / "output.log").read_text().splitlines()) == ["err", "out"]


async def test_appended_unless_asked_to_empty_it(tmp_path: Path) -> None:
    out = tmp_path / "o.out"
    out.write_text("first attempt\n")
    await _run(tmp_path, "d1", "echo second attempt", output=str(out))
    assert out.read_text() == "first attempt\nsecond attempt\n"  # a requeued run keeps what came before
    await _run(tmp_path, "d2", "echo fresh", output=str(out), truncate_output=True)
    assert out.read_text() == "fresh\n"  # a job's first start: emptied, as sbatch's default


async def test_the_file_is_written_while_the_job_runs(tmp_path: Path) -> None:
    """`tail -f slurm-12.out` follows the job: its line is in the file before the job ends."""
    out, gate = tmp_path / "o.out", tmp_path / "gate"
    run_dir = tmp_path / "runs" / "e"
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(run_dir), command=(
            "sh", "-c", f'echo started; while [ ! -e "{gate}" ]; do sleep 0.02; done; echo done'),
            output=str(out)))
        while "started" not in _text(out):
            [rep] = await ex.status([StatusQuery(h.run_dir, h)])
            assert rep.exit_code is None, "the job ended before its line reached the file"
            await asyncio.sleep(0.02)
        gate.touch()
        rep = await wait_status(ex, h, running=False)
    finally:
        await ex.close()
    assert rep.exit_code == 0 and out.read_text() == "started\ndone\n"


async def test_what_a_stopped_job_prints_last_reaches_the_file(tmp_path: Path) -> None:
    """A preempted or cancelled job's last words (a checkpoint saved, written while it stops) are copied before
    the run counts as ended; and a job's stray leftover writes nothing after that."""
    out = tmp_path / "o.out"
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(tmp_path / "runs" / "g"), command=(
            "sh", "-c", 'trap "echo saved; exit 0" TERM; echo hi; while :; do sleep 0.02; done'),
            output=str(out), stop_grace_s=5.0))
        await _file_has(out, "hi\n")  # the trap is set
        assert await ex.signal(h, "TERM", purpose="preempted")
        rep = await wait_status(ex, h, running=False)
    finally:
        await ex.close()
    text = out.read_text()  # (sh may say "Terminated" for its sleep in between)
    assert rep.exit_code == 0 and text.startswith("hi\n") and text.endswith("saved\n"), text


async def test_dev_null_is_a_file_like_any_other(tmp_path: Path) -> None:
    code, run_dir = await _run(tmp_path, "h", "echo quiet", output="/dev/null", truncate_output=True)
    assert code == 0 and (run_dir / "output.log").read_text() == "quiet\n"  # `hsched logs` still has it


async def test_a_file_that_cannot_be_opened_fails_the_run_saying_why(tmp_path: Path) -> None:
    code, run_dir = await _run(tmp_path, "f", "echo never", output=str(tmp_path / "nosuch" / "x.out"))
    assert code == 1
    log = (run_dir / "output.log").read_text()
    assert log == f"hsched: cannot open the output file {tmp_path}/nosuch/x.out: No such file or directory\n"


# ------------------------------------------------------------------------------------------------ lab mode


@pytest.fixture(scope="module")
def users() -> Iterator[LabUsers]:
    made = LabUsers.create()
    yield made
    made.remove()


@pytest.fixture
def base() -> Iterator[Path]:
    d = world_folder("hsched-outfiles-")
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_lab_run_opens_its_file_as_its_user(users: LabUsers, base: Path) -> None:
    pw = pwd.getpwnam("hslab1")
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, pw.pw_uid, pw.pw_gid)
    roots = base / "roots"
    roots.mkdir(mode=0o755)  # root may write here, the user may not
    ex = LocalExecutor()
    try:
        h = await ex.launch(LaunchRequest(run_dir=str(base / "runs" / "1"), command=("sh", "-c", "id -un"),
                                          user="hslab1", base_dir=str(base), workdir=str(theirs),
                                          output="mine.out"))
        ok = await wait_status(ex, h, running=False)
        h = await ex.launch(LaunchRequest(run_dir=str(base / "runs" / "2"), command=("sh", "-c", "id -un"),
                                          user="hslab1", base_dir=str(base), output=str(roots / "x.out")))
        refused = await wait_status(ex, h, running=False)
    finally:
        await ex.close()
    made = theirs / "mine.out"  # relative to the run's working folder
    assert ok.exit_code == 0 and made.read_text() == "hslab1\n"
    assert made.stat().st_uid == pw.pw_uid  # the user's file, made with their rights
    assert refused.exit_code == 1 and not (roots / "x.out").exists()
    log = (base / "runs" / "2" / "output.log").read_text()
    assert log == f"hsched: cannot open the output file {roots}/x.out as hslab1: Permission denied\n"
