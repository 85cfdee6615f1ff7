"""Device types a discovery plugin declares, in the simulator (issue 32): `--cluster tenstorrent-n300:8,...` needs
a speed for a type the throughput table, the built-in prior and the accelerator catalog do not know (`--speeds`),
and is refused in one line without one; with one, the table's jobs run there at their rates scaled by it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from hsched.cli import app
from hsched.sim.cluster import fit_speeds, parse_cluster
from hsched.sim.trace import load_trace
from tests.sim.test_loaders import GAVEL

TRACE = str(GAVEL / "ed69ec.trace")
N300 = "tenstorrent-n300"


def sim(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["sim", "--trace", TRACE, "--max-jobs", "30", "--json", *args])
    return r.exit_code, r.output


def test_a_type_with_no_speed_is_refused_in_one_line_naming_the_option() -> None:
    code, out = sim("--cluster", f"{N300}:8,v100:8")
    assert code == 2 and "Traceback" not in out
    assert f"GPU type {N300!r} has no speed" in out and f"--speeds {N300}=REL" in out
    code, out = sim("--cluster", f"{N300}:8", "--speeds", f"{N300}=fast")
    assert code == 2 and "--speeds" in out and "positive speed" in out
    code, out = sim("--cluster", "v100:8", "--speeds", f"{N300}=1")
    assert code == 2 and f"no GPU type {N300!r} in the simulated fleet" in out


def test_the_given_speed_scales_the_tables_rates_and_a_faster_device_finishes_sooner() -> None:
    trace = load_trace(GAVEL / "ed69ec.trace")
    servers = parse_cluster(f"{N300}:4,v100:4")
    model, used = fit_speeds(trace.throughput, servers, {N300: 0.5})
    assert used == {N300: 0.5}
    job = trace.jobs[0]
    v100 = model.rate(job.job_type, job.gpus, "v100")
    assert v100 is not None and trace.throughput.rate(job.job_type, job.gpus, N300) is None  # the table alone
    # the table's types' rates x 0.5 / their prior speed, geometric mean: v100's own rate x 0.5 is one of them
    n300 = model.rate(job.job_type, job.gpus, N300)
    assert n300 is not None and 0 < n300 < v100
    half, double = sim("--cluster", f"{N300}:8", "--speeds", f"{N300}=0.5"), sim("--cluster", f"{N300}:8",
                                                                                 "--speeds", f"{N300}=2")
    assert half[0] == 0 and double[0] == 0
    a, b = json.loads(half[1]), json.loads(double[1])
    assert a["speeds"] == {N300: 0.5} and a["unschedulable_jobs"] == 0 and a["cluster"] == {N300: 8}
    # 4x the speed, all else equal: the jobs (run there alone) take far less time
    assert b["avg_jct_s"] < a["avg_jct_s"] / 2 and b["makespan_s"] < a["makespan_s"] / 2


def test_a_type_the_catalog_knows_takes_its_relative_speed() -> None:
    """MI210: not in Gavel's table or the built-in prior; the accelerator catalog says 1.6 x a V100."""
    code, out = sim("--cluster", "mi210:8")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["speeds"] == {"mi210": 1.6} and doc["unschedulable_jobs"] == 0
