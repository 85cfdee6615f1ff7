"""What a policy knows in the simulator when it is not handed the truth: learned speeds and predicted durations.

By default a simulated policy reads the trace's throughput table (the oracle: every job's speed on every GPU
type, before it ever ran) and clairvoyant policies read true remaining work. The live controller has neither:
it learns speeds from the jobs' progress (hsched.learn.kinds) and predicts durations from the history of completed
jobs (hsched.learn.predict). These two classes give the simulator the same knowledge, from the same functions, so
`hsched sim --learned --predict` measures what the product would do on the trace:

* `Learner`: the policy's throughput model starts from the accelerator table's relative speeds alone
  (`hsched.learn.kinds.catalog_prior`); each stint of a job on a GPU type that ran long enough joins a learned table
  per (job type, GPU type, GPU count, placement class) with `hsched.learn.kinds.averaged`, and the model is
  `hsched.learn.kinds.learned_model` over it, rebuilt only when something was learned since the last one.
* `Predictor`: a job's expected running time is `hsched.learn.predict.expected_duration` over the completed jobs of
  its type (its user's, else anyone's), else the median of every completed job so far, else one hour.

Pure: no I/O, no clock; deterministic for a given order of calls.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from hsched.learn.kinds import (
    KindRate,
    PlacementClass,
    _fallback,
    averaged,
    catalog_prior,
    learned_model,
    measured_prior,
)
from hsched.learn.predict import HISTORY, expected_duration
from hsched.sched.throughput import ThroughputModel

RateKey = tuple[str, str, int, PlacementClass]
"""(job type, GPU type, GPU count, placement class): what one learned speed is of."""

_JOINED = (PlacementClass.SINGLE, PlacementClass.NVLINK, PlacementClass.PCIE)
"""The placement classes learned_model averages into one table (spanning placements are a table apart)."""

DEFAULT_GUESS_S = 3600.0
"""A job's expected duration when nothing has completed yet."""


class Learner:
    """The learned table and the policy's throughput model built from it.

    Args:
        gpu_types: the fleet's GPU types (the model completes every measured key on each of them).
        prior: relative speed per GPU type to start from; default the accelerator table's (catalog_prior()).
        refine_prior: re-estimate the prior's GPU-type speeds from what was measured (`measured_prior`) at
            each rebuild; True is what the live controller does (hsched.controller.learning).
    """

    def __init__(self, gpu_types: Iterable[str], prior: Mapping[str, float] | None = None,
                 refine_prior: bool = False) -> None:
        self.gpu_types = tuple(sorted(set(gpu_types)))
        self.prior = dict(catalog_prior() if prior is None else prior)
        self.refine_prior = refine_prior
        self.rates: dict[RateKey, KindRate] = {}
        self.observations = 0
        self.rebuilds = 0
        self._changed = True
        self._model: ThroughputModel = _fallback(ThroughputModel(prior=self.prior))

    def observe(self, job_type: str, gpu_type: str, gpus: int, klass: PlacementClass, steps_per_s: float,
                now: float) -> None:
        """One stint's measured speed joins its key's moving average."""
        if steps_per_s <= 0:
            return
        key = (job_type, gpu_type, gpus, klass)
        old = self.rates.get(key)
        runs = old.runs if old is not None else 0
        speed = averaged(old.steps_per_s if old is not None else None, runs, steps_per_s)
        self.rates[key] = KindRate(job_type, gpu_type, gpus, klass, speed, runs + 1, now)
        self.observations += 1
        # The model changes with a new key or a new speed; one more run at the same speed changes it only where
        # the runs weigh it against another placement class of the same GPU type (learned_model averages single,
        # NVLink and PCIe by runs). In the simulator a key's speed is the same every time, so this spares
        # nearly every rebuild once the job types have run.
        if old is None or speed != old.steps_per_s or (
                klass is not PlacementClass.SPANNING
                and any((job_type, gpu_type, gpus, c) in self.rates for c in _JOINED if c is not klass)):
            self._changed = True

    def model(self) -> ThroughputModel:
        """The policy's model: rebuilt when something was learned since the last call, else the same object
        (the round and the policies memoise per model: a model that changes every round would defeat that)."""
        if self._changed:
            self._changed = False
            if self.rates:
                prior = (measured_prior(self.rates.values(), self.prior, self.gpu_types) if self.refine_prior
                         else self.prior)
                # as the live controller: the measured ratios complete the job types that ran; one that never
                # ran keeps the starting prior
                self._model = _fallback(learned_model(self.rates.values(), self.gpu_types, self.prior,
                                                      completion=prior))
                self.rebuilds += 1
        return self._model


class Predictor:
    """Expected running times from the jobs completed so far (hsched.learn.predict.expected_duration).

    Args:
        default_s: the guess when no job has completed yet.
    """

    def __init__(self, default_s: float = DEFAULT_GUESS_S) -> None:
        self.default_s = default_s
        self._mine: dict[tuple[str, str], list[float]] = {}
        self._kind: dict[str, list[float]] = {}
        self._all: list[float] = []  # sorted, for the median of everything so far
        self._cache: dict[tuple[str, str], float] = {}
        self._errors: list[float] = []

    def done(self, job_type: str, user: str, duration_s: float, predicted_s: float | None = None) -> None:
        """A job completed after `duration_s` of running time; `predicted_s`: what was expected at its start."""
        for history in (self._mine.setdefault((job_type, user), []), self._kind.setdefault(job_type, [])):
            history.append(duration_s)
            if len(history) > 4 * HISTORY:
                del history[:-HISTORY]  # only the last HISTORY are ever read
        bisect.insort(self._all, duration_s)
        self._cache.clear()
        if predicted_s is not None and duration_s > 0:
            self._errors.append(abs(predicted_s - duration_s) / duration_s)

    def expected(self, job_type: str, user: str) -> float:
        """Expected running time of a job of this type by this user."""
        key = (job_type, user)
        hit = self._cache.get(key)
        if hit is None:
            got = expected_duration(self._mine.get(key, ()), self._kind.get(job_type, ()))
            if got is None:
                n = len(self._all)
                if n:  # the trace's median so far (the middle two's mean when even, as statistics.median)
                    got = self._all[n // 2] if n % 2 else (self._all[n // 2 - 1] + self._all[n // 2]) / 2
                else:
                    got = self.default_s
            hit = self._cache[key] = got
        return hit

    @staticmethod
    def remaining(elapsed_s: float, expected_s: float) -> float:
        """Running time still expected of a job that has run `elapsed_s`: its expected duration's rest, or, once
        it has outlived that, as long again as it has run (heavy-tailed durations: the longer a job has run the
        longer it is likely to keep running; the `hsched` policy's own guess when it weighs a move)."""
        return expected_s - elapsed_s if expected_s > elapsed_s else elapsed_s

    @property
    def mean_abs_error(self) -> float | None:
        """Mean relative error |predicted - actual| / actual of the predictions made at the jobs' starts."""
        return sum(self._errors) / len(self._errors) if self._errors else None
