"""Snapshot tests: fixed data (tests/tui/canned.py), fixed clock, explicit terminal sizes, no controller.

Taken with the Textual version pinned in pyproject.toml's `test` extra; after a deliberate change of the look,
`pytest tests/tui --snapshot-update` renews them (and the diff of the SVGs is what a reviewer reads).
"""

from __future__ import annotations

from typing import Any

from hsched.tui.app import DashApp

from .canned import NOW, frame


def make(view: str = "fleet", *, served: bool = False, **kwargs: Any) -> DashApp:
    return DashApp(None, frame=frame(served=served), clock=lambda: NOW, view=view, user="alice", **kwargs)


async def with_history(pilot: Any) -> None:
    """Thirty more frames a second apart, so that the sparklines have something to draw (a controller that
    serves no history: the dashboard samples the frames)."""
    app: DashApp = pilot.app
    for i in range(1, 31):
        app.apply_frame(frame(util_shift=i * 7.0, at=float(i)))
    await pilot.pause()


def test_fleet_120x36(snap_compare: Any) -> None:
    assert snap_compare(make("fleet"), terminal_size=(120, 36), run_before=with_history)


def test_jobs_120x30(snap_compare: Any) -> None:
    assert snap_compare(make("jobs"), terminal_size=(120, 30))


def test_jobs_tagged_sorted_by_priority_100x24(snap_compare: Any) -> None:
    assert snap_compare(make("jobs"), terminal_size=(100, 24), press=["space", "space", "s", "s"])


def test_topology_with_job_highlighted_120x36(snap_compare: Any) -> None:
    assert snap_compare(make("jobs"), terminal_size=(120, 36), press=["t"])


def test_topology_pcie_node_120x30(snap_compare: Any) -> None:
    assert snap_compare(make("topology"), terminal_size=(120, 30), press=["right_square_bracket"])


def test_events_100x20(snap_compare: Any) -> None:
    assert snap_compare(make("events"), terminal_size=(100, 20))


def test_help_readonly_100x40(snap_compare: Any) -> None:
    assert snap_compare(make("jobs", readonly=True), terminal_size=(100, 40), press=["question_mark"])


def test_confirm_cancel_100x24(snap_compare: Any) -> None:
    assert snap_compare(make("jobs"), terminal_size=(100, 24), press=["c"])


def test_history_panel_from_the_controllers_history_120x36(snap_compare: Any) -> None:
    # five minutes the controller kept before the dashboard opened; `j` twice: GPU 2, one of job 1's
    assert snap_compare(make("fleet", served=True), terminal_size=(120, 36), press=["j", "j"])


def test_history_panel_gap_and_host_100x30(snap_compare: Any) -> None:
    # `j` eight times (a100-box's GPU 0), then `k` back up one row: GPU 7 of dgx-h100, with a gap where its
    # node did not answer, next to its host's CPU
    assert snap_compare(make("fleet", served=True), terminal_size=(100, 30), press=["j"] * 8 + ["k"])


def test_processes_120x36(snap_compare: Any) -> None:
    assert snap_compare(make("processes"), terminal_size=(120, 36))


def test_processes_cursor_with_vim_keys_100x24(snap_compare: Any) -> None:
    assert snap_compare(make("processes"), terminal_size=(100, 24), press=["j", "j", "j", "k"])
