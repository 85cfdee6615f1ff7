"""Probes never hang (issue 12): with an nvidia-smi that never answers, a probe answers within its GPU timeout
with the error, the monitoring stream goes on and says what is wrong, no second nvidia-smi piles up behind a
hung one, and no nvidia-smi outlives the helper that started it (closed, stopped, or killed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hsched.executors.base import StatusQuery
from hsched.executors.local import LocalExecutor

from hsched.errors import NodeUnreachable
from hsched.node import nodehelper, records
from tests.conftest import SAFETY_S, process_gone, wait_until
from tests.procs import processes

pytestmark = pytest.mark.slow  # real processes

HELPER = str(Path(nodehelper.__file__).resolve())


class HungSmi:
    """An nvidia-smi on PATH that notes its pid and never answers (one process: its name is nvidia-smi)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pids_file = tmp_path / "smi-pids"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!{sys.executable}\nimport os, time\n"
                       f"with open({str(self.pids_file)!r}, 'a') as f:\n    f.write('%d\\n' % os.getpid())\n"
                       "time.sleep(100000)\n")
        smi.chmod(0o755)
        # and no NVML, whatever this machine has: GPU discovery must come to nvidia-smi
        (tmp_path / "nonvml").mkdir()
        (tmp_path / "nonvml" / "pynvml.py").write_text("raise ImportError('no NVML here')\n")
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nonvml"))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self.pids_file.read_text().split()]
        except FileNotFoundError:
            return []

    def alive(self) -> list[int]:
        return [p for p in self.pids() if not process_gone(p)]

    def all_gone(self) -> bool:
        return bool(self.pids()) and not self.alive()


async def until(cond: Callable[[], object]) -> None:
    """Poll `cond()` on the event loop until true (the test's own deadline is the only limit)."""
    while True:
        if cond():
            return
        await asyncio.sleep(0.02)


async def test_a_probe_answers_within_its_gpu_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = HungSmi(tmp_path, monkeypatch)
    ex = LocalExecutor()
    try:
        await ex.status([StatusQuery(str(tmp_path / "none"))])  # the server is up: the probe alone is timed
        # nvidia-smi never answers, yet the probe does, with the timeout's own error: bounded by the timeout
        p = await ex.probe(gpu_timeout_s=2.0)
        [stub] = smi.pids()
        assert p["gpus"] == {"source": None, "devices": [],
                             "error": f"GPU probe did not answer within 2 s (nvidia-smi pid {stub} killed)"}
        assert p["cpus"] == os.cpu_count() and p["boot_id"] == records.boot_id()  # the rest is there
        assert process_gone(stub)
    finally:
        await ex.close()


async def test_closing_the_executor_ends_a_probe_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = HungSmi(tmp_path, monkeypatch)
    ex = LocalExecutor()
    try:
        probing = asyncio.create_task(ex.probe(gpu_timeout_s=600.0))
        await until(smi.pids)
        [stub] = smi.pids()
        [probe_child] = [p.ppid for p in processes() if p.pid == stub]  # the helper's `_probe_gpus` child
        server = ex._proc
        assert server is not None
    finally:
        await ex.close()
    with pytest.raises(NodeUnreachable):
        await probing
    assert server.returncode == 0  # the server ended by itself at once, it was not killed after 5 s
    await until(lambda: process_gone(stub) and process_gone(probe_child))


def test_a_oneshot_probe_answers_within_its_gpu_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = HungSmi(tmp_path, monkeypatch)
    out = subprocess.run([sys.executable, HELPER, "probe"], input=json.dumps({"gpu_timeout_s": 1}),
                         capture_output=True, text=True, timeout=60)
    gpus = json.loads(out.stdout)["gpus"]
    [stub] = smi.pids()
    assert gpus["error"] == f"GPU probe did not answer within 1 s (nvidia-smi pid {stub} killed)"
    wait_until(smi.all_gone, "the hung nvidia-smi to be gone")


@pytest.mark.parametrize("stop", ["TERM", "KILL"])
def test_a_watch_reports_a_hung_nvidia_smi_and_takes_it_along(stop: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    smi = HungSmi(tmp_path, monkeypatch)
    watch = subprocess.Popen([sys.executable, HELPER, "watch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert watch.stdin is not None and watch.stdout is not None
    try:
        watch.stdin.write(json.dumps({"interval_s": 0.2, "gpu_timeout_s": 1}))
        watch.stdin.close()
        most = 0
        while True:
            sample = json.loads(watch.stdout.readline())
            most = max(most, len(smi.alive()))
            error = sample["gpu_error"] or ""
            if "sent nothing for" in error and "did not answer within 1 s" in error:
                break
        # the stream and one query at most: a hung query or stream is not joined by another
        assert most <= 2 and len(smi.pids()) == 2
        assert sample["gpus"] == {"source": "nvidia-smi", "devices": []} and sample["processes"] == []
        os.kill(watch.pid, getattr(signal, f"SIG{stop}"))
        watch.wait(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    # SIGTERM: the watch kills them itself; SIGKILL: they die with it (PR_SET_PDEATHSIG)
    wait_until(smi.all_gone, "every nvidia-smi the watch started to be gone")


async def test_the_local_executors_watch_leaves_no_nvidia_smi(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    smi = HungSmi(tmp_path, monkeypatch)
    ex = LocalExecutor()
    try:
        async with contextlib.aclosing(ex.watch(0.2)) as samples:
            async for sample in samples:
                if sample["gpu_error"]:
                    break
        assert smi.pids()
        await until(smi.all_gone)
    finally:
        await ex.close()


HANGING_PYNVML = """
import os, time
class NVMLError(Exception):
    pass
def nvmlInit():
    if os.environ.get("NVML_HANGS_IN_INIT"):
        time.sleep(100000)
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return b"GPU-nvml-0"
def nvmlDeviceGetUtilizationRates(h):
    time.sleep(100000)  # a sick GPU: the driver never answers
"""


def hanging_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, in_init: bool) -> None:
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(HANGING_PYNVML)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nvml"))
    if in_init:
        monkeypatch.setenv("NVML_HANGS_IN_INIT", "1")


def test_a_probe_answers_when_nvml_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hanging_nvml(tmp_path, monkeypatch, in_init=True)
    # NVML never answers, yet the probe does: the error below is the timeout's, so the wait was bounded by it
    out = subprocess.run([sys.executable, HELPER, "probe"], input=json.dumps({"gpu_timeout_s": 1}),
                         capture_output=True, text=True, timeout=SAFETY_S)
    error = json.loads(out.stdout)["gpus"]["error"]
    assert error.startswith("GPU probe did not answer within 1 s (") and error.endswith(" killed)")


@pytest.mark.parametrize("in_init", [False, True], ids=["in-sample", "in-init"])
def test_a_watch_goes_on_when_nvml_hangs(in_init: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hanging_nvml(tmp_path, monkeypatch, in_init=in_init)
    watch = subprocess.Popen([sys.executable, HELPER, "watch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert watch.stdin is not None and watch.stdout is not None
    try:
        watch.stdin.write(json.dumps({"interval_s": 0.2, "count": 12}))
        watch.stdin.close()
        samples, threads = [], 0
        for line in watch.stdout:
            samples.append(json.loads(line))
            if samples[-1].get("seq") == 8:  # more samples are to come: the watch still runs
                threads = len(os.listdir(f"/proc/{watch.pid}/task"))
        assert watch.wait(timeout=60) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert [s.get("seq") for s in samples] == [*range(12), None]  # every sample came, then the summary
    errors = [s["gpu_error"] for s in samples[:-1]]
    want = "NVML did not initialise within 1 s" if in_init else "nvml has not answered for"
    assert all(e is not None and e.startswith(want) for e in errors), errors
    assert samples[-2]["t"] - samples[0]["t"] < 12 * 0.2 + 5  # one wait at most, not one per sample
    assert 1 <= threads <= 4  # main, watchdog, the one hung NVML call: never one more per sample
