"""`hsched nodes`: a node's note is shown as the node said it, whole (folded, never cut), and never read as rich
markup; a host key fingerprint in it reads exactly as `ssh-keygen -l` prints it."""

from __future__ import annotations

import pytest

from hsched.cli.fleet import render_nodes

FP = "ssh-ed25519 SHA256:M1F/JuJH0BhkOmUY69uOEed3o+eZalZzPueKdvel/go"
NOTE = (f"unknown host key for [10.231.0.2]:22: {FP} (not in /root/.ssh/known_hosts); if that fingerprint is "
        "right, run: hsched node trust gpu-b [/]")


def test_the_note_is_whole_and_verbatim(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    node = {"name": "gpu-b", "state": "DOWN", "executor": "ssh", "cpus": None, "memory_total_mib": None,
            "devices": [], "message": NOTE}
    render_nodes([node])
    out = capsys.readouterr().out
    # the note column's lines, put back together (a fold may fall on a space)
    folded = "".join("".join(line.split()) for line in out.splitlines()[1:])
    assert "".join(FP.split()) in folded  # case kept, nothing cut: comparable with ssh-keygen -l
    assert "[10.231.0.2]:22" in folded and folded.endswith("hschednodetrustgpu-b[/]")
