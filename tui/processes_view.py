"""Processes view: nvitop's process list for the whole fleet, under each node's host CPU and memory.

The hosts table has a row per node (CPU load of all its cores, load average, memory); the process table a row
per process and GPU (a process on two GPUs is on two rows, as nvitop lists it), with the hsched job it belongs
to: a process of no job on a GPU is someone working around the scheduler, and what keeps that GPU busy.
"""

from __future__ import annotations

from typing import Any

from hsched.tui.fmt import bar, gib, node_state_text, printable
from hsched.tui.model import Frame, HostLoadView, NodeView, ProcessView
from hsched.tui.sync import RowSync
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from hsched.theme import load_color

HOST_COLUMNS = [("node", "NODE", 10), ("state", "STATE", 8), ("cpu", "HOST CPU", 13), ("cores", "CORES", 5),
                ("load", "LOAD AVG", 14), ("mem", "HOST MEMORY", 19), ("gpus", "GPUS", 4), ("procs", "PROCS", 5)]
# fixed widths (update_cell does not resize a column), 120 columns in all with the cells' padding
PROC_COLUMNS = [("node", "NODE", 10), ("gpu", "GPU", 3), ("pid", "PID", 7), ("user", "USER", 9), ("job", "JOB", 6),
                ("gmem", "GPU MEM", 7), ("cpu", "%CPU", 6), ("hmem", "HOST MEM", 8), ("cmd", "COMMAND", 40)]


class ProcessesView(Vertical):
    DEFAULT_CSS = """
    ProcessesView { height: 1fr; }
    ProcessesView #hosts-table { height: auto; max-height: 10; }
    ProcessesView #procs-status { height: 1; color: $text-muted; }
    ProcessesView #procs-table { height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hosts: DataTable[Any] = DataTable(id="hosts-table", cursor_type="row")
        self.table: DataTable[Any] = DataTable(id="procs-table", cursor_type="row")
        self.status = Static("", id="procs-status")
        self.host_sync = RowSync(self.hosts, [c[0] for c in HOST_COLUMNS])
        self.sync = RowSync(self.table, [c[0] for c in PROC_COLUMNS])
        self.processes: dict[str, ProcessView] = {}

    def compose(self) -> ComposeResult:
        for key, label, width in HOST_COLUMNS:
            self.hosts.add_column(label, key=key, width=width)
        for key, label, width in PROC_COLUMNS:
            self.table.add_column(label, key=key, width=width)
        yield self.hosts
        yield self.status
        yield self.table

    def apply(self, frame: Frame) -> None:
        hosts = {n.name: (n.name, n.state, n.load, len(n.devices), _count(n)) for n in frame.nodes}
        self.host_sync.apply(hosts, _host_cells)
        if self.host_sync.keys() != list(hosts):
            self.host_sync.clear()
            self.host_sync.apply(hosts, _host_cells)
        sources: dict[str, tuple[Any, ...]] = {}
        self.processes = {}
        for node in frame.nodes:
            if node.processes is None:
                if node.devices:  # a node that has GPUs but does not say what runs there
                    sources[f"node:{node.name}"] = (node.name, None, _simulated(node))
                continue
            for i, p in enumerate(node.processes):
                key = f"{node.name}/{p.uuid}/{p.pid}"
                sources[key] = (node.name, p, i == 0)
                self.processes[key] = p
        self.sync.apply(sources, _proc_cells)
        if self.sync.keys() != list(sources):
            # a process came or went in the middle: draw again in node, GPU, pid order (the cursor stays)
            selected = self._selected_key()
            self.sync.clear()
            self.sync.apply(sources, _proc_cells)
            if selected in sources:
                self.table.move_cursor(row=list(sources).index(selected))
        self._status(frame)

    def _status(self, frame: Frame) -> None:
        procs = [p for n in frame.nodes for p in n.processes or ()]
        gpus = {p.uuid for p in procs}
        others = sum(1 for p in procs if p.job is None)
        parts = [f"{len(procs)} GPU processes on {len(gpus)} GPUs" if procs else "no GPU processes"]
        if others:
            parts.append(f"{others} of no hsched job")
        unknown = [n.name for n in frame.nodes if n.processes is None and n.devices and not _simulated(n)]
        simulated = sum(1 for n in frame.nodes if n.processes is None and _simulated(n))
        if simulated:
            parts.append(f"{simulated} node{'s' if simulated > 1 else ''} of simulated GPUs")
        if unknown:
            parts.append(f"not listed by {', '.join(unknown[:4])}{' …' if len(unknown) > 4 else ''}")
        self.status.update("  ·  ".join(parts))

    def _selected_key(self) -> str | None:
        if self.table.row_count == 0:
            return None
        return str(self.table.coordinate_to_cell_key(self.table.cursor_coordinate).row_key.value)

    def cursor_process(self) -> ProcessView | None:
        key = self._selected_key()
        return self.processes.get(key) if key is not None else None


def _simulated(node: NodeView) -> bool:
    """Only simulated GPUs: nothing runs on them, and this machine's simulated nodes are not monitored."""
    return bool(node.devices) and all(d.simulated for d in node.devices)


def _count(node: NodeView) -> int | None:
    return None if node.processes is None else len(node.processes)


def _host_cells(src: tuple[str, str, HostLoadView | None, int, int | None]) -> tuple[Any, ...]:
    name, state, load, gpus, procs = src
    na = Text("N/A", style="bright_black")
    if load is None:
        cpu: Text = bar(None, 8)
        mem: Text = bar(None, 8)
        cores, avg = na, na
    else:
        pct = load.cpu_percent
        cpu = bar(None if pct is None else pct / 100.0, 8, "N/A" if pct is None else f"{pct:3.0f}%")
        cores = Text("N/A" if load.cpu_count is None else str(load.cpu_count))
        avg = Text(" ".join(f"{x:.1f}" for x in load.loadavg) if load.loadavg else "N/A")
        used, total = load.memory_used_mib, load.memory_total_mib
        mem = bar(used / total if used is not None and total else None, 8,
                  f"{gib(used)}/{gib(total)}" if used is not None else "N/A")
    return (Text(name[:10], style="bold"), node_state_text(state), cpu, cores, avg, mem, str(gpus),
            "?" if procs is None else str(procs))


def _proc_cells(src: tuple[str, ProcessView | None, bool]) -> tuple[Any, ...]:
    node, p, flag = src
    if p is None:  # the node's own line: `flag` says its GPUs are simulated
        why = "simulated GPUs: no GPU processes" if flag else "processes not known: no NVML or nvidia-smi sample"
        return (Text(node[:10], style="bold"), "", "", "", "", "", "", "", Text(why, style="bright_black"))
    node_cell = Text(node[:10], style="bold") if flag else Text("")
    if p.job is None:
        # not an hsched job's: shown so, since it is what keeps a GPU busy behind the scheduler's back
        job = Text("-", style="yellow")
    else:
        job = Text(str(p.job), style="bold")
    cpu = Text("N/A", style="bright_black") if p.cpu_percent is None else \
        Text(f"{p.cpu_percent:.0f}", style=load_color(min(p.cpu_percent, 100.0) / 100.0))
    command = printable(p.command)
    return (node_cell, "" if p.gpu is None else str(p.gpu), str(p.pid), p.user[:9] or "?", job,
            gib(p.gpu_memory_mib), cpu, gib(p.host_memory_mib),
            command if len(command) <= 40 else command[:39] + "…")
