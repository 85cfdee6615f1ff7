"""The preemption rule (hsched.sched.preempt), and the proof that the live controller and the simulator make
the same preemptions: both call it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hsched.config import DEFAULT_QOS_TABLE, QosClass
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched import live
from hsched.sched import round as core_round
from hsched.sched.preempt import PreemptRule, Victims, displaced, least_important, protected
from hsched.sched.registry import make_policy
from hsched.sched.round import build_input, schedule_round
from hsched.sched.servers import server_of
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, Plan, PolicyInput, Preempt, RoundDecision, ServerView, Start, Want
from hsched.sim import engine
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, default_rule, simulate
from hsched.sim.trace import Trace, TraceJob
from tests.sched.handmade import model

RULE = PreemptRule.from_qos(DEFAULT_QOS_TABLE)


def running(jid: int, node: str, devices: Sequence[str], qos: str = "normal", *, priority: int = 0,
            started: float = 0.0, gpu_type: str = "fast", checkpointable: bool = True) -> JobView:
    return JobView(jid, kind(len(devices)), len(devices), started, JobPhase.RUNNING, qos, priority, "u", gpu_type,
                   (Placement(node, tuple(devices)),), started, 0.0, 0.0, checkpointable=checkpointable)


def kind(gpus: int) -> str:
    """The hand-made table's job type of that size: A on one GPU, the gang G on two or four."""
    return "A" if gpus == 1 else "G"


def pending(jid: int, gpus: int, qos: str = "normal", arrival: float = 0.0) -> JobView:
    return JobView(jid, kind(gpus), gpus, arrival, qos=qos)


def counting_fits(free: dict[str, int], need: int) -> Any:
    """fits(node, freed): enough devices once `freed` are free (each victim device counts one)."""
    def fits(node: str, freed: frozenset[str]) -> bool:
        return free.get(node, 0) + len(freed) >= need
    return fits


# ---------------------------------------------------------------- the rule


def test_the_default_qos_table_is_the_controllers() -> None:
    assert RULE.may_preempt("prod", "normal") and RULE.may_preempt("prod", "scavenger")
    assert RULE.may_preempt("normal", "scavenger")
    assert not RULE.may_preempt("normal", "prod") and not RULE.may_preempt("normal", "normal")
    assert not RULE.may_preempt("scavenger", "scavenger")
    # the simulator's default rule is the live controller's, built from the same settings
    assert default_rule() == RULE


def test_least_important_first_lowest_class_then_priority_then_most_recent() -> None:
    jobs = [running(1, "a", ["d1"], "normal", started=5.0), running(2, "a", ["d2"], "scavenger", started=1.0),
            running(3, "a", ["d3"], "scavenger", started=9.0), running(4, "a", ["d4"], "normal", priority=-1),
            running(5, "a", ["d5"], "research")]  # an unknown class ranks with normal
    assert [j.id for j in sorted(jobs, key=least_important)] == [3, 2, 4, 1, 5]


def test_victims_are_the_fewest_and_least_important_on_one_server() -> None:
    run = [running(1, "a", ["a0", "a1"], "normal", started=1.0),
           running(2, "a", ["a2"], "scavenger", started=2.0),
           running(3, "a", ["a3"], "scavenger", started=3.0),
           running(4, "b", ["b0", "b1", "b2", "b3"], "normal")]
    v = Victims(RULE, run)
    # 2 GPUs for a prod job: on a the two scavengers (least important first), on b the one normal job: one
    # victim beats two, whatever their classes
    got = v.choose(pending(9, 2, "prod"), ["a", "b"], counting_fits({}, 2))
    assert got == Preempt(9, (4,), "b", "job 9 (prod) needs b: preempting 4 (normal)")
    # a normal job may take scavengers only: both of them, job 3 (started last) first
    got = v.choose(pending(10, 2, "normal"), ["a", "b"], counting_fits({}, 2))
    assert got is not None and got.victims == (3, 2) and got.node == "a"
    # victims chosen for one job are not offered to the next
    assert v.choose(pending(11, 2, "prod"), ["a", "b"], counting_fits({}, 2)).victims == (1,)  # type: ignore[union-attr]
    assert v.choose(pending(12, 1, "prod"), ["a", "b"], counting_fits({}, 1)) is None


def test_a_victim_taken_early_is_dropped_when_a_later_one_suffices() -> None:
    # the least important (scavenger, 1 GPU) comes first, but the normal job's 2 GPUs alone are enough
    run = [running(1, "a", ["a0"], "scavenger"), running(2, "a", ["a1", "a2"], "normal")]
    got = Victims(RULE, run).choose(pending(9, 2, "prod"), ["a"], counting_fits({}, 2))
    assert got is not None and got.victims == (2,)


def test_ties_go_to_the_first_server_the_caller_prefers() -> None:
    run = [running(1, "a", ["a0"], "scavenger"), running(2, "b", ["b0"], "scavenger")]
    assert Victims(RULE, run).choose(pending(9, 1, "prod"), ["b", "a"], counting_fits({}, 1)).node == "b"  # type: ignore[union-attr]


def test_gangs_over_several_servers_are_never_victims() -> None:
    gang = JobView(1, "A", 2, 0.0, JobPhase.RUNNING, "scavenger", gpu_type="fast",
                   placement=(Placement("a", ("a0",)), Placement("b", ("b0",))), run_start_s=0.0)
    assert Victims(RULE, [gang]).choose(pending(9, 1, "prod"), ["a", "b"], counting_fits({}, 1)) is None


def test_custom_classes_follow_their_own_table() -> None:
    table = {**DEFAULT_QOS_TABLE, "research": QosClass("research", preempts=("scavenger",)),
             "urgent": QosClass("urgent", preempts=("research", "normal"))}
    rule = PreemptRule.from_qos(table)
    run = [running(1, "a", ["a0"], "normal"), running(2, "b", ["b0"], "research"),
           running(3, "c", ["c0"], "scavenger")]
    nodes = ["a", "b", "c"]
    assert Victims(rule, run).choose(pending(9, 1, "research"), nodes, counting_fits({}, 1)).victims == (3,)  # type: ignore[union-attr]
    # urgent may take research and normal jobs, never scavengers: research ranks with normal, so the tie
    # goes to the first server the caller names
    assert Victims(rule, run).choose(pending(9, 1, "urgent"), nodes[::-1], counting_fits({}, 1)).victims == (2,)  # type: ignore[union-attr]
    # a class that preempts nobody
    assert Victims(rule, run).choose(pending(9, 1, "scavenger"), nodes, counting_fits({}, 1)) is None


def test_only_checkpointable_jobs_that_ran_long_enough_may_be_time_shared() -> None:
    jobs = [running(1, "a", ["a0"], started=0.0), running(2, "a", ["a1"], started=0.0, checkpointable=False),
            running(3, "a", ["a2"], started=90.0), pending(4, 1)]
    assert protected(RULE, jobs, 100.0) == {2}
    assert protected(PreemptRule(RULE.qos_preempts, min_run_s=60.0), jobs, 100.0) == {2, 3}
    assert protected(PreemptRule(RULE.qos_preempts, time_sharing=False), jobs, 100.0) == {1, 2, 3}


def test_a_stop_must_hand_its_devices_to_an_equal() -> None:
    jobs = {1: running(1, "a", ["a0"], "normal"), 2: running(2, "a", ["a1"], "scavenger"),
            3: running(3, "a", ["a2"], "normal"), 4: pending(4, 1, "normal"), 5: pending(5, 1, "prod")}
    decision = RoundDecision(preempt=(1, 2, 3), starts=(Start(4, "fast", (Placement("a", ("a0",)),)),
                                                        Start(5, "fast", (Placement("a", ("a1",)),))))
    keep, took = displaced(decision, jobs)
    # 1 went to an equal; 2 to a job of another class (that one waits for the QoS rule); 3 to nobody
    assert keep == {2, 3} and took == {5}


# ---------------------------------------------------------------- the round applies the rule

def round_of(policy: Any, jobs: Sequence[JobView], now: float = 100.0, rule: PreemptRule = RULE,
             cluster: str = "fast:2") -> RoundDecision:
    servers = parse_cluster(cluster, 4)
    return schedule_round(policy, build_input(now, jobs, servers, model()), servers, rule=rule)


@pytest.mark.parametrize("checkpointable", [True, False])
def test_time_sharing_never_stops_a_job_that_cannot_checkpoint(checkpointable: bool) -> None:
    # LAS: a job that has run 2 h of GPU time yields to a newcomer, if it can checkpoint
    old = running(1, "fast-0", ["fast-0/0", "fast-0/1"], started=0.0, checkpointable=checkpointable)
    old = old._replace(run_s=7200.0, service_s=7200.0)
    d = round_of(make_policy("las"), [old, pending(2, 2)], now=7200.0)
    if checkpointable:
        assert d.preempt == (1,) and [s.job_id for s in d.starts] == [2]
    else:
        assert d.preempt == () and d.starts == () and d.waiting == {2: "Resources"}


def test_a_plan_may_not_time_share_a_job_away_for_another_class() -> None:
    # las-hetero knows nothing of QoS: by service alone the scavenger would take the normal job's GPUs
    normal = running(1, "fast-0", ["fast-0/0", "fast-0/1"], "normal")._replace(run_s=9e3, service_s=9e3)
    d = round_of(make_policy("las-hetero"), [normal, pending(2, 2, "scavenger")], now=9e3)
    assert d.preempt == () and d.waiting == {2: "Resources"}


class DropEveryone:
    """A preemptive plan that wants nobody: without the rule every running job would stop for nothing."""

    name: ClassVar[str] = "drop-everyone"
    clairvoyant: ClassVar[bool] = False
    time_sharing: ClassVar[bool] = True

    def plan(self, inp: PolicyInput) -> Plan:
        return Plan((), preempt=True)


def test_a_job_stopped_for_nobody_keeps_running() -> None:
    d = round_of(DropEveryone(), [running(1, "fast-0", ["fast-0/0"])])
    assert d.preempt == ()


def test_qos_preemption_in_the_round_starts_the_job_on_its_victims_devices() -> None:
    full = [running(1, "fast-0", [f"fast-0/{i}" for i in range(4)], "normal", started=1.0),
            running(2, "fast-1", ["fast-1/0", "fast-1/1"], "scavenger", started=2.0),
            running(3, "fast-1", ["fast-1/2", "fast-1/3"], "normal", started=3.0)]
    for ckpt in (True, False):
        jobs = [j._replace(checkpointable=ckpt) for j in full] + [pending(4, 2, "prod", arrival=5.0)]
        d = round_of(make_policy("hsched"), jobs, cluster="fast:8")
        assert d.preemptions == (Preempt(4, (2,), "fast-1", "job 4 (prod) needs fast-1: preempting 2 (scavenger)"),)
        assert d.preempt == (2,)
        assert [(s.job_id, s.placement[0].devices) for s in d.starts] == [(4, ("fast-1/0", "fast-1/1"))]
        # without QoS rights nothing is stopped
        assert round_of(make_policy("hsched"), jobs, rule=PreemptRule(), cluster="fast:8").preempt == ()


def test_qos_preemption_first_uses_free_devices() -> None:
    # FIFO holds the prod job behind the head of the queue (which may preempt nobody), but a device is free:
    # the prod job takes it rather than stopping the scavenger
    jobs = [running(1, "fast-0", ["fast-0/0"], "scavenger"), pending(2, 4, "scavenger", arrival=0.0),
            pending(3, 1, "prod", arrival=1.0)]
    d = round_of(make_policy("fifo"), jobs, cluster="fast:4")
    assert d.preempt == () and [s.job_id for s in d.starts] == [3]


# ---------------------------------------------------------------- live and simulated agree

A100 = "NVIDIA A100-SXM4-80GB"
GPU_TYPE = live.gpu_type_of(A100)


def lab_nodes() -> tuple[Node, ...]:
    from hsched.config import SimulatedDevices
    from hsched.simulated import simulated_devices

    out = []
    for name in ("a", "b"):
        devices, links = simulated_devices(name, SimulatedDevices(A100, 4, topology="nvswitch"))
        out.append(Node(name, "local", NodeState.UP, devices=devices, links=links))
    return tuple(out)


# (id, qos, gpus, arrival s): a normal job fills node a, a normal and a scavenger job fill node b; then a prod
# job takes the scavenger's GPUs (the least important victim), and a 4-GPU prod job the only server where
# stopping one job is enough
JOBS = [(1, "normal", 4, 0.0), (2, "scavenger", 2, 0.0), (3, "normal", 2, 0.0), (4, "prod", 2, 10.0),
        (5, "prod", 4, 20.0)]


def live_preemptions() -> list[tuple[float, Preempt]]:
    """Drive the live seam as the controller does: every round gets the fleet's state, a preemption stops
    its victims (they go back to the queue) and the job launches in the next round."""
    nodes = lab_nodes()
    specs = {jid: JobSpec(command=("x",), qos=qos, resources=Resources(gpus=g)) for jid, qos, g, _ in JOBS}
    queue: dict[int, Job] = {}
    runs: dict[int, tuple[Job, float]] = {}
    out: list[tuple[float, Preempt]] = []
    for t in sorted({at for *_, at in JOBS}):
        for jid, _, _, at in JOBS:
            if at == t:
                queue[jid] = Job(jid, specs[jid], "u", JobState.PENDING, "", at)
        for _ in range(3):  # the round, the one after a preemption's victims stopped, and a quiet one
            busy = frozenset(u for job, _ in runs.values() for p in job.placement for u in p.devices)
            view = live.FleetView(nodes, busy, {}, tuple(live.Running(job, st) for job, st in runs.values()),
                                  rule=PreemptRule.from_qos(DEFAULT_QOS_TABLE), policy="hsched")
            for d in live.schedule(view, list(queue.values()), t):
                if isinstance(d, live.Launch):
                    job = queue.pop(d.job_id)
                    runs[d.job_id] = (Job(job.id, job.spec, "u", JobState.RUNNING, "", job.submit_time,
                                          start_time=t, placement=d.placements), t)
                elif isinstance(d, Preempt):
                    out.append((t, d))
                    for v in d.victims:
                        job, _ = runs.pop(v)
                        queue[v] = Job(v, job.spec, "u", JobState.PENDING, "preempted", job.submit_time,
                                       restarts=job.restarts + 1)
    return out


def simulated_preemptions(checkpointable: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, Preempt]]:
    servers = tuple(s for n in lab_nodes() if (s := server_of(n, live.gpu_type_of)) is not None)
    throughput = ThroughputModel(prior={GPU_TYPE: 1.0}, reference_type=GPU_TYPE)
    trace = Trace(tuple(TraceJob(jid, "", g, at, 1e6, qos=qos, user="u", checkpointable=checkpointable)
                        for jid, qos, g, at in JOBS), throughput, "qos")
    seen: list[tuple[float, Preempt]] = []
    real = engine.schedule_round

    def spy(policy: Any, inp: PolicyInput, *a: Any, **kw: Any) -> RoundDecision:
        d = real(policy, inp, *a, **kw)
        seen.extend((inp.now, p) for p in d.preemptions)
        return d

    monkeypatch.setattr(engine, "schedule_round", spy)
    r = simulate(trace, servers, make_policy("hsched"), SimConfig(max_time_s=100.0))
    assert r.summary["preemptions"] == len(seen)
    return seen


@pytest.fixture
def victim_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls of the one victim choice (`Victims.choose`), from whichever side makes them."""
    calls = {"n": 0}
    choose = Victims.choose

    def counted(self: Victims, *a: Any, **kw: Any) -> Preempt | None:
        calls["n"] += 1
        return choose(self, *a, **kw)

    monkeypatch.setattr(Victims, "choose", counted)
    return calls


@pytest.mark.parametrize("checkpointable", [False, True])
def test_the_live_controller_and_the_simulator_make_the_same_preemptions(
        checkpointable: bool, monkeypatch: pytest.MonkeyPatch, victim_calls: dict[str, int]) -> None:
    # one function decides them both: count its calls from each side
    assert live.Victims is core_round.Victims is Victims
    calls = victim_calls
    lived = live_preemptions()
    from_live = calls["n"]
    simulated = simulated_preemptions(checkpointable, monkeypatch)
    assert from_live > 0 and calls["n"] > from_live
    expected = [(10.0, Preempt(4, (2,), "b", "job 4 (prod) needs b: preempting 2 (scavenger)")),
                (20.0, Preempt(5, (1,), "a", "job 5 (prod) needs a: preempting 1 (normal)"))]
    assert lived == expected
    assert simulated == expected


def test_the_controller_in_process_preempts_as_the_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             victim_calls: dict[str, int]) -> None:
    """The real controller (hsched.testing.Lab: its rounds, store and stop protocol over fake nodes, the
    canned fleet being the two nodes above) records the preemptions the simulator makes."""
    from hsched.model import JobState
    from hsched.testing import Lab

    calls = victim_calls

    async def drive() -> list[tuple[float, str, list[int]]]:
        out: list[tuple[float, str, list[int]]] = []
        async with Lab.open(tmp_path) as lab:
            t0 = lab.clock.time()
            for at in sorted({at for *_, at in JOBS}):
                if at > lab.clock.time() - t0:
                    await lab.advance(at - (lab.clock.time() - t0))
                arriving = [(jid, qos, gpus) for jid, qos, gpus, when in JOBS if when == at]
                for jid, qos, gpus in arriving:
                    assert (await lab.submit("train.py", gpus=gpus, qos=qos)).id == jid
                await lab.round()  # the round that decides; the victims get their checkpoint signal
                for jid, *_ in arriving:
                    for e in await lab.ctl.db(lab.ctl.store.events, jid):
                        if e["kind"] == "preempts":
                            stopping = [j for j, *_ in JOBS if j <= jid
                                        and (await lab.job(j)).state is JobState.PREEMPTING]
                            out.append((lab.clock.time() - t0, e["message"], stopping))
                await lab.round()  # the victims' runs ended on SIGTERM: the newcomers take their GPUs
                for jid, *_ in arriving:
                    assert (await lab.job(jid)).state is JobState.RUNNING
        return out

    got = asyncio.run(drive())
    assert calls["n"] > 0
    simulated = simulated_preemptions(False, monkeypatch)
    assert got == [(t, p.why, list(p.victims)) for t, p in simulated]


def test_a_victim_that_cannot_checkpoint_starts_over_in_the_simulator() -> None:
    servers = parse_cluster("fast:1", 4)
    trace = Trace((TraceJob(0, "A", 1, 0.0, 100.0, qos="scavenger", checkpointable=False),
                   TraceJob(1, "A", 1, 10.0, 20.0, qos="prod")), model(), "hand-made")
    r = simulate(trace, servers, make_policy("hsched"), SimConfig())
    rec = {x.id: x for x in r.records}
    # the scavenger ran 10 s (20 units of 100 at 2/s) before the prod job took its GPU at once; it then
    # waited 10 s and ran its whole 50 s again
    assert r.summary["preemptions"] == 1 and rec[0].restarts == 1
    assert rec[1].start_s == pytest.approx(10.0)
    assert rec[0].end_s == pytest.approx(20.0 + 50.0)
    assert r.summary["gpu_hours_lost"] == pytest.approx(10.0 / 3600)


def test_without_time_sharing_the_simulator_preempts_by_qos_alone() -> None:
    # LAS would rotate two equal jobs on one GPU; with time-sharing off the first runs to the end
    servers = parse_cluster("fast:1", 4)
    trace = Trace((TraceJob(0, "A", 1, 0.0, 20000.0), TraceJob(1, "A", 1, 1.0, 20.0)), model(), "hand-made")
    shared = simulate(trace, servers, make_policy("las"), SimConfig())
    alone = simulate(trace, servers, make_policy("las"), SimConfig(preempt=default_rule(time_sharing=False)))
    assert shared.summary["preemptions"] > 0
    assert alone.summary["preemptions"] == 0
    assert {x.id: x.start_s for x in alone.records}[1] == pytest.approx(10000.0)


def test_one_conversion_from_node_to_server() -> None:
    a = lab_nodes()[0]
    assert server_of(a, live.gpu_type_of) == ServerView("a", GPU_TYPE, tuple(d.uuid for d in a.devices), "nvlink")
    assert server_of(a, live.gpu_type_of, {a.devices[0].uuid}).devices == tuple(d.uuid for d in a.devices[1:])
    pcie = Node("p", "local", NodeState.UP, devices=a.devices[:2])  # two GPUs, no NVLink between them
    assert server_of(pcie, str.lower).link == "pcie"  # type: ignore[union-attr]
    single = Node("s", "local", NodeState.UP, devices=a.devices[:1])
    assert server_of(single, str.lower).link == "nvlink"  # type: ignore[union-attr]
    assert server_of(Node("d", "local", NodeState.DOWN, devices=a.devices), str.lower) is None
    # the simulator's short spec goes through the same conversion
    assert [(s.name, s.gpu_type, len(s.devices), s.link) for s in parse_cluster("v100:6@pcie,k80:1", 4)] == [
        ("v100-0", "v100", 4, "pcie"), ("v100-1", "v100", 2, "pcie"), ("k80-0", "k80", 1, "nvlink")]


def test_wants_are_only_advice_the_rule_keeps_its_word() -> None:
    # a plan asking for a job the rule protects to be moved: it stays where it is
    class MoveIt:
        name: ClassVar[str] = "move-it"
        clairvoyant: ClassVar[bool] = False
        time_sharing: ClassVar[bool] = True

        def plan(self, inp: PolicyInput) -> Plan:
            return Plan((Want(1, ("slow",)),), preempt=True)

    servers = parse_cluster("fast:1,slow:1", 4)
    job = running(1, "fast-0", ["fast-0/0"], checkpointable=False)
    d = schedule_round(MoveIt(), build_input(0.0, [job], servers, model()), servers, rule=RULE)
    assert d.starts == () and d.preempt == ()
    d = schedule_round(MoveIt(), build_input(0.0, [job._replace(checkpointable=True)], servers, model()), servers,
                       rule=RULE)
    assert [(s.job_id, s.gpu_type, s.migrate) for s in d.starts] == [(1, "slow", True)]
