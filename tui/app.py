"""`hsched dash`: the live Textual view of the fleet, its topology and the queue.

One thread worker (feed.Feed) reads the controller's stream and posts immutable frames; every view applies a
frame by touching only what changed. Actions ask first, then call the controller from thread workers, so no
handler ever blocks. A worker that fails shows a notification; the app stays (exit_on_error=False).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from hsched.tui.banner import Banner
from hsched.tui.confirm import ConfirmScreen
from hsched.tui.events_view import EventsView
from hsched.tui.feed import Feed
from hsched.tui.fleet_view import FleetPanel, node_summary
from hsched.tui.help_screen import HelpScreen
from hsched.tui.history import History
from hsched.tui.job_screen import DashHost, JobScreen
from hsched.tui.jobs_view import SORTS, JobsView
from hsched.tui.keys import CHANGING_ACTIONS, bindings
from hsched.tui.messages import FeedLost, FeedRestored, FrameArrived
from hsched.tui.model import EventView, Frame, HistoryDelta, JobRow
from hsched.tui.processes_view import ProcessesView
from hsched.tui.prompt import PromptScreen
from hsched.tui.services_view import ServicesView
from hsched.tui.topology_view import TopologyView
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, TabbedContent, TabPane

from hsched.client import Client
from hsched.errors import HschedError
from hsched.paths import Home

VIEWS = ("fleet", "topology", "jobs", "events", "processes", "services")
JOB_KEYS = {"details", "logs", "tag", "sort", "reverse", "me", "topology_of_job", "cancel", "hold", "release",
            "requeue", "priority", "preempt"}
NODE_KEYS = {"drain", "resume"}

# what each job action asks and which request it sends
JOB_OPS: dict[str, tuple[str, str, Callable[[JobRow], dict[str, Any]]]] = {
    "cancel": ("Cancel", "cancel", lambda j: {"id": j.id}),
    "hold": ("Hold", "hold", lambda j: {"id": j.id, "hold": True}),
    "release": ("Release", "hold", lambda j: {"id": j.id, "hold": False}),
    "requeue": ("Requeue", "requeue", lambda j: {"id": j.id}),
    "preempt": ("Preempt now", "preempt", lambda j: {"id": j.id}),
}


class DashApp(App[None]):
    TITLE = "hsched dash"
    CSS = """
    TabbedContent { height: 1fr; }
    TabPane { padding: 0; }
    """
    BINDINGS = bindings()
    COMMAND_PALETTE_BINDING = "ctrl+p"

    def __init__(self, home: Home | None, *, readonly: bool = False, me: str | None = None, user: str = "",
                 interval: float = 1.0, clock: Callable[[], float] = time.time, frame: Frame | None = None,
                 view: str = "fleet") -> None:
        """`home` None: no controller, show `frame` only (snapshot tests, the benchmark)."""
        super().__init__()
        self.home = home
        self.readonly = readonly
        self.user = user
        self.interval = interval
        self.clock = clock
        self.frame: Frame | None = None
        self.initial_frame = frame
        self.initial_view = view
        self.can_preempt = False
        self.history = History()
        self.banner = Banner(id="banner")
        self.fleet = FleetPanel(self.history, id="fleet-view")
        self.topology = TopologyView(id="topology-view")
        self.jobs = JobsView(me=me, clock=clock, id="jobs-view")
        self.events_view = EventsView(id="events-view")
        self.processes = ProcessesView(id="processes-view")
        self.services = ServicesView(id="services-view")
        self.feed: Feed | None = None
        # frames are coalesced: when the UI is behind, only the newest frame is drawn (events and history
        # samples are kept: each frame brings only what is new)
        self._inbox_lock = threading.Lock()
        self._inbox: Frame | None = None
        self._inbox_events: list[EventView] = []
        self._inbox_history: list[HistoryDelta] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="▣")
        yield self.banner
        with TabbedContent(initial=self.initial_view, id="views"):
            with TabPane("1 Fleet", id="fleet"):
                yield self.fleet
            with TabPane("2 Topology", id="topology"):
                yield self.topology
            with TabPane("3 Jobs", id="jobs"):
                yield self.jobs
            with TabPane("4 Events", id="events"):
                yield self.events_view
            with TabPane("5 Procs", id="processes"):
                yield self.processes
            with TabPane("6 Services", id="services"):
                yield self.services
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "read-only" if self.readonly else ""
        if self.initial_frame is not None:
            self.apply_frame(self.initial_frame)
        if self.home is not None:
            self.feed = Feed(self.home, self.interval, on_frame=self._from_feed,
                             on_lost=lambda e, n: self.post_message(FeedLost(e, n)),
                             on_restored=lambda: self.post_message(FeedRestored()))
            self._run_feed()
        self.set_interval(1.0, self._tick)
        self._focus_view(self.initial_view)

    def _tick(self) -> None:
        # elapsed times move every second; only while the Jobs view is seen, since any cell update costs a
        # repaint of the visible table (the next frame or view switch brings hidden ones up to date)
        if self.active_view == "jobs" and len(self.screen_stack) == 1:
            self.jobs.tick()

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop()

    # ------------------------------------------------------------------ data flow

    @work(thread=True, exit_on_error=False, group="feed", name="feed")
    def _run_feed(self) -> None:
        assert self.feed is not None
        self.feed.run()

    def _from_feed(self, frame: Frame) -> None:
        """Feed thread: keep the newest frame; post a message only if none is waiting already."""
        with self._inbox_lock:
            waiting = self._inbox is not None
            self._inbox = frame
            self._inbox_events.extend(frame.events)
            if frame.history is not None:
                self._inbox_history.append(frame.history)
        if not waiting:
            self.post_message(FrameArrived(frame))

    def on_frame_arrived(self, message: FrameArrived) -> None:
        with self._inbox_lock:
            frame, events, history = self._inbox, self._inbox_events, self._inbox_history
            self._inbox, self._inbox_events, self._inbox_history = None, [], []
        if frame is None:
            frame = message.frame  # posted directly (tests)
            events = list(frame.events)
            history = [frame.history] if frame.history is not None else []
        self.apply_frame(frame, tuple(events), tuple(history))

    def apply_frame(self, frame: Frame, events: tuple[EventView, ...] | None = None,
                    history: tuple[HistoryDelta, ...] | None = None) -> None:
        """Draw one frame: every view applies it in place, inside one batch (one repaint). `events` and
        `history`: those of the frames coalesced into this one (else the frame's own)."""
        first = self.frame is None
        if frame.can_preempt != self.can_preempt:
            self.can_preempt = frame.can_preempt
            self.refresh_bindings()
        self.frame = frame
        self.history.add(frame, history if history is not None else ())
        with self.batch_update():
            self.fleet.apply(frame)
            self.topology.apply(frame)
            self.jobs.apply(frame)
            self.processes.apply(frame)
            self.services.apply(frame.services)
            self.events_view.add(frame.events if events is None else events)
            for screen in self.screen_stack:
                if isinstance(screen, JobScreen):
                    screen.on_frame(frame)
            where = str(self.home.root) if self.home is not None else "offline"
            self.sub_title = "  ·  ".join(
                x for x in ("read-only" if self.readonly else "", where, node_summary(frame.nodes),
                            f"{len(frame.jobs)} jobs", f"at {frame.time[11:19]}") if x)
        if first:
            self._focus_view(self.active_view)

    def on_feed_lost(self, message: FeedLost) -> None:
        self.banner.lost(message.error, message.attempt)

    def on_feed_restored(self, message: FeedRestored) -> None:
        self.banner.restored()
        self.notify("controller is back")

    def on_worker_state_changed(self, event: Any) -> None:
        # exit_on_error=False keeps the app alive; say what failed instead
        from textual.worker import WorkerState

        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name or 'worker'} failed: {event.worker.error}", severity="error")

    # ------------------------------------------------------------------ views

    @property
    def active_view(self) -> str:
        return self.query_one("#views", TabbedContent).active or "fleet"

    def _focus_view(self, view: str) -> None:
        target = {"fleet": self.fleet.table, "jobs": self.jobs.table, "topology": self.topology.node_tree,
                  "events": self.events_view, "processes": self.processes.table, "services": self.services}.get(view)
        if target is not None:
            target.focus()

    def action_view(self, view: str) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.query_one("#views", TabbedContent).active = view
        self._focus_view(view)
        self.refresh_bindings()

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._focus_view(self.active_view)
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide what does not apply: actions under --readonly, preempt without controller support, job keys
        outside the Jobs view, node keys outside Fleet and Topology."""
        if not isinstance(self.screen, Screen) or self.screen is not self.screen_stack[0]:
            return True
        if not self.action_allowed(action):
            return False
        if action in JOB_KEYS and self.active_view != "jobs":
            return False
        if action in NODE_KEYS and self.active_view not in ("fleet", "topology"):
            return False
        if action == "node" and self.active_view != "topology":
            return False
        if action == "toggle_history" and self.active_view != "fleet":
            return False
        return True

    def action_allowed(self, action: str) -> bool:
        if action in CHANGING_ACTIONS and self.readonly:
            return False
        return not (action == "preempt" and not self.can_preempt)

    def action_vim(self, direction: str) -> None:
        """`j`/`k`: what the arrow keys do in the focused table, tree or log (k9s's keys)."""
        widget = self.focused
        for name in (f"action_cursor_{direction}", f"action_scroll_{direction}"):
            step = getattr(widget, name, None)
            if callable(step):
                step()
                return

    def action_toggle_history(self) -> None:
        self.fleet.toggle_panel()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.readonly, self.can_preempt))

    def action_filter(self) -> None:
        if self.active_view != "jobs":
            self.action_view("jobs")
        self.jobs.open_filter()

    async def action_back(self) -> None:
        if self.jobs.filter_input.has_class("shown"):
            self.jobs.close_filter(clear=True)

    def action_details(self) -> None:
        job = self.jobs.cursor_job()
        if job is not None:
            self.push_screen(JobScreen(job.id))

    def action_logs(self) -> None:
        job = self.jobs.cursor_job()
        if job is not None:
            self.push_screen(JobScreen(job.id, log_only=True))

    def action_tag(self) -> None:
        self.jobs.toggle_tag()

    def action_sort(self) -> None:
        self.jobs.cycle_sort()

    def action_reverse(self) -> None:
        self.jobs.toggle_reverse()

    def action_me(self) -> None:
        self.jobs.toggle_me(self.user)

    def action_topology_of_job(self) -> None:
        job = self.jobs.cursor_job()
        if job is None:
            return
        self.topology.show(job=job)
        self.action_view("topology")

    def action_node(self, delta: int) -> None:
        self.topology.step_node(delta)

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_selected(self, event: DataTable.RowSelected) -> None:
        self.action_details()

    @on(DataTable.RowSelected, "#fleet-table")
    def _device_selected(self, event: DataTable.RowSelected) -> None:
        job = None
        if self.frame is not None:
            uuid = str(event.row_key.value)
            job = next((d.job for n in self.frame.nodes for d in n.devices if d.uuid == uuid), None)
        if job is not None:
            self.push_screen(JobScreen(job))

    @on(DataTable.RowSelected, "#procs-table")
    def _process_selected(self, event: DataTable.RowSelected) -> None:
        p = self.processes.cursor_process()
        if p is not None and p.job is not None:
            self.push_screen(JobScreen(p.job))

    @on(DataTable.RowHighlighted, "#jobs-table")
    def _job_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.topology.highlight = self.jobs.cursor_job()

    # ------------------------------------------------------------------ actions

    def action_cancel(self) -> None:
        self.job_action("cancel", self.jobs.targets())

    def action_hold(self) -> None:
        self.job_action("hold", self.jobs.targets())

    def action_release(self) -> None:
        self.job_action("release", self.jobs.targets())

    def action_requeue(self) -> None:
        self.job_action("requeue", self.jobs.targets())

    def action_preempt(self) -> None:
        self.job_action("preempt", self.jobs.targets())

    def action_priority(self) -> None:
        self.job_action("priority", self.jobs.targets())

    def job_action(self, name: str, jobs: list[JobRow]) -> None:
        """Ask, then send. Used by the Jobs view (tagged or cursor jobs) and by the job screen."""
        if not self.action_allowed(name):
            return
        if not jobs:
            self.notify("no job selected", severity="warning")
            return
        which = ", ".join(str(j.id) for j in jobs[:8]) + (" …" if len(jobs) > 8 else "")
        noun = f"job {which}" if len(jobs) == 1 else f"{len(jobs)} jobs ({which})"
        if name == "priority":
            first = jobs[0]

            def set_priority(answer: str | None) -> None:
                if not answer or not answer.strip():
                    return
                prio, _, qos = answer.strip().partition(" ")
                try:
                    value = int(prio)
                except ValueError:
                    self.notify(f"not a priority: {prio!r}", severity="error")
                    return
                args = {"priority": value, "qos": qos.strip() or None}
                self.send(f"priority of {noun}", [("priority", {"id": j.id, **args}) for j in jobs])

            # empty, with the current value as the hint: what is typed first is the new value, whole
            self.push_screen(PromptScreen(f"New priority for {noun} (optionally a QoS: `10 prod`)",
                                          placeholder=f"now {first.priority} ({first.qos})"), set_priority)
            return
        label, op, make = JOB_OPS[name]

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.send(f"{label.lower()} {noun}", [(op, make(j)) for j in jobs])
                self.jobs.tagged.clear()

        self.push_screen(ConfirmScreen(f"{label} {noun}?"), confirmed)

    def _node_for_action(self) -> str | None:
        if self.active_view == "topology":
            return self.topology.node_name
        return self.fleet.selected_node()

    def action_drain(self) -> None:
        node = self._node_for_action()
        if node is None:
            return

        def drain(reason: str | None) -> None:
            if reason is not None:
                self.send(f"drain {node}", [("node_admin", {"name": node, "action": "drain", "reason": reason})])

        self.push_screen(PromptScreen(f"Drain node {node}: no new jobs start there. Reason (Enter to drain, "
                                      "Esc to keep it):", placeholder="reason"), drain)

    def action_resume(self) -> None:
        node = self._node_for_action()
        if node is None:
            return

        def resume(yes: bool | None) -> None:
            if yes:
                self.send(f"resume {node}", [("node_admin", {"name": node, "action": "resume"})])

        self.push_screen(ConfirmScreen(f"Resume node {node}?"), resume)

    @work(thread=True, exit_on_error=False, group="actions", name="action")
    def send(self, what: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        """Thread worker: one request per target; the stream brings the result on screen."""
        if self.home is None:
            self.call_from_thread(self.notify, f"{what}: no controller", severity="warning")
            return
        errors: list[str] = []
        with Client(self.home, autostart=False) as client:
            for op, args in calls:
                try:
                    client.call(op, **args)
                except HschedError as e:
                    errors.append(str(e))
        if errors:
            self.call_from_thread(self.notify, f"{what}: " + "; ".join(errors[:3]), severity="error", timeout=8)
        else:
            self.call_from_thread(self.notify, f"{what}: done")

    # ------------------------------------------------------------------ palette

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for i, view in enumerate(VIEWS, 1):
            yield SystemCommand(f"View: {view}", f"switch to the {view} view (key {i})",
                                lambda v=view: self.action_view(v))
        yield SystemCommand("Filter jobs", "type words every shown job contains (key /)", self.action_filter)
        yield SystemCommand("Only my jobs / everyone's", "as --me (key m)", self.action_me)
        yield SystemCommand("Help: keys", "every key (key ?)", self.action_help)
        for name in SORTS:
            yield SystemCommand(f"Sort jobs by {name}", "again to reverse", lambda n=name: self._sort_by(n))
        if self.frame is not None:
            for node in self.frame.nodes:
                yield SystemCommand(f"Topology of {node.name}", f"{len(node.devices)} devices",
                                    lambda n=node.name: self._topology_of(n))
        if not self.readonly:
            for name, (label, _, _) in JOB_OPS.items():
                if self.action_allowed(name):
                    yield SystemCommand(f"{label} selected job(s)", "tagged jobs, else the cursor's",
                                        lambda n=name: self.job_action(n, self.jobs.targets()))
            yield SystemCommand("Change priority of selected job(s)", "key p",
                                lambda: self.job_action("priority", self.jobs.targets()))
            if self.frame is not None:
                for node in self.frame.nodes:
                    yield SystemCommand(f"Drain node {node.name}", "no new jobs start there",
                                        lambda n=node.name: self._node_admin(n, "drain"))
                    yield SystemCommand(f"Resume node {node.name}", "", lambda n=node.name: self._node_admin(n,
                                                                                                          "resume"))

    def _sort_by(self, name: str) -> None:
        self.jobs.set_sort(name)
        self.action_view("jobs")

    def _topology_of(self, node: str) -> None:
        self.topology.show(node=node)
        self.action_view("topology")

    def _node_admin(self, node: str, action: str) -> None:
        self._topology_of(node)
        self.action_drain() if action == "drain" else self.action_resume()


_HOSTS_THE_JOB_SCREEN: type[DashHost] = DashApp
"""The type checker holds DashApp to what the job screen asks of its app (a protocol: no import loop)."""
