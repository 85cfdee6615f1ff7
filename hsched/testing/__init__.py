"""Test helpers for hsched and for code built on it (as `trio.testing`): a whole controller in-process, on a
fake clock, over fake executors, with a real SQLite store.

    async with Lab.open(tmp_path) as lab:              # two canned nodes of 4 simulated A100s each
        job = await lab.submit("python", "train.py", gpus=2)
        await lab.round()                               # one scheduling round; launches complete
        run = lab.runs(job.id)[0]
        lab.finish(job.id, exit_code=0)                 # the fake node reports the run exited
        await lab.round()
        assert (await lab.job(job.id)).state is JobState.COMPLETED

Nothing here sleeps: `lab.advance(60)` moves the controller's clock and runs a round, so a 60 s grace
period passes in a millisecond. Stages run exactly as in the daemon (the same functions the loops call).

`hsched.testing.conformance` holds any executor to the executor protocol: `run_check(subject, name, folder)` for
each of `CHECKS`, or `check_executor` for them all (`fake_subject`, `local_subject` build the subjects of ours).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hsched.config import FleetConfig, NodeConfig, Settings, SimulatedDevices, parse_checkpoint_signal
from hsched.controller import commands
from hsched.controller.core import Controller
from hsched.controller.fleet import build_fleet
from hsched.controller.health import check_health, probe_all, record_sample
from hsched.controller.loops import one_round
from hsched.controller.store import Store
from hsched.datasets import Dataset
from hsched.executors.fake import FakeExecutor, FakeRun
from hsched.model import GpuHolder, Job, JobSpec, Nic, Resources, Run
from hsched.paths import Home
from hsched.spec.dependencies import parse_dependency
from hsched.testing.conformance import (
    CHECKS,
    ConformanceError,
    ExecutorUnderTest,
    check_executor,
    fake_subject,
    local_subject,
    run_check,
)
from hsched.topo.fabric import Fabric

__all__ = ["CANNED_FLEET", "CHECKS", "ConformanceError", "ExecutorUnderTest", "FakeClock", "FakeExecutor", "FakeRun",
           "Lab", "canned_fleet", "check_executor", "fake_subject", "local_subject", "run_check"]


class FakeClock:
    """A clock that moves only when told. `wait` returns when its event is set or when `advance` moves the
    clock past its deadline, never on its own. `advance` moves the wall and the monotonic clock together;
    `step_wall` steps the wall clock alone."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._now += seconds
        self._mono += seconds
        for deadline, fut in self._sleepers:
            if deadline <= self._mono and not fut.done():
                fut.set_result(None)

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone, by `seconds` either way (an administrator's `date -s`, an NTP step, a VM
        resumed hours later): the monotonic clock, and so every sleeper, does not move."""
        self._now += seconds

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        if event.is_set():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._mono + seconds, fut)
        self._sleepers.append(entry)
        waiter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait([fut, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            self._sleepers.remove(entry)


@dataclass(frozen=True, slots=True)
class CannedNode:
    name: str
    model: str
    gpus: int
    topology: str | None = "nvswitch"
    cpus: int = 64
    nics: tuple[Nic, ...] = ()
    """Its network adapters (simulated, as a fleet file's `simulate.nics`)."""


CANNED_FLEET = (CannedNode("a", "NVIDIA A100-SXM4-80GB", 4), CannedNode("b", "NVIDIA A100-SXM4-80GB", 4))
"""Two nodes of four NVLinked A100s: enough for gangs, preemption and placement choices."""


def canned_fleet(nodes: Sequence[CannedNode] = CANNED_FLEET) -> FleetConfig:
    """A fleet file's worth of nodes with simulated devices, run by fake executors."""
    return FleetConfig(
        nodes=tuple(NodeConfig(name=n.name, executor="fake",
                               simulate=SimulatedDevices(model=n.model, count=n.gpus, topology=n.topology,
                                                         cpus=n.cpus, memory_mib_host=256 * 1024, nics=n.nics))
                    for n in nodes),
        source="<hsched.testing canned fleet>",
    )


class Lab:
    """A controller built in-process over fake executors and a fake clock; see the module's docstring."""

    def __init__(self, ctl: Controller, clock: FakeClock, executors: Mapping[str, FakeExecutor]) -> None:
        self.ctl = ctl
        self.clock = clock
        self.executors = dict(executors)

    @classmethod
    @asynccontextmanager
    async def open(cls, root: Path, *, nodes: Sequence[CannedNode] = CANNED_FLEET,
                   settings: Settings | None = None, clock: FakeClock | None = None,
                   lab_mode: bool = False, datasets: Sequence[Dataset] = (),
                   fabric: Fabric | None = None) -> AsyncIterator[Lab]:
        """A controller over `root`'s store: open it again on the same `root` (and `clock`, so time goes on)
        for what a restarted controller finds. `lab_mode`: a lab controller's (every user's jobs, as their owners;
        its FakeExecutors' `accounts` say which users exist on each node)."""
        home = Home(root / "home", lab=lab_mode, lab_socket=root / "lab.sock" if lab_mode else None)
        home.ensure()
        cfg = canned_fleet(nodes)
        if datasets:
            cfg = replace(cfg, datasets=tuple(datasets))
        if fabric is not None:
            cfg = replace(cfg, fabric=fabric)
        clock = clock or FakeClock()
        # the nodes' own record of contact runs on the same clock as the controller's heartbeat check
        executors = {n.name: FakeExecutor(cpus=n.cpus, name=n.name, clock=clock.time, monotonic=clock.monotonic)
                     for n in nodes}
        # the fleet as the daemon builds it (simulated devices, links), over the fake transports
        built = build_fleet(cfg, transports=executors)
        store = Store(home.db)
        ctl = Controller(home, cfg, settings or Settings(), store, nodes=built, clock=clock)
        lab = cls(ctl, clock, executors)
        try:
            await probe_all(ctl)
            await lab.beat()
            ctl.ready.set()
            yield lab
        finally:
            await lab.settle_tasks()
            ctl.close()
            store.close()

    # ------------------------------------------------------------------------------------- driving

    async def beat(self) -> None:
        """Every reachable node sends a monitoring sample now (their heartbeat); then node states follow."""
        now, seen = self.clock.time(), self.clock.monotonic()
        for name, ex in self.executors.items():
            if not ex.unreachable:
                # the fake's GPU processes (its `processes` knob), as a node with nvidia-smi lists them
                sample = {"seq": 0, "node": name, "boot_id": ex.boot_id, "gpus": {"source": "fake", "devices": []},
                          "processes": [dict(p) for p in ex.processes]}
                record_sample(self.ctl.nodes[name], sample, now, seen=seen)
        await check_health(self.ctl)

    async def settle_tasks(self) -> None:
        """Until the controller's background work (launches) is done."""
        while self.ctl._tasks:
            await asyncio.gather(*list(self.ctl._tasks), return_exceptions=True)

    async def round(self) -> bool:
        """Heartbeats, node health, then one scheduling round as the daemon's loop runs it; launches finish."""
        await self.beat()
        changed = await one_round(self.ctl)
        await self.settle_tasks()
        return changed

    async def advance(self, seconds: float) -> bool:
        """Move the clock, then run a round."""
        self.clock.advance(seconds)
        return await self.round()

    # ------------------------------------------------------------------------------------- jobs

    async def submit(self, *command: str, gpus: int = 1, nodes: int = 1, qos: str = "normal", priority: int = 0,
                     name: str = "", user: str = "alice", checkpoint_signal: str = "TERM@30",
                     time_limit_s: float | None = None, warn: str | None = None, hold: bool = False,
                     retries: int | None = None, memory_mib: int | None = None, cpus: int | None = None,
                     dependency: str = "", kill_on_invalid_dep: bool = False, kind: str = "",
                     data: Sequence[str] = ()) -> Job:
        """`checkpoint_signal`, `warn` and `dependency` as the CLI takes them ("USR1@60", "B:USR1@60",
        "afterok:3")."""
        deps, any_of = parse_dependency(dependency) if dependency else ((), False)
        spec = JobSpec(command=command or ("true",), name=name, qos=qos, priority=priority,
                       resources=Resources(gpus=gpus, nodes=nodes, memory_mib=memory_mib, cpus=cpus),
                       checkpoint_signal=parse_checkpoint_signal(checkpoint_signal), time_limit_s=time_limit_s,
                       warn_signal=parse_checkpoint_signal(warn) if warn is not None else None, hold=hold,
                       retries=retries, dependency=deps, dependency_any=any_of,
                       kill_on_invalid_dep=kill_on_invalid_dep, kind=kind, data=tuple(data))
        return await commands.submit(self.ctl, spec, user, None)

    async def job(self, job_id: int) -> Job:
        return await self.ctl.get(job_id)

    async def runs(self, job_id: int) -> list[Run]:
        return await self.ctl.db(self.ctl.store.runs, job_id)

    async def fake_runs(self, job_id: int) -> list[FakeRun]:
        """The fake nodes' records of the job's runs (signals received, exit codes), oldest first."""
        out = []
        for run in await self.runs(job_id):
            ex = self.executors.get(run.node)
            if ex is not None and run.run_dir in ex.runs:
                out.append(ex.runs[run.run_dir])
        return out

    async def finish(self, job_id: int, exit_code: int = 0, *, rank: int | None = None,
                     end_time: float | None = None, oom: bool = False, gpu_left: Sequence[GpuHolder] = ()) -> None:
        """The job's live runs (or one rank) exit with `exit_code`, as the node will report them (with the exit
        record's `end_time`, an OOM kill, processes left on the GPUs)."""
        for run in await self.runs(job_id):
            if run.state.is_live() and (rank is None or run.rank == rank):
                self.executors[run.node].finish(run.run_dir, exit_code, end_time=end_time, oom=oom,
                                                gpu_left=gpu_left)

    async def events(self, job_id: int) -> list[str]:
        """The job's event kinds, in order."""
        return [e["kind"] for e in await self.ctl.db(self.ctl.store.events, job_id)]
