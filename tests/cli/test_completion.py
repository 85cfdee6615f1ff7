"""Shell completion (issue 16): job ids from the store read-only, QoS classes from the settings; never a
controller started, nothing offered when there is no store."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.cli import complete, main
from hsched.controller.store import Store
from hsched.model import JobSpec
from hsched.paths import Home


def complete_words(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], words: str) -> list[str]:
    monkeypatch.setenv("_HSCHED_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(len(words.split(" ")) - 1))
    monkeypatch.setattr("sys.argv", ["hsched"])
    with pytest.raises(SystemExit):
        main()
    return capsys.readouterr().out.split()


def test_job_ids_and_qos_complete(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path))
    assert complete.job_ids("") == []  # no store yet: nothing, and no controller started
    store = Store(Home(tmp_path).db)
    a = store.submit(JobSpec(command=("x",)), "u", 1.0)
    b = store.submit(JobSpec(command=("y",)), "u", 2.0)
    store.set_job(b.id, 3.0, state="COMPLETED")
    from hsched.spec.arrays import parse_array

    arr = store.submit_array(JobSpec(command=("z",), array=parse_array("0-1")), "u", 4.0)
    store.close()
    assert complete.job_ids("") == [f"{arr[0].id}_1", str(arr[0].id), f"{arr[0].id}_0", str(a.id)]
    assert complete_words(monkeypatch, capsys, "hsched cancel ") == complete.job_ids("")
    assert complete_words(monkeypatch, capsys, "hsched submit --qos s") == ["scavenger"]


def test_node_names_complete_where_a_node_is_asked_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # issue 29: node names never completed (drain, resume, trust, topo show)
    monkeypatch.setenv("HSCHED_HOME", str(tmp_path))
    monkeypatch.delenv("HSCHED_FLEET", raising=False)
    (tmp_path / "fleet.toml").write_text('[[node]]\nname = "gpu-a"\nexecutor = "local"\n\n'
                                         '[[node]]\nname = "gpu-b"\nexecutor = "local"\n\n'
                                         '[[node]]\nname = "cpu1"\nexecutor = "local"\n')
    for words in ("hsched node drain gpu", "hsched node resume gpu", "hsched node trust gpu", "hsched topo show gpu"):
        assert complete_words(monkeypatch, capsys, words) == ["gpu-a", "gpu-b"], words
