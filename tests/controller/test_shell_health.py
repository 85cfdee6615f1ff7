"""The controller's own health: a loop that keeps failing makes it unhealthy (and working again makes it well);
a reinstalled hsched under it makes it restart itself, once the new install holds still."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hsched.controller import loops
from hsched.controller.core import UNHEALTHY_AFTER, Controller, Health, installed_fingerprint
from hsched.testing import Lab
from tests.controller.conftest import until


def _outcomes(ctl: Controller) -> tuple[int, int]:
    """(failures, loops seen): it moves every time a round records how it went."""
    return sum(r.failures for r in ctl.loops.values()), len(ctl.loops)


async def _rounds(ctl: Controller, count: int) -> None:
    """Poke the loop until it has run `count` more rounds (each ends by recording ok or failed)."""
    for _ in range(count):
        before = _outcomes(ctl)
        ctl.poke()
        await until(lambda b=before: _outcomes(ctl) != b)


async def test_a_loop_failing_three_times_in_a_row_is_unhealthy_until_it_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = True

    async def round_(ctl: Controller) -> bool:
        if broken:
            raise KeyError("runs")  # what a controller running old code over a new helper once logged
        return False

    monkeypatch.setattr(loops, "one_round", round_)
    async with Lab.open(tmp_path) as lab:
        ctl = lab.ctl
        task = asyncio.create_task(loops.run_loop(ctl))
        await _rounds(ctl, UNHEALTHY_AFTER - 1)
        assert ctl.health is Health.OK  # a bad round or two is retried, not yet a sick controller
        await _rounds(ctl, 1)
        assert ctl.health is Health.UNHEALTHY
        report = ctl.health_report()
        assert report["health"] == "unhealthy"
        assert report["health_error"] == (f"the schedule loop failed {UNHEALTHY_AFTER} times in a row; "
                                          "last: KeyError: 'runs'")
        assert report["loops"]["schedule"]["failing"] == UNHEALTHY_AFTER
        broken = False
        ctl.poke()
        await until(lambda: not ctl.loops["schedule"].failing)
        assert ctl.health is Health.OK
        assert "failed 3 time(s), the last: KeyError" in ctl.health_report()["health_error"]  # still shown
        ctl.stopping.set()
        ctl.poke()
        await task


async def test_a_reinstall_under_the_controller_restarts_it_once_the_install_holds_still(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_disk = ["v1"]
    monkeypatch.setattr(loops, "installed_fingerprint", lambda: on_disk[0])
    async with Lab.open(tmp_path) as lab:
        ctl = lab.ctl
        ctl.fingerprint = "v1"
        ctl.home.lock.touch()  # the loop steps down without its lock file (a Lab has none)
        task = asyncio.create_task(loops.health_loop(ctl))

        async def look() -> None:
            """Let the loop take one more look at the install (the clock moves past the next check)."""
            await until(lambda: lab.clock._sleepers or task.done())
            lab.clock.advance(loops.INSTALL_CHECK_S)
            await until(lambda: not lab.clock._sleepers or task.done())
            await until(lambda: lab.clock._sleepers or task.done())

        await look()
        assert ctl.restart_reason is None
        on_disk[0] = "v2-half-written"
        await look()
        on_disk[0] = "v2"
        await look()
        assert ctl.restart_reason is None  # changing between looks: pip is still at it
        await look()
        assert ctl.restart_reason is not None and "v1 -> v2" in ctl.restart_reason
        assert ctl.stopping.is_set()
        await task


async def test_no_restart_when_run_from_a_source_tree_or_when_the_install_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Lab.open(tmp_path) as lab:
        lab.ctl.fingerprint = None
        monkeypatch.setattr(loops, "installed_fingerprint", lambda: "anything")
        assert await loops.installed_now(lab.ctl) is None
        lab.ctl.fingerprint = "v1"
        monkeypatch.setattr(loops, "installed_fingerprint", lambda: None)  # mid-uninstall: nothing to start
        assert await loops.installed_now(lab.ctl) is None


def test_the_installed_fingerprint_names_this_install() -> None:
    first = installed_fingerprint()
    assert first is not None and len(first) == 16  # the test environment installs hsched (.ci/venv)
    assert installed_fingerprint() == first
