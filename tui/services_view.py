"""The Services view (issue 30): a line per service: replicas ready of wanted (and MIN-MAX), requests a second, p99
against the objective, SLO attainment, address. From the snapshot's `services` (hsched.controller.services).

A rich table redrawn only when a figure changed: a handful of services, at most one repaint a frame.
"""

from __future__ import annotations

from typing import Any

from hsched.tui.fmt import printable
from hsched.tui.model import ServiceView
from rich.table import Table
from rich.text import Text
from textual.widgets import Static


class ServicesView(Static, can_focus=True):
    DEFAULT_CSS = """
    ServicesView { height: 1fr; padding: 0 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(render_services(()), **kwargs)
        self.shown: tuple[ServiceView, ...] | None = None

    def apply(self, services: tuple[ServiceView, ...]) -> None:
        if services == self.shown:
            return  # a frame where no figure moved costs nothing
        self.shown = services
        self.update(render_services(services))


def render_services(services: tuple[ServiceView, ...]) -> Table | Text:
    """One row per service. Names and addresses go in as Text, never as markup."""
    if not services:
        return Text("no services: `hsched serve start NAME --replicas 1-4 --slo p99=300ms -- CMD` starts one",
                    style="bright_black")
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2, 0, 0), expand=False)
    for col in ("SERVICE", "USER", "STATE", "READY/WANTED", "MIN-MAX", "REQ/S", "P99", "SLO", "ATTAIN", "ADDRESS"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("REQ/S", "P99", "SLO", "ATTAIN") else "left")
    for s in services:
        table.add_row(Text(printable(s.name), style="bold"), Text(printable(s.user)), s.state,
                      replicas(s), f"{s.min_replicas}-{s.max_replicas}", f"{s.requests_per_s:.1f}",
                      latency(s.p99_ms, s.slo_ms), f"{s.slo_ms:g} ms", attainment(s.attainment),
                      Text(printable(s.address)))
    return table


def replicas(s: ServiceView) -> Text:
    """`2/3`, red while fewer are ready than wanted and none is (it answers nothing), yellow while some start."""
    style = "red" if s.ready == 0 and s.wanted > 0 else "yellow" if s.ready < s.wanted else "green"
    return Text(f"{s.ready}/{s.wanted}", style=style)


def latency(p99_ms: float | None, slo_ms: float) -> Text:
    if p99_ms is None:
        return Text("-", style="bright_black")
    return Text(f"{p99_ms:g} ms", style="red" if p99_ms > slo_ms else "green")


def attainment(value: float | None) -> Text:
    if value is None:
        return Text("-", style="bright_black")
    return Text(f"{100 * value:.2f}%", style="green" if value >= 0.99 else "yellow" if value >= 0.95 else "red")
