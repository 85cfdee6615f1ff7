"""sbatch's `-o/--output` and `-e/--error` file name patterns: checked at submit, expanded for each run.

    %j  the job id               %A  the array's job id (the job id outside an array)
    %a  the array task id        %x  the job name
    %u  the user                 %N  the node the run is on
    %n  the node's index in the job (0 on a single node)
    %t  the rank (0 for a job of one task)
    %%  a %                      %4j a number zero-padded to 4 digits (ignored for names)

As sbatch: a pattern with a backslash is taken literally (the backslashes removed, nothing replaced), and %a
outside an array is 4294967294 (Slurm's "no value"), so a script written for both keeps its file names. Any
other letter is refused at submit, naming the known ones. A relative path is the run's node's business (it is
relative to the job's working folder there), so nothing here resolves paths.
"""

from __future__ import annotations

import re

from hsched.model import Job, Run

KNOWN = "jAaxuNnt%"
NO_ARRAY_TASK = 4294967294
"""What sbatch writes for %a in a job that is not an array task (Slurm's NO_VAL)."""
_MAX_WIDTH = 10  # sbatch's cap on a zero-padding width
_FIELD = re.compile(r"%(\d*)(.?)", re.DOTALL)
_ENV_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^/]*")


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a file name pattern, or None."""
    if not pattern.strip():
        return "expected a file name (patterns: %j %A %a %x %u %N %n %t %%)"
    if "\0" in pattern:
        return "contains a NUL character; give a file name"
    if "\\" in pattern:
        return None  # literal, as sbatch
    for m in _FIELD.finditer(pattern):
        letter = m.group(2)
        if not letter:
            return "ends with a lone %: write %% for a % sign"
        if letter not in KNOWN:
            return (f"unknown %{letter} (known: %j job id, %A array job id, %a array task id, %x job name, "
                    "%u user, %N node, %n node index, %t rank, %% a % sign)")
    return None


def env_like(pattern: str) -> bool:
    """`A=1`: what `-e` meant before it became sbatch's --error (hsched's --env)."""
    return _ENV_LIKE.fullmatch(pattern) is not None


def expand(pattern: str, *, job_id: int, array_id: int | None, array_task: int | None, name: str, user: str,
           node: str, node_index: int = 0, rank: int = 0) -> str:
    """The file name `pattern` (checked by pattern_problem) makes for one run."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers = {"j": job_id, "A": array_id if array_id is not None else job_id,
               "a": array_task if array_task is not None else NO_ARRAY_TASK, "n": node_index, "t": rank}
    names = {"x": name, "u": user, "N": node, "%": "%"}

    def one(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        if letter in numbers:
            return str(numbers[letter]).zfill(min(int(width or 0), _MAX_WIDTH))
        return names[letter]

    return _FIELD.sub(one, pattern)


def for_run(job: Job, run: Run) -> tuple[str | None, str | None]:
    """(output file, error file) of `run` on its node, expanded; None where the job gave none (its error file
    None: stderr goes where stdout goes, as sbatch's)."""
    tpn = max(job.spec.resources.tasks_per_node, 1)

    def one(pattern: str | None) -> str | None:
        if pattern is None:
            return None
        return expand(pattern, job_id=job.id, array_id=job.array_id, array_task=job.array_task, name=job.name,
                      user=job.user, node=run.node, node_index=run.rank // tpn, rank=run.rank)

    return one(job.spec.output), one(job.spec.error)
