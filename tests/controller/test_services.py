"""The service manager's reconcile (hsched.controller.services) in-process on a fake clock: replica jobs made on
scale up, clamped to MIN..MAX, a died replica replaced, scale down stopping a replica only after its drain, a
restarted controller adopting the replicas; the store's services table; the `serve` request's checks.

The router is a stand-in here (the real one, hsched.serve.router, is tested on loopback in tests/serve and end to
end in tests/e2e/test_serve_e2e.py): what is under test is what the manager does with its readings.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hsched.controller import services
from hsched.controller.api import Api
from hsched.controller.services import Phase, ServiceManager
from hsched.errors import PermissionDenied, UserError
from hsched.model import JobSpec, JobState, Resources
from hsched.sched.autoscale import Sample, ScaleDecision
from hsched.serve.router import LATENCY_BUCKETS_S, ReplicaStats, RouterStats
from hsched.spec.service import ServiceSpec, ServiceState
from hsched.testing import CannedNode, Lab


class StandInRouter:
    """What the manager asks of a router, recorded; `hold` keeps a replica's drain waiting (requests in flight)."""

    def __init__(self, name: str, host: str, port: int, clock: Callable[[], float], slo_s: float) -> None:
        self.name, self.port, self.clock, self.slo_s = name, port or 41000, clock, slo_s
        self.ready: dict[str, str] = {}
        self.log: list[tuple[str, str]] = []
        self.hold: dict[str, asyncio.Event] = {}
        self.last = clock()
        self.closed = False

    async def start(self) -> None:
        self.log.append(("start", ""))

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def add_ready(self, replica: str, base_url: str) -> None:
        self.ready[replica] = base_url
        self.log.append(("add_ready", replica))

    async def drain(self, replica: str, timeout_s: float) -> int:
        self.log.append(("drain", replica))
        if replica in self.hold:
            await self.hold[replica].wait()
        self.log.append(("drained", replica))
        return 0

    def remove(self, replica: str) -> None:
        if self.ready.pop(replica, None) is not None:
            self.log.append(("remove", replica))

    def sample(self) -> Sample:
        now = self.clock()
        s = Sample(t=now, dt=now - self.last, concurrency=0.0, arrivals=0, p99_s=None, ready=len(self.ready))
        self.last = now
        return s

    def stats(self) -> RouterStats:
        reps = tuple(ReplicaStats(n, u, True, False, 0, 0) for n, u in self.ready.items())
        return RouterStats(self.name, 0, 0, 0, 0, (0,) * (len(LATENCY_BUCKETS_S) + 1), 0.0, self.slo_s, 0, reps)

    async def close(self) -> None:
        self.closed = True


class Script:
    """The autoscaler's answer, set by the test; what the manager passed it, kept."""

    def __init__(self) -> None:
        self.wanted = 1
        self.calls: list[dict[str, Any]] = []

    def __call__(self, policy: Any, samples: Any, now: float, current: int, memo: Any,
                 cold_start_s: float = 0.0) -> ScaleDecision:
        self.calls.append({"current": current, "cold_start_s": cold_start_s, "samples": len(samples),
                           "min": policy.min_replicas, "max": policy.max_replicas,
                           "windows": (policy.stable_window_s, policy.panic_window_s, policy.scale_down_delay_s)})
        return ScaleDecision(self.wanted, f"scripted {self.wanted}", memo)


def make_manager(lab: Lab, script: Script, ready: set[str] | None = None) -> tuple[ServiceManager, list[Any]]:
    routers: list[StandInRouter] = []

    def make(*args: Any) -> StandInRouter:
        routers.append(StandInRouter(*args))
        return routers[-1]

    async def probe(url: str, path: str | None) -> bool:
        return ready is None or url in ready

    m = ServiceManager(lab.ctl, make_router=make, probe=probe, decide=script)
    lab.ctl.state.services = m
    return m, routers


def spec(lo: int = 1, hi: int = 3, **res: Any) -> ServiceSpec:
    return ServiceSpec(name="llm", replica=JobSpec(command=("python", "server.py"), resources=Resources(gpus=1, **res),
                                                   qos="normal"),
                       min_replicas=lo, max_replicas=hi, slo_p99_s=0.3, ready_path="/health")


async def replica_jobs(lab: Lab) -> list[Any]:
    return [j for j in await lab.ctl.db(lab.ctl.store.jobs) if j.spec.service == "llm"]


async def test_scale_up_makes_replica_jobs_clamped_to_min_max(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        script = Script()
        m, routers = make_manager(lab, script)
        out = await m.start_service(spec(), "alice", {"PATH": "/usr/bin"})
        assert out["address"] == "http://127.0.0.1:41000" and out["replicas"]["wanted"] == 1
        (first,) = await replica_jobs(lab)
        env = dict(first.spec.env)
        assert (env["HSCHED_SERVICE"], env["HSCHED_REPLICA"]) == ("llm", "0") and int(env["HSCHED_PORT"]) > 0
        assert (first.user, first.spec.replica, first.spec.workload, first.spec.resources.gpus) == ("alice", 0,
                                                                                                    "inference", 1)
        assert await lab.ctl.db(lab.ctl.store.job_env, first.id) == {"PATH": "/usr/bin"}
        await lab.round()
        assert (await lab.job(first.id)).state is JobState.RUNNING
        lab.clock.advance(4.0)  # the replica takes 4 s to load its model
        await m.tick()
        assert routers[0].ready == {"llm-0": f"http://127.0.0.1:{env['HSCHED_PORT']}"}
        assert m.report(m.services["llm"])["cold_start_s"] == pytest.approx(4.0)
        script.wanted = 3
        await m.tick()
        assert script.calls[-1]["cold_start_s"] == pytest.approx(4.0)  # the measured cold start goes to decide
        jobs = await replica_jobs(lab)
        assert sorted(j.spec.replica for j in jobs) == [0, 1, 2]
        assert len({dict(j.spec.env)["HSCHED_PORT"] for j in jobs}) == 3
        await lab.round()
        await m.tick()
        assert sorted(routers[0].ready) == ["llm-0", "llm-1", "llm-2"]
        script.wanted = 9  # above MAX: clamped
        await m.tick()
        assert len(await replica_jobs(lab)) == 3 and m.services["llm"].record.wanted == 3
        kinds = [e["kind"] for e in await lab.ctl.db(lab.ctl.store.service_events, "llm")]
        assert kinds.count("service_scale") == 1
        scale = [e for e in await lab.ctl.db(lab.ctl.store.service_events, "llm") if e["kind"] == "service_scale"]
        assert "scale up 1 -> 3: scripted 3" in scale[0]["message"]


async def test_the_service_s_stable_window_sets_the_policy_s_windows(tmp_path: Path) -> None:
    """The manager builds its policy as the simulator does (ScalePolicy.for_window): a service replayed 10x faster
    names a 6 s window; its panic window is 1 s (one tick), its scale-down delay 3 s. The samples it keeps cover the
    window, not a minute."""
    from dataclasses import replace

    async with Lab.open(tmp_path) as lab:
        script = Script()
        m, _ = make_manager(lab, script)
        await m.start_service(replace(spec(), stable_window_s=6.0), "alice", None)
        await lab.round()
        for _ in range(20):
            lab.clock.advance(1.0)
            await m.tick()
        assert script.calls[-1]["windows"] == (6.0, 1.0, 3.0)
        assert script.calls[-1]["samples"] <= 6 + 2 + 1
        assert m.report(m.services["llm"])["stable_window_s"] == 6.0
    async with Lab.open(tmp_path / "b") as lab:
        script = Script()
        m, _ = make_manager(lab, script)
        await m.start_service(spec(), "alice", None)
        await m.tick()
        assert script.calls[-1]["windows"] == (60.0, 6.0, 30.0)  # Knative's, when the service names none


async def test_scale_down_stops_a_replica_only_after_its_drain(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        script = Script()
        script.wanted = 2
        m, routers = make_manager(lab, script)
        await m.start_service(spec(lo=1, hi=2), "alice", None)
        await m.tick()
        await lab.round()
        await m.tick()
        router = routers[0]
        assert sorted(router.ready) == ["llm-0", "llm-1"]
        newest = max(await replica_jobs(lab), key=lambda j: j.id)
        router.hold[f"llm-{newest.spec.replica}"] = asyncio.Event()  # a request still in flight there
        script.wanted = 0  # below MIN: clamped to 1
        await m.tick()
        await asyncio.sleep(0)
        assert m.services["llm"].record.wanted == 1
        assert ("drain", f"llm-{newest.spec.replica}") in router.log
        assert (await lab.job(newest.id)).state is JobState.RUNNING  # not stopped while its request runs
        router.hold[f"llm-{newest.spec.replica}"].set()
        await lab.settle_tasks()
        i = router.log.index(("drained", f"llm-{newest.spec.replica}"))
        assert ("remove", f"llm-{newest.spec.replica}") in router.log[i:]
        assert (await lab.job(newest.id)).state in (JobState.COMPLETING, JobState.CANCELLED)
        await lab.round()
        await lab.round()
        assert (await lab.job(newest.id)).state is JobState.CANCELLED
        await m.tick()
        assert [r.job_id for r in m.services["llm"].replicas.values()] != [newest.id]
        assert len(m.services["llm"].replicas) == 1
        # no replacement for a replica stopped on purpose
        assert len(await replica_jobs(lab)) == 2


async def test_a_replica_that_dies_is_replaced(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        m, routers = make_manager(lab, Script())
        await m.start_service(spec(), "alice", None)
        await lab.round()
        await m.tick()
        (first,) = await replica_jobs(lab)
        assert "llm-0" in routers[0].ready
        await lab.finish(first.id, exit_code=1)
        await lab.round()
        assert (await lab.job(first.id)).state is JobState.FAILED  # a replica is not retried: it is replaced
        await m.tick()
        assert "llm-0" not in routers[0].ready
        jobs = await replica_jobs(lab)
        (new,) = [j for j in jobs if j.id != first.id]
        assert new.spec.replica == 0 and new.state is JobState.PENDING
        events = await lab.ctl.db(lab.ctl.store.service_events, "llm")
        assert any("ended unasked (F" in e["message"] and e["data"].get("replaced") for e in events)
        await lab.round()
        await m.tick()
        assert "llm-0" in routers[0].ready


async def test_a_replica_not_ready_takes_no_traffic(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        ready: set[str] = set()
        m, routers = make_manager(lab, Script(), ready)
        await m.start_service(spec(), "alice", None)
        await lab.round()
        await m.tick()
        assert routers[0].ready == {}
        (job,) = await replica_jobs(lab)
        ready.add(f"http://127.0.0.1:{dict(job.spec.env)['HSCHED_PORT']}")
        await m.tick()
        assert list(routers[0].ready) == ["llm-0"]


async def test_a_restarted_controller_adopts_the_replicas(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        script = Script()
        script.wanted = 2
        m, routers = make_manager(lab, script)
        await m.start_service(spec(), "alice", None)
        await m.tick()
        await lab.round()
        await m.tick()
        before = {r.index: (r.job_id, r.port) for r in m.services["llm"].replicas.values()}
        port = routers[0].port
        await m.close()
        assert routers[0].closed
    async with Lab.open(tmp_path, clock=lab.clock) as again:
        m2, routers2 = make_manager(again, script)
        await m2.load()
        rt = m2.services["llm"]
        assert {r.index: (r.job_id, r.port) for r in rt.replicas.values()} == before
        assert rt.record.wanted == 2 and routers2[0].port == port  # the same address
        events = await again.ctl.db(again.ctl.store.service_events, "llm")
        assert "adopted 2 replica job(s)" in events[-1]["message"]


async def test_stop_drains_every_replica_then_the_service_is_stopped(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        m, routers = make_manager(lab, Script())
        await m.start_service(spec(), "alice", None)
        await lab.round()
        await m.tick()
        await m.stop("llm")
        await lab.settle_tasks()
        assert ("drained", "llm-0") in routers[0].log
        await lab.round()
        await m.tick()
        assert "llm" not in m.services and routers[0].closed
        rec = await lab.ctl.db(lab.ctl.store.get_service, "llm")
        assert rec is not None and rec.state is ServiceState.STOPPED
        (job,) = await replica_jobs(lab)
        assert (await lab.job(job.id)).state is JobState.CANCELLED
        # the name is free again
        await m.start_service(spec(), "alice", None)
        assert m.services["llm"].record.state is ServiceState.ACTIVE


async def test_the_serve_request_checks_and_who_may_scale(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, lab_mode=True) as lab:
        make_manager(lab, Script())
        api = Api(lab.ctl)
        table = {"name": "llm", "replicas": "1-2", "slo": "p99=250ms", "gpus_per_replica": 1,
                 "command": ["python", "server.py"]}
        with pytest.raises(UserError, match="slo 'p99<250': expected p99=DURATION"):
            await api.handle("serve", {"action": "start", "service": {**table, "slo": "p99<250"}}, os.getuid())
        with pytest.raises(UserError, match="cannot be satisfied"):
            await api.handle("serve", {"action": "start", "service": {**table, "gpus_per_replica": 9}}, os.getuid())
        with pytest.raises(UserError, match="workload: expected one of"):
            await api.handle("serve", {"action": "start", "service": {**table, "workload": "x"}}, os.getuid())
        assert await lab.ctl.db(lab.ctl.store.services) == []  # nothing was recorded for a refused one
        out = await api.handle("serve", {"action": "start", "service": table}, os.getuid())
        assert out["slo_p99_ms"] == 250 and out["replicas"]["max"] == 2
        with pytest.raises(UserError, match="already runs"):
            await api.handle("serve", {"action": "start", "service": table}, os.getuid())
        listed = await api.handle("serve", {"action": "list"}, os.getuid())
        assert [s["name"] for s in listed] == ["llm"]
        shown = await api.handle("serve", {"action": "show", "name": "llm"}, os.getuid())
        assert shown["events"][0]["kind"] == "service"
        ping = await api.handle("ping", {}, os.getuid())
        assert [s["name"] for s in ping["services"]] == ["llm"]
        # someone else (not an admin of the lab) may look but not scale or stop
        nobody = 65534
        with pytest.raises(PermissionDenied, match="belongs to"):
            await api.handle("serve", {"action": "scale", "name": "llm", "replicas": "1-3"}, nobody)
        with pytest.raises(PermissionDenied, match="belongs to"):
            await api.handle("serve", {"action": "stop", "name": "llm"}, nobody)
        await api.handle("serve", {"action": "show", "name": "llm"}, nobody)
        with pytest.raises(PermissionDenied, match="port 80 is below 1024"):
            await api.handle("serve", {"action": "start", "service": {**table, "name": "web", "port": 80}}, nobody)
        scaled = await api.handle("serve", {"action": "scale", "name": "llm", "replicas": "2-3"}, os.getuid())
        assert (scaled["replicas"]["min"], scaled["replicas"]["wanted"]) == (2, 2)
        assert len(await replica_jobs(lab)) == 2
        with pytest.raises(UserError, match="replicas '3-1'"):
            await api.handle("serve", {"action": "scale", "name": "llm", "replicas": "3-1"}, os.getuid())
        with pytest.raises(UserError, match="no service 'nope'"):
            await api.handle("serve", {"action": "show", "name": "nope"}, os.getuid())
        assert services.summary(lab.ctl)[0]["replicas"]["wanted"] == 2
        assert Phase.STARTING.value == "starting"


async def test_a_prod_replica_preempts_checkpointable_training(tmp_path: Path) -> None:
    """Scaling up takes GPUs in the service's QoS order: on a full fleet a prod replica stops a training job with its
    checkpoint signal, the training job goes back to the queue (to resume from its checkpoint), the replica runs."""
    async with Lab.open(tmp_path) as lab:
        trainers = [await lab.submit("python", "train.py", gpus=4, checkpoint_signal="USR1@60") for _ in range(2)]
        await lab.round()
        assert [(await lab.job(t.id)).state for t in trainers] == [JobState.RUNNING] * 2
        m, routers = make_manager(lab, Script())
        prod = ServiceSpec(name="llm", replica=JobSpec(command=("python", "server.py"), resources=Resources(gpus=1),
                                                       qos="prod"),
                           min_replicas=1, max_replicas=2, slo_p99_s=0.3)
        await m.start_service(prod, "alice", None)
        await lab.round()
        states = [(await lab.job(t.id)).state for t in trainers]
        assert states.count(JobState.PREEMPTING) == 1
        (victim,) = [t for t, s in zip(trainers, states, strict=True) if s is JobState.PREEMPTING]
        assert (await lab.fake_runs(victim.id))[-1].signals == ["USR1"]  # its checkpoint signal, first
        await lab.finish(victim.id, exit_code=85)  # it saved its checkpoint and exited (settings checkpoint_exit_code)
        await lab.round()
        await lab.round()
        assert (await lab.job(victim.id)).state is JobState.PENDING  # requeued, to resume later
        (replica,) = await replica_jobs(lab)
        assert (await lab.job(replica.id)).state is JobState.RUNNING
        await m.tick()
        assert list(routers[0].ready) == ["llm-0"]


async def test_the_autoscaler_itself_scales_on_the_router_s_samples(tmp_path: Path) -> None:
    """hsched.sched.autoscale.decide (not a script) on the samples the manager keeps: concurrency of 6 against a
    target of 2 per replica wants 3 replicas (the panic window reacts within seconds)."""
    async with Lab.open(tmp_path) as lab:
        routers: list[StandInRouter] = []

        def make(*args: Any) -> StandInRouter:
            routers.append(StandInRouter(*args))
            return routers[-1]

        async def probe(url: str, path: str | None) -> bool:
            return True

        m = ServiceManager(lab.ctl, make_router=make, probe=probe)
        lab.ctl.state.services = m
        await m.start_service(spec(lo=1, hi=4), "alice", None)
        await lab.round()
        await m.tick()
        loaded = routers[0]
        loaded.sample = lambda: Sample(t=loaded.clock(), dt=1.0, concurrency=6.0, arrivals=12,  # type: ignore[method-assign]
                                       p99_s=0.2, ready=len(loaded.ready))
        for _ in range(4):
            lab.clock.advance(1.0)
            await m.tick()
        assert m.services["llm"].record.wanted == 3
        assert len(await replica_jobs(lab)) == 3


async def test_a_preempted_replica_leaves_the_router_until_it_runs_again(tmp_path: Path) -> None:
    async with Lab.open(tmp_path, nodes=(CannedNode("a", "NVIDIA A100-SXM4-80GB", 1),)) as lab:
        m, routers = make_manager(lab, Script())
        await m.start_service(spec(), "alice", None)  # a normal-class replica on the one GPU
        await lab.round()
        await m.tick()
        assert list(routers[0].ready) == ["llm-0"]
        (replica,) = await replica_jobs(lab)
        urgent = await lab.submit("python", "urgent.py", gpus=1, qos="prod")
        await lab.round()
        assert (await lab.job(replica.id)).state is JobState.PREEMPTING
        await m.tick()
        assert routers[0].ready == {}  # no new request goes to a replica being stopped
        await lab.advance(31.0)  # its grace over: stopped, requeued
        assert (await lab.job(replica.id)).state is JobState.PENDING
        await lab.finish(urgent.id)
        await lab.round()
        lab.clock.advance(3.0)
        await m.tick()
        assert list(routers[0].ready) == ["llm-0"]
        # its cold start counts from this run's launch, not its first
        assert m.services["llm"].replicas[0].cold_start_s == pytest.approx(3.0)
        assert [r.job_id for r in m.services["llm"].replicas.values()] == [replica.id]  # the same job, not replaced


async def test_a_port_in_use_refuses_the_start_and_records_nothing_running(tmp_path: Path) -> None:
    import socket

    async with Lab.open(tmp_path) as lab:
        from hsched.controller.services import _real_probe, _real_router

        m = ServiceManager(lab.ctl, make_router=_real_router, probe=_real_probe, decide=Script())
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(UserError, match=f"--port {port}: the service's router cannot listen there"):
                await m.start_service(replace_port(spec(), port), "alice", None)
        rec = await lab.ctl.db(lab.ctl.store.get_service, "llm")
        assert rec is not None and rec.state is ServiceState.STOPPED and await replica_jobs(lab) == []
        out = await m.start_service(spec(), "alice", None)  # a free port: the real router listens there
        assert out["address"].startswith("http://127.0.0.1:") and not out["address"].endswith(":0")
        await m.close()


def replace_port(s: ServiceSpec, port: int) -> ServiceSpec:
    from dataclasses import replace

    return replace(s, port=port)


async def test_shared_replicas_pack_on_one_gpu(tmp_path: Path) -> None:
    """--shared: small models share a GPU (the sharing stage packs one user's shared jobs by memory)."""
    async with Lab.open(tmp_path, nodes=(CannedNode("a", "NVIDIA A100-SXM4-80GB", 1),)) as lab:
        script = Script()
        script.wanted = 3
        m, routers = make_manager(lab, script)
        await m.start_service(spec(lo=1, hi=3, gpu_memory_mib=20_000, shared=True), "alice", None)
        await m.tick()
        await lab.round()
        jobs = await replica_jobs(lab)
        assert [j.state for j in jobs] == [JobState.RUNNING] * 3
        assert len({d for j in jobs for p in j.placement for d in p.devices}) == 1
        await m.tick()
        assert sorted(routers[0].ready) == ["llm-0", "llm-1", "llm-2"]
