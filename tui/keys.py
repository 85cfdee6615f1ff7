"""Every key of the dashboard in one table: the bindings and the help screen are both made from it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True, slots=True)
class Key:
    key: str  # Textual key names, comma separated
    action: str
    label: str  # shown in the footer when `footer`
    help: str
    group: str
    footer: bool = False
    changes: bool = False  # changes the queue or the fleet: hidden under --readonly
    shown_as: str = ""  # how the help screen spells the key, when not the key name


KEYS: list[Key] = [
    Key("question_mark", "help", "Help", "this help", "General", True, shown_as="?"),
    Key("q", "quit", "Quit", "quit (Esc or q closes a dialog or the job screen first)", "General", True),
    Key("colon", "command_palette", "Palette", "command palette: views, sorts, actions, nodes", "General", True,
        shown_as=":"),
    Key("1", "view('fleet')", "Fleet", "Fleet view: every node and device", "Views"),
    Key("2", "view('topology')", "Topo", "Topology view of one node", "Views"),
    Key("3", "view('jobs')", "Jobs", "Jobs view: the queue", "Views"),
    Key("4", "view('events')", "Events", "Events view: what happened, as it happens", "Views"),
    Key("5", "view('processes')", "Procs", "Processes view: GPU processes as nvitop lists them, hosts' CPU, memory",
        "Views"),
    Key("6", "view('services')", "Services", "Services view: replicas, requests/s, p99 against the SLO", "Views"),
    Key("g", "toggle_history", "History", "show / hide the GPU history panel under the Fleet table", "Views"),
    Key("escape", "back", "Back", "close the filter, a dialog or the job screen", "General",
        shown_as="Esc"),
    Key("j", "vim('down')", "Down", "down a row (as k9s and vim; the arrow keys too)", "General"),
    Key("k", "vim('up')", "Up", "up a row", "General"),
    Key("slash", "filter", "Filter", "filter the jobs (words, all must match); Esc clears", "Jobs", True,
        shown_as="/"),
    Key("enter", "details", "Details", "details of the job under the cursor: spec, placement, runs, events, log",
        "Jobs", True),
    Key("l", "logs", "Logs", "the job's live log tail", "Jobs", True),
    Key("space", "tag", "Tag", "tag / untag the job (actions then apply to every tagged job)", "Jobs", True),
    Key("s", "sort", "Sort", "next sort column (state, id, priority, user, gpus, node, elapsed)", "Jobs", True),
    Key("S", "reverse", "Reverse", "reverse the sort", "Jobs"),
    Key("m", "me", "Mine", "only my jobs / everyone's (as --me)", "Jobs", True),
    Key("t", "topology_of_job", "Where", "show the job's devices in the Topology view", "Jobs", True),
    Key("left_square_bracket", "node(-1)", "Prev node", "previous node", "Topology", True, shown_as="["),
    Key("right_square_bracket", "node(1)", "Next node", "next node", "Topology", True, shown_as="]"),
    Key("c", "cancel", "Cancel", "cancel the job(s), after confirming", "Actions", True, changes=True),
    Key("h", "hold", "Hold", "hold the pending job(s)", "Actions", True, changes=True),
    Key("r", "release", "Release", "release held job(s)", "Actions", True, changes=True),
    Key("e", "requeue", "Requeue", "requeue the job(s)", "Actions", True, changes=True),
    Key("p", "priority", "Priority", "change priority (and QoS: `10 prod`)", "Actions", True, changes=True),
    Key("P", "preempt", "Preempt", "preempt now: checkpoint signal, then requeue", "Actions", True, changes=True),
    Key("d", "drain", "Drain", "drain the node (Fleet / Topology view)", "Actions", True, changes=True),
    Key("u", "resume", "Resume", "resume a drained node", "Actions", True, changes=True),
]

CHANGING_ACTIONS = {k.action for k in KEYS if k.changes}


def bindings() -> list[BindingType]:
    return [Binding(k.key, k.action, k.label, show=k.footer) for k in KEYS if k.key != "enter"]
