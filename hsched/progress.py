"""Progress reports from inside a job: `from hsched.progress import report`.

    from hsched.progress import report
    for step in range(start, total):
        train_one_step()
        report(step=step + 1, total=total, loss=loss)

Each call appends a JSON line to the file named by `HSCHED_PROGRESS` (hsched sets it for every run), at most
once a second (the last call always counts: it is written at exit). Outside hsched the variable is not set
and `report` does nothing, so a trainer keeps it in unconditionally. Standard library only: a job's
environment needs nothing but this file, and a job without hsched installed can write the same lines itself
(`echo "step=1200 total=50000" >> "$HSCHED_PROGRESS"`, or a JSON object with `step`, optional `total`,
`samples`, `loss`).

The controller reads the file with its monitoring stream (no extra SSH round trip), learns the job's steps
per second on its GPUs (`hsched kinds`) and shows its progress (`hsched show`).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

ENV = "HSCHED_PROGRESS"
EVERY_S = 1.0
"""At most one line a second: a trainer may call `report` every step."""

class _Reporter:
    """The last report not yet written, and when a line was last written (one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_write = float("-inf")
        """time.monotonic() of the last write: the wall clock stepped back must not silence the reports."""
        self.pending: dict[str, float] | None = None
        self.registered = False

    def write(self, path: str) -> None:
        if self.pending is None:
            return
        try:
            with open(path, "a") as f:
                f.write(json.dumps(self.pending) + "\n")
        except OSError:
            return  # progress is a nicety: a full disk must not fail the training
        self.pending = None
        self.last_write = time.monotonic()


_R = _Reporter()


def report(step: float | None = None, total: float | None = None, *, samples: float | None = None,
           loss: float | None = None) -> None:
    """Record the job's progress: `step` (steps done), `total` (steps in all, when known), `samples`
    (samples seen), `loss`. A no-op outside hsched."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = {k: float(v) for k, v in (("step", step), ("total", total), ("samples", samples), ("loss", loss))
            if v is not None}
    if not line:
        return
    line["t"] = time.time()
    with _R.lock:
        if not _R.registered:
            atexit.register(flush)
            _R.registered = True
        _R.pending = line
        if time.monotonic() - _R.last_write >= EVERY_S:
            _R.write(path)


def flush() -> None:
    """Write the last report now (done at exit by itself)."""
    path = os.environ.get(ENV)
    if path:
        with _R.lock:
            _R.write(path)
