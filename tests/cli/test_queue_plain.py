"""A long queue is printed as plain columns (rich's table took ~10 s for 5,000 rows: bench_queue.py)."""

from __future__ import annotations

import pytest

from hsched.cli import listing


def job(i: int, state: str = "PENDING") -> dict[str, object]:
    return {"id": i, "name": f"job-{i}\x1b[31m", "user": "alice", "state": state, "qos": "normal", "priority": 0,
            "gpus": 1, "start_time": None, "end_time": None, "placement": [], "reason": "Resources",
            "array_id": None, "array_task": None, "display_id": str(i)}


def test_a_long_queue_is_plain_aligned_columns(capsys: pytest.CaptureFixture[str]) -> None:
    listing.render_queue([job(i) for i in range(1, listing.PLAIN_ROWS + 2)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == listing.PLAIN_ROWS + 2 and lines[0].split() == [
        "JOBID", "NAME", "USER", "ST", "QOS", "PRIO", "GPUS", "TIME", "NODES(REASON)"]
    assert "\x1b" not in "".join(lines)  # a name's escape sequence never reaches the terminal
    assert lines[1].index("alice") == lines[-1].index("alice")  # one width per column
    assert lines[-1].rstrip().endswith("(Resources)")


def test_a_short_queue_keeps_the_rich_table(capsys: pytest.CaptureFixture[str]) -> None:
    listing.render_queue([job(1)])
    out = capsys.readouterr().out
    assert "JOBID" in out and "job-1" in out
