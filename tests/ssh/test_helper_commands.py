"""The node helper's commands for remote nodes (read, watch) run on the oldest Python a node may have."""

from __future__ import annotations

import ast
import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hsched import nodehelper

HELPER = str(Path(nodehelper.__file__).resolve())


def _python38() -> str | None:
    """A working python3.8 (pyenv's shim exists even when that version is not selected, so try it)."""
    candidates = [str(p) for p in Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")]
    candidates += [c for c in [shutil.which("python3.8")] if c]
    for c in candidates:
        if subprocess.run([c, "-c", "pass"], capture_output=True).returncode == 0:
            return c
    return None


PY38 = _python38()


def test_helper_parses_as_python_38() -> None:
    ast.parse(Path(HELPER).read_text(), feature_version=(3, 8))


@pytest.mark.parametrize("python", [sys.executable, PY38], ids=["current", "3.8"])
def test_read_and_watch(python: str | None, tmp_path: Path) -> None:
    if python is None:
        pytest.skip("no python3.8 here")
    log = tmp_path / "output.log"
    log.write_bytes(b"abc\xff\x00def")

    def call(cmd: str, req: dict) -> list[dict]:
        out = subprocess.run([python, HELPER, cmd], input=json.dumps(req), capture_output=True, text=True,
                             timeout=30, check=True)
        return [json.loads(line) for line in out.stdout.splitlines()]

    [got] = call("read", {"path": str(log), "offset": 2, "max_bytes": 4})
    assert base64.b64decode(got["data"]) == b"c\xff\x00d" and got["size"] == 8
    assert call("read", {"path": str(tmp_path / "none")}) == [{"data": "", "size": None}]
    lines = call("watch", {"interval_s": 0.05, "count": 3, "simulate": {"uuids": ["GPU-x"], "memory_mib": 10}})
    assert [s.get("seq") for s in lines] == [0, 1, 2, None] and lines[-1] == {"samples": 3}
    assert lines[0]["gpus"]["devices"][0]["uuid"] == "GPU-x"
