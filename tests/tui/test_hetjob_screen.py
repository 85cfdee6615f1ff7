"""The dashboard's job screen shows a heterogeneous job's components (issue 31): one line each, with its id as squeue
shows it, its state, request and nodes."""

from __future__ import annotations

from rich.console import Console

from tui.job_screen import detail_table


def test_the_job_screen_lists_each_component() -> None:
    d = {"id": 12, "name": "pipe", "state": "RUNNING", "components": [
        {"component": 0, "display_id": "12+0", "state": "RUNNING", "gpus": 1, "gpu_types": ["l40s"],
         "placement": [{"node": "l", "devices": ["GPU-1"]}], "command": ["python", "prep.py"]},
        {"component": 1, "display_id": "12+1", "state": "FAILED", "gpus": 0, "gpu_types": [],
         "placement": [{"node": "c", "devices": []}], "command": ["python", "fuse.py"]}]}
    con = Console(width=140, record=True)
    con.print(detail_table(d))
    text = con.export_text()
    assert "12+0  RUNNING  1 GPU l40s  on l  python prep.py" in text
    assert "12+1  FAILED  CPU only  on c  python fuse.py" in text
    plain = Console(width=140, record=True)
    plain.print(detail_table({"id": 3, "name": "x", "state": "PENDING"}))
    assert "component" not in plain.export_text()
