"""Dataset copies under way (issue 15 item 2) in the Fleet view, on canned data with no controller: the snapshot's
`transfers` parsed (or absent, from an older controller), a line per copy in a panel under the table, the panel
gone while there are none, and names shown as written."""

from __future__ import annotations

import asyncio
from typing import Any

from hsched.tui.app import DashApp
from hsched.tui.model import Frame, TransferView, TransferWhy, parse_snapshot
from hsched.tui.transfers_view import render_transfers
from rich.console import Console

from .canned import EVENTS, NOW, snapshot

GIB = 1 << 30


def copy(dataset: str, src: str, dst: str, done: int, total: int | None, seconds: float | None, *,
         job_id: int | None = None, why: str = "start") -> dict[str, Any]:
    return {"dataset": dataset, "from": src, "to": dst, "done": done, "total": total, "job_id": job_id, "why": why,
            "seconds": seconds}


TRANSFERS = [
    copy("imagenet", "dgx-h100", "a100-box", 2 * GIB, 5 * GIB, 20.0, job_id=4, why="start"),
    copy("[bold]x", "dgx-h100", "a100-box", 300_000_000, 1_200_000_000, 6.0, job_id=5, why="prefetch"),
    copy("c4-en", "a100-box", "dgx-h100", 0, None, 0.0, why="resume"),
]


def with_transfers(rows: list[Any] | None = None) -> Frame:
    snap = snapshot()
    snap["transfers"] = TRANSFERS if rows is None else rows
    return parse_snapshot(snap, EVENTS, True)


def plain(frame: Frame, width: int = 120) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(render_transfers(frame.transfers))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_an_older_controller_sends_no_transfers() -> None:
    snap = snapshot()
    assert "transfers" not in snap
    assert parse_snapshot(snap).transfers == ()
    snap["transfers"] = None
    assert parse_snapshot(snap).transfers == ()


def test_transfers_parse_by_receiving_node_and_skip_what_they_cannot_name() -> None:
    rows = [*TRANSFERS, "junk", {"dataset": "no-node"}, {"to": "ws1"},
            copy("later", "a", "b", True, 10, 1.0, why="a reason from a newer controller")]
    got = with_transfers(rows).transfers
    assert [(t.node, t.dataset) for t in got] == [
        ("a100-box", "[bold]x"), ("a100-box", "imagenet"), ("b", "later"), ("dgx-h100", "c4-en")]
    x, imagenet, later, c4 = got
    assert imagenet == TransferView(dataset="imagenet", source="dgx-h100", node="a100-box", done=2 * GIB,
                                    total=5 * GIB, seconds=20.0, job_id=4, why=TransferWhy.START)
    assert imagenet.fraction == 0.4 and imagenet.mb_per_s == 2 * GIB / 20.0 / 1e6
    assert x.why is TransferWhy.PREFETCH and c4.why is TransferWhy.RESUME
    # a boolean is no byte count, and a reason this dashboard does not know is no reason it makes up
    assert later.done == 0 and later.why is None
    # size not known yet, no time elapsed: no percent and no rate rather than a division by zero
    assert c4.fraction is None and c4.mb_per_s is None


def test_a_line_per_copy_with_progress_rate_and_whom_it_is_for() -> None:
    lines = plain(with_transfers())
    assert len(lines) == 3
    x, imagenet, c4 = lines
    # the name is printed as written, not read as markup
    assert x.startswith("[bold]x") and "dgx-h100 → a100-box" in x
    assert "25%" in x and "50 MB/s" in x and x.endswith("for job 5 (prefetch)")
    assert imagenet.startswith("imagenet") and " 40%" in imagenet and "2.0 GiB of 5.0 GiB" in imagenet
    assert "107 MB/s" in imagenet and imagenet.endswith("for job 4") and "prefetch" not in imagenet
    assert "a100-box → dgx-h100" in c4 and "N/A" in c4 and "0 B of ?" in c4 and c4.endswith("(resume)")


def test_past_six_copies_the_last_line_counts_the_rest() -> None:
    rows = [copy(f"set-{i}", "a", "b", i, 10, 1.0) for i in range(9)]
    lines = plain(with_transfers(rows))
    assert len(lines) == 6
    assert [line.split()[0] for line in lines[:5]] == [f"set-{i}" for i in range(5)]
    assert lines[5] == "… and 4 more"


def test_the_panel_shows_while_copies_run_and_goes_when_they_end() -> None:
    async def go() -> None:
        app = DashApp(None, frame=with_transfers([]), clock=lambda: NOW, view="fleet", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            panel = app.fleet.transfers
            table_height = app.fleet.table.region.height
            assert not panel.display and panel.region.height == 0
            frame = with_transfers()
            app.apply_frame(frame)
            await pilot.pause()
            assert panel.display and panel.shown == frame.transfers
            # three lines and the border, taken from the table above
            assert panel.region.height == 5 and app.fleet.table.region.height == table_height - 5
            assert panel.border_title == "Transfers (3)"
            later = with_transfers([])
            app.apply_frame(later)
            await pilot.pause()
            assert not panel.display and app.fleet.table.region.height == table_height

    asyncio.run(go())


def test_fleet_with_transfers_120x36(snap_compare: Any) -> None:
    app = DashApp(None, frame=with_transfers(), clock=lambda: NOW, view="fleet", user="alice")
    assert snap_compare(app, terminal_size=(120, 36))
