"""`hsched kinds` is one table (issue 29): a kind's job counts and usual profile sit on its row, so no two tables
count different jobs under the same name."""

from __future__ import annotations

import pytest

from hsched.cli.kinds import render_kinds


def test_one_table_with_counts_and_profile(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    render_kinds([
        {"kind": "train.py model=m", "jobs_now": 2, "completed": 5, "profile": "compute-bound",
         "profiles": {"compute-bound": 4, "idle": 1},
         "rates": [{"gpu_type": "a100", "gpus": 1, "class": "single", "steps_per_s": 3.1, "runs": 4}]},
        {"kind": "", "jobs_now": 1, "completed": 0, "rates": [], "profiles": {}},
    ])
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out] == ["KIND", "train.py", "(no"]  # one header: one table
    assert out[1].split()[2:6] == ["2", "5", "compute", "4/5"]
    assert "not measured" in out[2]


def test_a_job_not_running_shows_no_time_left() -> None:
    # issue 29: a completed job still showed "about 0m04s left" from its last progress report
    from hsched.cli.jobs import _progress_line

    p = {"step": 96, "total": 100, "steps_per_s": 1.0, "gpus": 1, "gpu_type": "A100", "class": "single",
         "remaining_s": 4.0}
    assert "about 0m04s left" in _progress_line(p)
    assert "left" not in _progress_line(p, ended=True) and "step 96 of 100" in _progress_line(p, ended=True)
