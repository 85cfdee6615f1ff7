"""The dataset copies under way, a line each, in a small panel under the Fleet table; hidden while there are none,
so that a fleet without copies looks exactly as it did before datasets existed.

A panel rather than rows of the table: the table's narrow fixed columns (a cell cannot span) would cut a dataset's
name, route and rate into pieces, and a copy is no device the cursor should land on.
"""

from __future__ import annotations

from typing import Any

from hsched.tui.fmt import printable
from hsched.tui.model import TransferView, TransferWhy
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from hsched.datasets import show_bytes

MAX_ROWS = 6
"""Copies shown at most; beyond, the last line counts the others (the table above keeps the height)."""
BAR_WIDTH = 16


class TransfersView(Static):
    DEFAULT_CSS = """
    TransfersView { height: auto; border: round $primary-darken-1; border-title-color: $text; padding: 0 1; }
    TransfersView.hidden { display: none; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.add_class("hidden")
        self.shown: tuple[TransferView, ...] = ()

    def apply(self, transfers: tuple[TransferView, ...]) -> None:
        if transfers == self.shown:
            return  # a frame where no copy moved costs nothing
        self.shown = transfers
        self.set_class(not transfers, "hidden")
        if transfers:
            self.border_title = f"Transfers ({len(transfers)})"
            self.update(render_transfers(transfers))


def render_transfers(transfers: tuple[TransferView, ...], limit: int = MAX_ROWS) -> Table:
    """One row per copy: dataset, from -> to, progress, bytes, rate, whom it is for. User text (dataset and node
    names) goes in as Text, never as markup."""
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0), expand=False)
    table.add_column("dataset", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("route", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("progress", no_wrap=True)
    table.add_column("bytes", no_wrap=True, justify="right")
    table.add_column("rate", no_wrap=True, justify="right")
    table.add_column("for", no_wrap=True, overflow="ellipsis")
    # past the limit, the last row says how many more rather than one more copy
    shown = transfers if len(transfers) <= limit else transfers[:limit - 1]
    for t in shown:
        table.add_row(Text(printable(t.dataset), style="bold"),
                      Text(f"{printable(t.source) or '?'} → {printable(t.node)}"),
                      progress(t.fraction, BAR_WIDTH), f"{show_bytes(t.done)} of {show_bytes(t.total or None)}",
                      rate(t.mb_per_s), purpose(t))
    if len(shown) < len(transfers):
        table.add_row(Text(f"… and {len(transfers) - len(shown)} more", style="bright_black"))
    return table


def progress(fraction: float | None, width: int) -> Text:
    """A bar and a percent; one colour throughout, since a copy near its end is good news (the load colours of
    the table's bars turn red when full)."""
    if fraction is None:
        return Text("░" * width + "    ?", style="bright_black")
    full = round(fraction * width)
    text = Text("█" * full, style="cyan")
    text.append("░" * (width - full), style="bright_black")
    text.append(f" {100 * fraction:3.0f}%")
    return text


def rate(mb_per_s: float | None) -> str:
    if mb_per_s is None:
        return "N/A"
    return f"{mb_per_s:.1f} MB/s" if mb_per_s < 10 else f"{mb_per_s:.0f} MB/s"


def purpose(t: TransferView) -> Text:
    parts = [f"for job {t.job_id}"] if t.job_id is not None else []
    if t.why in (TransferWhy.PREFETCH, TransferWhy.RESUME):
        parts.append(f"({t.why.value})")
    return Text(" ".join(parts), style="bright_black" if t.job_id is None else "")
