"""The processes on AMD GPUs (issue 32): the after-run check and the watch read `amd-smi process` or
`rocm-smi --showpids` (hsched/node/amdprocs.py), from published captures (tests/fixtures/amdprocs/); the slow tests
run them through the stub tools of tests/fixtures/amdbin/ on PATH."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hsched.node.amdprocs import amd_gpu_processes, parse_amd_smi_process, parse_rocm_showpids
from hsched.node.gpucheck import gpu_holders
from hsched.node.samplers import gpu_sampler
from tests.conftest import FIXTURES
from tests.node.test_amd_probe import HELPER, on_path

AMDPROCS = FIXTURES / "amdprocs"


def capture(name: str) -> str:
    lines = (AMDPROCS / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(lines[next(i for i, line in enumerate(lines) if line.startswith("# ----")) + 1:])


def test_amd_smi_process_text_gives_gpu_pid_and_vram() -> None:
    procs = parse_amd_smi_process(capture("amd-smi-process__mi300x-1proc.txt"))
    # NAME: N/A is no name; 1.9 GB of VRAM in MiB
    assert procs == [{"index": 0, "pid": 2266127, "name": None, "used_memory_mib": 1946}]
    assert parse_amd_smi_process("") == []


def test_rocm_smi_showpids_gives_pids_and_how_many_gpus() -> None:
    procs = parse_rocm_showpids(capture("rocm-smi-showpids__8proc.txt"))
    assert len(procs) == 8 and [p["pid"] for p in procs][:3] == [3722222, 3814512, 1168514]
    busy = [p for p in procs if p["gpu_count"]]
    assert busy == [{"pid": 1168514, "name": "pt_main_thread", "gpu_count": 1, "used_memory_mib": 169169}]
    # a release that cannot read a process's figures: UNKNOWN, and the "Not supported" lines above the table
    unknown = parse_rocm_showpids(capture("rocm-smi-showpids__unknown-4proc.txt"))
    assert [(p["pid"], p["name"], p["gpu_count"], p["used_memory_mib"]) for p in unknown] == [
        (55573, "gmx_mpi", 1, None), (55571, "gmx_mpi", 1, None), (55574, "gmx_mpi", 1, None),
        (55572, "gmx_mpi", 1, None)]


@pytest.mark.slow
def test_rocm_smi_places_a_process_only_where_its_gpu_count_leaves_no_doubt(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The 4 gmx_mpi ranks use 1 GPU each: on a 1-GPU node that is its GPU; on 2 GPUs nobody can say which."""
    stub = tmp_path / "rocm-smi"
    stub.write_text("#!/bin/sh\n[ \"$1\" = --showpids ] && exec cat %s\nexit 2\n" % (tmp_path / "out.txt"))
    stub.chmod(0o755)
    (tmp_path / "out.txt").write_text(capture("rocm-smi-showpids__unknown-4proc.txt"))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    one = [{"index": 0, "uuid": "AMD-GPU0"}]
    procs, error = amd_gpu_processes(one, 10.0)
    assert error is None and [(p["uuid"], p["pid"]) for p in procs or []] == [
        ("AMD-GPU0", 55573), ("AMD-GPU0", 55571), ("AMD-GPU0", 55574), ("AMD-GPU0", 55572)]
    procs, error = amd_gpu_processes([*one, {"index": 1, "uuid": "AMD-GPU1"}], 10.0)
    assert procs is None and error is not None and "uses 1 of the 2 GPUs but not which" in error


# (amd-smi on this MI300X box gives no UUID: its GPUs are named by PCI address and this machine's name, hsched.node.amd)
MI300X_GPU0, MI300X_GPU3 = f"AMD-{socket.gethostname()}-0000:0c:00.0", f"AMD-{socket.gethostname()}-0000:5c:00.0"


@pytest.mark.slow
def test_the_after_run_check_reports_a_process_left_on_an_amd_gpu_and_none_on_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi300x")
    holders, error = gpu_holders([MI300X_GPU0, MI300X_GPU3])
    assert error is None and holders == [{"uuid": MI300X_GPU0, "pid": 2266127, "name": None}]
    holders, error = gpu_holders([MI300X_GPU3])
    assert error is None and holders == []


@pytest.mark.slow
def test_the_after_run_check_says_why_where_rocm_smi_cannot_place_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi210")
    holders, error = gpu_holders([f"AMD-{socket.gethostname()}-GPU0"])
    assert holders == [] and error is not None and "pid 1168514 uses 1 of the 8 GPUs but not which" in error


@pytest.mark.slow
def test_the_watch_lists_the_processes_on_an_amd_node(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi300x")
    sampler = gpu_sampler({}, 1.0)
    try:
        devices, procs, error = sampler.sample()
        assert error is None and len(devices) == 8
        assert procs == [{"uuid": MI300X_GPU0, "pid": 2266127, "name": None, "used_memory_mib": 1946}]
    finally:
        sampler.close()
    out = subprocess.run([sys.executable, str(HELPER), "watch"], input=json.dumps({"interval_s": 0.2, "count": 1}),
                         capture_output=True, text=True, timeout=120)
    sample = json.loads(out.stdout.splitlines()[0])
    assert sample["gpus"]["source"] == "amd-smi" and sample["processes_error"] is None
    assert [(p["uuid"], p["pid"], p["used_memory_mib"]) for p in sample["processes"]] == [
        (MI300X_GPU0, 2266127, 1946)]
