"""The process list, the history panel and the vim keys (issue 16, item 8), on canned data with no controller:
what the snapshot and `history` answers become, how the history merges, what the keys do."""

from __future__ import annotations

import asyncio
from typing import Any

from hsched.tui.app import DashApp
from hsched.tui.history import History
from hsched.tui.history_panel import bars, columns
from hsched.tui.job_screen import JobScreen
from hsched.tui.model import HistoryDelta, parse_history, parse_snapshot

from .canned import EVENTS, NOW, frame, history, snapshot


def test_the_snapshot_gives_each_node_its_processes_and_host_load() -> None:
    f = frame()
    h100 = f.node("dgx-h100")
    assert h100 is not None and h100.processes is not None and h100.load is not None
    assert [(p.gpu, p.pid) for p in h100.processes][:3] == [(0, 41000), (0, 41100), (1, 41001)]  # by GPU, pid
    (foreign,) = [p for p in h100.processes if p.job is None]
    assert (foreign.user, foreign.gpu, foreign.gpu_memory_mib) == ("dave", 6, 30_000)
    assert h100.load.cpu_count == 112 and h100.load.memory_total_mib == 2 << 20
    gone = f.node("old-v100")
    assert gone is not None and gone.processes is None and gone.load is None


def test_an_older_controllers_snapshot_still_parses() -> None:
    snap = snapshot()
    for n in snap["nodes"]:
        del n["processes"], n["host_load"]
    f = parse_snapshot(snap, EVENTS)
    assert all(n.processes is None and n.load is None for n in f.nodes) and f.history is None


def test_history_columns_and_bad_input() -> None:
    h = parse_history(history(10))
    series = dict(h.devices)["GPU-dgx-h100-00"]
    assert len(series) == 10 and series[-1][0] == NOW and series == tuple(sorted(series))
    assert h.interval_s == 1.0 and dict(h.hosts)["a100-box"][0][1] == 20.0
    # columns that do not line up, or a time that is not a number, are left out rather than guessed at
    odd = parse_history({"devices": {"u": {"t": [1, 2], "utilization_gpu": [5], "memory_used_mib": [1, 2]},
                                     "v": {"t": ["x", 3], "utilization_gpu": [1, 2], "memory_used_mib": [1, 2]}}})
    assert dict(odd.devices) == {"u": (), "v": ((3.0, 2.0, 2.0),)}


def test_history_merges_the_controllers_samples_once_each() -> None:
    h = History()
    f = frame()
    seed = parse_history(history(300))
    h.add(f, [seed])
    uuid = "GPU-dgx-h100-02"
    assert len(h.device(uuid)) == 300 and h.served
    # the next catch-up starts at the last answer's time: its first sample is one the history has
    again = HistoryDelta(devices=((uuid, ((NOW, 1.0, 1.0), (NOW + 1, 42.0, 100.0))),))
    h.add(f, [again])
    assert len(h.device(uuid)) == 300  # the window keeps its length: the oldest left
    assert h.device(uuid)[-2][0] == NOW and h.device(uuid)[-2][1] != 1.0  # the one it had, kept
    assert h.device(uuid)[-1] == (NOW + 1, 42.0, 100.0)
    assert h.get(uuid)[-1] == 42.0 and len(h.get(uuid)) == 60
    # once served, frames add nothing of their own; devices that left the fleet are forgotten
    h.add(frame(at=5.0))
    assert h.device(uuid)[-1] == (NOW + 1, 42.0, 100.0)
    snap = snapshot()
    snap["nodes"] = snap["nodes"][1:]
    h.add(parse_snapshot(snap))
    assert h.device(uuid) == () and h.host("dgx-h100") == ()


def test_without_a_served_history_each_frame_is_a_sample() -> None:
    h = History()
    for i in range(3):
        h.add(frame(util_shift=i * 10.0, at=float(i)))
    assert [p[0] - NOW for p in h.device("GPU-dgx-h100-01")] == [0.0, 1.0, 2.0]
    assert [p[1] for p in h.host("dgx-h100")] == [41.5, 41.5, 41.5]


def test_chart_columns_are_slices_of_time() -> None:
    points = [(100.0, 10.0, None), (101.0, 90.0, None), (150.0, None, None), (199.0, 50.0, None)]
    # 4 columns over 100..200: 100-125, 125-150, 150-175, 175-200; the highest reading of each, None if none
    assert columns(points, 1, end=200.0, span=100.0, width=4) == [90.0, None, None, 50.0]
    rows = bars([100.0, 0.0, None, 50.0], top=100.0, height=2)
    assert [r.plain for r in rows] == ["█   ", "█▁ █"]  # 50 % of two rows: the bottom one full


def run(coro: Any) -> None:
    asyncio.run(coro)


def test_vim_keys_move_the_cursor_and_enter_on_a_process_opens_its_job() -> None:
    async def go() -> None:
        app = DashApp(None, frame=frame(served=True), clock=lambda: NOW, view="processes", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            table = app.processes.table
            assert app.focused is table and table.cursor_row == 0
            await pilot.press("j", "j", "j")
            assert table.cursor_row == 3
            await pilot.press("k")
            assert table.cursor_row == 2
            p = app.processes.cursor_process()
            assert p is not None and (p.pid, p.job) == (41001, 1)
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, JobScreen) and app.screen.job_id == 1

    run(go())


def test_the_history_panel_follows_the_cursor_and_g_hides_it() -> None:
    async def go() -> None:
        app = DashApp(None, frame=frame(served=True), clock=lambda: NOW, view="fleet", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            panel = app.fleet.panel
            assert str(panel.border_title).startswith("GPU 0 · dgx-h100")
            await pilot.press("j", "j", "j", "j")
            assert str(panel.border_title).startswith("GPU 4 · dgx-h100") and "job 2" in str(panel.border_title)
            assert panel.util.spec is not None and len(panel.util.spec.points) == 300
            await pilot.press("g")
            assert not panel.display
            await pilot.press("g")
            assert panel.display

    run(go())


def test_coalesced_frames_keep_every_history_delta() -> None:
    async def go() -> None:
        app = DashApp(None, frame=frame(), clock=lambda: NOW, view="fleet", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            uuid = "GPU-dgx-h100-00"
            first = parse_snapshot(snapshot(), history={"now": NOW + 1, "devices": {
                uuid: {"t": [NOW + 1], "utilization_gpu": [11.0], "memory_used_mib": [1]}}})
            second = parse_snapshot(snapshot(), history={"now": NOW + 2, "devices": {
                uuid: {"t": [NOW + 2], "utilization_gpu": [22.0], "memory_used_mib": [2]}}})
            # the feed thread hands over two frames before the UI draws either: one draw, both samples
            app._from_feed(first)
            app._from_feed(second)
            await pilot.pause()
            assert app.history.device(uuid)[-2:] == ((NOW + 1, 11.0, 1.0), (NOW + 2, 22.0, 2.0))

    run(go())


def test_nodes_that_list_no_processes_say_why() -> None:
    async def go() -> None:
        snap = snapshot()
        for n in snap["nodes"]:
            del n["processes"], n["host_load"]
        snap["nodes"][1]["devices"][0]["simulated"] = False  # a100-box: a real GPU among them
        app = DashApp(None, frame=parse_snapshot(snap), clock=lambda: NOW, view="processes", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            rows = [str(app.processes.sync.cells(k)[-1]) for k in app.processes.sync.keys()]  # type: ignore[index]
            assert rows == ["simulated GPUs: no GPU processes", "processes not known: no NVML or nvidia-smi sample"]
            status = str(app.processes.status.render())
            assert "1 node of simulated GPUs" in status and "not listed by a100-box" in status

    run(go())
