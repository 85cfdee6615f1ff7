"""Dashboard papercuts (issue 19), on canned data with no controller: the priority prompt takes the first key
typed, `S` reverses with a filter on, readings keep their units, names never break a line."""

from __future__ import annotations

import asyncio

from hsched.tui.app import DashApp
from hsched.tui.fmt import printable, reading
from hsched.tui.prompt import PromptScreen
from textual.widgets import Input

from .canned import NOW, frame


def make(view: str = "jobs") -> DashApp:
    return DashApp(None, frame=frame(), clock=lambda: NOW, view=view, user="alice")


def test_the_priority_prompt_takes_the_first_key_typed() -> None:
    async def go() -> None:
        app = make()
        sent: list[object] = []
        app.send = lambda what, ops: sent.append(ops)  # type: ignore[method-assign,assignment]
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            await pilot.press("p", "7")  # typed at once, as people do: the 7 replaces the old value
            assert isinstance(app.screen, PromptScreen)
            assert app.screen.query_one(Input).value == "7"
            await pilot.press("enter")
            await pilot.pause()
        assert sent and sent[0][0][1]["priority"] == 7  # type: ignore[index]

    asyncio.run(go())


def test_reverse_with_a_filter_on_reverses_the_rows() -> None:
    async def go() -> None:
        app = make()
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            await pilot.press("slash", *"a", "enter")  # a filter that keeps several jobs
            await pilot.pause()
            before = [app.jobs.table.coordinate_to_cell_key((r, 0)).row_key.value
                      for r in range(app.jobs.table.row_count)]
            assert len(before) > 1
            await pilot.press("S")
            await pilot.pause()
            after = [app.jobs.table.coordinate_to_cell_key((r, 0)).row_key.value
                     for r in range(app.jobs.table.row_count)]
            assert app.jobs.reverse and after == list(reversed(before))

    asyncio.run(go())


def test_readings_and_names() -> None:
    assert (reading(67.6, "C"), reading(358.8, "W"), reading(None, "W")) == ("68C", "359W", "N/A")
    assert printable("two\nlines\x1b[2J") == "two\\nlines\\x1b[2J"


def test_a_job_name_is_drawn_as_it_is_never_as_markup() -> None:
    # a member's job name is text: `[reverse]` in it must not restyle everyone's dashboard (DataTable reads a str
    # cell as Rich markup; the dashboard hands it Text)
    from hsched.tui.model import parse_snapshot

    from .canned import EVENTS, snapshot

    snap = snapshot()
    snap["jobs"][3]["name"] = "[reverse]x[/]y"

    async def go() -> None:
        app = DashApp(None, frame=parse_snapshot(snap, EVENTS, True, None), clock=lambda: NOW, view="jobs",
                      user="alice")
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            cell = app.jobs.table.get_cell("4", "name")
            assert str(cell) == "[reverse]x[/]y" and not getattr(cell, "spans", None)
            assert "[reverse]x[/]y" in app.export_screenshot()

    asyncio.run(go())
