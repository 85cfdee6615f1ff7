"""Probes never block: requests answer at once while a node's probe hangs; the node is PROBING, then UNHEALTHY
at its probe timeout (on the controller's clock), never UP with no devices; the first scheduling round waits
for the startup reconcile, requests do not; a stop cancels the probes still hanging."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hsched.config import FleetConfig, NodeConfig, Settings, SimulatedDevices
from hsched.controller import commands
from hsched.controller.api import Api
from hsched.controller.core import Controller
from hsched.controller.fleet import build_fleet, within
from hsched.controller.health import PROBE_TIMEOUT_S, check_health, probe_timeout_s, record_sample, reprobe
from hsched.controller.loops import reconcile, run_loop, start
from hsched.controller.store import Store
from hsched.errors import HelperError, NodeUnreachable
from hsched.model import JobSpec, JobState, NodeState, Resources
from hsched.paths import Home
from hsched.testing import FakeClock, FakeExecutor
from tests.controller.conftest import until


class HangingProbe(FakeExecutor):
    """A node whose probe never answers until `release` is set (a hung nvidia-smi), while every other call
    works; `gpus` is what the probe reports once released."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = 0
        self.gpus: dict[str, Any] | None = None

    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        reply = await super().probe(gpu_timeout_s=gpu_timeout_s)
        if self.gpus is not None:
            reply["gpus"] = self.gpus
        return reply


def _sim(gpus: int = 4) -> SimulatedDevices:
    return SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=gpus, topology="nvswitch", cpus=64,
                            memory_mib_host=256 * 1024)


@dataclass
class Rig:
    ctl: Controller
    clock: FakeClock
    api: Api

    def state(self, node: str) -> NodeState:
        return self.ctl.nodes[node].node.state

    def sample(self, node: str) -> None:
        """The node's monitoring sample arrives: it answers, whatever its probe does."""
        record_sample(self.ctl.nodes[node], {"seq": 0, "gpus": {"devices": []}, "processes": []}, self.clock.time(),
                      seen=self.clock.monotonic())


@asynccontextmanager
async def rig(root: Path, nodes: Mapping[str, tuple[FakeExecutor, NodeConfig]],
              settings: Settings | None = None) -> AsyncIterator[Rig]:
    """A controller as the daemon builds it (not hsched.testing.Lab, which waits for every first probe)."""
    home = Home(root / "home")
    home.ensure()
    cfg = FleetConfig(nodes=tuple(nc for _, nc in nodes.values()), source="<test>")
    clock = FakeClock()
    for ex, _ in nodes.values():
        ex.clock = clock.time
        ex.monotonic = clock.monotonic
    store = Store(home.db)
    ctl = Controller(home, cfg, settings or Settings(), store,
                     nodes=build_fleet(cfg, transports={n: ex for n, (ex, _) in nodes.items()}), clock=clock)
    try:
        yield Rig(ctl, clock, Api(ctl))
    finally:
        ctl.stopping.set()
        ctl.cancel_probes()
        await asyncio.gather(*ctl.probes, *ctl._tasks, return_exceptions=True)
        ctl.close()
        store.close()


def fake_node(name: str, *, gpus: int = 4, executor: str = "fake") -> NodeConfig:
    return NodeConfig(name=name, executor=executor, simulate=_sim(gpus))


def spec(gpus: int = 1) -> JobSpec:
    return JobSpec(command=("python", "train.py"), resources=Resources(gpus=gpus))


async def test_requests_answer_while_a_probe_hangs_and_the_node_is_unhealthy_at_its_timeout(tmp_path: Path) -> None:
    hung = HangingProbe(name="hung")
    good = FakeExecutor(name="good")
    async with rig(tmp_path, {"hung": (hung, fake_node("hung")), "good": (good, fake_node("good"))}) as r:
        await start(r.ctl)  # returns with the probes still under way: nothing here waits on a node
        await hung.started.wait()
        assert r.state("hung") is NodeState.PROBING
        # requests are answered from what is known, at once: no request waits for `ready`
        assert not r.ctl.ready.is_set()
        queue = await r.api.handle("queue", {}, 0)
        assert queue == []
        nodes = {n["name"]: n for n in await r.api.handle("nodes", {}, 0)}
        assert nodes["hung"]["state"] == "PROBING"
        job = await r.api.handle("submit", {"spec": {"command": ["python", "train.py"]}}, 0)
        assert job["state"] == "PENDING"  # durable and acknowledged before any node answered
        ping = await r.api.handle("ping", {}, 0)
        assert ping["ready"] is False and "hung" in ping["probing"]

        # the node keeps answering otherwise (its monitoring samples), only its probe hangs
        r.sample("hung")
        await check_health(r.ctl)
        assert r.state("hung") is NodeState.PROBING  # not UP with 0 devices, not given work
        assert r.state("good") is NodeState.UP
        r.clock.advance(PROBE_TIMEOUT_S - 1)
        r.sample("hung")
        await asyncio.sleep(0)
        assert not hung.cancelled  # the timeout is the controller's clock's, and it has not passed yet
        r.clock.advance(1)
        await r.ctl.nodes["hung"].probe_task  # type: ignore[misc]
        r.sample("hung")
        await check_health(r.ctl)
        node = r.ctl.nodes["hung"].node
        assert node.state is NodeState.UNHEALTHY
        assert node.message == f"probe timed out after {PROBE_TIMEOUT_S:g} s"
        assert hung.cancelled == 1  # the hung call was cancelled, not left running
        events = [e["message"] for e in await r.ctl.db(r.ctl.store.events, None)]
        assert any("hung is unhealthy: probe timed out after 15 s" in m for m in events)


async def test_an_unhealthy_node_gets_no_work_and_comes_back_on_a_probe_that_answers(tmp_path: Path) -> None:
    hung = HangingProbe(name="hung")
    async with rig(tmp_path, {"hung": (hung, fake_node("hung", executor="local"))}) as r:
        await start(r.ctl)
        r.clock.advance(PROBE_TIMEOUT_S)
        await r.ctl.nodes["hung"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)  # this machine's own node always answers: unhealthy, not unreachable
        assert r.state("hung") is NodeState.UNHEALTHY
        await reconcile(r.ctl)
        job = await commands.submit(r.ctl, spec(), "alice", None)
        from hsched.controller.loops import one_round

        await one_round(r.ctl)
        assert (await r.ctl.get(job.id)).state is JobState.PENDING  # nothing is placed on an unhealthy node
        hung.release.set()
        reprobe(r.ctl)
        await r.ctl.nodes["hung"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.state("hung") is NodeState.UP and r.ctl.nodes["hung"].node.message == ""
        await one_round(r.ctl)
        await asyncio.gather(*r.ctl._tasks)
        assert (await r.ctl.get(job.id)).state is JobState.RUNNING
        events = [e["message"] for e in await r.ctl.db(r.ctl.store.events, None)]
        assert "hung is healthy again" in events


async def test_helper_errors_are_unhealthy_and_unreachable_nodes_stay_unreachable(tmp_path: Path) -> None:
    broken = FakeExecutor(name="broken")
    away = FakeExecutor(name="away")
    broken.fail_with = HelperError("node helper 'probe': NVMLError: driver not loaded", "probe")
    away.unreachable = True
    async with rig(tmp_path, {"broken": (broken, fake_node("broken", executor="local")),
                              "away": (away, fake_node("away"))}) as r:
        await start(r.ctl)
        await asyncio.gather(*(rt.probe_task for rt in r.ctl.nodes.values()))  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.state("broken") is NodeState.UNHEALTHY
        assert r.ctl.nodes["broken"].node.message.startswith("probe failed: node helper 'probe': NVMLError")
        assert r.state("away") is NodeState.UNREACHABLE
        assert isinstance(r.ctl.nodes["away"].probe_error, NodeUnreachable)


async def test_a_probe_reply_that_cannot_be_read_is_the_nodes_problem_not_a_stuck_probe(tmp_path: Path) -> None:
    odd = HangingProbe(name="odd")
    odd.gpus = {"source": "nvidia-smi", "devices": ["GPU-1"]}  # a device that is not an object
    odd.release.set()
    async with rig(tmp_path, {"odd": (odd, NodeConfig(name="odd", executor="local"))}) as r:
        await start(r.ctl)
        await r.ctl.nodes["odd"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.state("odd") is NodeState.UNHEALTHY
        assert r.ctl.nodes["odd"].node.message.startswith("probe failed: ")


async def test_a_gpu_tool_that_fails_on_a_real_node_is_unhealthy_not_zero_gpus(tmp_path: Path) -> None:
    real = HangingProbe(name="real")
    real.gpus = {"source": None, "devices": [], "error": "GPU probe did not answer within 7.5 s (nvidia-smi pid 9 "
                                                          "killed)"}
    real.release.set()
    cpu_only = FakeExecutor(name="cpu")  # no GPU tool at all: a node with no GPUs, and healthy
    async with rig(tmp_path, {"real": (real, NodeConfig(name="real", executor="local")),
                              "cpu": (cpu_only, NodeConfig(name="cpu", executor="local"))}) as r:
        await start(r.ctl)
        await asyncio.gather(*(rt.probe_task for rt in r.ctl.nodes.values()))  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.state("real") is NodeState.UNHEALTHY
        assert r.ctl.nodes["real"].node.message == "GPU probe did not answer within 7.5 s (nvidia-smi pid 9 killed)"
        assert real.probe_timeouts == [7.5]  # the node's own bound on its GPU tools, inside the probe's 15 s
        assert r.state("cpu") is NodeState.UP
        # its GPUs are unknown, not absent: a GPU job waits for it instead of being refused as impossible
        job = await r.api.handle("submit", {"spec": {"command": ["true"], "resources": {"gpus": 1}}}, 0)
        waiting = [e["message"] for e in await r.ctl.db(r.ctl.store.events, job["id"]) if e["kind"] == "waiting"]
        assert job["state"] == "PENDING" and waiting and waiting[0].endswith("waiting for real")
        # the GPU tools answer again: up, with its GPUs; when they fail once more, what was known of them stays
        gpu = {"uuid": "GPU-real-0", "index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920}
        real.gpus = {"source": "nvidia-smi", "devices": [gpu]}
        reprobe(r.ctl)
        await r.ctl.nodes["real"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.state("real") is NodeState.UP and [d.uuid for d in r.ctl.nodes["real"].node.devices] == ["GPU-real-0"]
        real.gpus = {"source": None, "devices": [], "error": "GPU probe failed (exit status 255): no driver"}
        reprobe(r.ctl)
        await r.ctl.nodes["real"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)
        node = r.ctl.nodes["real"].node
        assert node.state is NodeState.UNHEALTHY and node.message == "GPU probe failed (exit status 255): no driver"
        assert [d.uuid for d in node.devices] == ["GPU-real-0"]


async def test_the_first_round_waits_for_the_reconcile_and_requests_do_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hsched.controller import loops

    rounds: list[bool] = []  # for each round: was the reconcile done?
    real_round = loops.one_round

    async def recorded_round(ctl: Controller) -> bool:
        rounds.append(ctl.ready.is_set())
        return await real_round(ctl)

    monkeypatch.setattr(loops, "one_round", recorded_round)
    hung = HangingProbe(name="hung")
    good = FakeExecutor(name="good")
    async with rig(tmp_path, {"hung": (hung, fake_node("hung")), "good": (good, fake_node("good"))}) as r:
        await start(r.ctl)
        job = await commands.submit(r.ctl, spec(), "alice", None)  # pokes the loop before it even starts
        loop = asyncio.create_task(run_loop(r.ctl))
        # a loop that did not wait would run a round on that poke before it first sleeps on the clock
        await until(lambda: r.clock._sleepers)
        assert rounds == [] and (await r.ctl.get(job.id)).state is JobState.PENDING
        reconciling = asyncio.create_task(reconcile(r.ctl))
        r.clock.advance(PROBE_TIMEOUT_S)  # the hung node is given up on: the reconcile ends, rounds begin
        await reconciling
        assert r.ctl.ready.is_set()
        while (await r.ctl.get(job.id)).state is JobState.PENDING:
            await r.ctl.wait_changed(r.ctl.version, 5.0)
        assert (await r.ctl.get(job.id)).placement[0].node == "good"
        assert rounds and all(rounds)
        r.ctl.stopping.set()
        r.ctl.poke()
        await loop


async def test_a_stop_cancels_probes_still_hanging(tmp_path: Path) -> None:
    hung = HangingProbe(name="hung")
    async with rig(tmp_path, {"hung": (hung, fake_node("hung"))}) as r:
        await start(r.ctl)
        await hung.started.wait()
        task = r.ctl.nodes["hung"].probe_task
        assert task is not None and task in r.ctl.probes
        r.ctl.cancel_probes()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and hung.cancelled == 1 and not r.ctl.probes


async def test_the_probe_timeout_comes_from_the_settings_where_they_have_it(tmp_path: Path) -> None:
    @dataclass(frozen=True, slots=True)
    class WithTimeout(Settings):
        probe_timeout_s: float = 2.0

    hung = HangingProbe(name="hung")
    async with rig(tmp_path, {"hung": (hung, fake_node("hung", executor="local"))}, settings=WithTimeout()) as r:
        assert probe_timeout_s(r.ctl) == 2.0
        await start(r.ctl)
        r.clock.advance(2.0)
        await r.ctl.nodes["hung"].probe_task  # type: ignore[misc]
        await check_health(r.ctl)
        assert r.ctl.nodes["hung"].node.message == "probe timed out after 2 s"
    async with rig(tmp_path / "b", {"x": (FakeExecutor(name="x"), fake_node("x"))}) as r:
        assert probe_timeout_s(r.ctl) == PROBE_TIMEOUT_S


async def test_within_times_out_on_the_given_clock_only() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    async def slow() -> str:
        await gate.wait()
        return "answered"

    task = asyncio.create_task(within(clock, 10, slow()))
    await until(lambda: clock._sleepers)  # parked on the fake clock's deadline (real time has no say)
    gate.set()
    assert await task == "answered"
    assert not clock._sleepers  # its timer went with it
    gate.clear()
    late = asyncio.create_task(within(clock, 10, slow()))
    await until(lambda: clock._sleepers)
    clock.advance(10)
    with pytest.raises(TimeoutError):
        await late


async def test_a_submit_waits_for_first_probes_only_when_they_decide_whether_it_can_run(tmp_path: Path) -> None:
    real = HangingProbe(name="real")  # real GPUs, not known until its probe answers
    sim = FakeExecutor(name="sim")
    async with rig(tmp_path, {"real": (real, NodeConfig(name="real", executor="fake")),
                              "sim": (sim, fake_node("sim", gpus=2))}) as r:
        await start(r.ctl)
        await real.started.wait()
        small = await r.api.handle("submit", {"spec": {"command": ["true"], "resources": {"gpus": 2}}}, 0)
        assert small["state"] == "PENDING"  # a known node can run it: accepted while the probe hangs
        big = asyncio.create_task(r.api.handle("submit", {"spec": {"command": ["true"],
                                                                   "resources": {"gpus": 8}}}, 0))
        await asyncio.sleep(0)  # one step: the request runs up to its first wait (nothing before it awaits)
        assert not big.done()  # only the probing node can say whether 8 GPUs exist anywhere
        r.clock.advance(PROBE_TIMEOUT_S)  # it never says: the job is queued to wait for that node
        job = await big
        events = [e["kind"] for e in await r.ctl.db(r.ctl.store.events, job["id"])]
        assert job["state"] == "PENDING" and "waiting" in events
        assert job["submit_time"] != small["submit_time"]  # recorded after the probe gave up, not before
