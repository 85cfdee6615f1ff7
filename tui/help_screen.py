"""`?`: every key, grouped, from the same table the bindings come from (so the list is never out of date)."""

from __future__ import annotations

from hsched.tui.keys import KEYS
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def help_table(readonly: bool, can_preempt: bool) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold cyan", width=8)
    table.add_column()
    group = ""
    for k in KEYS:
        if k.changes and readonly:
            continue
        if k.action == "preempt" and not can_preempt:
            continue
        if k.group != group:
            group = k.group
            table.add_row(Text(""), Text(group, style="bold underline"))
        table.add_row(k.shown_as or k.key, k.help)
    if readonly:
        table.add_row(Text(""), Text("read-only: the actions that change jobs or nodes are hidden",
                                     style="yellow"))
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; max-height: 90%; height: auto; border: thick $accent;
                                  background: $surface; padding: 0 2; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, readonly: bool, can_preempt: bool) -> None:
        super().__init__()
        self.readonly = readonly
        self.can_preempt = can_preempt

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("hsched dash: keys", style="bold"))
            yield Static(help_table(self.readonly, self.can_preempt))

    def action_close(self) -> None:
        self.dismiss(None)
