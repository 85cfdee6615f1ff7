"""The helper bundle shipped to SSH nodes: the whole of hsched/node in one folder named by the hash of every file
(the script last: its presence means complete), with nvidia-ml-py's pynvml.py, so a node without it installed
still discovers and samples its GPUs through NVML (nvidia-smi stays the fallback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hsched.executors.ssh import _BOOTSTRAP, HELPER_DIR, bundle_digest, helper_bundle


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


def test_the_bundle_is_the_whole_package_and_its_name_follows_every_module() -> None:
    bundle = helper_bundle()
    names = [name for name, _ in bundle.files]
    package = sorted(p.name for p in HELPER_DIR.glob("*.py"))
    assert sorted(n for n in names if n not in ("pynvml.py", "nvml_probe.py")) == package
    assert len(set(names)) == len(names)
    assert bundle.dirname == f"helper-{bundle.digest[:16]}" and bundle.digest == bundle_digest(bundle.files)
    for i, (name, data) in enumerate(bundle.files):  # any one module changed: another digest, another folder
        changed = list(bundle.files)
        changed[i] = (name, data + b"\n")
        assert bundle_digest(changed) != bundle.digest, name


@pytest.mark.slow  # python processes
def test_a_node_runs_the_bundle_from_its_folder_and_first_contact_sees_any_module_changed(tmp_path: Path) -> None:
    py = shutil.which("python3.8") and subprocess.run(["python3.8", "-c", ""], capture_output=True).returncode == 0
    node_python = "python3.8" if py else sys.executable  # the oldest python a node may have, where there is one
    bundle = helper_bundle()
    names = [name for name, _ in bundle.files]

    def first_contact() -> dict[str, object]:
        out = subprocess.run([node_python, "-c", _BOOTSTRAP, bundle.dirname, str(tmp_path), *names],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        return json.loads(out)

    assert first_contact()["present"] is False
    d = tmp_path / bundle.dirname
    d.mkdir()
    for name, data in bundle.files:
        (d / name).write_bytes(data)
    assert first_contact()["digest"] == bundle.digest
    # as a lab's launcher runs it: isolated from the environment, from any working folder
    p = subprocess.run([node_python, "-E", "-s", str(d / "nodehelper.py"), "--confine", str(tmp_path), "whoami"],
                       input="{}", capture_output=True, text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["confine"] == str(tmp_path)
    (d / "status.py").write_bytes((d / "status.py").read_bytes() + b"# changed\n")
    assert first_contact()["digest"] != bundle.digest  # shipped again rather than used
