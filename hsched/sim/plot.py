"""`--plot FILE.png` for `hsched sim` and `hsched sim compare`: JCT distributions and utilization over time.

matplotlib is an optional extra (`pip install 'hsched[plot]'`): it is imported here, lazily, only when a plot
is asked for, so the CLI starts fast and works without it.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsched.errors import UserError
from hsched.sim.metrics import SimResult

NEEDS_MATPLOTLIB = "--plot needs matplotlib: pip install 'hsched[plot]'"

# A long trace under a time-sharing policy changes the GPUs held hundreds of thousands of times; drawn as is,
# the steps blur into a solid band and Agg spends seconds on it. Past MAX_STEPS change points a series is
# drawn as time-weighted averages over RESAMPLE_BINS equal bins instead (a few bins per pixel column).
MAX_STEPS = 5_000
RESAMPLE_BINS = 2_000


def _matplotlib() -> Any:
    """The matplotlib module, or a one-line UserError saying how to install it. The process's backend is left
    alone (a notebook or an application importing hsched keeps its own): plots are drawn on an Agg canvas
    of their own (plot_comparison), which needs no display."""
    try:
        import matplotlib
    except ImportError:
        raise UserError(NEEDS_MATPLOTLIB) from None
    return matplotlib


def check_target(path: Path) -> None:
    """Fail now, before minutes of simulation, if the plot could not be written: no matplotlib or no folder."""
    _matplotlib()
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"{path}: cannot write the plot: folder {folder} does not exist")
    if path.is_dir():
        raise UserError(f"{path}: cannot write the plot: is a folder, expected a file name like plot.png")


def resample_steps(points: Sequence[tuple[float, float]], end: float, bins: int) -> list[tuple[float, float]]:
    """A step series (t, value from t on) as `bins` equal bins over [first t, end], each the time-weighted mean.

    The area under the series, hence its time-weighted mean (the utilization the summary reports), is kept.
    Plain Python, O(points + bins): it runs once per plot, and numpy would add nothing worth a dependency.
    """
    if not points or bins < 1 or end <= points[0][0]:
        return list(points)
    start = points[0][0]
    width = (end - start) / bins
    edges = [start + k * width for k in range(bins)] + [end]
    area = [0.0] * bins
    for i, (t, value) in enumerate(points):
        t1 = min(points[i + 1][0] if i + 1 < len(points) else end, end)
        b = min(int((t - start) / width), bins - 1)
        while t < t1 and b < bins:
            seg_end = min(t1, edges[b + 1])
            if seg_end > t:  # float rounding may put t a hair past its bin's right edge: nothing to add there
                area[b] += value * (seg_end - t)
                t = seg_end
            b += 1
    return [(edges[k], area[k] / (edges[k + 1] - edges[k])) for k in range(bins)]


def _utilization(result: SimResult, end: float) -> tuple[list[float], list[float]]:
    """(x, y) for a post-step plot of the fraction of GPUs held, closed at `end` so the last level shows."""
    total = sum(result.summary["cluster"].values()) or 1
    points = [(t, held / total) for t, held in result.busy] or [(0.0, 0.0)]
    if len(points) > MAX_STEPS:
        points = resample_steps(points, end, RESAMPLE_BINS)
    xs = [t for t, _ in points] + [max(end, points[-1][0])]
    ys = [v for _, v in points] + [points[-1][1]]
    return xs, ys


def _end_s(result: SimResult) -> float:
    s = result.summary
    return max(s.get("makespan_s") or 0.0, result.busy[-1][0] if result.busy else 0.0)


def plot_comparison(results: Sequence[SimResult], path: Path, title: str) -> None:
    """One PNG at `path`: (a) empirical CDF of JCT per policy, (b) fraction of GPUs held over time per policy.

    Raises a one-line UserError when matplotlib is missing or the folder does not exist. The file is replaced
    atomically, so a reader (or a browser tab reloading it) never sees half a PNG.
    """
    check_target(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The object API rather than pyplot: no global figure registry to leak into, or to clean up after an error.
    fig = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_cdf, ax_util = fig.subplots(1, 2)
    fig.suptitle(title)

    any_jct = False
    for r in results:
        jcts = sorted(rec.jct_s / 3600.0 for rec in r.records if rec.jct_s > 0)  # log axis: zero has no place
        avg_h = r.summary["avg_jct_s"] / 3600.0
        label = f"{r.summary['policy']} (avg JCT {avg_h:,.1f} h)"
        if not jcts:
            ax_cdf.plot([], [], label=label)
            continue
        any_jct = True
        n = len(jcts)
        ax_cdf.step(jcts, [(i + 1) / n for i in range(n)], where="post", label=label)
    bound_s = results[0].summary["lower_bound_avg_jct_s"] if results else 0.0
    if bound_s > 0:
        ax_cdf.axvline(bound_s / 3600.0, color="black", linestyle="--", linewidth=1,
                       label=f"lower bound of avg JCT ({bound_s / 3600.0:,.1f} h)")
        any_jct = True
    if any_jct:
        ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (hours, log scale)")
    ax_cdf.set_ylabel("fraction of jobs finished within")
    ax_cdf.set_ylim(0, 1.02)
    ax_cdf.set_title("JCT distribution")
    ax_cdf.grid(True, which="both", alpha=0.3)
    ax_cdf.legend(loc="upper left", fontsize="small")  # a CDF rises left to right: that corner stays empty

    end = max((_end_s(r) for r in results), default=0.0)
    # days once the run is longer than three of them: 200 ticks of hours are unreadable
    unit, per = ("days", 86_400.0) if end > 3 * 86_400 else ("hours", 3_600.0)
    total_gpus = max((sum(r.summary["cluster"].values()) for r in results), default=0)
    for r in results:
        xs, ys = _utilization(r, end)
        ax_util.step([x / per for x in xs], ys, where="post", linewidth=0.8,
                     label=f"{r.summary['policy']} (util {r.summary['utilization']:.2f})")
    ax_util.set_xlabel(f"simulated time ({unit})")
    ax_util.set_ylabel(f"fraction of the {total_gpus} GPUs held")
    ax_util.set_ylim(0, 1.05)
    if end > 0 and not math.isinf(end):
        ax_util.set_xlim(0, end / per)
    ax_util.set_title("utilization over time")
    ax_util.grid(True, alpha=0.3)
    # below the panel: every corner inside it is where some policy's utilization drops
    ax_util.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(4, max(1, len(results))),
                   fontsize="small", frameon=False)

    _write_atomic(fig, path)


def _write_atomic(fig: Any, path: Path) -> None:
    """Save to a temporary file beside `path`, then rename over it (same folder: same filesystem, atomic).

    Opened with plain open() rather than mkstemp so the PNG gets the usual umask permissions, not 0600.
    No fsync: a plot lost to a power cut is redrawn by rerunning; a reader must only never see half of one.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("xb") as f:
            fig.savefig(f, format="png")  # format given: the temporary name does not end in .png
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write the plot: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
