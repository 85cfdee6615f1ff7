"""The node helper's commands for remote nodes (read, watch) run on the oldest Python a node may have."""

from __future__ import annotations

import ast
import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hsched.node import nodehelper

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


@pytest.mark.slow  # runs the helper
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


FAKE_SMI = r'''#!/usr/bin/env python3
import os, sys, time
args = sys.argv[1:]
if any(a.startswith("--query-compute-apps") for a in args):
    print("GPU-fake-0, %s, 1234" % os.environ["FAKE_APP_PID"])
    print("GPU-fake-1, 1, 10")
    sys.exit(0)
ms = int(args[args.index("-lms") + 1]) if "-lms" in args else None
while True:
    print("0, GPU-fake-0, 37, 1234, 81559, 45, 123.45")
    print("1, GPU-fake-1, [N/A], 0, 81559, [Not Supported], [N/A]")
    sys.stdout.flush()
    if ms is None:
        break
    time.sleep(ms / 1000.0)
'''

FAKE_PYNVML = r'''
import os
NVML_TEMPERATURE_GPU = 0
class NVMLError(Exception):
    pass
class _O(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return ("GPU-nvml-%d" % h).encode()
def nvmlDeviceGetUtilizationRates(h): return _O(gpu=50 + h, memory=3)
def nvmlDeviceGetMemoryInfo(h): return _O(used=2048 << 20, total=81559 << 20, free=0)
def nvmlDeviceGetTemperature(h, kind):
    if h == 1:
        raise NVMLError("Not Supported")
    return 61
def nvmlDeviceGetPowerUsage(h): return 250500
def nvmlDeviceGetComputeRunningProcesses(h):
    return [_O(pid=int(os.environ["FAKE_APP_PID"]), usedGpuMemory=1024 << 20)] if h == 0 else []
def nvmlDeviceGetGraphicsRunningProcesses(h):
    raise NVMLError("Not Supported")
'''


def _owned_process(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process that belongs to an hsched run (it carries the run marker), as if it used a GPU."""
    env = dict(os.environ, HSCHED_RUN_DIR=str(tmp_path / "runs" / "7-1-1"))
    return subprocess.Popen(["sleep", "30"], env=env)


def _watch(tmp_path: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, HELPER, "watch"], input=json.dumps({"interval_s": 0.1, "count": 2}),
                         capture_output=True, text=True, timeout=30, check=True, env=env)
    return json.loads(out.stdout.splitlines()[-2])


@pytest.mark.slow  # runs the helper
def test_watch_with_nvidia_smi(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    owned = _owned_process(tmp_path)
    try:
        # no pynvml importable (an empty module that fails), so the helper falls back to nvidia-smi
        (tmp_path / "nonvml").mkdir()
        (tmp_path / "nonvml" / "pynvml.py").write_text("raise ImportError('no NVML here')\n")
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_APP_PID=str(owned.pid),
                   PYTHONPATH=str(tmp_path / "nonvml"))
        s = _watch(tmp_path, env)
    finally:
        owned.kill()
        owned.wait()
    assert s["gpus"]["source"] == "nvidia-smi"
    d0, d1 = s["gpus"]["devices"]
    assert (d0["uuid"], d0["utilization_gpu"], d0["memory_used_mib"], d0["temperature_c"], d0["power_w"]) == (
        "GPU-fake-0", 37.0, 1234, 45.0, 123.45)
    assert d1["utilization_gpu"] is None and d1["temperature_c"] is None and d1["power_w"] is None
    by_pid = {p["pid"]: p for p in s["processes"]}
    assert by_pid[owned.pid]["run_dir"] == str(tmp_path / "runs" / "7-1-1")
    assert by_pid[owned.pid]["uuid"] == "GPU-fake-0" and by_pid[owned.pid]["used_memory_mib"] == 1234
    assert by_pid[1]["run_dir"] is None  # a GPU process no hsched run owns is shown, with no owner


@pytest.mark.slow  # runs the helper
def test_watch_with_nvml(tmp_path: Path) -> None:
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "pynvml.py").write_text(FAKE_PYNVML)
    owned = _owned_process(tmp_path)
    try:
        env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"), FAKE_APP_PID=str(owned.pid))
        s = _watch(tmp_path, env)
    finally:
        owned.kill()
        owned.wait()
    assert s["gpus"]["source"] == "nvml"
    d0, d1 = s["gpus"]["devices"]
    assert d0 == {"index": 0, "uuid": "GPU-nvml-0", "utilization_gpu": 50.0, "memory_used_mib": 2048,
                  "memory_total_mib": 81559, "temperature_c": 61.0, "power_w": 250.5, "utilization_memory": 3.0}
    assert d1["temperature_c"] is None and d1["utilization_gpu"] == 51.0
    assert [(p["pid"], p["uuid"], p["used_memory_mib"], p["run_dir"]) for p in s["processes"]] == [
        (owned.pid, "GPU-nvml-0", 1024, str(tmp_path / "runs" / "7-1-1"))]
