"""`hsched topo parse` on every kind of capture issue 19 names (nvidia-smi -L with its MIG devices, the MIG devices
table, --query-gpu CSV, topo -c, amd-smi static --json, partial lscpu and its -e/-p tables): the devices and
topology each holds, MIG devices as hsched's own; a kind that holds none refused in one line naming what it is
and what to capture instead."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.controller.fleet import mig_devices
from hsched.errors import UserError
from hsched.model import Device, Node, NodeState, Resources
from hsched.topo.inventory import HostNuma, Inventory
from hsched.topo.parse import detect_format, parse_capture, read_capture
from hsched.topo.place import topology_of_node
from hsched.topo.topology import Topology, TopologyParseError
from tests.conftest import FIXTURES

WRITTEN = FIXTURES / "topo-written"
runner = CliRunner()


def _inv(name: str) -> Inventory:
    inv = read_capture(WRITTEN / name)
    assert isinstance(inv, Inventory)
    return inv


def test_nvidia_smi_L_mig_devices_are_hscheds_mig_devices() -> None:
    inv = _inv("nvidia-smi-L__a100-80gb-x2-mig.txt")
    assert [(g.device_name, g.index, g.mig_profile) for g in inv.gpus] == [
        ("GPU0", 0, None), ("GPU0.0", 100, "3g.40gb"), ("GPU0.1", 101, "2g.20gb"), ("GPU0.2", 102, "1g.10gb"),
        ("GPU1", 1, None)]
    assert inv.gpus[0].mig_current is True and inv.gpus[4].mig_current is None
    devices = inv.devices()
    # GPU 0 is its three instances and no device itself; GPU 1 is whole
    assert [d.uuid[:12] for d in devices] == ["MIG-afd2822c", "MIG-05fdbd80", "MIG-a2b1ca98", "GPU-817ea2b7"]
    # the same devices as the controller builds from NVML's MIG listing of that GPU
    parent = Device(uuid="GPU-2a462c04-2319-4298-9d80-7d66a0638d5f", index=0, model="NVIDIA A100-SXM4-80GB")
    nvml = mig_devices(parent, [{"uuid": g.uuid, "name": g.name} for g in inv.gpus if g.mig_parent == 0])
    assert devices[:3] == tuple(nvml)
    # the topology names them as the capture's listing does, and a slice request gets a slice, never a GPU
    node = Node(name="n", executor="local", state=NodeState.UP, devices=devices)
    names = {d.uuid: d.name for d in topology_of_node(node).devices}
    assert [names[d.uuid] for d in devices] == [g.device_name for g in inv.gpus if g.index != 0]
    assert [d["name"] for d in inv.to_json()["devices"]] == ["GPU0.0", "GPU0.1", "GPU0.2", "GPU1"]
    # and the readable view says what hsched would hand out
    r = runner.invoke(app, ["topo", "parse", str(WRITTEN / "nvidia-smi-L__a100-80gb-x2-mig.txt")])
    assert r.exit_code == 0 and "hsched devices: GPU0.0, GPU0.1, GPU0.2, GPU1" in " ".join(r.output.split())
    assert [d.model for d in devices if Resources(gpu_types=("1g.10gb",)).matches_model(d.model)] == [
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
    assert [d.index for d in devices if Resources().matches_model(d.model)] == [1]


def test_nvidia_smi_L_r450_mig_uuids() -> None:
    inv = _inv("nvidia-smi-L__a100-40gb-mig-r450.txt")
    assert [(g.device_name, g.uuid) for g in inv.gpus[1:]] == [
        ("GPU0.0", "MIG-GPU-f906a8be-4eb5-4e24-aec3-7482a042e25f/1/0"),
        ("GPU0.1", "MIG-GPU-f906a8be-4eb5-4e24-aec3-7482a042e25f/2/0")]
    assert [d.mig_profile for d in inv.devices()] == ["3g.20gb", "3g.20gb"]


def test_mig_lines_without_their_gpu_are_refused_in_one_line() -> None:
    text = "  MIG 3g.48gb     Device  0: (UUID: MIG-51fa7c7a-4c41-59bf-b08a-9cb4b47525a7)\n"
    assert detect_format(text) == "nvidia-smi -L"
    with pytest.raises(TopologyParseError, match=r"line 1: MIG device lines without the `GPU N: \.\.\.` line"):
        parse_capture(text, "l.txt")


def test_the_mig_devices_table_of_plain_nvidia_smi() -> None:
    inv = _inv("nvidia-smi__a100-80gb-pcie-x2-mig.txt")
    got = [(g.device_name, g.mig_current, g.gpu_instance_id, g.memory_total_mib, g.memory_used_mib, g.sm_count)
           for g in inv.gpus]
    assert got == [("GPU0", True, None, 81920, 213, None), ("GPU0.0", None, 2, 40192, 124, 42),
                   ("GPU0.1", None, 3, 19968, 89, 28), ("GPU1", False, None, 81920, 4, None)]
    assert inv.gpus[1].name == "NVIDIA A100 80GB PCIe MIG" and inv.gpus[1].mig_profile is None
    assert "no profile or UUID" in inv.warnings[0]
    # the table names no UUID: nothing to hand out, rather than made-up identities
    assert inv.devices() == ()


def test_the_mig_devices_block_alone() -> None:
    inv = _inv("nvidia-smi-mig-devices__a100-40gb-r580.txt")
    assert inv.source_format == "nvidia-smi MIG devices"
    assert [(g.device_name, g.gpu_instance_id, g.compute_instance_id, g.memory_total_mib, g.sm_count)
            for g in inv.gpus] == [("GPU0.0", 1, 0, 19968, 42), ("GPU0.1", 7, 0, 4864, 14), ("GPU0.2", 8, 0, 4864, 14)]


def test_topo_c_gives_the_gpus_local_to_each_cpu_asked_about() -> None:
    inv = _inv("nvidia-smi-topo-c__dgx-a100.txt")
    assert [(g.index, g.affine_cpus) for g in inv.gpus] == [(0, (48,)), (1, (48,)), (6, (222,)), (7, (222,))]
    # only the CPUs asked about: partial, and it says what gives the whole
    assert inv.partial and "nvidia-smi topo -m" in inv.warnings[0]
    assert inv.to_json()["gpus"][0]["affine_cpus"] == "48"


def test_query_gpu_csv_with_units_and_without_an_index() -> None:
    inv = _inv("nvidia-smi-query-gpu__a100-80gb-x2-mig.txt")
    assert [(g.index, g.pci_bus_id, g.memory_total_mib, g.mig_current) for g in inv.gpus] == [
        (0, "0000:07:00.0", 81920, True), (1, "0000:0f:00.0", 81920, False)]
    # a GPU in MIG mode is never handed out whole, even where the capture lists no instance of it
    assert [d.index for d in inv.devices()] == [1]
    telemetry = _inv("nvidia-smi-query-gpu__no-index.txt")
    assert [(g.index, g.utilization_gpu, g.power_w) for g in telemetry.gpus] == [(0, 0.0, 23.45), (1, 87.0, 281.02)]
    assert telemetry.warnings == ("no index column: GPUs numbered in row order",)


@pytest.mark.parametrize(("text", "says"), [
    ("NVIDIA GeForce RTX 4090, 24564\nNVIDIA GeForce RTX 4090, 24564\n",
     "without its header line (noheader), 2 columns"),
    ("0, 1, 0\n", "without its header line (noheader), 3 columns"),
    ("timestamp, pstate\n2023/10/26 09:16:06.573, P0\n", "none of the fields hsched reads"),
], ids=["noheader-names", "noheader-numbers", "unread-fields"])
def test_query_gpu_csv_it_cannot_read_is_refused_naming_the_capture(text: str, says: str) -> None:
    assert detect_format(text) == "nvidia-smi --query-gpu csv"
    with pytest.raises(TopologyParseError, match="--query-gpu=index,uuid,name") as e:
        parse_capture(text, "q.csv")
    assert says in str(e.value)


def test_amd_smi_static_json_bus_and_numa() -> None:
    inv = _inv("amd-smi-static-json__mi300x-x2.txt")
    assert [(g.index, g.name, g.pci_bus_id, g.numa_node, g.memory_total_mib, g.gfx_target, g.pcie_width_max)
            for g in inv.gpus] == [(0, "MI300X-O", "0000:05:00.0", 0, 196592, "gfx942", 16),
                                   (1, "MI300X-O", "0000:26:00.0", 1, 196592, "gfx942", 16)]
    assert not inv.partial


@pytest.mark.parametrize(("name", "fmt", "nodes", "cpus"), [
    ("lscpu__xeon-8480-indented-partial.txt", "lscpu", ["0-55,112-167", "56-111,168-223"], 224),
    ("lscpu__model-only-partial.txt", "lscpu", [], None),
    ("lscpu-e__2socket-2numa.txt", "lscpu -e", ["0-3", "4-7"], 8),
    ("lscpu-p__2socket-2numa.txt", "lscpu -p", ["0-3", "4-7"], 8),
])
def test_lscpu_in_part_and_its_tables(name: str, fmt: str, nodes: list[str], cpus: int | None) -> None:
    host = read_capture(WRITTEN / name)
    assert isinstance(host, HostNuma) and host.source_format == fmt and host.cpus == cpus
    assert [n["cpus"] for n in host.to_json()["nodes"]] == nodes
    assert host.partial == (not nodes)


@pytest.mark.parametrize(("text", "kind"), [
    ((WRITTEN / "nvidia-smi-mig-lgi__a100-40gb.txt").read_text(), "`nvidia-smi mig -lgi` output"),
    ("+----+\n| GPU instance profiles:  |\n| GPU   Name   ID   Instances   Memory |\n",
     "`nvidia-smi mig -lgip` output"),
    ("No devices were found\n", "found no GPU"),
], ids=["mig-lgi", "mig-lgip", "no-devices"])
def test_kinds_without_devices_are_refused_in_one_line(text: str, kind: str, tmp_path: Path) -> None:
    f = tmp_path / "capture.txt"
    f.write_text(text)
    r = runner.invoke(app, ["topo", "parse", str(f)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and kind in lines[0] and "capture `nvidia-smi -L`" in lines[0], r.output


@pytest.mark.parametrize("path", sorted(WRITTEN.glob("*.txt")), ids=lambda p: p.name)
def test_the_cli_reads_each_written_capture_or_refuses_in_one_line(path: Path) -> None:
    r = runner.invoke(app, ["topo", "parse", str(path)])
    assert "Traceback" not in r.output
    if "mig-lgi" in path.name:
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    else:
        assert r.exit_code == 0, r.output


def test_a_damaged_numactl_distance_row_is_one_line_naming_it() -> None:
    text = "available: 2 nodes (0-1)\nnode 0 cpus: 0 1\nnode distances:\nnode   0   1\n  0:  10  21\n  1:  21 1:\n"
    with pytest.raises(TopologyParseError, match=r"line 6: node 1's distances are not numbers"):
        parse_capture(text, "n.txt")


def _damaged(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True) or [""]
    i = rng.randrange(len(lines))
    match rng.randrange(5):
        case 0:
            return text[: rng.randrange(len(text) + 1)]  # cut short
        case 1:
            return "".join(lines[:i] + lines[i + 1 :])  # a line lost
        case 2:
            return "".join([*lines[:i], lines[i][: rng.randrange(len(lines[i]) + 1)], *lines[i + 1 :]])
        case 3:
            at = rng.randrange(len(text) + 1)
            junk = rng.choice(["N/A", "x", ",", "|", ":", "-1", "\t", "[", "{", "GPU0", "9" * 20])
            return text[:at] + junk + text[at:]
        case _:
            return "".join([*lines[:i], lines[rng.randrange(len(lines))], *lines[i:]])  # a line twice


@pytest.mark.parametrize("path", sorted((FIXTURES / "topo").glob("*.txt")) + sorted(WRITTEN.glob("*.txt")),
                         ids=lambda p: p.name)
def test_damaged_captures_are_read_or_refused_never_a_traceback(path: Path) -> None:
    # hand edits and cut pastes: whatever is left is read, or refused as a UserError naming the file
    rng = random.Random(path.name)
    text = path.read_text()
    for _ in range(40):
        try:
            parse_capture(_damaged(text, rng), "damaged.txt")
        except UserError as e:
            assert str(e).startswith("damaged.txt") and "\n" not in str(e)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_capture_saved_with_a_byte_order_mark_is_read(encoding: str, tmp_path: Path) -> None:
    # PowerShell 5 redirects in UTF-16 with a BOM, Notepad may save a UTF-8 BOM: the same capture either way
    text = (WRITTEN / "amd-smi-static-json__mi300x-x2.txt").read_text()
    f = tmp_path / "capture.txt"
    f.write_bytes(text.replace("\n", "\r\n").encode(encoding))
    inv = read_capture(f)
    assert isinstance(inv, Inventory) and [g.pci_bus_id for g in inv.gpus] == ["0000:05:00.0", "0000:26:00.0"]


def test_rocm_smi_json_topology_and_identity() -> None:
    # read as rocm-smi's own, not as a one-GPU amd-smi fragment (what a `{"card0": ...}` document was taken for)
    topo = read_capture(WRITTEN / "rocm-smi-showtopo-json__mi300x-x4.txt")
    assert isinstance(topo, Topology) and topo.source_format == "rocm-smi --showtopo --json"
    assert [(d.name, d.numa_node) for d in topo.devices] == [("GPU0", 0), ("GPU1", 0), ("GPU2", 1), ("GPU3", 1)]
    assert len(topo.links) == 6 and {(lk.kind, lk.weight, lk.hops) for lk in topo.links} == {("XGMI", 15, 1)}
    assert not topo.partial
    inv = read_capture(WRITTEN / "rocm-smi-json__mi210-x2.txt")
    assert isinstance(inv, Inventory) and inv.source_format == "rocm-smi --json"
    assert [(g.name, g.pci_bus_id, g.memory_total_mib, g.gfx_target) for g in inv.gpus] == [
        ("AMD Instinct MI210", "0000:05:00.0", 65520, "gfx90a"),
        ("AMD Instinct MI210", "0000:26:00.0", 65520, "gfx90a")]


def test_amd_smi_json_wrapped_in_bytes_and_its_listing() -> None:
    # ROCm 7 wraps the list in {"gpu_data": [...]}; some releases give the VRAM in bytes
    wrapped = ('{"gpu_data": [{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X"},'
               ' "bus": {"bdf": "0000:05:00.0"}, "vram": {"size": {"value": 206141652992, "unit": "B"}}}]}')
    inv = parse_capture(wrapped, "s.json")
    assert isinstance(inv, Inventory) and inv.source_format == "amd-smi static --json"
    assert (inv.gpus[0].memory_total_mib, inv.gpus[0].pci_bus_id) == (196592, "0000:05:00.0")
    listing = ('[{"gpu": 0, "bdf": "0000:05:00.0", "uuid": "1fff74a1-0000-1000-807c-84c80bd7a1b5", "kfd_id": 49360,'
               ' "node_id": 2, "partition_id": 0}]')
    inv = parse_capture(listing, "l.json")
    assert isinstance(inv, Inventory) and inv.source_format == "amd-smi list --json" and not inv.partial
    assert (inv.gpus[0].uuid, inv.gpus[0].pci_bus_id) == ("1fff74a1-0000-1000-807c-84c80bd7a1b5", "0000:05:00.0")


WINDOWS_TABLE = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 566.36                 Driver Version: 566.36         CUDA Version: 12.7     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                  Driver-Model | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA GeForce RTX 4070 ...  WDDM  |   00000000:01:00.0  On |                  N/A |
| N/A   45C    P8              3W /  115W |     345MiB /   8188MiB |      0%      Default |
|                                         |                        |                  N/A |
+-----------------------------------------+------------------------+----------------------+
"""


def test_the_windows_table_with_its_driver_model_column() -> None:
    # Windows prints Driver-Model (WDDM/TCC) where Linux prints Persistence-M: the same GPU rows
    inv = parse_capture(WINDOWS_TABLE, "win.txt")
    assert isinstance(inv, Inventory) and inv.driver_version == "566.36"
    assert [(g.index, g.name, g.pci_bus_id, g.memory_total_mib) for g in inv.gpus] == [
        (0, "NVIDIA GeForce RTX 4070 ...", "0000:01:00.0", 8188)]
