"""Jobs view: the queue like squeue, with a live `/` filter, sorting, tags and `--me`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hsched.tui.fmt import duration, printable, state_text
from hsched.tui.model import Frame, JobRow
from hsched.tui.sync import RowSync
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

COLUMNS = [("tag", " ", 1), ("id", "JOBID", 6), ("name", "NAME", 18), ("user", "USER", 10), ("st", "ST", 2),
           ("qos", "QOS", 9), ("prio", "PRIO", 5), ("gpus", "GPUS", 4), ("node", "NODE", 12),
           ("time", "TIME", 10), ("reason", "REASON", 28)]

# squeue's default order is by state then priority; the others are one `s` away
# jobs holding devices first (running, launching, preempting), then the waiting ones
STATE_RANK = {"RUNNING": 0, "PREEMPTING": 0, "LAUNCHING": 0, "COMPLETING": 0, "PENDING": 1}
SORTS: dict[str, Callable[[JobRow], Any]] = {
    "state": lambda j: (STATE_RANK.get(j.state, 2), -j.priority, j.id),
    "id": lambda j: j.id,
    "priority": lambda j: (-j.priority, j.id),
    "user": lambda j: (j.user, j.id),
    "gpus": lambda j: (-j.gpus, j.id),
    "node": lambda j: (j.node or "~", j.id),
    "elapsed": lambda j: (j.start_ts or float("inf"), j.id),
}


def elapsed(job: JobRow, now: float) -> str:
    if job.start_ts is None:
        return duration(0)
    return duration((job.end_ts or now) - job.start_ts)


def matches(job: JobRow, needle: str) -> bool:
    """Case-insensitive substring over the columns a user reads (k9s's `/`)."""
    if not needle:
        return True
    hay = f"{job.id} {job.name} {job.user} {job.state} {job.qos} {job.node} {job.reason}".lower()
    return all(word in hay for word in needle.lower().split())


class JobsView(Vertical):
    DEFAULT_CSS = """
    JobsView { height: 1fr; }
    JobsView DataTable { height: 1fr; }
    JobsView #jobs-filter { dock: bottom; display: none; }
    JobsView #jobs-filter.shown { display: block; }
    JobsView #jobs-status { height: 1; color: $text-muted; }
    """

    def __init__(self, *, me: str | None, clock: Callable[[], float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.me = me  # the user name when --me is on
        self.clock = clock
        self.filter_text = ""
        self.sort = "state"
        self.reverse = False
        self.tagged: set[int] = set()
        self.jobs: dict[int, JobRow] = {}
        self.table: DataTable[Any] = DataTable(id="jobs-table", cursor_type="row")
        self.sync = RowSync(self.table, [c[0] for c in COLUMNS])
        self.filter_input = Input(placeholder="filter: words that every shown job contains (Esc clears)",
                                  id="jobs-filter")
        self.status = Static("", id="jobs-status")

    def compose(self) -> ComposeResult:
        for key, label, width in COLUMNS:
            self.table.add_column(label, key=key, width=width)
        yield self.status
        yield self.table
        yield self.filter_input

    # ------------------------------------------------------------------ data

    def apply(self, frame: Frame) -> None:
        self.jobs = {j.id: j for j in frame.jobs}
        self.tagged &= set(self.jobs)
        self._refresh_rows()

    def _visible(self) -> dict[str, tuple[JobRow, bool, str]]:
        now = self.clock()
        out: dict[str, tuple[JobRow, bool, str]] = {}
        for j in self.jobs.values():
            if self.me is not None and j.user != self.me:
                continue
            if not matches(j, self.filter_text):
                continue
            out[str(j.id)] = (j, j.id in self.tagged, elapsed(j, now))
        return out

    def _refresh_rows(self, force_sort: bool = False) -> None:
        visible = self._visible()
        before = {k: self.sync.cells(k) for k in visible}
        shape = self.sync.apply(visible, _render)
        # sort again only when the order could have changed: rows came or went, or a sorted-on value moved
        moved = any(before[k] is not None and before[k] != self.sync.cells(k) for k in visible)
        if shape or force_sort or (moved and self.sort != "id"):
            key = SORTS[self.sort]
            self.table.sort("id", key=lambda cell: key(self.jobs[int(str(cell))]), reverse=self.reverse)
        self._status(len(visible))

    def _status(self, shown: int) -> None:
        parts = [f"{shown}/{len(self.jobs)} jobs", f"sort: {self.sort}{' (reversed)' if self.reverse else ''}"]
        if self.filter_text:
            parts.append(f"filter: {self.filter_text!r}")
        if self.me is not None:
            parts.append(f"only {self.me}'s")
        if self.tagged:
            parts.append(f"{len(self.tagged)} tagged")
        self.status.update("  ·  ".join(parts))

    def tick(self) -> None:
        """Once a second: move the elapsed time of running jobs, touching that one cell only."""
        now = self.clock()
        for key in self.sync.keys():
            j = self.jobs.get(int(key))
            if j is not None and j.start_ts is not None and j.end_ts is None:
                self.sync.update_cell(key, "time", elapsed(j, now))

    # ------------------------------------------------------------------ selection

    def cursor_job(self) -> JobRow | None:
        if self.table.row_count == 0:
            return None
        key = self.table.coordinate_to_cell_key(self.table.cursor_coordinate).row_key.value
        return self.jobs.get(int(str(key)))

    def targets(self) -> list[JobRow]:
        """Tagged jobs if any (htop's space), else the one under the cursor."""
        if self.tagged:
            return [self.jobs[i] for i in sorted(self.tagged) if i in self.jobs]
        job = self.cursor_job()
        return [job] if job else []

    def toggle_tag(self) -> None:
        job = self.cursor_job()
        if job is None:
            return
        self.tagged ^= {job.id}
        self._refresh_rows()
        self.table.action_cursor_down()

    def cycle_sort(self) -> None:
        names = list(SORTS)
        self.sort = names[(names.index(self.sort) + 1) % len(names)]
        self._refresh_rows(force_sort=True)

    def toggle_reverse(self) -> None:
        self.reverse = not self.reverse
        self._refresh_rows(force_sort=True)

    def set_sort(self, name: str) -> None:
        if name == self.sort:
            self.reverse = not self.reverse
        self.sort = name
        self._refresh_rows(force_sort=True)

    def toggle_me(self, user: str) -> None:
        self.me = None if self.me is not None else user
        self._refresh_rows()

    # ------------------------------------------------------------------ filter

    def open_filter(self) -> None:
        self.filter_input.add_class("shown")
        self.filter_input.value = self.filter_text
        self.filter_input.focus()

    def close_filter(self, clear: bool) -> None:
        if clear:
            self.filter_input.value = ""
            self.filter_text = ""
            self._refresh_rows()
        self.filter_input.remove_class("shown")
        self.table.focus()

    @on(Input.Changed, "#jobs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._refresh_rows()

    @on(Input.Submitted, "#jobs-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.close_filter(clear=False)


def _render(src: tuple[JobRow, bool, str]) -> tuple[Any, ...]:
    j, tagged, took = src
    return (Text("*", style="bold yellow") if tagged else Text(" "), str(j.id), printable(j.name)[:18], j.user[:10],
            state_text(j.state), j.qos, str(j.priority), str(j.gpus), j.node[:12], took, j.reason[:28])
