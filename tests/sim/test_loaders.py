"""Trace loaders on the real published files (copied into tests/fixtures/traces) and on small files of our own."""

from __future__ import annotations

import pytest

from hsched.errors import UserError
from hsched.sched import make_policy
from hsched.sched.throughput import parse_gavel_key
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import simulate
from hsched.sim.trace import Trace, load_csv, load_trace, parse_columns, synthetic
from tests.conftest import FIXTURES

GAVEL = FIXTURES / "traces" / "gavel-msr" / "seed=0"
TIRESIAS = FIXTURES / "traces" / "tiresias"


def test_gavel_key_parsing():
    assert parse_gavel_key("('ResNet-50 (batch size 64)', 1)") == ("ResNet-50 (batch size 64)", 1)
    assert parse_gavel_key("('LM (batch size 80)', 8)") == ("LM (batch size 80)", 8)
    assert parse_gavel_key("null") is None
    # a literal, never code; quotes and commas inside the name are fine; anything else is junk
    assert parse_gavel_key("(\"Bob's model, v2 (bs 8)\", 4)") == ("Bob's model, v2 (bs 8)", 4)
    for junk in ("__import__('os').system('true')", "('x', True)", "('', 1)", "('x', 1, 2)", "('x', 1.5)", "("):
        assert parse_gavel_key(junk) is None


def test_gavel_ed69ec():
    tr = load_trace(GAVEL / "ed69ec.trace")
    assert len(tr.jobs) == 951
    assert all(j.gpus == 1 for j in tr.jobs)
    assert tr.throughput.rate("ResNet-50 (batch size 64)", 1, "v100") == pytest.approx(4.394774823323071)
    # the bound the traces README publishes, from our loader and throughput model
    fastest = [j.work / max(tr.throughput.rate(j.job_type, 1, t) for t in ("v100", "p100", "k80")) for j in tr.jobs]
    assert sum(fastest) / len(fastest) == pytest.approx(111_916, abs=1)


def test_gavel_gang_trace_runs_scales_without_throughput_on_the_prior_and_reports_them():
    tr = load_trace(GAVEL / "ee9e8c.trace")
    assert len(tr.jobs) == 2000
    sliced = Trace(tr.jobs[:120], tr.throughput, tr.source)
    s = simulate(sliced, parse_cluster("v100:16,p100:16,k80:16", 4), make_policy("hsched")).summary
    model = tr.throughput
    unmeasured = [j for j in sliced.jobs if not model.measured(j.job_type, j.gpus)]
    assert unmeasured, "slice should contain (job type, scale) pairs the table lacks"
    # they run on the table's scaling prior, and the summary counts them ...
    assert s["prior_rate_jobs"] == len(unmeasured)
    # ... except those no GPU type is big enough for, which are reported with that reason
    too_big = {j.id for j in sliced.jobs if j.gpus > 16}
    reported = {u["id"]: u["reason"] for u in s["unschedulable"]}
    assert set(reported) == too_big and all("GPUs of one type" in r for r in reported.values())
    assert s["jobs"] + s["unschedulable_jobs"] + s["unfinished_jobs"] == 120


def test_scaling_prior_by_gpu_count():
    model = load_trace(GAVEL / "ed69ec.trace").throughput
    # a type measured at 1 and 4 GPUs: its own figure, no estimate
    jt = "ResNet-18 (batch size 64)"
    assert model.measured(jt, 4) and model.rate(jt, 4, "v100") == model._table["v100"][(jt, 4)]
    # A3C is measured alone only: 4 GPUs run at its 1-GPU rate times the table's geometric-mean 4-GPU speedup
    assert model.measured("A3C", 1) and not model.measured("A3C", 4)
    ratios = [model._table["v100"][(t, 4)] / model._table["v100"][(t, 1)] for t, s in model.known_keys()
              if s == 4 and (t, 1) in model._table["v100"]]
    gm = __import__("math").prod(ratios) ** (1 / len(ratios))
    assert model.rate("A3C", 4, "v100") == pytest.approx(model.rate("A3C", 1, "v100") * gm)
    # a count the table never measured (16) scales linearly from the largest measured one (8)
    assert model.rate("A3C", 16, "k80") == pytest.approx(model.rate("A3C", 8, "k80") * 2)
    # a job type the table does not know at all still has no rate (no reference type for Gavel traces)
    assert model.rate("no such model", 1, "v100") is None


def test_gavel_10_column_variant(tmp_path):
    line7 = (GAVEL / "ed69ec.trace").read_text().splitlines()[0].split("\t")
    # 10 columns: type, command, workdir, num_steps_arg, needs_data_dir, total_steps, scale, priority, SLO, arrival
    row = [line7[0], line7[1], "/wd", line7[2], line7[3], line7[4], line7[6], "1", "-1", "42.0"]
    f = tmp_path / "ten.trace"
    f.write_text("\t".join(row) + "\n")
    tr = load_trace(f, throughputs=GAVEL.parent / "simulation_throughputs.json")
    (j,) = tr.jobs
    assert (j.job_type, j.gpus, j.arrival_s, j.work) == (line7[0], 1, 42.0, float(line7[4]))


def test_gavel_bad_line_names_file_and_line(tmp_path):
    (tmp_path / "simulation_throughputs.json").write_text('{"v100": {}}')
    f = tmp_path / "bad.trace"
    f.write_text("a\tb\tc\n")
    with pytest.raises(UserError, match=r"bad.trace:1: expected 7 or 10"):
        load_trace(f)


def test_tiresias_csv():
    tr = load_trace(TIRESIAS / "60_job.csv")
    assert len(tr.jobs) == 60
    assert tr.work_unit == "seconds"
    assert {j.gpus for j in tr.jobs} >= {1, 8}
    s = simulate(tr, parse_cluster("v100:64", 4), make_policy("hsched")).summary
    assert s["jobs"] == 60


def test_generic_csv_with_preset_and_rejections(tmp_path):
    f = tmp_path / "helios.csv"
    f.write_text(
        "job_id,user,vc,gpu_num,node_num,state,submit_time,duration\n"
        "a,u1,vc1,2,1,COMPLETED,2020-04-01 00:00:10,100\n"
        "b,u2,vc1,0,1,COMPLETED,2020-04-01 00:00:00,50\n"
        "c,u2,vc1,1,1,FAILED,2020-04-01 00:00:00,30\n"
    )
    tr = load_csv(f, parse_columns("helios"))
    assert [(j.name, j.arrival_s, j.gpus, j.user) for j in tr.jobs] == [("c", 0.0, 1, "u2"), ("a", 10.0, 2, "u1")]
    assert tr.rejected == (("b", "no GPUs"),)


def test_unknown_csv_layout_asks_for_columns(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("foo,bar\n1,2\n")
    with pytest.raises(UserError, match="--columns"):
        load_trace(f)


def test_synthetic_is_seeded():
    a, b, c = synthetic(50, seed=1), synthetic(50, seed=1), synthetic(50, seed=2)
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs
    assert {j.gpus for j in synthetic(400, seed=1).jobs} == {1, 2, 4, 8}
