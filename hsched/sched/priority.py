"""The multifactor priority's arithmetic (Slurm's priority/multifactor, classic fair share), as the scheduling core
computes it: the weights, each factor, and the one value per user through which the caller hands the core what fair
share knows (`UserShare`). Pure functions: what the controller learns of usage (hsched.learn.fairshare) reaches the
core as these numbers, never by an import of the layers above."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    """Settings' `[priority]`: how the multifactor priority weighs its factors (Slurm's PriorityWeight*), and what
    normalises age (PriorityMaxAge). Each factor is in [0, 1]; a job's priority is the weighted sum."""

    fairshare: float = 10_000.0
    """The user's fair-share factor (Slurm classic, with what the selection hands out counted: `charged_factor`)."""
    age: float = 1_000.0
    """Time the job has waited (not run), over `max_age_s`, at most 1."""
    size: float = 1_000.0
    """GPUs the job asks for, over the fleet's (Slurm's default favours large jobs: they starve otherwise)."""
    max_age_s: float = 7 * 86400.0
    """Waiting this long gives the full age factor (Slurm's PriorityMaxAge, 7 days)."""


class UserShare(float):
    """One user's entry of `PolicyInput.user_usage`: the float is what it always was (decayed GPU-seconds per equal
    share, `policy_usage`), and it carries what the multifactor priority needs besides: the user's decayed
    GPU-seconds, their normalised share of the lab, the whole lab's decayed GPU-seconds (classic fair share is a
    fraction of the lab's usage, not of the round's users'), the ids of their jobs whose priority an admin set
    (those may order across users), and the weights.

    A float, not a record, because the live round hands the controller's values through to the policy as they
    are, keyed by user (hsched.sched.live builds no fair share of its own): one value per user is the whole
    channel. Read-only once made."""

    __slots__ = ("admin_jobs", "decayed_s", "hold_s", "lab_decayed_s", "norm_share", "weights")
    decayed_s: float
    norm_share: float
    lab_decayed_s: float
    admin_jobs: frozenset[int]
    weights: PriorityWeights
    hold_s: float
    """How long the lab's runs typically hold their GPUs (`Ledger.typical_run_s`; 0: unknown): what fair share
    counts a GPU handed out in a selection as."""

    def __new__(cls, per_share: float, *, decayed_s: float, norm_share: float, lab_decayed_s: float,
                admin_jobs: frozenset[int] = frozenset(), weights: PriorityWeights | None = None,
                hold_s: float = 0.0) -> UserShare:
        self = super().__new__(cls, per_share)
        for k, v in (("decayed_s", decayed_s), ("norm_share", norm_share), ("lab_decayed_s", lab_decayed_s),
                     ("admin_jobs", admin_jobs), ("weights", weights or PriorityWeights()), ("hold_s", hold_s)):
            object.__setattr__(self, k, v)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"UserShare is read-only ({name})")

    def __reduce__(self) -> tuple[object, ...]:
        return (_user_share, (float(self), self.decayed_s, self.norm_share, self.lab_decayed_s, self.admin_jobs,
                              self.weights, self.hold_s))

    def __repr__(self) -> str:
        return (f"UserShare({float(self)!r}, decayed_s={self.decayed_s!r}, norm_share={self.norm_share!r}, "
                f"lab_decayed_s={self.lab_decayed_s!r})")


def _user_share(v: float, d: float, n: float, t: float, a: frozenset[int], w: PriorityWeights, hold: float
                ) -> UserShare:
    return UserShare(v, decayed_s=d, norm_share=n, lab_decayed_s=t, admin_jobs=a, weights=w, hold_s=hold)


def charged_factor(decayed_s: float, charged_s: float, norm_share: float, lab_decayed_s: float,
                   lab_charge_s: float) -> float:
    """The classic fair-share factor 2^(-effective usage / normalised share), with what a selection hands out
    counted as usage: `charged_s` the user's (their GPUs held now and started so far, times the policy's quantum),
    `lab_charge_s` the whole selection's (the fleet's GPUs times the quantum). Effective usage is then

        (decayed + charged) / (lab decayed + lab charge)

    a mix of the user's fraction of the lab's past usage and their fraction of the fleet now, the latter weighing
    as one quantum of the whole fleet. Without a charge it is sshare's factor (`share_rows`)."""
    total = lab_decayed_s + lab_charge_s
    if norm_share <= 0:
        return 0.0
    if total <= 0:
        return 1.0
    return 2.0 ** (-((decayed_s + charged_s) / total) / norm_share)


@dataclass(frozen=True, slots=True)
class PriorityTerms:
    """A job's multifactor priority, factor by factor (sprio's columns): each factor in [0, 1] and its weight."""

    fairshare: float
    age: float
    size: float
    weights: PriorityWeights
    admin: int | None = None
    """The priority an admin set on the job (it orders across users, ahead of the sum); None: none."""

    @property
    def total(self) -> float:
        w = self.weights
        return w.fairshare * self.fairshare + w.age * self.age + w.size * self.size

    def as_dict(self) -> dict[str, object]:
        w = self.weights
        return {"fairshare": round(self.fairshare, 6), "age": round(self.age, 6), "size": round(self.size, 6),
                "weight_fairshare": w.fairshare, "weight_age": w.age, "weight_size": w.size,
                "admin_priority": self.admin, "total": round(self.total, 3)}


def age_factor(waited_s: float, max_age_s: float) -> float:
    """Time waited over PriorityMaxAge, at most 1 (0 max age: every waiting job has the full factor)."""
    if max_age_s <= 0:
        return 1.0
    return min(1.0, max(0.0, waited_s) / max_age_s)


def size_factor(gpus: int, fleet_gpus: int) -> float:
    """GPUs asked for over the fleet's, at most 1."""
    return min(1.0, gpus / fleet_gpus) if fleet_gpus > 0 else 0.0
