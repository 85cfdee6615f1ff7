"""The package installs as users get it: a wheel into a fresh virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip builds a wheel and installs it into a new virtual environment

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}")
    wheels = list(out.glob("hsched-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_layout(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert "tui" not in tops and "executors" not in tops and "examples" not in tops
    assert "hsched/tui/__init__.py" in names
    assert "hsched/executors/local.py" in names
    assert "hsched/node/nodehelper.py" in names and "hsched/node/safefiles.py" in names
    assert "hsched/examples/lab/fleet.toml" in names
    # every module of the checkout is in the wheel: pyproject lists packages by hand, and a package left out (the
    # round's stages, the policies) imports in a checkout and fails only for someone who ran `pip install .`
    mapped = {"hsched": REPO / "hsched", "hsched/tui": REPO / "tui", "hsched/executors": REPO / "executors"}
    missing = sorted(f"{prefix}/{f.relative_to(folder)}" for prefix, folder in mapped.items()
                     for f in folder.rglob("*.py") if "__pycache__" not in f.parts
                     and f"{prefix}/{f.relative_to(folder)}" not in names)
    assert missing == []


def test_fresh_venv_install(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert not (Path(site) / "tui").exists() and not (Path(site) / "executors").exists()
    check = subprocess.run([str(py), "-c", "import hsched.tui, hsched.executors.local, hsched.executors.fake; "
                            "import importlib.util as u; print(u.find_spec('tui'), u.find_spec('executors'))"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "None None"
    env = dict(os.environ, HSCHED_HOME=str(tmp_path / "home"))
    version = subprocess.run([str(venv / "bin" / "hsched"), "--version"], capture_output=True, text=True, env=env,
                             timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("hsched ")
