"""Job dependencies as sbatch's `--dependency` means them, as pure functions.

    afterok:12:13       start after jobs 12 and 13 both COMPLETED (never, if either ends otherwise)
    afternotok:15       start after job 15 ended in failure (FAILED, CANCELLED, TIMEOUT, LOST)
    afterany:13         start after job 13 ended, however it ended
    afterok:5_3         start after task 3 of array 5 completed (`afterok:5`: after every task of it)
    after:12            start after job 12 started (or ended without ever starting)
    singleton           start when no other job of the same name and user is running
    a,b                 all of them (sbatch's `,`)     a?b   any of them (sbatch's `?`)

A dependency that can never be satisfied (afterok on a job that failed) makes the job wait with reason
`DependencyNeverSatisfied`, or cancels it with `--kill-on-invalid-dep`, as Slurm does.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hsched.model import Dependency, DepKind, Job, JobState
from hsched.spec.jobids import job_id, task_index

_DEP_RE = re.compile(r"^(after|afterok|afternotok|afterany)((?::\d+(?:_\d+)?)+)$|^(singleton)$")
HELP = ("a dependency such as afterok:12, afterany:13:14, afternotok:15, afterok:12_3 (one array task) or singleton "
        "(joined by , or ?)")


def parse_dependency(text: str) -> tuple[tuple[Dependency, ...], bool]:
    """The dependencies in `text` and whether any one suffices (`?`) rather than all (`,`). ValueError naming
    what is expected (a job id out of the store's range too: hsched.spec.jobids)."""
    text = text.strip()
    if not text:
        raise ValueError(HELP)
    if "," in text and "?" in text:
        raise ValueError("either , (all of) or ? (any of), not both, as sbatch")
    any_of = "?" in text
    deps = []
    for part in re.split(r"[,?]", text):
        m = _DEP_RE.match(part.strip())
        if m is None:
            raise ValueError(HELP)
        if m.group(3):
            deps.append(Dependency(DepKind.SINGLETON, ()))
        else:
            words = m.group(2).split(":")[1:]
            ids = tuple(job_id(i) for i in words if "_" not in i)
            tasks = tuple((job_id(a), task_index(t)) for a, _, t in (w.partition("_") for w in words if "_" in w))
            deps.append(Dependency(DepKind(m.group(1)), ids, tasks))
    return tuple(deps), any_of


class DepState(enum.StrEnum):
    SATISFIED = "satisfied"
    WAITING = "Dependency"
    NEVER = "DependencyNeverSatisfied"


@dataclass(frozen=True, slots=True)
class DepVerdict:
    state: DepState
    why: str = ""
    """For NEVER: which dependency failed and how (an event message)."""


_NOT_OK = (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.LOST)


def _one(dep: Dependency, job: Job, others: Mapping[int, Job], running_names: set[tuple[str, str]],
         tasks_of: Mapping[int, Sequence[Job]]) -> DepVerdict:
    if dep.kind is DepKind.SINGLETON:
        if (job.user, job.name) in running_names:
            return DepVerdict(DepState.WAITING)
        return DepVerdict(DepState.SATISFIED)
    waiting = False
    for jid, targets in _targets(dep, others, tasks_of):
        if targets is None:
            return DepVerdict(DepState.NEVER, f"{dep}: job {jid} does not exist")
        for other in targets:
            done = other.state.is_terminal()
            name = other.display_id
            if dep.kind is DepKind.AFTER:
                if not (done or other.start_time is not None):
                    waiting = True
            elif dep.kind is DepKind.AFTERANY:
                waiting |= not done
            elif dep.kind is DepKind.AFTEROK:
                if done and other.state is not JobState.COMPLETED:
                    return DepVerdict(DepState.NEVER, f"{dep}: job {name} ended {other.state.value}")
                waiting |= not done
            elif dep.kind is DepKind.AFTERNOTOK:
                if other.state is JobState.COMPLETED:
                    return DepVerdict(DepState.NEVER, f"{dep}: job {name} completed")
                waiting |= not (done and other.state in _NOT_OK)
    return DepVerdict(DepState.WAITING if waiting else DepState.SATISFIED)


def _targets(dep: Dependency, others: Mapping[int, Job], tasks_of: Mapping[int, Sequence[Job]]
             ) -> list[tuple[str, Sequence[Job] | None]]:
    """Each job or task `dep` names (as typed) with the jobs it stands for; None: there is no such job or task."""
    out: list[tuple[str, Sequence[Job] | None]] = []
    for jid in dep.job_ids:
        first = others.get(jid)
        # an array's id stands for every task of it, as in Slurm
        out.append((str(jid), None if first is None else (tasks_of.get(jid) or (first,))))
    for array_id, index in dep.tasks:
        task = next((t for t in tasks_of.get(array_id, ()) if t.array_task == index), None)
        out.append((f"{array_id}_{index}", None if task is None else (task,)))
    return out


def verdict(job: Job, others: Mapping[int, Job], running_names: set[tuple[str, str]],
            tasks_of: Mapping[int, Sequence[Job]] | None = None) -> DepVerdict:
    """Whether `job` may start as far as its dependencies go. `others`: the jobs its dependencies name, by id;
    `running_names`: (user, name) of every job that is not pending and not ended (for singleton);
    `tasks_of`: for a named id that is an array's, every task of the array."""
    deps = job.spec.dependency
    if not deps:
        return DepVerdict(DepState.SATISFIED)
    verdicts = [_one(d, job, others, running_names, tasks_of or {}) for d in deps]
    if job.spec.dependency_any:
        if any(v.state is DepState.SATISFIED for v in verdicts):
            return DepVerdict(DepState.SATISFIED)
        if all(v.state is DepState.NEVER for v in verdicts):
            return DepVerdict(DepState.NEVER, "; ".join(v.why for v in verdicts))
        return DepVerdict(DepState.WAITING)
    never = [v for v in verdicts if v.state is DepState.NEVER]
    if never:
        return never[0]
    if any(v.state is DepState.WAITING for v in verdicts):
        return DepVerdict(DepState.WAITING)
    return DepVerdict(DepState.SATISFIED)


def named_jobs(deps: Sequence[Dependency]) -> set[int]:
    """The job ids `deps` name: a task's (`12_3`) is its array's (the store finds the task among the array's)."""
    return {j for d in deps for j in d.job_ids} | {a for d in deps for a, _ in d.tasks}


def named_tasks(deps: Sequence[Dependency]) -> set[tuple[int, int]]:
    """The array tasks `deps` name on their own (`12_3`): (array id, index)."""
    return {t for d in deps for t in d.tasks}

