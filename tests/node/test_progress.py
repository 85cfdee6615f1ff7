"""Progress reports (issue 14, item 1): what a job writes (hsched.progress, or lines of its own) and what the
node helper's watch reads of it: the last report of each active run since its last look, numbers only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hsched import progress
from hsched.node import progress as node_progress


@pytest.mark.parametrize(("line", "parsed"), [
    ("step=1200 total=50000", {"step": 1200.0, "total": 50000.0}),
    ("step=3, loss=0.25, lr=0.1", {"step": 3.0, "loss": 0.25}),
    ('{"step": 7, "samples": 224, "loss": 1.5, "t": 100.0}', {"step": 7.0, "samples": 224.0, "loss": 1.5,
                                                              "t": 100.0}),
    ('{"samples": 64}', {"samples": 64.0}),
    ("loss=0.3", None),  # no step, no samples: not progress
    ('{"step": true}', None),
    ('{"step": "NaN"}', None),
    ("[1, 2]", None),
    ("epoch 3 done", None),
    ("", None),
])
def test_report_lines(line: str, parsed: dict[str, float] | None) -> None:
    assert node_progress.parse_progress(line) == parsed


def test_the_watch_reads_each_active_runs_new_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [tmp_path / "1-1-r0-5", tmp_path / "2-1-r0-6"]
    for r in runs:
        r.mkdir()
    monkeypatch.setattr(node_progress, "active_runs", lambda: [str(r) for r in runs])
    reader = node_progress.ProgressReader(5.0)
    (runs[0] / "progress.log").write_text("step=1\nstep=2 total=10\nstep=3 tot")  # the last line is half written
    (first,) = reader.read()
    assert (first["run_dir"], first["step"], first["total"], first["reports"]) == (str(runs[0]), 2.0, 10.0, 2)
    assert reader.read() == []  # nothing new
    with open(runs[0] / "progress.log", "a") as f:
        f.write("al=10\n")
    (again,) = reader.read()
    assert (again["step"], again["reports"]) == (3.0, 3)
    (runs[0] / "progress.log").write_text("step=1\n")  # written anew (a new file): read from its start
    assert reader.read()[0]["step"] == 1.0
    # a link in a run folder is not followed
    (runs[1] / "progress.log").symlink_to(runs[0] / "progress.log")
    assert [r["run_dir"] for r in reader.read()] == []
    # a run that ended is forgotten
    runs.pop(0)
    reader.read()
    assert list(reader.offsets) == []


def test_due_says_when_to_look(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(node_progress.time, "monotonic", lambda: now[0])
    reader = node_progress.ProgressReader(5.0)
    assert reader.due() and not reader.due()
    now[0] += 5.0
    assert reader.due()


def test_report_writes_json_lines_at_most_once_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "progress.log"
    now = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    monkeypatch.setattr(progress, "_R", progress._Reporter())
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.report(step=1)  # outside hsched: nothing
    assert not path.exists()
    monkeypatch.setenv(progress.ENV, str(path))
    progress.report(step=1, total=100, loss=2.5)
    now[0] += 0.3
    progress.report(step=2, total=100)  # within the second: kept, not written
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"step": 1.0, "total": 100.0, "loss": 2.5, "t": 1000.0}]
    progress.flush()  # (atexit does this at the end)
    assert json.loads(path.read_text().splitlines()[-1])["step"] == 2.0
    assert node_progress.parse_progress(path.read_text().splitlines()[-1]) == {"step": 2.0, "total": 100.0, "t": 1000.3}
