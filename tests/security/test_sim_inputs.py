"""Issue 27, point 7: `hsched sim` hung on a trace with a `nan` step count (NaN passes every `<= 0` check and
never finishes) and on `--cluster v100:1000000000` (a quarter of a billion servers built before the first
round). The simulator refuses bad traces and absurd clusters in one line naming the file, line and field
(exit 2), and a job larger than the cluster is reported unschedulable with its id, never counted as completed.

The bad-input tests are bounded by pytest-timeout: on the starting code they fail by timing out instead of
hanging the suite. The traces are made from the repo's own fixtures (one row changed)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from tests.conftest import FIXTURES

GAVEL = FIXTURES / "traces" / "gavel-msr"
TIRESIAS = FIXTURES / "traces" / "tiresias" / "60_job.csv"
CLUSTER = "v100:4,p100:4,k80:4"
"""12 GPUs, as in the issue."""


def gavel_trace(tmp_path: Path, column: int, value: str) -> Path:
    """The seed=0 trace's first three rows, the second one's `column` (0-based) set to `value`."""
    rows = (GAVEL / "seed=0" / "0e4a51.trace").read_text().splitlines()[:3]
    cols = rows[1].split("\t")
    cols[column] = value
    rows[1] = "\t".join(cols)
    out = tmp_path / "bad.trace"
    out.write_text("\n".join(rows) + "\n")
    return out


def tiresias_trace(tmp_path: Path, field: str, value: str, rows: int = 5) -> Path:
    """The Tiresias fixture's first `rows` jobs, the second one's `field` set to `value`."""
    with TIRESIAS.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        jobs = [r for _, r in zip(range(rows), reader, strict=False)]
    jobs[1][field] = value
    out = tmp_path / "bad.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(jobs)
    return out


def sim(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["sim", *args])
    return r.exit_code, r.output


def one_line(code: int, output: str) -> str:
    assert code == 2, output
    assert "Traceback" not in output and output.count("\n") == 1, output
    return output


# 7-column Gavel rows: total_steps is column 4, arrival_time 5, scale_factor 6
@pytest.mark.timeout(30)
@pytest.mark.parametrize(("column", "value", "field"), [
    (4, "nan", "total_steps"), (4, "inf", "total_steps"), (4, "-5", "total_steps"),
    (5, "nan", "arrival_time"), (5, "inf", "arrival_time"), (5, "-1", "arrival_time"),
    (6, "nan", "scale_factor"), (6, "inf", "scale_factor"), (6, "-2", "scale_factor"),
    (6, "2000000", "scale_factor"),
])
@pytest.mark.parametrize("mode", [["--policy", "hsched"], ["--round-mode", "gavel", "--policy", "fifo"]])
def test_a_bad_gavel_field_is_refused_naming_file_line_and_field(tmp_path: Path, column: int, value: str,
                                                                 field: str, mode: list[str]) -> None:
    trace = gavel_trace(tmp_path, column, value)
    out = one_line(*sim("--trace", str(trace), "--throughputs", str(GAVEL / "simulation_throughputs.json"),
                        "--cluster", CLUSTER, "--json", *mode))
    assert f"bad.trace:2: {field}:" in out, out


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("field", "value"), [
    ("duration", "nan"), ("duration", "inf"), ("duration", "-164"), ("duration", "1e12"),
    ("submit_time", "nan"), ("submit_time", "inf"), ("submit_time", "-30"),
    ("num_gpu", "nan"), ("num_gpu", "inf"), ("num_gpu", "-8"), ("num_gpu", "1e300"),
])
def test_a_bad_tiresias_field_is_refused_naming_file_line_and_field(tmp_path: Path, field: str,
                                                                    value: str) -> None:
    trace = tiresias_trace(tmp_path, field, value)
    out = one_line(*sim("--trace", str(trace), "--cluster", CLUSTER, "--json"))
    assert f"bad.csv:3: {field}:" in out, out


@pytest.mark.timeout(30)
def test_a_job_running_for_centuries_is_refused(tmp_path: Path) -> None:
    """A finite step count can still be decades of simulated time (a time-sharing policy rounds every 360 s
    while it runs): refused with the job's name, not replayed for hours."""
    trace = gavel_trace(tmp_path, 4, "1e12")
    out = one_line(*sim("--trace", str(trace), "--throughputs", str(GAVEL / "simulation_throughputs.json"),
                        "--cluster", CLUSTER))
    assert "job bad:2:" in out and "days at its fastest" in out, out


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("args", "needle"), [
    (["--cluster", "v100:1000000000"], "--cluster 'v100:1000000000': 1,000,000,000 GPUs"),
    (["--cluster", "v100:60000,k80:60000"], "the simulator takes up to 100,000"),
    (["--cluster", f"v100:{'9' * 30}"], "--cluster"),
    (["--cluster", "v100:4", "--gpus-per-node", "100000"], "--gpus-per-node 100000"),
    (["--cluster", "v100:4", "--round-s", "nan"], "--round-s"),
    (["--cluster", "v100:4", "--round-s", "0.000001"], "--round-s"),
    (["--cluster", "v100:4", "--checkpoint-cost", "nan"], "--checkpoint-cost"),
    (["--cluster", "v100:4", "--span-factor", "inf"], "--span-factor"),
    (["--cluster", "v100:4", "--slurm-pool", "v100:1000000000"], "--slurm-pool"),
    (["--cluster", "v100:4", "--slurm-pool", "v100:8:nan"], "--slurm-pool"),
    (["--cluster", "v100:4", "--data-model", "synthetic", "--data-link-gbps", "nan"], "--data-link-gbps"),
    (["--cluster", "v100:4", "--data-model", f"synthetic:{'9' * 5000}"], "--data-model"),
    (["--cluster", "v100:4", "--jobs-per-hour", "nan"], "--jobs-per-hour"),
    (["--cluster", "v100:4", "--max-jobs", "0"], "--max-jobs"),
])
def test_absurd_clusters_and_options_are_refused_in_one_line(args: list[str], needle: str) -> None:
    out = one_line(*sim("--synthetic", "5", *args))
    assert needle in out, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [["--policy", "hsched"], ["--policy", "fifo"], ["--policy", "las"],
                                  ["--round-mode", "gavel", "--policy", "fifo"]])
def test_a_job_larger_than_the_cluster_is_unschedulable_never_completed(tmp_path: Path, mode: list[str]) -> None:
    trace = tiresias_trace(tmp_path, "num_gpu", "1000000", rows=6)
    jobs_csv = tmp_path / "jobs.csv"
    code, out = sim("--trace", str(trace), "--cluster", CLUSTER, "--json", "--jobs-csv", str(jobs_csv), *mode)
    assert code == 0, out
    summary = json.loads(out)
    why = {u["id"]: u["reason"] for u in summary["unschedulable"]}
    assert "1000000" in why[1], why  # (the fixture's 8-GPU job 1 too: no type has 8 GPUs here)
    assert summary["unschedulable_jobs"] == len(why)
    # the others completed; it did not
    assert summary["jobs"] + len(why) == 6 and summary["unfinished_jobs"] == 0, summary
    with jobs_csv.open(newline="") as f:
        done = list(csv.DictReader(f))
    assert len(done) == summary["jobs"]
    assert "1" not in {r["id"] for r in done}, done


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_hsched_sim_on_a_nan_trace_exits_at_once(tmp_path: Path) -> None:
    """The command itself, as a user runs it: one line, exit 2, in seconds (it hung before)."""
    trace = gavel_trace(tmp_path, 4, "nan")
    env = {**os.environ, "HSCHED_HOME": str(tmp_path / "home")}
    p = subprocess.run([sys.executable, "-m", "hsched", "sim", "--trace", str(trace), "--throughputs",
                        str(GAVEL / "simulation_throughputs.json"), "--cluster", CLUSTER],
                       capture_output=True, text=True, timeout=100, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "bad.trace:2: total_steps:" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "hsched", "sim", "--synthetic", "5", "--cluster", "v100:1000000000"],
                       capture_output=True, text=True, timeout=100, env=env)
    assert p.returncode == 2 and "1,000,000,000 GPUs" in p.stderr, p.stderr


@pytest.mark.timeout(30)
def test_a_fleet_file_of_absurd_simulated_nodes_is_refused(tmp_path: Path) -> None:
    """The same bound for `--fleet`: counted before any device is made (a 100,000-GPU node is five billion
    links)."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "a"\nexecutor = "local"\n[node.simulate]\nmodel = "NVIDIA V100-SXM2-16GB"\n'
                     "count = 100000\n")
    out = one_line(*sim("--synthetic", "5", "--fleet", str(fleet)))
    assert "count" in out, out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args", [["--speedup", "nan"], ["--speedup", "inf"], ["--wall", "inf"]])
def test_replay_options_are_finite(tmp_path: Path, args: list[str]) -> None:
    """`hsched replay` is refused before its controller starts."""
    r = CliRunner().invoke(app, ["replay", str(TIRESIAS), "--max-jobs", "3", "--keep", str(tmp_path / "r"), *args])
    one_line(r.exit_code, r.output)
    assert "--speedup" in r.output and not (tmp_path / "r").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rate", ["NaN", "Infinity", "-4.5"])
def test_a_throughput_table_with_a_non_finite_rate_is_refused(tmp_path: Path, rate: str) -> None:
    """JSON takes NaN and Infinity: an infinite rate finished every job of its type at once."""
    table = json.loads((GAVEL / "simulation_throughputs.json").read_text())
    table["v100"]["('ResNet-18 (batch size 16)', 1)"]["null"] = "RATE"
    bad = tmp_path / "simulation_throughputs.json"
    bad.write_text(json.dumps(table).replace('"RATE"', rate))
    out = one_line(*sim("--trace", str(GAVEL / "seed=0" / "0e4a51.trace"), "--throughputs", str(bad),
                        "--cluster", CLUSTER, "--max-jobs", "5"))
    assert "simulation_throughputs.json: v100 ('ResNet-18 (batch size 16)', 1) rate:" in out, out
