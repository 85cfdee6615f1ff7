"""Events view: node up/down, placements, preemptions, failures, as they happen (newest at the bottom)."""

from __future__ import annotations

from typing import Any

from hsched.tui.model import EventView
from rich.text import Text
from textual.widgets import RichLog

from hsched.theme import event_color

MAX_LINES = 2000


def kind_style(kind: str) -> str:
    return event_color(kind)


class EventsView(RichLog):
    DEFAULT_CSS = """
    EventsView { height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_lines=MAX_LINES, wrap=False, markup=False, highlight=False, **kwargs)
        self.count = 0

    def add(self, events: tuple[EventView, ...]) -> None:
        for e in events:
            line = Text()
            line.append(e.time[11:19] if len(e.time) >= 19 else e.time, style="bright_black")
            line.append(f" {e.kind:<12}", style=kind_style(e.kind))
            line.append(f" job {e.job_id:<5}" if e.job_id is not None else " " * 10)
            line.append(f" {e.node or '':<10}", style="bold")
            line.append(f" {e.message}")
            self.write(line)
            self.count += 1
