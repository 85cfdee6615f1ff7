"""A crash in the launch window, made deterministic: the controller in-process (hsched.testing's Lab: fake nodes,
a fake clock, the real store and stages), stopped dead between recording a run and recording its launch, then a
new controller on the same store and nodes. The run was either never launched (launched now, once) or launched
with the reply lost (adopted): never twice, never lost. The real-process version, where the kill lands wherever
it lands, is in test_controller_kill.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hsched.controller import launching
from hsched.controller.core import Controller
from hsched.controller.fleet import build_fleet
from hsched.controller.health import probe_all
from hsched.controller.store import Store
from hsched.controller.watching import watch_runs
from hsched.model import JobState, RunState
from hsched.testing import Lab, canned_fleet
from tests.faults.cluster import read_store
from tests.faults.invariants import state_violations

pytestmark = pytest.mark.slow  # the fault matrix (in-process: no process started)


class Crash(BaseException):
    """The controller dies here (a BaseException: no handler of the controller's catches it)."""


async def restarted(lab: Lab) -> Lab:
    """A new controller on the old one's store and nodes, started as the daemon starts one (probe, then adopt or
    settle what the old one left)."""
    old = lab.ctl
    old.close()
    old.store.close()
    store = Store(old.home.db)
    cfg = canned_fleet()
    ctl = Controller(old.home, cfg, old.settings, store, nodes=build_fleet(cfg, transports=lab.executors),
                     clock=lab.clock)
    new = Lab(ctl, lab.clock, lab.executors)
    await probe_all(ctl)
    await new.beat()
    await watch_runs(ctl)
    await new.settle_tasks()
    ctl.ready.set()
    return new


async def close(lab: Lab) -> None:
    """The restarted controller's own store and threads (Lab.open closes the first one's)."""
    await lab.settle_tasks()
    lab.ctl.close()
    lab.ctl.store.close()


def check_store(lab: Lab) -> None:
    found = state_violations(read_store(lab.ctl.home.db, integrity=True), [], quiescent=True)
    assert not found, found


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_recorded_but_never_launched_is_launched_once_after_a_restart(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with Lab.open(tmp_path) as lab:
            job = await lab.submit("train", gpus=2)
            with monkeypatch.context() as m:
                m.setattr(launching, "spawn_launch", lambda *_a, **_k: None)  # dies before any launch is sent
                await lab.round()
            [run] = await lab.runs(job.id)
            assert run.state is RunState.LAUNCHING and sum(ex.launches for ex in lab.executors.values()) == 0
            lab = await restarted(lab)
            [run] = await lab.runs(job.id)
            assert run.state is RunState.RUNNING and sum(ex.launches for ex in lab.executors.values()) == 1
            await lab.finish(job.id, 0)
            await lab.round()
            assert (await lab.job(job.id)).state is JobState.COMPLETED and len(await lab.runs(job.id)) == 1
            assert sum(ex.launches for ex in lab.executors.values()) == 1
            check_store(lab)
            await close(lab)

    run(main())


def test_launched_with_the_reply_lost_is_adopted_after_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with Lab.open(tmp_path) as lab:
            job = await lab.submit("train", gpus=2)
            real = lab.ctl.store.run_launched

            def crash(*_a: object, **_k: object) -> None:
                raise Crash("the controller dies after the node started the run, before recording it")

            lab.ctl.store.run_launched = crash  # type: ignore[method-assign]
            with pytest.raises(Crash):
                await lab.beat()
                changed = await launching.run_round(lab.ctl)
                assert changed
                tasks = list(lab.ctl._tasks)
                await asyncio.gather(*tasks)
            lab.ctl.store.run_launched = real  # type: ignore[method-assign]
            for t in list(lab.ctl._tasks):
                t.cancel()
            [run] = await lab.runs(job.id)
            assert run.state is RunState.LAUNCHING and sum(ex.launches for ex in lab.executors.values()) == 1
            lab = await restarted(lab)
            [run] = await lab.runs(job.id)
            assert run.state is RunState.RUNNING and run.handle is not None  # adopted, not launched again
            assert sum(ex.launches for ex in lab.executors.values()) == 1
            await lab.finish(job.id, 0)
            await lab.round()
            assert (await lab.job(job.id)).state is JobState.COMPLETED and len(await lab.runs(job.id)) == 1
            check_store(lab)
            await close(lab)

    run(main())
