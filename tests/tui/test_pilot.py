"""Pilot tests: the dashboard against a real controller on the simulated lab (examples/lab/fleet.toml)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from hsched.tui.app import DashApp
from hsched.tui.confirm import ConfirmScreen
from hsched.tui.help_screen import HelpScreen, help_table
from hsched.tui.job_screen import JobScreen
from hsched.tui.jobs_view import COLUMNS
from hsched.tui.prompt import PromptScreen
from rich.console import Console

from tests.conftest import SAFETY_S

from .conftest import Lab, make_lab, run, until

pytestmark = pytest.mark.slow  # a real controller on the simulated lab, as a separate process

LAB_GPUS = 16


def app_for(lab: Lab, **kwargs: object) -> DashApp:
    return DashApp(lab.home, user="alice", interval=0.2, **kwargs)  # type: ignore[arg-type]


def state(lab: Lab, job_id: int) -> str:
    return str(lab.call("show", id=job_id)["state"])


def test_views_live_data_and_help(lab: Lab) -> None:
    jid = lab.submit(["sleep", "300"], gpus=2, name="views-job")

    async def go() -> None:
        app = app_for(lab)
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.frame is not None and app.frame.job(jid) is not None, "a frame")
            assert app.active_view == "fleet"
            assert app.fleet.table.row_count == LAB_GPUS
            await until(pilot, lambda: app.can_preempt, "the preempt probe")  # this controller knows `preempt`
            await pilot.press("3")
            assert app.active_view == "jobs"
            assert str(jid) in app.jobs.sync.keys()
            await pilot.press("2")
            assert app.active_view == "topology"
            assert app.topology.node_name == "dgx-h100"
            await pilot.press("right_square_bracket")
            assert app.topology.node_name == "a100-box"
            await pilot.press("4")
            assert app.active_view == "events"
            await until(pilot, lambda: app.events_view.count > 0, "events")
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("q")
        assert app.return_code in (0, None)

    run(go())
    lab.call("cancel", id=jid)


def test_filter_tag_sort_and_me(lab: Lab) -> None:
    a = lab.submit(["sleep", "300"], name="alpha-run", user="alice", hold=True)
    b = lab.submit(["sleep", "300"], name="beta-run", user="bob", hold=True)

    async def go() -> None:
        app = app_for(lab, view="jobs")
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: {str(a), str(b)} <= set(app.jobs.sync.keys()), "both jobs")
            await pilot.press("slash", *"beta")
            assert app.jobs.sync.keys() == [str(b)]
            await pilot.press("escape")
            assert {str(a), str(b)} <= set(app.jobs.sync.keys())
            # the controller records the submitter from the kernel (SO_PEERCRED), whatever a request says: both
            # jobs are this process's user's, so "only mine" keeps both and "only alice's" (the app's user) none
            me = lab.call("show", id=a)["user"]
            assert lab.call("show", id=b)["user"] == me
            await pilot.press("m")
            assert set(app.jobs.sync.keys()) == (set() if me != "alice" else {str(a), str(b)})
            await pilot.press("m")
            assert {str(a), str(b)} <= set(app.jobs.sync.keys())
            await pilot.press("s")
            assert app.jobs.sort == "id"
            app.jobs.table.move_cursor(row=0)
            await pilot.press("space", "space")
            assert len(app.jobs.tagged) == 2
            await pilot.press("c")
            assert isinstance(app.screen, ConfirmScreen)
            assert "2 jobs" in app.screen.question
            await pilot.press("n")
            assert not isinstance(app.screen, ConfirmScreen)
            assert len(app.jobs.tagged) == 2  # nothing was sent

    run(go())
    for j in (a, b):
        lab.call("cancel", id=j)


def test_open_job_detail_and_log_tail(lab: Lab) -> None:
    jid = lab.submit(["sh", "-c", "echo hello-from-the-job; sleep 300"], name="chatty")

    async def go() -> None:
        app = app_for(lab, view="jobs")
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.frame is not None and (j := app.frame.job(jid)) is not None
                        and j.state == "RUNNING", "the job to run")
            app.jobs.filter_text = "chatty"
            app.jobs.apply(app.frame)  # type: ignore[arg-type]
            await pilot.press("enter")
            assert isinstance(app.screen, JobScreen)
            screen = app.screen
            await until(pilot, lambda: screen.detail is not None and screen.detail["runs"], "the details")
            assert "NUMA" in str(screen.detail["placement_explanation"])
            await until(pilot, lambda: any("hello-from-the-job" in ln for ln in screen.log_view.lines), "the log")
            await pilot.press("l")
            assert screen.has_class("log-only")
            await pilot.press("escape")
            assert not isinstance(app.screen, JobScreen)

    run(go())
    lab.call("cancel", id=jid)


def test_cancel_with_confirmation(lab: Lab) -> None:
    jid = lab.submit(["sleep", "300"], name="victim")

    async def go() -> None:
        app = app_for(lab, view="jobs")
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: str(jid) in app.jobs.sync.keys(), "the job")
            await pilot.press("slash", *"victim", "enter")
            await pilot.press("c")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("escape")  # no: nothing happens
            assert state(lab, jid) in ("PENDING", "RUNNING", "LAUNCHING")
            await pilot.press("c", "y")
            await until(pilot, lambda: state(lab, jid) == "CANCELLED", "the cancel")
            # ended jobs stay listed a while (the snapshot's recent_s), shown as cancelled
            st = COLUMNS.index(next(c for c in COLUMNS if c[0] == "st"))
            await until(pilot, lambda: "CA" in str((app.jobs.sync.cells(str(jid)) or ())[st:st + 1]), "the CA row")

    run(go())


def test_hold_release_priority_requeue(lab: Lab) -> None:
    blocker = lab.submit(["sleep", "300"], gpus=8, gpu_types=("h100",), name="blocker")
    jid = lab.submit(["sleep", "300"], gpu_types=("h100",), name="waiting-one")  # pending: the H100s are taken

    async def go() -> None:
        app = app_for(lab, view="jobs")
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: str(jid) in app.jobs.sync.keys(), "the job")
            await pilot.press("slash", *"waiting-one", "enter")
            await pilot.press("p")
            assert isinstance(app.screen, PromptScreen)
            await pilot.press(*"7", "enter")
            await until(pilot, lambda: lab.call("show", id=jid)["priority"] == 7, "the priority")
            await pilot.press("h", "y")
            await until(pilot, lambda: lab.call("show", id=jid)["reason"] == "JobHeldUser", "the hold")
            await pilot.press("r", "y")
            await until(pilot, lambda: lab.call("show", id=jid)["reason"] != "JobHeldUser", "the release")
            lab.call("cancel", id=blocker)
            await until(pilot, lambda: state(lab, jid) == "RUNNING", "the job to start")
            await pilot.press("enter")  # ended jobs leave the queue, so requeue is done from the job screen
            assert isinstance(app.screen, JobScreen)
            screen = app.screen
            await until(pilot, lambda: screen.detail is not None, "the details")
            await pilot.press("c", "y")
            await until(pilot, lambda: state(lab, jid) == "CANCELLED", "the cancel")
            await until(pilot, lambda: screen.detail is not None and screen.detail["state"] == "CANCELLED",
                        "the job screen to follow")
            await pilot.press("e", "y")
            await until(pilot, lambda: any(e["kind"] == "requeued" for e in lab.call("show", id=jid)["events"]),
                        "the requeue")

    run(go())
    lab.call("cancel", id=jid)


def test_drain_and_resume_node(lab: Lab) -> None:
    async def go() -> None:
        app = app_for(lab)
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.frame is not None, "a frame")
            app.fleet.table.move_cursor(row=LAB_GPUS - 1)  # ws-l40s
            await pilot.press("d")
            assert isinstance(app.screen, PromptScreen)
            await pilot.press(*"fan", "enter")
            await until(pilot, lambda: (n := app.frame.node("ws-l40s")) is not None  # type: ignore[union-attr]
                        and n.state == "DRAINED", "the drain")
            await pilot.press("u", "y")
            await until(pilot, lambda: app.frame.node("ws-l40s").state == "UP", "the resume")  # type: ignore

    run(go())


def test_history_comes_from_the_controller(lab: Lab) -> None:
    """The history panel shows what the controller kept before the dashboard opened (issue 16, item 8)."""
    def kept() -> int:
        return max((len(d["t"]) for d in lab.call("history")["devices"].values()), default=0)

    jid = lab.submit(["sleep", "300"], gpus=1, name="history-job")
    deadline = time.monotonic() + SAFETY_S
    while kept() < 4:  # the controller's own samples, from before the dashboard opens
        assert time.monotonic() < deadline, "the controller kept no history"
        time.sleep(0.2)

    async def go() -> None:
        app = app_for(lab)
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.frame is not None and app.frame.job(jid) is not None, "a frame")
            assert app.history.served
            # one frame seen, and already several samples of every device: they came from the controller
            assert min(len(app.history.device(d.uuid)) for n in app.frame.nodes for d in n.devices) >= 4
            await pilot.press("5")
            assert app.active_view == "processes"
            assert app.processes.hosts.row_count == len(app.frame.nodes)
            # this machine's simulated nodes are not monitored (nothing runs on their GPUs): each says so
            assert all(n.processes is None for n in app.frame.nodes)
            assert app.processes.table.row_count == len(app.frame.nodes)
            assert "simulated GPUs" in str(app.processes.status.render())

    run(go())
    lab.call("cancel", id=jid)


def test_readonly_hides_actions(lab: Lab) -> None:
    jid = lab.submit(["sleep", "300"], name="untouchable", hold=True)

    async def go() -> None:
        app = app_for(lab, readonly=True, view="jobs")
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: str(jid) in app.jobs.sync.keys(), "the job")
            for action in ("cancel", "hold", "release", "requeue", "priority", "preempt", "drain", "resume"):
                assert app.check_action(action, ()) is False, action
            footer_keys = {b.binding.action for b in app.active_bindings.values() if b.enabled}
            assert "cancel" not in footer_keys and "tag" in footer_keys
            await pilot.press("c", "h", "p", "d")
            assert not isinstance(app.screen, (ConfirmScreen, PromptScreen))
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            console = Console(width=120, record=True, file=io.StringIO())
            console.print(help_table(app.screen.readonly, app.screen.can_preempt))
            text = console.export_text()
            assert "read-only" in text and "cancel the job" not in text
            await pilot.press("escape")
            await pilot.press("enter")
            assert isinstance(app.screen, JobScreen)
            await pilot.press("c")
            assert isinstance(app.screen, JobScreen)  # the job screen's actions are hidden too

    run(go())
    assert state(lab, jid) == "PENDING"
    lab.call("cancel", id=jid)


def test_lost_controller_banner_and_reconnect(tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "home")

    async def go() -> None:
        app = app_for(lab)
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, lambda: app.frame is not None, "a frame")
            assert not app.banner.has_class("shown")
            lab.stop()
            await until(pilot, lambda: app.banner.has_class("shown"), "the banner")
            assert "controller lost" in str(app.banner.render())
            lab.start()
            await until(pilot, lambda: not app.banner.has_class("shown"), "the reconnection")

    try:
        run(go())
    finally:
        lab.stop()
