"""The dashboard's fleet view and `hsched nodes` show a probing or unhealthy node in the theme's colour, with
the reason on a line of its own above its devices, and go back to the usual rows when it is up again."""

from __future__ import annotations

from typing import Any

import pytest
from hsched.tui.app import DashApp
from hsched.tui.model import parse_snapshot

from hsched.cli.fleet import render_nodes
from hsched.theme import NODE_STYLE
from tests.tui.canned import EVENTS, NOW, snapshot

WHY = "probe timed out after 15 s"


def frame_with(state: str, message: str) -> Any:
    snap = snapshot()
    snap["nodes"][0] = {**snap["nodes"][0], "state": state, "message": message}
    return parse_snapshot(snap, EVENTS, True)


def text(cell: Any) -> str:
    return str(getattr(cell, "plain", cell))


async def test_an_unhealthy_node_says_why_above_its_devices_and_rows_stay_in_fleet_order() -> None:
    app = DashApp(None, frame=frame_with("UNHEALTHY", WHY), clock=lambda: NOW, view="fleet", user="alice")
    async with app.run_test(size=(120, 36)) as pilot:
        sync = app.fleet.sync
        keys = sync.keys()
        assert keys[0] == "node:dgx-h100" and keys[1].startswith("GPU-dgx-h100")
        note = sync.cells("node:dgx-h100")
        assert note is not None
        assert text(note[0]) == "dgx-h100" and text(note[1]) == NODE_STYLE["UNHEALTHY"][0] == "unhealthy"
        assert note[1].style == NODE_STYLE["UNHEALTHY"][1]
        assert " ".join(text(c) for c in note[3:] if text(c)) == WHY  # flowed over the columns after GPU
        first_gpu = sync.cells(keys[1])
        assert first_gpu is not None and text(first_gpu[0]) == ""  # the node's name is on its note line
        app.apply_frame(frame_with("UP", ""))  # a probe came back whole
        await pilot.pause()
        keys = sync.keys()
        assert "node:dgx-h100" not in keys and keys[0].startswith("GPU-dgx-h100")
        first = sync.cells(keys[0])
        assert first is not None and text(first[0]) == "dgx-h100" and text(first[1]) == "up"
        app.apply_frame(frame_with("PROBING", "first probe under way"))  # its line comes back, above, in order
        await pilot.pause()
        assert sync.keys()[0] == "node:dgx-h100" and text(sync.cells("node:dgx-h100")[1]) == "probing"  # type: ignore[index]


def test_hsched_nodes_shows_the_state_and_why_and_no_free_gpus_there(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table's width where stdout is not a terminal
    nodes = snapshot()["nodes"]
    nodes[0] = {**nodes[0], "state": "UNHEALTHY", "message": WHY,
                "devices": [{**d, "job": None} for d in nodes[0]["devices"]]}
    render_nodes(nodes)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("dgx-h100"))
    assert "unhealthy" in row and WHY in row
    assert row.split()[5:7] == ["8", "-"]  # 8 GPUs, none free: nothing is placed on an unhealthy node
