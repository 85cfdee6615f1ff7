"""The dashboard's Services view (issue 30) on canned data with no controller: the snapshot's `services` parsed
(absent from an older controller, a bad row skipped), a row per service with replicas ready of wanted, requests a
second, p99 against the SLO, attainment and address; key 6 shows it; names shown as written."""

from __future__ import annotations

import asyncio
from typing import Any

from hsched.tui.app import DashApp
from hsched.tui.model import Frame, parse_snapshot
from hsched.tui.services_view import render_services
from rich.console import Console

from .canned import EVENTS, NOW, snapshot


def service(name: str, ready: int, wanted: int, rps: float, p99: float | None, attain: float | None) -> dict[str, Any]:
    return {"name": name, "user": "alice", "state": "active", "address": "http://127.0.0.1:8123",
            "replicas": {"min": 1, "max": 4, "wanted": wanted, "ready": ready, "starting": wanted - ready,
                         "draining": 0},
            "requests_per_s": rps, "p99_ms": p99, "slo_p99_ms": 300.0, "slo_attainment": attain}


def with_services(rows: Any) -> Frame:
    snap = snapshot()
    snap["services"] = rows
    return parse_snapshot(snap, EVENTS, True)


def plain(frame: Frame) -> list[str]:
    console = Console(width=140, record=True, color_system=None)
    console.print(render_services(frame.services))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_services_are_parsed_and_shown() -> None:
    assert parse_snapshot(snapshot()).services == ()  # an older controller sends none
    frame = with_services([service("llm", 2, 3, 12.5, 210.0, 0.9987), {"name": "broken"},
                           service("[bold]x", 0, 1, 0.0, None, None)])
    assert [s.name for s in frame.services] == ["[bold]x", "llm"]
    lines = plain(frame)
    assert lines[0].split() == ["SERVICE", "USER", "STATE", "READY/WANTED", "MIN-MAX", "REQ/S", "P99", "SLO", "ATTAIN",
                                "ADDRESS"]
    assert lines[1].split() == ["[bold]x", "alice", "active", "0/1", "1-4", "0.0", "-", "300", "ms", "-",
                                "http://127.0.0.1:8123"]
    assert lines[2].split() == ["llm", "alice", "active", "2/3", "1-4", "12.5", "210", "ms", "300", "ms", "99.87%",
                                "http://127.0.0.1:8123"]
    assert "no services" in plain(with_services([]))[0]


def test_key_6_shows_the_services_view() -> None:
    async def go() -> None:
        app = DashApp(None, frame=with_services([service("llm", 1, 1, 3.0, 120.0, 1.0)]), clock=lambda: NOW,
                      view="fleet", user="alice")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("6")
            await pilot.pause()
            assert app.active_view == "services"
            assert [s.name for s in app.services.shown or ()] == ["llm"]
            later = with_services([service("llm", 2, 2, 9.0, 150.0, 0.999)])
            app.apply_frame(later)
            await pilot.pause()
            assert app.services.shown == later.services

    asyncio.run(go())
