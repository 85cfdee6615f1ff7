"""`hsched data`'s table: datasets, where each is and how it got there, copies under way with their progress; user
text (names, paths, messages) printed as written, never read as markup."""

from __future__ import annotations

import pytest

from hsched.cli.data import render_data


def test_the_table_says_where_each_dataset_is_and_what_is_being_copied(capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # (a terminal wide enough that no cell folds)
    render_data([
        {"name": "imagenet", "size": 5 << 30, "declared_size": 5 << 30, "shared": False, "path": None,
         "where": [{"node": "a", "path": "/data/imagenet", "origin": "declared", "state": "ready", "bytes": None,
                    "last_used": None, "message": ""},
                   {"node": "c", "path": "/scratch/imagenet", "origin": "copy", "state": "failed", "bytes": None,
                    "last_used": None, "message": "no room [bold]"}],
         "transfers": [{"node": "b", "from": "a", "done": 1 << 30, "total": 4 << 30, "job_id": 7, "why": "prefetch",
                        "seconds": 10.0}]},
        {"name": "[red]laion", "size": None, "declared_size": None, "shared": True, "path": "/nfs/laion", "where": [],
         "transfers": []},
        {"name": "coco", "size": None, "declared_size": None, "shared": False, "path": "/d/coco", "where": [],
         "transfers": []},
    ])
    out = capsys.readouterr().out
    assert "imagenet" in out and "5.0 GiB" in out and "/data/imagenet" in out and "declared" in out
    assert "imagenet a -> b: 25% (1.0 GiB of 4.0 GiB, 107 MB/s), prefetch for job 7" in out
    assert "failed: no room [bold]" in out and "[red]laion" in out and "(every node)" in out
    assert "nowhere yet" in out


def test_no_datasets_says_how_to_declare_them(capsys: pytest.CaptureFixture[str]) -> None:
    render_data([])
    assert "declare them in the fleet file's [[dataset]] tables" in capsys.readouterr().out
