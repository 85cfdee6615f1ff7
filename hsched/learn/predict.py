"""Predictions: how long a job will run, when a running one will end.

* **Remaining time of a running job**: from its progress when it reports a `total` (steps left over its
  current speed); else from its kind's history: the expected duration minus what it has run (none once it
  has run longer than that: the history has nothing to say about it any more).
* **Expected duration of a job**: the median of the last HISTORY runs of the same kind by the same user
  (at least TRUST of them), else of the kind by anyone, else none (Helios's and QSSF's observation: a user's
  repeated jobs of one kind take about as long as the last ones did). Durations are running time (all the
  job's attempts), of jobs that completed.

When a waiting job would start (`submit --test-only`, `queue --start`) is no rule of this module's: the
controller's own round, stepped forward through these predictions, says it (hsched.controller.forecast).

Pure: no I/O. hsched.controller.learning keeps the history and records how wrong the predictions were.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

HISTORY = 10
"""The last runs a prediction looks at: recent enough to follow a kind that changes."""
TRUST = 2
"""Fewer runs than this of a (user, kind) and the kind's runs by anyone are used instead."""


def expected_duration(mine: Sequence[float], everyone: Sequence[float]) -> float | None:
    """Median running time of the user's last runs of the kind, else everyone's, else None."""
    for history in (mine, everyone):
        recent = list(history)[-HISTORY:]
        if len(recent) >= TRUST:
            return float(statistics.median(recent))
    return None


def remaining(elapsed_s: float, expected_s: float | None, step: float | None = None, total: float | None = None,
              steps_per_s: float | None = None) -> float | None:
    """Seconds a running job still needs: from its progress when it can tell, else from its expected
    duration; None when neither can."""
    if step is not None and total is not None and steps_per_s and total >= step:
        return (total - step) / steps_per_s
    if expected_s is not None and expected_s >= elapsed_s:
        return expected_s - elapsed_s
    return None
