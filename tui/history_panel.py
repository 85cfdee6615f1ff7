"""The GPU-history panel under the Fleet table: the highlighted device's utilization and memory, and its node's
host CPU, over the window the controller keeps (5 minutes at one sample a second), as bar charts.

Columns are slices of time, not of samples: a gap in the samples (a node that was away, a dashboard that was
not yet open on a controller without history) is a gap in the chart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hsched.tui.fmt import gib, short_model
from hsched.tui.history import KEEP, History
from hsched.tui.model import DeviceView, NodeView, Point
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget

from hsched.theme import load_color

BLOCKS = " ▁▂▃▄▅▆▇█"
LABEL_WIDTH = 5


@dataclass(frozen=True, slots=True)
class ChartSpec:
    """What one chart draws: `pick` (1 or 2) of each point, on a scale of 0 to `top`, over the `span` seconds
    that end at `end`."""

    title: Text
    points: tuple[Point, ...]
    pick: int
    top: float
    end: float
    span: float
    label: Callable[[float], str]


def columns(points: Sequence[Point], pick: int, end: float, span: float, width: int) -> list[float | None]:
    """Each column's highest reading among the points in its slice of time (None: no point there)."""
    out: list[float | None] = [None] * width
    if width <= 0 or span <= 0:
        return out
    start = end - span
    for p in points:
        v = p[pick]
        if v is None or p[0] < start or p[0] > end:
            continue
        i = min(width - 1, int((p[0] - start) / span * width))
        before = out[i]
        out[i] = v if before is None else max(before, v)
    return out


def bars(cols: Sequence[float | None], top: float, height: int) -> list[Text]:
    """`height` rows, top first, of vertical bars in eighths of a row; a reading of nearly nothing still shows
    as a dim base, so that idle and unknown (blank) differ."""
    rows = [Text() for _ in range(height)]
    for c in cols:
        if c is None:
            for row in rows:
                row.append(" ")
            continue
        f = min(max(c / top, 0.0), 1.0) if top > 0 else 0.0
        eighths = round(f * height * 8)
        style = load_color(f)
        for r, row in enumerate(rows):
            level = height - 1 - r  # 0: the bottom row
            fill = min(8, max(0, eighths - level * 8))
            if fill:
                row.append(BLOCKS[fill], style=style)
            elif level == 0:
                row.append("▁", style="bright_black")
            else:
                row.append(" ")
    return rows


def chart_lines(spec: ChartSpec | None, width: int, height: int) -> list[Text]:
    """The whole chart in `width` x `height` cells: a title line, the bars with a scale on their left, and a
    time axis."""
    if spec is None or width < LABEL_WIDTH + 4 or height < 3:
        return [Text("")]
    plot_w = width - LABEL_WIDTH - 1
    plot_h = height - 2
    cols = columns(spec.points, spec.pick, spec.end, spec.span, plot_w)
    lines = [spec.title.copy()]
    lines[0].truncate(width, overflow="ellipsis")
    for r, row in enumerate(bars(cols, spec.top, plot_h)):
        if r == 0:
            label = spec.label(spec.top)
        elif r == plot_h - 1:
            label = spec.label(0.0)
        elif r == plot_h // 2 and plot_h >= 4:
            label = spec.label(spec.top / 2)
        else:
            label = ""
        line = Text(f"{label:>{LABEL_WIDTH}}", style="bright_black")
        line.append("│", style="bright_black")
        line.append_text(row)
        lines.append(line)
    minutes = spec.span / 60.0
    left = f"-{minutes:g} min" if minutes >= 1 else f"-{spec.span:g} s"
    axis = Text(" " * (LABEL_WIDTH + 1) + left, style="bright_black")
    axis.append(" " * max(1, plot_w - len(left) - 3) + "now", style="bright_black")
    lines.append(axis)
    return lines


class Chart(Widget):
    """One chart, drawn for its size at each refresh (so a resize redraws it right)."""

    DEFAULT_CSS = """
    Chart { width: 1fr; height: 1fr; padding: 0 1 0 0; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec: ChartSpec | None = None

    def set(self, spec: ChartSpec | None) -> None:
        if spec != self.spec:
            self.spec = spec
            self.refresh()

    def render(self) -> Text:
        return Text("\n").join(chart_lines(self.spec, self.content_size.width, self.content_size.height))


def _pct(v: float) -> str:
    return f"{v:.0f}%"


def _last(points: Sequence[Point], pick: int) -> float | None:
    return next((p[pick] for p in reversed(points) if p[pick] is not None), None)


def _peak(points: Sequence[Point], pick: int) -> float | None:
    return max((p[pick] for p in points if p[pick] is not None), default=None)  # type: ignore[type-var]


def _avg(points: Sequence[Point], pick: int) -> float | None:
    values = [p[pick] for p in points if p[pick] is not None]
    return sum(v for v in values if v is not None) / len(values) if values else None


def _or_na(v: float | None, fmt: Callable[[float], str]) -> str:
    return "N/A" if v is None else fmt(v)


class HistoryPanel(Horizontal):
    DEFAULT_CSS = """
    HistoryPanel { height: 10; border: round $primary-darken-1; border-title-color: $text; padding: 0 1; }
    HistoryPanel.hidden { display: none; }
    """

    def __init__(self, history: History, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.util = Chart(id="history-util")
        self.memory = Chart(id="history-memory")
        self.host = Chart(id="history-host")
        self.border_title = "GPU history"

    def compose(self) -> ComposeResult:
        yield self.util
        yield self.memory
        yield self.host

    def show(self, node: NodeView | None, device: DeviceView | None, end: float | None, job: str = "") -> None:
        """Draw `device` (of `node`) and `node`'s host, up to `end` (the frame's time)."""
        if node is None or end is None:
            self.border_title = "GPU history"
            for chart in (self.util, self.memory, self.host):
                chart.set(None)
            return
        span = KEEP * (self.history.interval_s or 1.0)
        if device is None:
            self.border_title = f"{node.name} · no devices"
            self.util.set(None)
            self.memory.set(None)
        else:
            parts = [f"GPU {device.index}", node.name, short_model(device.model)]
            if job:
                parts.append(job)
            self.border_title = " · ".join(parts)
            points = self.history.device(device.uuid)
            self.util.set(ChartSpec(
                Text.assemble(("UTIL ", "bold"), _or_na(_last(points, 1), _pct),
                              f"  avg {_or_na(_avg(points, 1), _pct)}  max {_or_na(_peak(points, 1), _pct)}"),
                points, 1, 100.0, end, span, _pct))
            top = float(device.memory_total_mib or _peak(points, 2) or 1)
            self.memory.set(ChartSpec(
                Text.assemble(("MEM ", "bold"), f"{_or_na(_last(points, 2), _gib)}/{_gib(top)}",
                              f"  max {_or_na(_peak(points, 2), _gib)}"),
                points, 2, top, end, span, _gib))
        host = self.history.host(node.name)
        load = node.load
        title = Text.assemble(("HOST CPU ", "bold"), _or_na(_last(host, 1), _pct))
        if load is not None and load.memory_used_mib is not None:
            title.append("  ")
            title.append("MEM ", style="bold")
            title.append(f"{gib(load.memory_used_mib)}/{gib(load.memory_total_mib)}")
        self.host.set(ChartSpec(title, host, 1, 100.0, end, span, _pct))


def _gib(mib: float) -> str:
    return gib(round(mib))
