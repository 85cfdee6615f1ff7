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

NODE_STYLE: dict[str, tuple[str, str]] = {
    "UP": ("up", "green"),
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
