"""QoS caps: how many GPUs a class, and each user in it, may hold at once, and how many jobs a user may run.

    [qos.normal]
    max_gpus = 16              # every job of the class together       (Slurm's GrpTRES=gres/gpu=16)
    max_gpus_per_user = 2      # one user's jobs of the class together  (MaxTRESPerUser=gres/gpu=2)
    max_jobs_per_user = 4      # one user's jobs of the class at once   (MaxJobsPerUser=4)

A job whose start would go over a cap waits, with the limit's name as its reason (`QOSMaxGpuPerUserLimit`,
`QOSGrpGpuLimit`, `QOSMaxJobsPerUserLimit`, as squeue says them), and neither starts nor preempts anyone
until the class or the user holds less. Every job that holds devices counts (launching, running, being
stopped): its GPUs are not free until it is gone. Pure: the live round keeps one `Tally` and grows it with each
start it decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from hsched.model import EndReason, Job, Resources


class QosLimitsLike(Protocol):
    """What the caps read of a settings QoS class (hsched.config.QosClass)."""

    @property
    def max_gpus(self) -> int | None: ...

    @property
    def max_gpus_per_user(self) -> int | None: ...

    @property
    def max_jobs_per_user(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class QosLimits:
    """One class's caps; None: no cap."""

    max_gpus: int | None = None
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None

    @classmethod
    def from_qos(cls, table: Mapping[str, QosLimitsLike]) -> dict[str, QosLimits]:
        """The caps of a settings QoS table (`Settings.qos`), for the classes that have any."""
        out = {}
        for name, q in table.items():
            lim = cls(q.max_gpus, q.max_gpus_per_user, q.max_jobs_per_user)
            if lim != cls():
                out[name] = lim
        return out


def gpus_of(res: Resources) -> int:
    """GPUs a job holds in all (per node, times its nodes)."""
    return res.gpus * res.nodes


def job_gpus(job: Job) -> int:
    """The GPUs a job holds: a heterogeneous job's components' together (its `resources` are component 0's)."""
    if job.spec.components:
        return sum(gpus_of(c.resources) for c in job.spec.components)
    return gpus_of(job.spec.resources)


def never_within(res: Resources, qos: str, limits: Mapping[str, QosLimits]) -> str | None:
    """Why a request can never start under its class's caps, whatever else runs (a request larger than the
    cap itself), or None. The submit refuses such a job rather than queue it for ever."""
    lim = limits.get(qos)
    if lim is None:
        return None
    gpus = gpus_of(res)
    if lim.max_jobs_per_user is not None and lim.max_jobs_per_user < 1:
        return f"QoS class {qos!r} allows no jobs (max_jobs_per_user = 0); use another --qos"
    if lim.max_gpus_per_user is not None and gpus > lim.max_gpus_per_user:
        return (f"it asks for {gpus} GPU(s) but QoS class {qos!r} allows {lim.max_gpus_per_user} per user "
                "(max_gpus_per_user); lower --gpus or use another --qos")
    if lim.max_gpus is not None and gpus > lim.max_gpus:
        return (f"it asks for {gpus} GPU(s) but QoS class {qos!r} allows {lim.max_gpus} in all (max_gpus); "
                "lower --gpus or use another --qos")
    return None


class Tally:
    """What each class and each user holds during one round, and whether a job's start would go over a cap."""

    __slots__ = ("class_gpus", "limits", "user_gpus", "user_jobs")

    def __init__(self, limits: Mapping[str, QosLimits], holders: Iterable[Job] = ()) -> None:
        self.limits = limits
        self.class_gpus: dict[str, int] = {}
        self.user_gpus: dict[tuple[str, str], int] = {}
        self.user_jobs: dict[tuple[str, str], int] = {}
        if limits:  # (without caps nothing is counted: a round's 512 holders need not be looked at)
            for j in holders:
                self.add(j)

    def blocked(self, job: Job) -> str | None:
        """The cap the job's start would break (its squeue reason), or None."""
        qos = job.spec.qos
        lim = self.limits.get(qos)
        if lim is None:
            return None
        key = (qos, job.user)
        gpus = job_gpus(job)
        if lim.max_jobs_per_user is not None and self.user_jobs.get(key, 0) + 1 > lim.max_jobs_per_user:
            return EndReason.QOS_MAX_JOBS_PER_USER.value
        if gpus and lim.max_gpus_per_user is not None and self.user_gpus.get(key, 0) + gpus > lim.max_gpus_per_user:
            return EndReason.QOS_MAX_GPU_PER_USER.value
        if gpus and lim.max_gpus is not None and self.class_gpus.get(qos, 0) + gpus > lim.max_gpus:
            return EndReason.QOS_GRP_GPU.value
        return None

    def add(self, job: Job) -> None:
        """The job holds (or will hold) its devices."""
        qos = job.spec.qos
        if qos not in self.limits:
            return
        key = (qos, job.user)
        gpus = job_gpus(job)
        self.class_gpus[qos] = self.class_gpus.get(qos, 0) + gpus
        self.user_gpus[key] = self.user_gpus.get(key, 0) + gpus
        self.user_jobs[key] = self.user_jobs.get(key, 0) + 1
