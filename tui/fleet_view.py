"""Fleet view: every device of every node, nvitop-style bars, a history sparkline, and who holds it; under it the
dataset copies under way (only while there are some)."""

from __future__ import annotations

from typing import Any

from hsched.tui.fmt import NODE_STYLE, bar, gib, node_state_text, reading, short_model, sparkline
from hsched.tui.history import History
from hsched.tui.history_panel import HistoryPanel
from hsched.tui.model import DeviceView, Frame, NodeView, ts
from hsched.tui.sync import RowSync
from hsched.tui.transfers_view import TransfersView
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

# (key, label, width): fixed widths, because update_cell does not resize columns (resizing costs a re-measure)
# (so that the whole table fits 120 columns: 11 columns with 2 cells of padding each)
COLUMNS = [("node", "NODE", 10), ("state", "STATE", 8), ("gpu", "GPU", 3), ("model", "MODEL", 14),
           ("util", "UTIL", 13), ("mem", "MEMORY", 16), ("hist", "UTIL 60×", 12), ("temp", "TEMP", 4),
           ("power", "POWER", 5), ("job", "JOB", 4), ("user", "USER", 8)]
HISTORY_WIDTH = 12  # 60 samples, 5 per cell (the highest of the five)
NOTED_STATES = ("PROBING", "UNHEALTHY")
"""Node states whose reason gets a line of its own in the table, above the node's devices."""
FLOW_WIDTHS = [w for key, _, w in COLUMNS[3:]]
"""The widths of the columns after GPU, over which such a line's reason is written."""


class FleetPanel(Vertical):
    DEFAULT_CSS = """
    FleetPanel { height: 1fr; }
    FleetPanel DataTable { height: 1fr; }
    """

    def __init__(self, history: History, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.table: DataTable[Any] = DataTable(id="fleet-table", cursor_type="row", zebra_stripes=False)
        self.panel = HistoryPanel(history, id="history-panel")
        self.transfers = TransfersView(id="transfers-panel")
        self.sync = RowSync(self.table, [c[0] for c in COLUMNS])
        self._node_of: dict[str, str] = {}
        self.frame: Frame | None = None

    def compose(self) -> ComposeResult:
        for key, label, width in COLUMNS:
            self.table.add_column(label, key=key, width=width)
        yield self.table
        yield self.transfers
        yield self.panel

    def toggle_panel(self) -> None:
        self.panel.toggle_class("hidden")
        self.show_history()

    @on(DataTable.RowHighlighted, "#fleet-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_history()

    def show_history(self) -> None:
        """The history panel follows the row under the cursor (a node's line: that node's host only)."""
        frame = self.frame
        if frame is None or self.panel.has_class("hidden"):
            return
        key = self._selected_key()
        node = frame.node(self._node_of.get(key, "")) if key is not None else None
        device = next((d for d in node.devices if d.uuid == key), None) if node is not None else None
        job = ""
        if device is not None and device.job is not None:
            j = frame.job(device.job)
            job = f"job {device.job}" + (f" {j.name} ({j.user})" if j is not None else "")
        self.panel.show(node, device, ts(frame.time), job)

    def selected_node(self) -> str | None:
        """The node of the row under the cursor (node actions act on it)."""
        keys = self.sync.keys()
        if not keys or self.table.row_count == 0:
            return None
        row_key = self.table.coordinate_to_cell_key(self.table.cursor_coordinate).row_key.value
        return self._node_of.get(str(row_key))

    def apply(self, frame: Frame) -> None:
        self.frame = frame
        users = {j.id: j.user for j in frame.jobs}
        sources: dict[str, tuple[Any, ...]] = {}
        for node in frame.nodes:
            # a node whose devices are unknown (unreachable, still probing) still gets its line; one that is
            # probing or unhealthy gets a line saying why above its devices, since nothing is placed there
            noted = not node.devices or (node.state in NOTED_STATES and bool(node.message))
            if noted:
                key = f"node:{node.name}"
                sources[key] = (node.name, node.state, node.message, None, True, None, ())
                self._node_of[key] = node.name
            for i, d in enumerate(node.devices):
                sources[d.uuid] = (node.name, node.state, node.message, d, i == 0 and not noted,
                                   users.get(d.job) if d.job is not None else None, self.history.get(d.uuid))
                self._node_of[d.uuid] = node.name
        self.sync.apply(sources, self._row_cells)
        if self.sync.keys() != list(sources):
            # rows came in out of order (a node's state line appeared above devices already shown, or its
            # devices replaced its line): draw the table again in fleet order, the cursor on the same row
            selected = self._selected_key()
            self.sync.clear()
            self.sync.apply(sources, self._row_cells)
            if selected in sources:
                self.table.move_cursor(row=list(sources).index(selected))
        self.transfers.apply(frame.transfers)
        self.show_history()

    def _selected_key(self) -> str | None:
        if self.table.row_count == 0:
            return None
        return str(self.table.coordinate_to_cell_key(self.table.cursor_coordinate).row_key.value)

    @staticmethod
    def _row_cells(src: tuple[Any, ...]) -> tuple[Any, ...]:
        name, state, message, d, first, user, samples = src
        state_color = NODE_STYLE.get(state, ("", "white"))[1]
        node_cell = Text(name[:10], style="bold") if first else Text("")
        state_cell = node_state_text(state) if first else Text("")
        if d is None:
            if state in NOTED_STATES and message:
                # why it takes no work, flowed word by word over the columns after GPU (a cell cannot span)
                return (node_cell, state_cell, "", *(Text(part, style=state_color) for part in
                                                    _flow(message, FLOW_WIDTHS)))
            return (node_cell, state_cell, "", Text(message or "no devices", style="bright_black"),
                    "", "", "", "", "", "", "")
        return (node_cell, state_cell, str(d.index), short_model(d.model)[:14], _util(d), _mem(d),
                sparkline(samples, HISTORY_WIDTH), reading(d.temperature_c, "C"), reading(d.power_w, "W"),
                "" if d.job is None else str(d.job), (user or "")[:8])


def _flow(text: str, widths: list[int]) -> list[str]:
    """`text` cut into one piece per width, at spaces where it can be (a word too long for any cell is cut);
    what does not fit in the last cell is dropped with an ellipsis."""
    words = text.split()
    out: list[str] = []
    for i, width in enumerate(widths):
        piece = ""
        while words:
            candidate = f"{piece} {words[0]}" if piece else words[0]
            if len(candidate) <= width:
                piece = candidate
                words.pop(0)
            elif not piece:
                piece, words[0] = words[0][:width], words[0][width:]
            else:
                break
        if i == len(widths) - 1 and words:
            piece = piece[:width - 1] + "…"
        out.append(piece)
    return out


def _util(d: DeviceView) -> Text:
    u = d.utilization_gpu
    return bar(None if u is None else u / 100.0, 8, "N/A" if u is None else f"{u:3.0f}%")


def _mem(d: DeviceView) -> Text:
    if d.memory_total_mib is None or d.memory_used_mib is None:
        return bar(None, 6)
    frac = d.memory_used_mib / d.memory_total_mib if d.memory_total_mib else 0.0
    return bar(frac, 6, f"{gib(d.memory_used_mib)}/{gib(d.memory_total_mib)}")


def node_summary(nodes: tuple[NodeView, ...]) -> str:
    gpus = sum(len(n.devices) for n in nodes)
    busy = sum(1 for n in nodes for d in n.devices if d.job is not None)
    return f"{len(nodes)} nodes, {busy}/{gpus} GPUs busy"
