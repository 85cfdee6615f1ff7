"""The helper bundle shipped to SSH nodes carries nvidia-ml-py's pynvml.py, so a node without it installed
still discovers and samples its GPUs through NVML (nvidia-smi stays the fallback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hsched.executors.ssh import helper_bundle


def test_the_bundle_holds_pynvml_before_the_helper() -> None:
    names = [name for name, _ in helper_bundle().files]
    assert "pynvml.py" in names and names[-1] == "nodehelper.py"  # the helper last: its presence means complete


@pytest.mark.slow  # a venv and a helper process
def test_a_node_python_without_pynvml_imports_the_bundled_one(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a node's python3: the standard library and nothing else
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    py = str(bare / "bin" / "python")
    assert subprocess.run([py, "-c", "import pynvml"], capture_output=True).returncode != 0
    d = tmp_path / "helper"
    d.mkdir()
    for name, data in helper_bundle().files:
        (d / name).write_bytes(data)
    out = subprocess.run([py, str(d / "nodehelper.py"), "probe"], input="{}", capture_output=True, text=True,
                         timeout=120, check=True).stdout
    gpus = json.loads(out)["gpus"]
    # NVML was tried (on a machine without a driver it says so); without pynvml it would not have been
    assert gpus["source"] == "nvml" or any("NVML" in e for e in gpus.get("errors", [])), gpus
