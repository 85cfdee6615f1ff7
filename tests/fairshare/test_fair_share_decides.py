"""Fair share that decides (issue 29, item 1): inside a QoS class the `hsched` policy picks whose job runs next by a
multifactor priority (the classic fair-share factor, age, size), and which of a user's jobs by their own priority and
least attained service. The acceptance figures, in the simulator and in the live controller on a fake clock:

* two users, equal shares, 20 equal one-GPU jobs each submitted at once on a 2-GPU node: the starts alternate from
  the first one on (never more than one job apart);
* shares 2:1: while both users have jobs waiting, the GPU-seconds split 2:1 within 10%.

A member's --priority orders only their own jobs; an admin's orders across users."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.config import Settings
from hsched.learn.fairshare import Account, PriorityWeights, UserShare
from hsched.model import JobState
from hsched.sched.policies.hsched import Hsched
from hsched.sched.registry import make_policy
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, PolicyInput, ServerView
from hsched.sim.engine import SimConfig, simulate
from hsched.sim.trace import Trace, TraceJob
from hsched.testing import CannedNode, Lab

JOB_S = 1000.0
PER_USER = 20
MODEL = ThroughputModel({"a100": {("A", 1): 1.0}})
TWO_GPUS = (ServerView("n", "a100", ("0", "1")),)


def flood_trace() -> Trace:
    """alice's 20 jobs, then bob's 20, all at t=0 (ids 0-19 alice's, 20-39 bob's): alice's come first by
    arrival and id, the order the issue saw all of one user's jobs start in."""
    jobs = [TraceJob(i, "A", 1, 0.0, JOB_S, user="alice") for i in range(PER_USER)]
    jobs += [TraceJob(PER_USER + i, "A", 1, 0.0, JOB_S, user="bob") for i in range(PER_USER)]
    return Trace(tuple(jobs), MODEL, "flood")


def sim_starts(shares: dict[str, float]) -> list[tuple[float, float, str]]:
    """(start, end, user) of every job of the flood replayed by the simulator, in start order (a round's starts in
    the order the policy served them: ids, which within a round are one per user when alternating)."""
    res = simulate(flood_trace(), TWO_GPUS, make_policy("hsched"), SimConfig(shares=shares))
    assert all(r.restarts == 0 for r in res.records)  # nobody time-shared away: 1000-s jobs, a 1.5 h quantum
    return [(r.start_s, r.end_s, "alice" if r.id < PER_USER else "bob")
            for r in sorted(res.records, key=lambda r: (r.start_s, r.id))]


def most_apart(users: list[str]) -> int:
    """The largest difference, over every prefix of the start order, between the two users' counts of starts."""
    gap = worst = 0
    for u in users:
        gap += 1 if u == "alice" else -1
        worst = max(worst, abs(gap))
    return worst


def split_while_both_wait(runs: list[tuple[float, float, str]]) -> tuple[float, dict[str, float]]:
    """(the end of the window, GPU-seconds each user got in it): from the first start until the first user whose
    queue runs dry starts their last job. After that only one user waits, so fair share no longer decides."""
    last = {u: max(s for s, _e, who in runs if who == u) for u in ("alice", "bob")}
    until = min(last.values())
    used = {"alice": 0.0, "bob": 0.0}
    for start, end, u in runs:
        used[u] += max(0.0, min(end, until) - start)
    return until, used


# ---------------------------------------------------------------- the simulator


def test_sim_equal_shares_alternate_from_the_first_start() -> None:
    runs = sim_starts({})
    users = [u for _s, _e, u in runs]
    assert "".join(u[0].upper() for u in users) == "AB" * PER_USER
    assert most_apart(users) == 1
    assert [s for s, _e, _u in runs[:2]] == [0.0, 0.0]  # the second GPU of the first round went to bob


def test_sim_shares_two_to_one_split_the_gpu_seconds_two_to_one() -> None:
    runs = sim_starts({"alice": 2, "bob": 1})
    until, used = split_while_both_wait(runs)
    # measured: alice 19,000 GPU-s, bob 9,000 GPU-s until alice's queue ran dry at 14,000 s (2.11:1)
    assert used["alice"] / used["bob"] == pytest.approx(2.0, rel=0.10), (until, used)
    assert until == 14 * JOB_S


def test_sim_single_user_order_is_least_attained_service_alone() -> None:
    """One user: fair share has nobody to decide between, and the order is the one before it (LAS): the simulator's
    pinned figures of single-user traces did not move (tests/sim/test_decisions_pinned.py)."""
    jobs = tuple(TraceJob(i, "A", 1, float(i), JOB_S, user="solo") for i in range(6))
    res = simulate(Trace(jobs, MODEL, "solo"), TWO_GPUS, make_policy("hsched"), SimConfig())
    assert [r.id for r in sorted(res.records, key=lambda r: (r.start_s, r.id))] == list(range(6))


# ---------------------------------------------------------------- the policy's order, pure


def view(i: int, user: str, *, priority: int = 0, arrival: float = 0.0, gpus: int = 1) -> JobView:
    return JobView(i, "A", gpus, arrival, JobPhase.PENDING, "normal", priority, user)


def policy_input(jobs: tuple[JobView, ...], usage: dict[str, float], capacity: int = 2) -> PolicyInput:
    return PolicyInput(now=100.0, jobs=jobs, capacity={"a100": capacity}, gpu_types=("a100",), throughput=MODEL,
                       user_usage=usage)


def shares(decayed: dict[str, float], norm: dict[str, float] | None = None,
           admin: dict[str, frozenset[int]] | None = None, weights: PriorityWeights | None = None
           ) -> dict[str, float]:
    """What the controller hands the round (hsched.learn.fairshare.policy_usage), from decayed GPU-seconds per user."""
    lab = sum(decayed.values())
    norm = norm or {u: 1 / len(decayed) for u in decayed}
    return {u: UserShare(d / (norm[u] * len(decayed)), decayed_s=d, norm_share=norm[u], lab_decayed_s=lab,
                         admin_jobs=(admin or {}).get(u, frozenset()), weights=weights) for u, d in decayed.items()}


def test_a_members_priority_orders_only_their_own_jobs() -> None:
    # bob used more; his priority-100 job still waits for alice's next turn, and goes first among his own
    jobs = (view(1, "alice"), view(2, "alice"), view(3, "bob"), view(4, "bob", priority=100))
    order = [j.id for j in Hsched().order(policy_input(jobs, shares({"alice": 0.0, "bob": 3600.0})))]
    assert order[0] == 1 and order.index(4) < order.index(3)


def test_an_admins_priority_orders_across_users() -> None:
    jobs = (view(1, "alice"), view(2, "alice"), view(3, "bob"), view(4, "bob", priority=100))
    usage = shares({"alice": 0.0, "bob": 3600.0}, admin={"bob": frozenset({4})})
    assert Hsched().order(policy_input(jobs, usage))[0].id == 4


def test_the_factor_reacts_within_one_selection_and_shares_weigh() -> None:
    """No history at all: each job taken counts as its user's usage, so four free GPUs go two and two with equal
    shares; with alice at 3 shares to bob's 1, three to her (the classic factor compares usage to share)."""
    jobs = tuple(view(i, "alice") for i in range(1, 6)) + tuple(view(i, "bob") for i in range(6, 11))
    equal = [j.user for j in Hsched().order(policy_input(jobs, shares({"alice": 0.0, "bob": 0.0}), 4))][:4]
    assert sorted(equal) == ["alice", "alice", "bob", "bob"]
    weighted = Hsched().order(policy_input(jobs, shares({"alice": 0.0, "bob": 0.0}, {"alice": 0.75, "bob": 0.25}),
                                           4))
    assert sorted(j.user for j in weighted[:4]) == ["alice", "alice", "alice", "bob"]


def test_age_and_size_weigh_between_users_as_set() -> None:
    """Equal usage: with only the size weight, bob's 2-GPU job goes before alice's 1-GPU one; with only age,
    alice's older job first."""
    jobs = (view(1, "alice", arrival=0.0), view(2, "bob", arrival=90.0, gpus=2))
    size_only = shares({"alice": 10.0, "bob": 10.0}, weights=PriorityWeights(fairshare=0.0, age=0.0, size=1000.0))
    assert [j.id for j in Hsched().order(policy_input(jobs, size_only, 4))] == [2, 1]
    age_only = shares({"alice": 10.0, "bob": 10.0},
                      weights=PriorityWeights(fairshare=0.0, age=1000.0, size=0.0, max_age_s=100.0))
    assert [j.id for j in Hsched().order(policy_input(jobs, age_only, 4))] == [1, 2]


# ---------------------------------------------------------------- the live controller, on a fake clock


async def live_starts(tmp_path: Path, shares: dict[str, int]) -> list[tuple[float, float, str]]:
    """The flood through the live controller: alice submits her 20 jobs, then bob his 20; every 1000 s the
    running jobs end and a round starts the next. (start, end, user) in start order (a round's in id order)."""
    accounts = {u: Account(u, (u,), s) for u, s in shares.items()}
    node = CannedNode("a", "NVIDIA A100-SXM4-80GB", 2)
    async with Lab.open(tmp_path, nodes=(node,), settings=Settings(accounts=accounts)) as lab:
        owner = {}
        for u in ("alice", "bob"):
            for _ in range(PER_USER):
                owner[(await lab.submit("train", user=u)).id] = u
        t0 = lab.clock.time()
        await lab.round()
        for _ in range(2 * PER_USER):
            running = [i for i in owner if (await lab.job(i)).state is JobState.RUNNING]
            if not running:
                break
            await lab.advance(JOB_S)
            for i in running:
                await lab.finish(i)
            await lab.round()
        out = []
        for i, u in owner.items():
            j = await lab.job(i)
            assert j.start_time is not None and j.end_time is not None
            out.append((j.start_time - t0, j.end_time - t0, u, i))
        return [(s, e, u) for s, e, u, _i in sorted(out, key=lambda r: (r[0], r[3]))]


async def test_live_equal_shares_alternate_from_the_first_start(tmp_path: Path) -> None:
    runs = await live_starts(tmp_path, {})
    users = [u for _s, _e, u in runs]
    assert "".join(u[0].upper() for u in users) == "AB" * PER_USER  # AABB... with the round's own head
    assert most_apart(users) == 1
    assert [s for s, _e, _u in runs[:2]] == [0.0, 0.0]


async def test_live_shares_two_to_one_split_the_gpu_seconds_two_to_one(tmp_path: Path) -> None:
    until, used = split_while_both_wait(await live_starts(tmp_path, {"alice": 2, "bob": 1}))
    # measured: alice 18,000 GPU-s, bob 10,000 GPU-s until alice's queue ran dry at 14,000 s (1.8:1, one job short
    # of 2:1; the simulator's 2.11:1 is one job over: a 2-GPU node hands out 1000-s slices), with the round's own
    # reservation head and with the policy's alike. (Rounds 1 and 2 go AB AA in the simulator and AB AB here: at
    # 1000 s the two users tie exactly on paper, and the live ledger's decay breaks the tie the other way.)
    assert used["alice"] / used["bob"] == pytest.approx(2.0, rel=0.10), (until, used)
    assert until == 14 * JOB_S


def test_hsched_sim_shares_option_reads_the_traces_user_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hsched.cli import main

    trace = tmp_path / "flood.csv"
    trace.write_text("id,submit,duration,gpus,user\n" + "".join(f"a{i},0,1000,1,alice\n" for i in range(20))
                     + "".join(f"b{i},0,1000,1,bob\n" for i in range(20)))
    out = tmp_path / "jobs.csv"
    cols = "id=id,submit=submit,duration=duration,gpus=gpus,user=user"

    def run(*argv: str) -> int:
        monkeypatch.setattr("sys.argv", ["hsched", "sim", "--trace", str(trace), "--columns", cols,
                                         "--cluster", "a100:2", "--gpus-per-node", "2", *argv])
        with pytest.raises(SystemExit) as ex:
            main()
        return int(ex.value.code or 0)

    assert run("--shares", "alice=2,bob=1", "--json", "--jobs-csv", str(out)) == 0
    import csv

    rows = list(csv.DictReader(out.open()))
    runs = sorted(((float(r["start_s"]), float(r["end_s"]), "alice" if r["name"].startswith("a") else "bob")
                   for r in rows), key=lambda r: r[0])
    _until, used = split_while_both_wait(runs)
    assert used["alice"] / used["bob"] == pytest.approx(2.0, rel=0.10)
    capsys.readouterr()
    assert run("--shares", "alice=two") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "hsched: error: --shares 'alice=two': expected USER=N pairs with N > 0, such as alice=2,bob=1"]
