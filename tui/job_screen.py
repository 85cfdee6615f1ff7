"""Job detail (Enter) and log tail (`l`): spec, placement and why, its profile, runs, events, its devices, the
live log.

Controller calls run in thread workers: `show` when the job changes, `logs` once a second from the last offset.
"""

from __future__ import annotations

import base64
from typing import Any, Protocol, cast

from hsched.tui.events_view import kind_style
from hsched.tui.fmt import bar, gib, na, printable, reading, short_model, state_text
from hsched.tui.model import Frame, JobRow, job_from_dict
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from hsched.client import Client
from hsched.paths import Home


class DashHost(Protocol):
    """What the screen asks of the app that shows it (hsched.tui.app's DashApp): its latest frame, its
    controller, and its job actions. A protocol, so the screen need not import the app that imports it."""

    frame: Frame | None
    home: Home | None

    def action_allowed(self, action: str) -> bool: ...

    def job_action(self, name: str, jobs: list[JobRow]) -> None: ...


LOG_POLL_S = 1.0
LOG_MAX_LINES = 5000


def detail_table(d: dict[str, Any]) -> Table:
    """The `show` answer as label/value lines (hsched show's layout)."""
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold", width=16)
    t.add_column()
    res = d.get("resources") or {}
    state = Text()
    state.append_text(state_text(str(d.get("state", ""))))
    state.append(f" {d.get('state', '')}  {d.get('reason') or ''}")
    cmd = d.get("command") or []
    rows: list[tuple[str, Any]] = [
        ("job", f"{d.get('id')}  {printable(str(d.get('name', '')))}"),
        ("state", state),
        ("user", str(d.get("user", ""))),
        ("qos / priority", f"{d.get('qos')} / {d.get('priority')}"),
        ("command", " ".join(cmd) if isinstance(cmd, list) else str(cmd)),
        ("workdir", str(d.get("workdir") or "")),
        ("resources", f"{res.get('gpus', d.get('gpus'))} GPU  types {','.join(res.get('gpu_types') or []) or 'any'}"
                      f"  interconnect {res.get('interconnect', d.get('interconnect'))}"
                      f"  cpus {na(res.get('cpus'))}  memory {gib(res.get('memory_mib'))}"),
        ("checkpoint", f"{d.get('checkpoint_signal', '')}  {d.get('checkpoint_dir', '')}"),
        ("time limit", na(d.get("time_limit_s"), " s")),
        ("submitted", str(d.get("submit_time") or "")),
        ("started", str(d.get("start_time") or "")),
        ("ended", str(d.get("end_time") or "")),
        ("exit code", na(d.get("exit_code"))),
        ("restarts", str(d.get("restarts", 0))),
        ("profile", profile_text(d.get("profile"))),
    ]
    for p in d.get("placement") or []:
        rows.append(("placement", f"{p['node']}: {len(p['devices'])} device(s)"))
    rows.append(("why there", str(d.get("placement_explanation") or "not placed yet")))
    for c in d.get("components") or []:
        # a heterogeneous job: each component's id, state, request and where it runs (hsched show's lines)
        gpus = f"{c['gpus']} GPU {'|'.join(c.get('gpu_types') or []) or ''}".rstrip() if c.get("gpus") else "CPU only"
        where = ", ".join(p["node"] for p in c.get("placement") or []) or "not placed"
        rows.append((f"component {c.get('component')}", f"{c.get('display_id')}  {c.get('state')}  {gpus}  on {where}"
                                                         f"  {printable(' '.join(c.get('command') or []))}"))
    for label, value in rows:
        # (a name, a command or a reason is its owner's text: drawn as it is, never read as Rich markup)
        t.add_row(label, value if isinstance(value, Text) else Text(str(value)))
    return t


def profile_text(p: dict[str, Any] | None) -> Text:
    """What its GPUs' readings say the job is (hsched.learn.profiles), as `hsched show` says it; a job flagged idle
    stands out."""
    if not p:
        return Text("- (no GPU readings)", style="bright_black")
    flagged = bool(p.get("flagged"))
    text = Text(str(p.get("profile", "")) + (" (flagged)" if flagged else ""),
                style="bold yellow" if flagged else "bold")
    text.append(f"  {p.get('reason') or ''}")  # figures as text, never markup
    return text


def runs_table(d: dict[str, Any]) -> Table:
    t = Table(title="runs", title_justify="left", box=None, header_style="bold", pad_edge=False)
    for col in ("#", "node", "devices", "state", "reason", "start", "end", "exit"):
        t.add_column(col)
    for r in d.get("runs") or []:
        t.add_row(*(Text(c) if isinstance(c, str) else c for c in (
            str(r.get("attempt")), str(r.get("node")), str(len(r.get("devices") or [])), str(r.get("state")),
            str(r.get("reason") or ""), str(r.get("start_time") or "")[11:19], str(r.get("end_time") or "")[11:19],
            na(r.get("exit_code")))))
    return t


def events_text(d: dict[str, Any]) -> Text:
    text = Text("events\n", style="bold")
    for e in d.get("events") or []:
        text.append(str(e.get("time") or "")[11:19] + " ", style="bright_black")
        text.append(f"{e.get('kind', ''):<12}", style=kind_style(str(e.get("kind", ""))))
        text.append(f" {e.get('message', '')}\n")
    return text


class JobScreen(Screen[None]):
    DEFAULT_CSS = """
    JobScreen #job-body { height: 1fr; }
    JobScreen #job-info { width: 1fr; padding: 0 1; }
    JobScreen #job-log { width: 1fr; border-left: solid $accent; }
    JobScreen.log-only #job-info { display: none; }
    JobScreen #job-title { height: 1; background: $accent; color: $text; padding: 0 1; text-style: bold; }
    """
    BINDINGS = [
        Binding("escape,q", "back", "Back"),
        Binding("l", "toggle_log", "Log only"),
        Binding("c", "act('cancel')", "Cancel"),
        Binding("h", "act('hold')", "Hold"),
        Binding("r", "act('release')", "Release"),
        Binding("e", "act('requeue')", "Requeue"),
        Binding("p", "act('priority')", "Priority"),
        Binding("P", "act('preempt')", "Preempt"),
    ]

    def __init__(self, job_id: int, *, log_only: bool = False) -> None:
        super().__init__()
        self.job_id = job_id
        self.log_only = log_only
        self.log_offset = 0
        self.run_no: int | None = None
        self._tail_busy = False
        self._job: JobRow | None = None
        self.detail: dict[str, Any] | None = None  # the last `show` answer
        self.title_bar = Static(f"job {job_id}", id="job-title")
        self.info = Static("loading…", id="job-info-text")
        self.devices = Static("", id="job-devices")
        self.runs = Static("", id="job-runs")
        self.events = Static("", id="job-events")
        self.log_view = Log(max_lines=LOG_MAX_LINES, id="job-log", auto_scroll=True)

    @property
    def dash(self) -> DashHost:
        return cast(DashHost, self.app)  # textual types `app` as any App; ours is a DashApp

    def compose(self) -> ComposeResult:
        yield self.title_bar
        with Horizontal(id="job-body"):
            with VerticalScroll(id="job-info"):
                yield self.info
                yield self.devices
                yield self.runs
                yield self.events
            yield self.log_view
        yield Footer()

    def on_mount(self) -> None:
        self.set_class(self.log_only, "log-only")
        if self.dash.frame is not None:
            self.on_frame(self.dash.frame)
        if self.dash.home is None:
            self.info.update("no controller (canned data): details need a live controller")
            return
        self.fetch_show()
        self.fetch_log()
        self.set_interval(LOG_POLL_S, self.fetch_log)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "act":
            return self.dash.action_allowed(str(parameters[0]))
        return True

    # ------------------------------------------------------------------ data

    def on_frame(self, frame: Frame) -> None:
        job = frame.job(self.job_id)
        if job != self._job and self._job is not None and self.dash.home is not None:
            self.fetch_show()  # the job moved: state, runs or events changed
        self._job = job
        self._title(job)
        self._devices(frame, job)

    def _title(self, job: JobRow | None) -> None:
        t = Text(f"job {self.job_id}")
        if job is not None:
            t.append(f"  {printable(job.name)}  {job.state}  {job.user}  {job.node}")
        if self.run_no is not None:
            t.append(f"  log of run {self.run_no}")
        self.title_bar.update(t)

    def _devices(self, frame: Frame, job: JobRow | None) -> None:
        if job is None or not job.devices:
            self.devices.update("")
            return
        mine = set(job.devices)
        t = Table(title="its devices", title_justify="left", box=None, header_style="bold", pad_edge=False)
        for col in ("node", "GPU", "model", "util", "memory", "temp", "power"):
            t.add_column(col)
        for n in frame.nodes:
            for d in n.devices:
                if d.uuid in mine:
                    u = d.utilization_gpu
                    mem = (d.memory_used_mib / d.memory_total_mib
                           if d.memory_used_mib is not None and d.memory_total_mib else None)
                    t.add_row(n.name, str(d.index), short_model(d.model),
                              bar(None if u is None else u / 100, 8, "N/A" if u is None else f"{u:.0f}%"),
                              bar(mem, 8, gib(d.memory_used_mib)), reading(d.temperature_c, "C"),
                              reading(d.power_w, "W"))
        self.devices.update(t)

    @work(thread=True, exit_on_error=False, group="job-show")
    def fetch_show(self) -> None:
        home = self.dash.home
        assert home is not None
        with Client(home, autostart=False) as c:
            try:
                d = c.call("show", id=self.job_id)
            except Exception as e:  # shown in place of the details; the screen stays
                self.app.call_from_thread(self.info.update, f"cannot load job {self.job_id}: {e}")
                return
        self.app.call_from_thread(self._show, d)

    def _show(self, d: dict[str, Any]) -> None:
        self.detail = d
        self.info.update(detail_table(d))
        self.runs.update(runs_table(d))
        self.events.update(events_text(d))

    def fetch_log(self) -> None:
        if self._tail_busy or self.dash.home is None:
            return  # the previous read is still out: never pile up reads
        self._tail_busy = True
        self._read_log()

    @work(thread=True, exit_on_error=False, group="job-log")
    def _read_log(self) -> None:
        home = self.dash.home
        assert home is not None
        try:
            with Client(home, autostart=False) as c:
                chunk = c.call("logs", id=self.job_id, offset=self.log_offset)
        except Exception:
            chunk = None  # a lost controller is already on the banner; try again next second
        self.app.call_from_thread(self._log_chunk, chunk)

    def _log_chunk(self, chunk: dict[str, Any] | None) -> None:
        self._tail_busy = False
        if not chunk:
            return
        run = chunk.get("run")
        if run is not None and self.run_no is not None and run != self.run_no:
            self.log_view.write_line(f"──── run {run} ────")
            self.log_offset = 0  # a new run has a new log: read it from its start next time
            self.run_no = run
            return
        self.run_no = run
        data = base64.b64decode(chunk.get("data") or "")
        if data:
            self.log_view.write(data.decode("utf-8", errors="replace"))
        self.log_offset = int(chunk.get("offset", self.log_offset))
        self._title(self._job)

    # ------------------------------------------------------------------ keys

    def action_back(self) -> None:
        self.dismiss(None)

    def action_toggle_log(self) -> None:
        self.log_only = not self.log_only
        self.set_class(self.log_only, "log-only")

    def action_act(self, name: str) -> None:
        # an ended job has left the snapshot (active jobs only) but `show` still has it: requeue needs that
        job = self._job or (job_from_dict(self.detail) if self.detail else None)
        if job is None:
            self.notify(f"job {self.job_id} is not in the queue any more", severity="warning")
            return
        self.dash.job_action(name, [job])
