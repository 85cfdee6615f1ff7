"""AMD GPUs live (issue 32): the node helper's probe, with stub `amd-smi`/`rocm-smi` executables on PATH that print
real captures (tests/fixtures/amdbin/), finds the devices, their NUMA nodes and the topology text; the controller
reads that text into XGMI links (hsched/controller/fleet.py). The stubs are processes: slow."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hsched.controller.fleet import amd_links
from hsched.model import Device
from hsched.node import amd
from hsched.node.probe import _gpu_tools, probe_gpus
from hsched.node.samplers import gpu_sampler

AMDBIN = Path(__file__).resolve().parent.parent / "fixtures" / "amdbin"
HELPER = Path(__file__).resolve().parents[2] / "hsched" / "node" / "nodehelper.py"


def on_path(monkeypatch: pytest.MonkeyPatch, machine: str | None) -> None:
    """Only the machine's stub tools and the basics: no nvidia-smi, no amd-smi/rocm-smi of this host."""
    dirs = ([str(AMDBIN / machine)] if machine else []) + [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # type: ignore[arg-type]  # no NVML either


def devices_of(gpus: dict) -> list[Device]:
    return [Device(uuid=d["uuid"], index=d["index"], model=d["name"], pci_bus_id=d.get("pci_bus_id"),
                   numa_node=d.get("numa_node")) for d in gpus["devices"]]


@pytest.mark.slow
def test_an_mi300x_node_is_found_with_amd_smi_and_its_xgmi_hive_reaches_the_links(
        monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi300x")
    assert _gpu_tools()
    gpus = probe_gpus()
    assert gpus["source"] == "amd-smi" and gpus["vendor"] == "amd"
    devs = gpus["devices"]
    assert [d["index"] for d in devs] == list(range(8))
    assert {d["name"] for d in devs} == {"MI300X-O"} and {d["memory_total_mib"] for d in devs} == {196592}
    assert [d["pci_bus_id"] for d in devs][:2] == ["00000000:0C:00.0", "00000000:22:00.0"]
    assert [d["numa_node"] for d in devs] == [0, 0, 0, 0, 1, 1, 1, 1]
    # `topology --json` is not in this release's capture: the text tables, as printed, for the controller
    assert gpus["topo_format"] == "amd-smi topology" and "LINK TYPE TABLE:" in gpus["topo_text"]
    links = amd_links(gpus, devices_of(gpus))
    assert len(links) == 28 and {lk.kind for lk in links} == {"XGMI"}
    assert {lk.bandwidth_gbps for lk in links} == {50.0}  # the NUMA BW table's 50000 MB/s


@pytest.mark.slow
def test_the_xgmi_table_is_the_topology_where_amd_smi_prints_no_pair_tables(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A release whose `topology` fails: `amd-smi xgmi` (per-GPU link type, all XGMI) still gives the hive."""
    stub = tmp_path / "amd-smi"
    stub.write_text((AMDBIN / "mi300x" / "amd-smi").read_text().replace(
        '    ("topology",): "topo/amd-smi-topology__mi300x-8gpu.txt",\n', "").replace(
        "Path(__file__).resolve().parent.parent", repr(str(AMDBIN))))
    stub.chmod(0o755)
    on_path(monkeypatch, None)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    gpus = probe_gpus()
    assert gpus["topo_format"] == "amd-smi xgmi"
    links = amd_links(gpus, devices_of(gpus))
    assert len(links) == 28 and {lk.kind for lk in links} == {"XGMI"} and {lk.bandwidth_gbps for lk in links} == {64.0}


@pytest.mark.slow
def test_an_mi210_node_is_found_with_rocm_smi_text_forms_and_its_numa_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi210")
    gpus = probe_gpus()
    assert gpus["source"] == "rocm-smi" and gpus["vendor"] == "amd"
    devs = gpus["devices"]
    assert len(devs) == 8 and {d["name"] for d in devs} == {"Instinct MI210"}
    assert {d["utilization_gpu"] for d in devs} == {0.0}
    # NPS4 on two sockets: GPU0 on NUMA 3 ... GPU7 on NUMA 4 (the reversed order of the capture)
    assert [d["numa_node"] for d in devs] == [3, 2, 1, 0, 7, 6, 5, 4]
    assert len({d["uuid"] for d in devs}) == 8
    assert gpus["topo_format"] == "rocm-smi --showtoponuma"
    assert amd_links(gpus, devices_of(gpus)) == ()  # NUMA only: no link-type table in this capture


def test_no_amd_tool_no_amd_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, None)
    assert amd.probe_amd() is None and not _gpu_tools()
    assert probe_gpus() == {"source": None, "devices": []}


@pytest.mark.slow
def test_a_watch_on_an_amd_node_samples_its_gpus_with_the_amd_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi210")
    sampler = gpu_sampler({}, 1.0)
    try:
        assert sampler.source == "rocm-smi"
        devices, procs, error = sampler.sample()
        assert error is None and procs is None  # rocm-smi --showpids cannot say which GPU (amdprocs.py)
        assert [d["index"] for d in devices] == list(range(8)) and {d["utilization_gpu"] for d in devices} == {0.0}
        # (rocm-smi on this MI210 box gives no UUID nor bus id: named by index and this machine's name)
        assert devices[0]["uuid"] == f"AMD-{socket.gethostname()}-GPU0" and devices[0]["temperature_c"] == 34.0
    finally:
        sampler.close()


@pytest.mark.slow
def test_a_watch_sample_on_an_amd_node_lists_no_processes_rather_than_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller reads `processes: []` as "no GPU process there" (a dirty GPU is clean again): a rocm-smi-only
    node whose --showpids names a process on 1 of its 8 GPUs but not which says None, and why."""
    on_path(monkeypatch, "mi210")
    out = subprocess.run([sys.executable, str(HELPER), "watch"], input=json.dumps({"interval_s": 0.2, "count": 1}),
                         capture_output=True, text=True, timeout=120)
    sample = json.loads(out.stdout.splitlines()[0])  # then the closing {"samples": 1}
    assert sample["gpus"]["source"] == "rocm-smi" and len(sample["gpus"]["devices"]) == 8
    assert sample["processes"] is None and sample["gpu_error"] is None
    assert "pid 1168514 uses 1 of the 8 GPUs but not which" in sample["processes_error"]


@pytest.mark.slow
def test_a_rocm_smi_with_no_show_text_alone_is_read_from_its_full_dump_and_its_json_topology(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The 4x MI300X guest: the concise table, `rocm-smi -a` for bus and identity, `--showtopo --json`."""
    on_path(monkeypatch, "mi300x-4")
    gpus = probe_gpus()
    devs = gpus["devices"]
    assert [d["pci_bus_id"] for d in devs] == ["00000000:26:00.0", "00000000:46:00.0", "00000000:65:00.0",
                                               "00000000:85:00.0"]
    assert devs[0]["uuid"] == "AMD-0x8d1457e2c20f59d2" and {d["name"] for d in devs} == {"AMD Instinct MI300X"}
    assert [d["numa_node"] for d in devs] == [0, 0, 1, 1]
    assert gpus["topo_format"] == "rocm-smi --json"
    links = amd_links(gpus, devices_of(gpus))
    assert len(links) == 6 and {lk.kind for lk in links} == {"XGMI"}


@pytest.mark.slow
def test_rocm_smis_json_inventory_gives_memory_and_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, "mi210-2")
    gpus = probe_gpus()
    assert [(d["name"], d["memory_total_mib"], d["pci_bus_id"]) for d in gpus["devices"]] == [
        ("AMD Instinct MI210", 65520, "00000000:05:00.0"), ("AMD Instinct MI210", 65520, "00000000:26:00.0")]
    assert gpus["topo_text"] is None  # no topology form answered: devices without links


@pytest.mark.slow
def test_an_amd_tool_that_fails_is_the_probes_error_not_zero_gpus(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    stub = tmp_path / "amd-smi"
    stub.write_text("#!/bin/sh\necho 'ERROR: amdgpu driver not initialized' >&2\nexit 1\n")
    stub.chmod(0o755)
    on_path(monkeypatch, None)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    gpus = probe_gpus()
    assert gpus["devices"] == [] and gpus["error"] == (
        "AMD GPU probe failed: amd-smi static --json failed (exit status 1): ERROR: amdgpu driver not initialized")


@pytest.mark.slow
def test_gpus_without_a_unique_id_are_told_apart_from_their_namesakes_on_another_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller knows a device by its name across the fleet (who holds it, what it reads). amd-smi on the
    MI300X box and rocm-smi on the MI210 box give no Unique ID: two such machines have the same PCI addresses and
    indices, so those names carry the machine's; a GPU with a Unique ID keeps it alone."""
    for machine in ("mi300x", "mi210"):
        on_path(monkeypatch, machine)
        named = {}
        for host in ("box-a", "box-b", "box-a"):
            monkeypatch.setattr(amd, "_host", lambda host=host: host)
            named.setdefault(host, []).append([d["uuid"] for d in probe_gpus()["devices"]])
        (a, again), (b,) = named["box-a"], named["box-b"]
        assert a == again and len(set(a)) == len(a) == 8 and not set(a) & set(b), machine
        assert all(u.startswith("AMD-box-a-") for u in a)
    on_path(monkeypatch, "mi300x-4")
    monkeypatch.setattr(amd, "_host", lambda: "box-a")
    assert probe_gpus()["devices"][0]["uuid"] == "AMD-0x8d1457e2c20f59d2"
