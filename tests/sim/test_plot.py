"""`--plot FILE.png`: a readable PNG from results, the CLI flag, one-line errors, the resampling keeps the mean."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.errors import UserError
from hsched.sim.metrics import JobRecord, SimResult, summarize
from hsched.sim.plot import MAX_STEPS, NEEDS_MATPLOTLIB, plot_comparison, resample_steps

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMPARE = ["sim", "compare", "--synthetic", "200", "--cluster", "v100:4,k80:4", "--policy", "fifo,hsched"]


def _result(policy: str, jcts: list[float], busy: list[tuple[float, int]]) -> SimResult:
    """A SimResult built by hand (no simulator: fast, and the shape of the data is known)."""
    records = [
        JobRecord(id=i, name=f"j{i}", job_type="t", gpus=1, arrival_s=0.0, start_s=0.0, end_s=jct, jct_s=jct,
                  queue_s=0.0, run_s=jct, restarts=0, migrations=0, last_gpu_type="v100", fastest_runtime_s=jct,
                  ftf_rho=1.0, overhead_s=0.0)
        for i, jct in enumerate(jcts)
    ]
    return summarize(records, policy=policy, trace="hand-made", capacity={"v100": 4, "k80": 4}, unschedulable=[],
                     unfinished=[], rounds=1, preemptions=0, busy_gpu_s=0.0, lost_gpu_s=0.0, end_s=max(jcts),
                     lower_bound_avg_jct_s=3_600.0, lower_bound_makespan_s=max(jcts), wall_s=0.0, busy=busy)


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    assert width > 600 and height > 300


@pytest.mark.slow  # matplotlib runs fc-list once per process to find fonts
def test_plot_comparison_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    rng = random.Random(0)
    few = _result("fifo", [rng.uniform(600, 400_000) for _ in range(50)], [(0.0, 0), (100.0, 8), (300_000.0, 3)])
    # more change points than MAX_STEPS: drawn through the resampling path
    steps = [(0.0, 0)] + [(float(t), rng.randint(0, 8)) for t in range(1, MAX_STEPS + 500)]
    many = _result("hsched", [rng.uniform(600, 200_000) for _ in range(50)], steps)
    out = tmp_path / "cmp.png"
    import matplotlib

    matplotlib.use("svg")  # the caller's own choice of backend (a notebook's, an application's)...
    plot_comparison([few, many], out, "two policies")
    _assert_png(out)
    assert matplotlib.get_backend().lower() == "svg"  # ...is left alone: the plot draws on its own Agg canvas
    assert [p.name for p in tmp_path.iterdir()] == ["cmp.png"]  # no temporary file left beside it


@pytest.mark.slow  # matplotlib runs fc-list once per process to find fonts
def test_cli_compare_plot_json(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.png"
    r = CliRunner().invoke(app, [*COMPARE, "--plot", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["plot"] == str(out)
    assert {"runs", "lower_bound_avg_jct_s", "lower_bound_makespan_s"} <= doc.keys()
    assert [x["policy"] for x in doc["runs"]] == ["fifo", "hsched"]
    _assert_png(out)


def test_cli_plot_into_missing_folder_exits_2(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "missing" / "out.png"
    r = CliRunner().invoke(app, [*COMPARE, "--plot", str(out)])
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and str(out) in lines[0], r.stderr
    assert not out.parent.exists()


def test_without_matplotlib_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.raises(UserError) as e:
        plot_comparison([_result("fifo", [1_000.0], [(0.0, 0)])], tmp_path / "p.png", "t")
    assert str(e.value) == NEEDS_MATPLOTLIB
    r = CliRunner().invoke(app, [*COMPARE, "--plot", str(tmp_path / "p.png")])
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [f"hsched: error: {NEEDS_MATPLOTLIB}"]
    assert not (tmp_path / "p.png").exists()


def _mean(points: list[tuple[float, float]], end: float) -> float:
    area = sum(v * ((points[i + 1][0] if i + 1 < len(points) else end) - t) for i, (t, v) in enumerate(points))
    return area / (end - points[0][0])


def test_resample_keeps_time_weighted_mean():
    # 0 for 1 s, 10 for 2 s, 4 for 1 s: mean 6 over [0, 4]
    assert _mean(resample_steps([(0.0, 0), (1.0, 10), (3.0, 4)], 4.0, 3), 4.0) == pytest.approx(6.0)
    rng = random.Random(1)
    t = 0.0
    points = []
    for _ in range(20_000):
        points.append((t, float(rng.randint(0, 24))))
        t += rng.expovariate(1 / 37.0)
    end = t + 5.0
    binned = resample_steps(points, end, 2_000)
    assert len(binned) == 2_000
    assert binned[0][0] == 0.0
    assert all(0.0 <= v <= 24.0 for _, v in binned)
    assert _mean(binned, end) == pytest.approx(_mean(points, end), rel=1e-9)


@pytest.mark.slow  # matplotlib runs fc-list once per process to find fonts
def test_cli_single_policy_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "one.png"
    r = CliRunner().invoke(app, ["sim", "--synthetic", "40", "--cluster", "v100:4,k80:4", "--policy", "fifo",
                                 "--plot", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["plot"] == str(out)
    _assert_png(out)
