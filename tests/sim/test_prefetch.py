"""The simulator's prefetch (issue #15): the live controller's rule, copies ahead of a start, hits and waste."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.sched import make_policy
from hsched.sched.locality import Locality, link_bytes_per_s
from hsched.sim.cluster import parse_cluster
from hsched.sim.data import GB, DataModel, Dataset, DataState, SyntheticSpec, Waiting, prefetch_copies, synthetic_data
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.trace import Trace, TraceJob, load_trace
from tests.sched.handmade import model, trace

LINK = link_bytes_per_s(10.0)  # 100 GB copies in 80 s
TIRESIAS = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "tiresias" / "60_job.csv"


def _model(homes: tuple[str, ...], of_job: dict[int, int], quota_gb: float = 10_000.0) -> DataModel:
    return DataModel(tuple(Dataset(f"d{i}", 100 * GB, h) for i, h in enumerate(homes)), of_job, LINK,
                     round(quota_gb * GB))


def _run(tr, data: DataModel, locality: Locality, prefetch_s: float | None):
    # two one-GPU servers: the first two jobs take fast-0 and fast-1 (best fit, by name)
    cfg = SimConfig(data=data, locality=locality, prefetch_s=prefetch_s)
    return simulate(tr, parse_cluster("fast:2", 1), make_policy("fifo-hetero"), cfg)


# ---------------------------------------------------------------- hand-made replays


@pytest.mark.parametrize("locality", list(Locality))
@pytest.mark.parametrize(("short_work", "saved"), [(1000.0, 80.0), (100.0, 49.0)])
def test_a_prefetch_starts_the_job_computing_earlier_by_what_it_copied(locality, short_work, saved):
    # fast-0 runs a 10,000 s job and holds d0; fast-1 frees after short_work / 2 s. The job reading d0 arrives at
    # t=1: waiting 9,999 s for the holder loses to an 80 s copy, and fast-1 frees within the horizon, so its data
    # goes there at once. With 500 s to go the copy is whole by then: the job starts computing 80 s earlier; with
    # 49 s to go it waits for the rest (31 s) and gains the 49 s the copy ran ahead.
    tr = trace(("A", 1, 0.0, 20_000.0), ("A", 1, 0.0, short_work), ("A", 1, 1.0, 200.0))
    data = _model(("fast-0",), {2: 0})
    free_at = short_work / 2.0
    before, after = (_run(tr, data, locality, p) for p in (None, 900.0))
    jct = {r.id: r.jct_s for r in before.records}
    assert jct[2] == pytest.approx(free_at - 1.0 + 80.0 + 100.0)
    got = {r.id: r for r in after.records}
    assert got[2].jct_s == pytest.approx(jct[2] - saved)
    assert got[2].copy_s == pytest.approx(80.0 - saved)
    assert got[2].start_s == pytest.approx(free_at)
    s = after.summary
    assert (s["data_prefetches"], s["data_prefetch_hits"], s["data_prefetch_wasted"]) == (1, 1, 0)
    assert s["data_prefetch_bytes"] == 100 * GB and s["data_bytes_copied"] == 100 * GB
    assert before.summary["data_prefetches"] == 0


def test_no_prefetch_past_the_horizon():
    # fast-1 frees in 499 s: past a 400 s horizon plus the 80 s copy, so nothing is copied ahead
    tr = trace(("A", 1, 0.0, 20_000.0), ("A", 1, 0.0, 1000.0), ("A", 1, 1.0, 200.0))
    data = _model(("fast-0",), {2: 0})
    near, far = (_run(tr, data, Locality.AWARE, h) for h in (419.0, 418.0))
    assert near.summary["data_prefetches"] == 1
    assert far.summary["data_prefetches"] == 0
    assert far.records == _run(tr, data, Locality.AWARE, None).records


@pytest.mark.parametrize("locality", list(Locality))
def test_a_prefetch_no_start_uses_is_wasted(locality):
    # fast-0 runs 3,000 s and holds d0; fast-1 frees at 800 s. The data job arrives at t=1 and its data goes to
    # fast-1 ahead. At t=100 a job of higher priority arrives: first in the queue order, it takes fast-1 at 800 s
    # (EASY backfill's order is the live queue's), and the data job starts at 3,000 s on fast-0, which holds its
    # data: the copy to fast-1 was wasted.
    jobs = [*trace(("A", 1, 0.0, 6000.0), ("A", 1, 0.0, 1600.0), ("A", 1, 1.0, 200.0)).jobs,
            TraceJob(3, "A", 1, 100.0, 10_000.0, name="j3", priority=5)]
    tr = Trace(tuple(jobs), model(), "hand-made", "steps")
    cfg = SimConfig(data=_model(("fast-0",), {2: 0}), locality=locality, prefetch_s=900.0)
    r = simulate(tr, parse_cluster("fast:2", 1), make_policy("backfill"), cfg)
    s = r.summary
    assert (s["data_prefetches"], s["data_prefetch_hits"], s["data_prefetch_wasted"]) == (1, 0, 1)
    start = {x.id: x.start_s for x in r.records}
    assert start[3] == pytest.approx(800.0) and start[2] == pytest.approx(3000.0)
    assert all(x.copy_s == 0.0 for x in r.records)


def test_prefetched_copies_keep_to_the_quota_and_an_evicted_one_is_wasted():
    state = DataState(_model(("h", "h"), {}, quota_gb=100.0))  # room for one copy
    assert state.prefetch(0, "x", 0.0)
    assert not state.prefetch(0, "x", 1.0)  # arriving already: not copied again
    assert not state.prefetch(1, "x", 10.0)  # d0 is still arriving, so cannot go: no room (the live copy fails)
    assert state.prefetch_refused == 1 and state.evictions == 0
    assert state.prefetch(1, "x", 100.0)  # d0 arrived and nobody reads it: evicted for d1
    assert state.ready_in("x", 0, 100.0) is None
    assert state.acquire(1, ["x"], 1, 150.0) == pytest.approx(30.0)  # a start on d1's prefetch: the rest of it
    s = state.summary()
    assert (s["data_prefetches"], s["data_prefetch_hits"], s["data_prefetch_wasted"]) == (2, 1, 1)
    assert (s["data_copies"], s["data_evictions"], s["data_hit_rate"], s["data_prefetch_refused"]) == (2, 1, 1.0, 1)


def test_an_arriving_prefetch_is_not_evicted_for_a_start():
    state = DataState(_model(("h", "h"), {}, quota_gb=100.0))
    assert state.prefetch(0, "x", 0.0)
    assert state.acquire(1, ["x"], 1, 10.0) == pytest.approx(80.0)  # over the quota: d0 still arriving stays
    assert state.ready_in("x", 0, 10.0) == pytest.approx(70.0) and state.evictions == 0
    state.release(1, ["x"], 200.0)  # both idle now: d0, the least recently used and never used, goes
    assert state.ready_in("x", 0, 200.0) is None and state.ready_in("x", 1, 200.0) == 0.0
    assert state.summary()["data_prefetch_wasted"] == 1


def _free_in(ends: dict[str, list[float]]):
    """free_in(server, n) from each GPU's predicted free time (0: free now): when the n-th first frees."""
    return lambda name, n: sorted(ends[name])[n - 1] if n <= len(ends[name]) else None


def test_the_rule_gives_the_jobs_ahead_the_gpus_they_take_first():
    # as the live rule's test (tests/sched/test_data_placement.py): a holds the data and frees in 2 h, b in 10 min
    state = DataState(_model(("a",), {2: 0}))
    data_job = Waiting(2, 1, ("a", "b"))
    ends = {"a": [7200.0], "b": [600.0]}
    assert prefetch_copies(state, [data_job], _free_in(ends), 0.0, 900.0) == [(2, "b", 0)]
    # behind a job that will take b first it is not (that copy would be wasted) ...
    assert prefetch_copies(state, [Waiting(1, 1, ("a", "b")), data_job], _free_in(ends), 0.0, 900.0) == []
    # ... unless b has room for both
    roomy = {"a": [7200.0], "b": [600.0, 600.0]}
    assert prefetch_copies(state, [Waiting(1, 1, ("a", "b")), data_job], _free_in(roomy), 0.0, 900.0) == [
        (2, "b", 0)]
    # not soon: b frees past the horizon plus the copy (80 s)
    assert prefetch_copies(state, [data_job], _free_in({"a": [7200.0], "b": [981.0]}), 0.0, 900.0) == []
    assert prefetch_copies(state, [data_job], _free_in({"a": [7200.0], "b": [980.0]}), 0.0, 900.0) != []
    # waiting for the holder is as good as the copy: no copy
    assert prefetch_copies(state, [data_job], _free_in({"a": [80.0], "b": [0.0]}), 0.0, 900.0) == []
    assert prefetch_copies(state, [data_job], _free_in({"a": [81.0], "b": [0.0]}), 0.0, 900.0) == [(2, "b", 0)]


def test_the_rule_looks_at_eight_jobs_with_data_among_the_first_64():
    state = DataState(_model(tuple("h" for _ in range(10)), {i: i for i in range(10)}))
    many = {"h": [1e9], "x": [0.0] * 100}
    queue = [Waiting(i, 1, ("x",)) for i in range(10)]
    assert prefetch_copies(state, queue, _free_in(many), 0.0, 900.0) == [(i, "x", i) for i in range(8)]
    # a gang that must span servers is passed over, and does not count among the eight
    queue = [Waiting(0, 8, ()), *queue[1:]]
    assert [j for j, _, _ in prefetch_copies(state, queue, _free_in(many), 0.0, 900.0)] == list(range(1, 9))
    # 63 jobs without data ahead: only the first data job is within the 64 looked at
    queue = [Waiting(100 + i, 1, ("x",)) for i in range(63)] + [Waiting(i, 1, ("x",)) for i in range(10)]
    assert prefetch_copies(state, queue, _free_in(many), 0.0, 900.0) == [(0, "x", 0)]


# ---------------------------------------------------------------- a real trace


def test_same_seed_same_replay_with_prefetch():
    tr = load_trace(TIRESIAS)
    servers = parse_cluster("v100:8", 4)
    runs = []
    for _ in range(2):
        data = synthetic_data(tr, servers, SyntheticSpec(8, 50.0, 500.0), seed=1)
        runs.append(simulate(tr, servers, make_policy("las"), SimConfig(data=data, prefetch_s=900.0)))
    a, b = runs
    assert a.records == b.records
    assert {k: v for k, v in a.summary.items() if k != "wall_s"} == {
        k: v for k, v in b.summary.items() if k != "wall_s"}
    s = a.summary
    assert s["data_prefetches"] > 0
    assert s["data_prefetch_hits"] + s["data_prefetch_wasted"] == s["data_prefetches"]


def test_cli_prefetch():
    r = CliRunner().invoke(app, ["sim", "--trace", str(TIRESIAS), "--cluster", "v100:8", "--policy", "las",
                                 "--data-model", "synthetic:8:50-500", "--prefetch", "--prefetch-horizon", "600",
                                 "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["data_prefetch_horizon_s"] == 600.0 and s["data_prefetches"] > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--prefetch"], "--prefetch needs --data-model"),
    (["--data-model", "synthetic", "--prefetch", "--prefetch-horizon", "-1"], "--prefetch-horizon -1"),
])
def test_bad_prefetch_options_exit_2_with_one_line(args, needle):
    r = CliRunner().invoke(app, ["sim", "--synthetic", "5", "--cluster", "v100:4", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output
