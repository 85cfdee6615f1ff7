"""`srun` inside a batch script (issue 29, item 9): hsched has no srun, and `--ntasks=2` ran the whole script once
per task, so `srun` in it failed. A batch shell script now gets an srun function (hsched.spec.batch.SRUN) that runs its
command once per task of the job, as srun within an allocation. Here the function runs in real shells (bash and
the system's sh), from the very command `hsched submit` makes of the script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hsched.spec.batch import read_batch_script

pytestmark = pytest.mark.slow  # real shells

SHELLS = list(dict.fromkeys(os.path.realpath(s) for s in ("/bin/bash", "/bin/sh", shutil.which("dash") or "")
                            if s and os.path.exists(s)))


def run(tmp_path: Path, shell: str, body: str, tasks: int | None, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sh"
    path.write_text(f"#!{shell}\n#SBATCH -J t\n{body}\n")
    script = read_batch_script(path)
    assert script is not None
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HSCHED_", "BASH_FUNC_"))}
    if tasks is not None:
        base.update(HSCHED_SRUN_TASKS=str(tasks), SLURM_NTASKS=str(tasks))
    base["HSCHED_NODE"] = "n1"
    return subprocess.run(script.command, env={**base, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("shell", SHELLS)
def test_srun_runs_the_command_once_per_task(tmp_path: Path, shell: str) -> None:
    body = ("set -eu\n"
            "srun sh -c 'echo all $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_NPROCS $SLURM_STEP_ID'\n"
            "srun -n 2 sh -c 'echo two $SLURM_PROCID $SLURM_STEP_ID'\n"
            "srun --ntasks=1 -N 1 --mpi=pmix -c 2 --label sh -c 'echo one $SLURM_PROCID of $SLURM_NTASKS'\n"
            "echo after $SLURM_NTASKS")
    p = run(tmp_path, shell, body, 3)
    assert p.returncode == 0, p
    lines = p.stdout.splitlines()
    assert sorted(lines[:3]) == ["all 0 0 3 3 0", "all 1 1 3 3 0", "all 2 2 3 3 0"]
    assert sorted(lines[3:5]) == ["two 0 1", "two 1 1"]
    assert lines[5:] == ["one 0 of 1", "after 3"]  # the batch shell's own variables are untouched


@pytest.mark.parametrize("shell", SHELLS)
def test_the_highest_exit_status_and_failed_tasks_are_said(tmp_path: Path, shell: str) -> None:
    p = run(tmp_path, shell, "srun sh -c 'exit $((SLURM_PROCID * 3))'\necho rc=$?", 3)
    assert p.stdout == "rc=6\n"
    assert sorted(p.stderr.splitlines()) == ["srun: error: n1: task 1: Exited with exit code 3",
                                             "srun: error: n1: task 2: Exited with exit code 6"]
    # under set -e a failing srun ends the script with it, as srun's exit status does
    p = run(tmp_path, shell, "set -e\nsrun sh -c 'exit 4'\necho not reached", 1)
    assert (p.returncode, p.stdout) == (4, "")


@pytest.mark.parametrize("shell", SHELLS)
def test_more_tasks_than_the_job_has_or_no_command_is_an_error(tmp_path: Path, shell: str) -> None:
    p = run(tmp_path, shell, "srun -n 3 echo x; echo rc=$?\nsrun; echo rc=$?\nsrun -n x echo; echo rc=$?", 2)
    assert p.stdout == "rc=1\nrc=1\nrc=1\n"
    assert p.stderr.splitlines() == [
        "srun: error: Unable to create step: 3 tasks requested, the job has 2 (--ntasks)",
        "srun: error: no command to run", "srun: error: --ntasks x: expected a number of tasks"]


@pytest.mark.parametrize("shell", SHELLS)
def test_in_one_of_hscheds_ranks_srun_runs_the_command_once(tmp_path: Path, shell: str) -> None:
    # a job over several nodes: each rank is one task already (SLURM_PROCID set by hsched), no HSCHED_SRUN_TASKS
    p = run(tmp_path, shell, "srun sh -c 'echo rank $SLURM_PROCID of $SLURM_NTASKS'", None, SLURM_PROCID="5",
            SLURM_NTASKS="8")
    assert (p.returncode, p.stdout) == (0, "rank 5 of 8\n")


def test_line_numbers_hold_and_child_bash_shells_see_srun(tmp_path: Path) -> None:
    p = run(tmp_path, "/bin/bash", 'echo "line $LINENO"\nbash -c \'srun echo child\'', 2)
    assert p.returncode == 0, p
    assert p.stdout.splitlines()[0] == "line 3"  # the #! line and #SBATCH line come first, as in the file
    assert p.stdout.splitlines()[1:] == ["child", "child"]
