"""`hsched sim` on the command line: JSON fields of the contract, exit code 2 with one clear line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from hsched.cli import app
from tests.sim.test_loaders import GAVEL

CONTRACT_FIELDS = (
    "jobs", "unschedulable_jobs", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s",
    "utilization", "preemptions", "gpu_hours_lost", "max_ftf_rho", "lower_bound_avg_jct_s", "lower_bound_makespan_s",
    "avg_jct_over_bound", "wall_s",
)


def test_sim_json(tmp_path):
    out = tmp_path / "jobs.csv"
    r = CliRunner().invoke(app, ["sim", "--trace", str(GAVEL / "ed69ec.trace"), "--cluster", "v100:4,p100:4,k80:4",
                                 "--policy", "hsched", "--max-jobs", "40", "--json", "--jobs-csv", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    for k in CONTRACT_FIELDS:
        assert k in data
    assert data["jobs"] == 40
    assert len(out.read_text().splitlines()) == 41


def test_sim_synthetic_compare_json():
    r = CliRunner().invoke(app, ["sim", "compare", "--synthetic", "40", "--cluster", "v100:4,k80:4",
                                 "--policy", "fifo,hsched", "--json"])
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["runs"]
    assert [x["policy"] for x in runs] == ["fifo", "hsched"]


def test_bad_cluster_spec_exits_2():
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100=4"])
    assert r.exit_code == 2
    assert "--cluster" in r.output and "TYPE:COUNT" in r.output


def test_missing_trace_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["sim", "--trace", str(tmp_path / "nope.trace"), "--cluster", "v100:4"])
    assert r.exit_code == 2
    assert "nope.trace" in r.output


def test_unknown_policy_exits_2():
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", "--policy", "fif"])
    assert r.exit_code == 2
    assert "known:" in r.output


def test_list_policies():
    r = CliRunner().invoke(app, ["sim", "--list-policies", "--json"])
    assert r.exit_code == 0
    names = {p["name"] for p in json.loads(r.stdout)}
    assert {"fifo", "fifo-hetero", "las", "las-hetero", "ftf", "srtf-oracle", "backfill", "hsched"} <= names


def test_settings_and_time_sharing_options(tmp_path):
    base = ["sim", "--synthetic", "40", "--cluster", "v100:4,k80:4", "--policy", "las", "--json"]
    shared = CliRunner().invoke(app, base)
    alone = CliRunner().invoke(app, [*base, "--no-time-sharing"])
    assert shared.exit_code == 0 and alone.exit_code == 0, shared.output + alone.output
    assert json.loads(shared.stdout)["preemptions"] > 0
    assert json.loads(alone.stdout)["preemptions"] == 0  # one class, no time-sharing: nobody may be stopped
    settings = tmp_path / "settings.toml"
    settings.write_text('[qos.research]\npreempts = ["scavenger"]\n')
    assert CliRunner().invoke(app, [*base, "--settings", str(settings)]).exit_code == 0
    r = CliRunner().invoke(app, [*base, "--settings", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "--settings" in r.output
