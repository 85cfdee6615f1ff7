"""Data locality in the simulator (issue #15): the wait-or-copy rule, copies and their cache, aware vs ignore."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.sched import make_policy
from hsched.sched.locality import Locality, choose_wait, copy_seconds, leaves_room, link_bytes_per_s
from hsched.sim.cluster import parse_cluster
from hsched.sim.data import GB, DataModel, Dataset, DataState, SyntheticSpec, parse_data_model, synthetic_data
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.trace import load_trace, synthetic
from tests.sched.handmade import model, trace
from tests.sim.test_loaders import GAVEL

LINK = link_bytes_per_s(10.0)  # 1.25 GB/s: 100 GB copies in 80 s


# ---------------------------------------------------------------- the pure rule


def test_copy_seconds():
    assert LINK == 1.25e9
    assert copy_seconds(100 * GB, LINK) == pytest.approx(80.0)
    assert copy_seconds(0, LINK) == 0.0
    assert copy_seconds(GB, 0.0) == math.inf


def test_wait_rule_at_its_boundary():
    assert choose_wait(80.0, 80.0)  # a tie: waiting moves no bytes for the same start
    assert not choose_wait(80.0, math.nextafter(80.0, math.inf))
    assert choose_wait(80.0, 79.0)
    assert choose_wait(80.0, -5.0)  # an overdue prediction counts as now
    assert not choose_wait(80.0, None)  # no holder can ever hold the job
    assert not choose_wait(80.0, math.nan)
    assert not choose_wait(0.0, 1.0)  # nothing to copy: never wait


def test_the_wait_so_far_counts_against_the_copy():
    assert choose_wait(160.0, 50.0, 110.0)  # 110 s waited + 50 s to go = the copy: still a tie
    assert not choose_wait(160.0, 50.0, 110.001)
    assert not choose_wait(160.0, 0.0, 200.0)  # waited past the copy: copy even if the holder is free now
    assert not choose_wait(160.0, 10.0, math.nan)


def test_a_held_holder_takes_others_only_when_it_still_has_room_in_time():
    assert leaves_room(30.0, 30.0)  # room for the waiting job exactly when promised
    assert not leaves_room(math.nextafter(30.0, math.inf), 30.0)
    assert not leaves_room(None, 30.0)  # never room again: the other job would take the waiting job's place
    assert not leaves_room(math.nan, 30.0)


# ---------------------------------------------------------------- hand-made replays

def _data(home: str, size_gb: float = 100.0, jobs: int = 2) -> DataModel:
    return DataModel((Dataset("d0", round(size_gb * GB), home),), dict.fromkeys(range(jobs), 0), LINK, 10_000 * GB)


def _run(tr, data: DataModel, locality: Locality):
    # two one-GPU servers, fast-0 and fast-1; without data, best fit takes fast-0 first (by name)
    cfg = SimConfig(data=data, locality=locality)
    return simulate(tr, parse_cluster("fast:2", 1), make_policy("fifo-hetero"), cfg)


def test_aware_takes_the_holder_ignore_pays_the_copy():
    # one job of 100 s (A: 200 work at 2/s on fast) whose data is on fast-1
    tr = trace(("A", 1, 0.0, 200.0))
    aware, ignore = (_run(tr, _data("fast-1", jobs=1), m) for m in Locality)
    assert aware.summary["avg_jct_s"] == pytest.approx(100.0)
    assert ignore.summary["avg_jct_s"] == pytest.approx(100.0 + 80.0)  # the copy to fast-0, GPUs held
    assert (aware.summary["data_copies"], ignore.summary["data_copies"]) == (0, 1)
    assert ignore.summary["data_bytes_copied"] == 100 * GB
    assert ignore.records[0].copy_s == pytest.approx(80.0)
    assert (aware.summary["data_hit_rate"], ignore.summary["data_hit_rate"]) == (1.0, 0.0)


@pytest.mark.parametrize(("arrival", "waits"), [(50.0, True), (20.0, True), (10.0, False)])
def test_second_job_waits_for_the_holder_only_when_it_frees_before_the_copy(arrival, waits):
    # job 0 runs 0..100 on fast-0, the data's home. Job 1, same data, arrives at `arrival`: the holder frees in
    # 100 - arrival s; the copy to fast-1 takes 80 s. Aware waits when 100 - arrival <= 80 (JCT 200 - arrival),
    # else copies as ignore always does (JCT 80 + 100).
    tr = trace(("A", 1, 0.0, 200.0), ("A", 1, arrival, 200.0))
    aware, ignore = (_run(tr, _data("fast-0"), m) for m in Locality)
    jct1 = {m: {r.id: r.jct_s for r in res.records}[1] for m, res in zip(Locality, (aware, ignore), strict=True)}
    assert jct1[Locality.IGNORE] == pytest.approx(180.0)
    assert jct1[Locality.AWARE] == pytest.approx(200.0 - arrival if waits else 180.0)
    assert ignore.summary["avg_jct_s"] - aware.summary["avg_jct_s"] == pytest.approx(
        (arrival - 20.0) / 2 if waits else 0.0)
    assert aware.summary["data_waits"] == (1 if waits else 0)
    assert aware.summary["data_copies"] == (0 if waits else 1)


def _holder_and_stream() -> tuple:
    """Two 2-GPU servers, all data (200 GB: 160 s to copy) on fast-0. Jobs 0 and 1 (one GPU each) hold fast-0
    until 100 and 150 s. Job 2 (two GPUs, arrives at 10) finds only fast-1 free: fast-0 has room for it in 140 s,
    before the copy would end (160 s), so it waits for fast-0. Job 3 (one GPU, reads nothing) arrives at 20. A stream
    of one-GPU jobs (4 to 9) reading the same data arrives every 50 s from 100 s, each as a GPU of fast-0 frees, and
    runs 100 s."""
    jobs = [("A", 1, 0.0, 200.0), ("A", 1, 0.0, 300.0), ("G", 2, 10.0, 800.0), ("B", 1, 20.0, 200.0)]
    jobs += [("A", 1, 100.0 + 50.0 * k, 200.0) for k in range(6)]
    reads = {i: 0 for i in range(len(jobs)) if i != 3}
    data = DataModel((Dataset("d0", 200 * GB, "fast-0"),), reads, LINK, 10_000 * GB)
    return trace(*jobs), data


def test_a_waiting_job_holds_its_holder_against_the_jobs_behind_it():
    # Before the fix (the wait rule alone, reserving nothing), each stream job took the GPU fast-0 freed, the
    # prediction for job 2 slid by 50 s each time and stayed under the copy, so job 2 waited 10 times, until the
    # stream ended: it started at 500 s, 490 s after it arrived, where a copy would have cost 160 s (mean JCT 202 s;
    # now 188 s).
    tr, data = _holder_and_stream()
    res = simulate(tr, parse_cluster("fast:4", 2), make_policy("fifo-hetero"),
                   SimConfig(data=data, locality=Locality.AWARE))
    rec = {r.id: r for r in res.records}
    assert rec[2].start_s == pytest.approx(150.0)  # on fast-0 as soon as job 1 left it, no copy
    assert rec[2].copy_s == 0.0
    # job 4 (at 100 s) was kept off the GPU job 0 freed, held for job 2: it went to fast-1 and copied there
    assert rec[4].start_s == pytest.approx(100.0) and rec[4].copy_s == pytest.approx(160.0)
    s = res.summary
    assert (s["data_wait_jobs"], s["data_gave_up"], s["data_backfills"]) == (1, 0, 0)
    assert s["data_wait_s"] == pytest.approx(140.0)


def test_the_gpus_a_waiting_job_was_counted_go_to_the_job_behind_it():
    # FIFO grants job 2 the two free GPUs (of fast-1) at 20 s too; it waits for fast-0 instead, and the round runs
    # again without it, so job 3 (one GPU, no data) starts at once rather than at the next event (100 s)
    tr, data = _holder_and_stream()
    res = simulate(tr, parse_cluster("fast:4", 2), make_policy("fifo-hetero"),
                   SimConfig(data=data, locality=Locality.AWARE))
    rec = {r.id: r for r in res.records}
    assert rec[3].start_s == pytest.approx(20.0)
    assert rec[3].copy_s == 0.0


def test_a_copy_arriving_is_waited_for_not_copied_again():
    # fast-0 gets the data at 0..80 for job 0 (home fast-1 is busy with job 1); job 2 lands on fast-0 at 100
    state = DataState(_data("fast-1", jobs=3))
    assert state.acquire(0, ["fast-0"], 1, 0.0) == pytest.approx(80.0)
    assert state.acquire(0, ["fast-0"], 1, 30.0) == pytest.approx(50.0)  # the rest of the copy under way
    assert state.copies == 1
    assert state.acquire(0, ["fast-1"], 1, 30.0) == 0.0  # the home copy
    assert state.hits == 2 and state.starts == 3


def test_least_recently_used_copies_go_past_the_quota_never_one_in_use():
    datasets = tuple(Dataset(f"d{i}", 60 * GB, "home") for i in range(3))
    state = DataState(DataModel(datasets, {0: 0, 1: 1, 2: 2}, LINK, 100 * GB))  # room for one copy
    state.acquire(0, ["s"], 1, 0.0)
    state.acquire(1, ["s"], 1, 0.0)  # over quota, but d0 is in use: both stay
    assert set(state.cached["s"]) == {0, 1}
    state.release(0, ["s"], 0.0)  # d0 is no longer read: the cache goes back under quota, d0 out
    assert set(state.cached["s"]) == {1}
    state.release(1, ["s"], 0.0)
    state.acquire(2, ["s"], 1, 0.0)  # d1 least recently used and idle: evicted for d2
    assert set(state.cached["s"]) == {2}
    assert state.evictions == 2
    assert state.ready_in("s", 0, 0.0) is None and state.ready_in("home", 0, 0.0) == 0.0


# ---------------------------------------------------------------- the synthetic model, determinism


def test_synthetic_data_is_reproducible_and_spans_its_sizes():
    tr = synthetic(200, seed=1, jobs_per_hour=6.0, throughput=model(), reference_type="fast")
    servers = parse_cluster("fast:8,slow:8", 4)
    spec = SyntheticSpec(4, 50.0, 500.0)
    a = synthetic_data(tr, servers, spec, seed=7)
    assert a == synthetic_data(tr, servers, spec, seed=7)
    assert a != synthetic_data(tr, servers, spec, seed=8)
    assert all(50 * GB <= d.size_bytes <= 500 * GB for d in a.datasets)
    assert {d.home for d in a.datasets} <= {s.name for s in servers}
    # one dataset per job type: jobs of a type read the same data
    by_type: dict[str, set[int]] = {}
    for j in tr.jobs:
        if j.job_type:  # (a job of no known type, here an 8-GPU gang, reads data of its own)
            by_type.setdefault(j.job_type, set()).add(a.of_job[j.id])
    assert len(by_type) > 1 and all(len(v) == 1 for v in by_type.values())


@pytest.mark.parametrize("locality", list(Locality))
def test_same_seed_same_replay(locality):
    tr = synthetic(150, seed=3, jobs_per_hour=6.0, throughput=model(), reference_type="fast")
    servers = parse_cluster("fast:8,slow:8", 4)
    runs = []
    for _ in range(2):
        data = synthetic_data(tr, servers, SyntheticSpec(4, 50.0, 500.0), seed=5, quota_gb=300.0)
        runs.append(simulate(tr, servers, make_policy("hsched"), SimConfig(data=data, locality=locality)))
    a, b = runs
    assert a.records == b.records
    assert {k: v for k, v in a.summary.items() if k != "wall_s"} == {
        k: v for k, v in b.summary.items() if k != "wall_s"}
    assert a.summary["data_copies"] > 0


def test_without_a_data_model_nothing_changes():
    tr = synthetic(80, seed=2, jobs_per_hour=6.0, throughput=model(), reference_type="fast")
    servers = parse_cluster("fast:8,slow:8", 4)
    r = simulate(tr, servers, make_policy("hsched"))
    assert "locality" not in r.summary and "data_copies" not in r.summary
    assert all(x.copy_s == 0.0 for x in r.records)


def test_parse_data_model():
    assert parse_data_model("synthetic") == SyntheticSpec()
    assert parse_data_model("synthetic:4") == SyntheticSpec(4)
    assert parse_data_model("Synthetic:4:10-20") == SyntheticSpec(4, 10.0, 20.0)


# ---------------------------------------------------------------- the command line


def test_cli_compares_aware_and_ignore():
    r = CliRunner().invoke(app, ["sim", "compare", "--trace", str(GAVEL / "ed69ec.trace"), "--cluster",
                                 "v100:4,p100:4,k80:4", "--policy", "hsched", "--max-jobs", "60", "--data-model",
                                 "synthetic:8:50-500", "--locality", "aware,ignore", "--json"])
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["runs"]
    assert [x["locality"] for x in runs] == ["aware", "ignore"]
    for x in runs:
        for k in ("data_bytes_copied", "data_copies", "data_copy_s", "data_hit_rate", "data_model"):
            assert k in x
    assert runs[1]["data_waits"] == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--locality", "aware"], "--locality needs --data-model"),
    (["--data-model", "synth:3"], "--data-model 'synth:3'"),
    (["--data-model", "synthetic:0"], "K >= 1"),
    (["--data-model", "synthetic", "--locality", "near"], "--locality 'near'"),
    (["--data-model", "synthetic", "--locality", "aware,ignore"], "`hsched sim compare` runs several"),
    (["--data-model", "synthetic", "--data-link-gbps", "0"], "--data-link-gbps"),
])
def test_bad_data_options_exit_2_with_one_line(args, needle):
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_a_hold_for_a_job_waiting_for_data_never_stalls_the_replay():
    # seed 0 at 1 Gbit/s: an 8-GPU gang heading hsched's order was refused a server held for a job behind it that
    # waited for its data there; with nothing left running no event lapsed the hold, and 11 jobs never ran
    tr = load_trace(GAVEL.parents[1] / "tiresias" / "60_job.csv")
    servers = parse_cluster("v100:8", 4)
    data = synthetic_data(tr, servers, SyntheticSpec(8, 50.0, 500.0), seed=0, link_gbps=1.0)
    r = simulate(tr, servers, make_policy("hsched"), SimConfig(data=data))
    assert (r.summary["jobs"], r.summary["unfinished_jobs"]) == (60, 0)
