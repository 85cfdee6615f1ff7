"""One table of state codes and colours, shared by the CLI and the dashboard (squeue's codes where it has one)."""

from __future__ import annotations

STATE_STYLE: dict[str, tuple[str, str]] = {
    "PENDING": ("PD", "yellow"),
    "LAUNCHING": ("CF", "cyan"),
    "RUNNING": ("R", "green"),
    "PREEMPTING": ("PG", "magenta"),
    "PREEMPTED": ("PR", "magenta"),
    "COMPLETING": ("CG", "cyan"),
    "COMPLETED": ("CD", "bright_black"),
    "FAILED": ("F", "red"),
    "CANCELLED": ("CA", "bright_black"),
    "TIMEOUT": ("TO", "red"),
    "NODE_FAIL": ("NF", "red"),
    "LOST": ("LO", "red"),
}

# the node's message says why it is not up (the CLI and the dashboard show it next to the state)
NODE_STYLE: dict[str, tuple[str, str]] = {
    "PROBING": ("probing", "cyan"),
    "UP": ("up", "green"),
    "UNHEALTHY": ("unhealthy", "bright_red"),
    "DRAINED": ("drain", "yellow"),
    "UNREACHABLE": ("unreach*", "red"),
    "DOWN": ("down", "red"),
}


def state_code(state: str) -> str:
    return STATE_STYLE.get(state, (state[:2], "white"))[0]


def state_color(state: str) -> str:
    return STATE_STYLE.get(state, ("", "white"))[1]


def load_color(fraction: float | None) -> str:
    """Green when idle, yellow when busy, red when saturated (nvitop's convention)."""
    if fraction is None:
        return "bright_black"
    if fraction < 0.3:
        return "green"
    if fraction < 0.7:
        return "yellow"
    return "red"


# Link classes as nvidia-smi users read them: the stronger the link, the greener.
LINK_COLOR: dict[str, str] = {"NV": "bright_green", "XGMI": "bright_green", "PIX": "cyan", "PXB": "blue",
                              "PHB": "yellow", "NODE": "magenta", "SYS": "red", "X": "bright_black"}


def link_color(kind: str) -> str:
    k = kind.upper()
    if k.startswith("NV"):
        return LINK_COLOR["NV"]
    if k.startswith("XGMI"):
        return LINK_COLOR["XGMI"]
    if k == "SOC":  # old drivers' name for SYS
        return LINK_COLOR["SYS"]
    return LINK_COLOR.get(k, "white")


# Event kinds the controller writes, as the dashboard and `hsched show` colour them.
EVENT_COLOR: dict[str, str] = {
    "submitted": "yellow", "held": "yellow", "released": "yellow", "priority": "yellow",
    "placed": "cyan", "started": "green", "ended": "white", "rank_ended": "white",
    "preempts": "magenta", "preempting": "magenta", "preempted": "magenta", "requeued": "magenta",
    "checkpoint": "magenta", "checkpoint_moved": "magenta", "signal": "magenta", "warning": "yellow",
    "cancel": "bright_black", "cancelled": "bright_black", "timeout": "red", "rank_failed": "red",
    "lost": "red", "node_lost": "red", "fenced": "red", "launch_failed": "red", "node": "cyan",
    "controller": "bright_black",
}


def event_color(kind: str) -> str:
    if kind in EVENT_COLOR:
        return EVENT_COLOR[kind]
    if any(w in kind for w in ("fail", "down", "lost", "error", "timeout")):
        return "red"
    return "magenta" if "preempt" in kind else "white"
