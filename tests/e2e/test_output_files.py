"""sbatch's -o/-e end to end (issue 16): the real CLI, controller, helper and job; the file appears at the
expanded path in the job's working folder with the job's output, keeps the first attempt's output across a
requeue, and `hsched logs` still shows the run's output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Hs

pytestmark = pytest.mark.slow  # the CLI and the controller as real processes

FLEET = """
[[node]]
name = "a"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 2
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Hs]:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    h = Hs(tmp_path / "home", fleet=fleet)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text("poll_interval_s = 0.2\nkill_after_s = 2\n")
    yield h
    h.stop()


def test_the_file_is_at_the_expanded_path_and_survives_a_requeue(lab: Hs, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    # the first run exits with the checkpoint code: requeued, and the second run resumes
    script = ('echo "start $HSCHED_RUN"; echo "warn $HSCHED_RUN" >&2; if [ -z "$HSCHED_RESUME" ]; then exit 85; fi; '
              'echo "end $HSCHED_RUN"')
    jid = lab.run("submit", "--parsable", "-D", str(work), "-J", "tr", "-o", "logs/%x-%j.%u.%N.out", "--",
                  "sh", "-c", script, check=True).stdout.strip()
    assert lab.run("wait", jid, "--timeout", "120", timeout=180).returncode == 0
    job = lab.json("show", jid)
    assert job["restarts"] == 1 and job["output"] == "logs/%x-%j.%u.%N.out"  # type: ignore[index]
    [out] = (work / "logs").iterdir()
    assert out.name == f"tr-{jid}.{job['user']}.a.out"  # type: ignore[index]
    assert out.read_text() == "start 1\nwarn 1\nstart 2\nwarn 2\nend 2\n"
    # the run folder's log is kept: `hsched logs` reads it as before
    assert lab.run("logs", jid, check=True).stdout == "start 2\nwarn 2\nend 2\n"
    assert "output: logs/%x-%j.%u.%N.out (stdout and stderr)" in lab.run("show", jid, check=True).stdout


def test_array_tasks_get_their_own_files_and_stderr_its_own(lab: Hs, tmp_path: Path) -> None:
    jid = lab.run("submit", "--parsable", "-D", str(tmp_path), "--array", "0-1", "-o", "%A_%a.out", "-e",
                  "%A_%a.err", "--", "sh", "-c", 'echo "task $SLURM_ARRAY_TASK_ID"; echo oops >&2',
                  check=True).stdout.strip()
    assert lab.run("wait", jid, "--timeout", "120", timeout=180).returncode == 0
    for task in (0, 1):
        assert (tmp_path / f"{jid}_{task}.out").read_text() == f"task {task}\n"
        assert (tmp_path / f"{jid}_{task}.err").read_text() == "oops\n"


def test_a_missing_folder_fails_the_job_saying_so(lab: Hs, tmp_path: Path) -> None:
    jid = lab.run("submit", "--parsable", "-D", str(tmp_path), "-o", "nosuch/%j.out", "--", "echo", "hi",
                  check=True).stdout.strip()
    assert lab.run("wait", jid, "--timeout", "120", timeout=180).returncode != 0
    assert lab.json("show", jid)["state"] == "FAILED"  # type: ignore[index]
    assert lab.run("logs", jid).stdout == (f"hsched: cannot open the output file {tmp_path}/nosuch/{jid}.out: "
                                           "No such file or directory\n")


def test_a_bad_pattern_is_one_line_and_exit_2(lab: Hs) -> None:
    proc = lab.run("submit", "-o", "slurm-%q.out", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "hsched: error: --output 'slurm-%q.out': unknown %q (known: %j job id, %A array job id, %a array task id, "
        "%x job name, %u user, %N node, %n node index, %t rank, %% a % sign)"]
