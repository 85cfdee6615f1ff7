"""Parsers against every real capture in tests/fixtures/topo, plus small inline edge cases.

Expected values are read off the captures by eye (noted per test), not produced by the parser.
"""

from __future__ import annotations

import itertools

import pytest
from captures import all_captures, capture, strip_header

from hsched.errors import UserError
from hsched.topo.inventory import HostNuma, Inventory, NvlinkStatus, P2PMatrix
from hsched.topo.parse import detect_format, parse_capture, parse_topology, read_topology_file
from hsched.topo.parse_nvidia import parse_query_csv, parse_topo_matrix
from hsched.topo.topology import Topology, TopologyParseError, format_cpulist, normalize_bus_id, parse_cpulist


def kinds(topo: Topology, a: str, b: str) -> str:
    lk = topo.link(a, b)
    assert lk is not None, f"no link {a}-{b}"
    return lk.kind


def gpu_pairs(n: int) -> list[tuple[str, str]]:
    return [(f"GPU{i}", f"GPU{j}") for i, j in itertools.combinations(range(n), 2)]


# ---- every capture ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", all_captures(), ids=lambda p: p.name)
def test_every_capture_parses_or_is_flagged(path):
    text = strip_header(path.read_text(encoding="utf-8"))
    result = parse_capture(text, path.name)
    cut = any(w in path.name for w in ("truncated", "elided", "snippet"))
    if cut and not result.partial:
        # a snippet may still be whole for what it shows (lscpu socket/NUMA lines); it must then be sensible
        assert isinstance(result, HostNuma) and result.nodes
    if isinstance(result, Topology):
        assert result.devices
        names = {d.name for d in result.devices} | {n.name for n in result.nics}
        for lk in result.links:
            assert lk.a in names and lk.b in names and lk.a != lk.b
        if not result.partial and len(result.devices) > 1 and result.links:
            n = len(result.devices)
            assert len(result.device_links()) == n * (n - 1) // 2
    elif isinstance(result, Inventory):
        assert result.gpus
    elif isinstance(result, HostNuma):
        assert result.nodes
    else:
        assert isinstance(result, P2PMatrix | NvlinkStatus)


def test_every_capture_is_found():
    assert len(all_captures()) >= 30


# ---- nvidia-smi topo -m: values read off the captures ------------------------------------------------


def test_h100_sxm_11nic_ansi():
    t = parse_topology(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    assert [d.name for d in t.devices] == [f"GPU{i}" for i in range(8)]
    assert len(t.nics) == 11
    assert all(kinds(t, a, b) == "NV18" for a, b in gpu_pairs(8))
    assert [d.numa_node for d in t.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.devices[0].cpu_affinity == parse_cpulist("0-55,112-167")
    assert t.devices[7].cpu_affinity == parse_cpulist("56-111,168-223")
    assert all(d.gpu_numa_id is None for d in t.devices)
    nic = {n.name: n for n in t.nics}
    assert nic["NIC9"].device == "mlx5_10" and nic["NIC10"].device == "mlx5_11"
    assert kinds(t, "GPU0", "NIC0") == "PIX" and kinds(t, "GPU0", "NIC1") == "PXB"
    assert kinds(t, "GPU0", "NIC2") == "NODE" and kinds(t, "GPU0", "NIC6") == "SYS"
    assert kinds(t, "GPU6", "NIC8") == "PIX" and kinds(t, "GPU7", "NIC8") == "PXB"
    assert nic["NIC0"].numa_node == 0 and nic["NIC6"].numa_node == 1
    assert not t.partial


@pytest.mark.parametrize(
    "name,kind,cpus0,cpus4",
    [
        ("nvidia-smi-topo__a100-sxm-8gpu-nv12-2numa.txt", "NV12", "0-23", "24-47"),
        ("nvidia-smi-topo__h100-sxm-8gpu-nv18-2numa-narrow.txt", "NV18", "0-51", "52-103"),
        ("nvidia-smi-topo__h100-sxm-8gpu-nv18-ht-affinity.txt", "NV18", "0-51,104-155", "52-103,156-207"),
    ],
)
def test_nvswitch_8gpu_two_numa(name, kind, cpus0, cpus4):
    t = parse_topology(capture(name))
    assert len(t.devices) == 8 and not t.nics
    assert all(kinds(t, a, b) == kind for a, b in gpu_pairs(8))
    assert [d.numa_node for d in t.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert format_cpulist(t.devices[0].cpu_affinity) == cpus0
    assert format_cpulist(t.devices[4].cpu_affinity) == cpus4


def test_dgx1_hybrid_cube_mesh_old_legend():
    t = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    assert len(t.devices) == 8
    assert [n.name for n in t.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    # row GPU0: X NV1 NV1 NV2 NV2 SYS SYS SYS | PIX SYS PHB SYS
    assert [kinds(t, "GPU0", f"GPU{j}") for j in range(1, 8)] == [
        "NV1",
        "NV1",
        "NV2",
        "NV2",
        "SYS",
        "SYS",
        "SYS",
    ]
    assert kinds(t, "GPU1", "GPU5") == "NV2" and kinds(t, "GPU2", "GPU6") == "NV1"
    assert kinds(t, "GPU3", "GPU7") == "NV1" and kinds(t, "GPU4", "GPU7") == "NV2"
    assert kinds(t, "GPU0", "mlx5_0") == "PIX" and kinds(t, "GPU0", "mlx5_1") == "PHB"
    assert kinds(t, "GPU6", "mlx5_3") == "PIX"
    assert t.devices[0].cpu_affinity == parse_cpulist("0-19,40-59")
    assert t.devices[4].cpu_affinity == parse_cpulist("20-39,60-79")
    assert all(d.numa_node is None for d in t.devices)  # no NUMA Affinity column on this driver
    assert sum(1 for a, b in gpu_pairs(8) if kinds(t, a, b) == "SYS") == 12


def test_h100_4gpu_vm_and_a100_1gpu_ansi():
    t = parse_topology(capture("nvidia-smi-topo__h100-4gpu-vm-ansi.txt"))
    assert len(t.devices) == 4 and all(kinds(t, a, b) == "NV18" for a, b in gpu_pairs(4))
    assert {d.numa_node for d in t.devices} == {0} and t.devices[3].cpu_affinity == tuple(range(96))
    one = parse_topology(capture("nvidia-smi-topo__a100-pcie-1gpu-ansi.txt"))
    assert len(one.devices) == 1 and not one.links
    assert one.devices[0].numa_node == 0 and one.devices[0].cpu_affinity == tuple(range(16))


@pytest.mark.parametrize(
    "name,kind,ncpu",
    [
        ("nvidia-smi-topo__2gpu-nv2-workstation.txt", "NV2", 24),
        ("nvidia-smi-topo__2gpu-phb-consumer.txt", "PHB", 12),
    ],
)
def test_two_gpu_workstations(name, kind, ncpu):
    t = parse_topology(capture(name))
    assert kinds(t, "GPU0", "GPU1") == kind
    assert all(d.numa_node is None and len(d.cpu_affinity) == ncpu for d in t.devices)


# ---- other NVIDIA captures ----------------------------------------------------------------------------


def test_p2p_matrices():
    ok = parse_capture(capture("nvidia-smi-topo-p2p__h100-8gpu.txt"))
    assert isinstance(ok, P2PMatrix) and len(ok.status) == 56 and {s for *_, s in ok.status} == {"OK"}
    cns = parse_capture(capture("nvidia-smi-topo-p2p__l4-2gpu-cns.txt"))
    assert isinstance(cns, P2PMatrix) and cns.get("GPU0", "GPU1") == "CNS"


def test_smi_q_h100_sxm():
    inv = parse_capture(capture("nvidia-smi-q__h100-sxm-x8.txt"))
    assert isinstance(inv, Inventory) and inv.source_format == "nvidia-smi -q"
    assert len(inv.gpus) == 8 and inv.driver_version == "565.57.01"
    g0 = inv.gpus[0]
    assert g0.name == "NVIDIA H100 80GB HBM3" and g0.uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert g0.pci_bus_id == "0000:18:00.0" and g0.memory_total_mib == 81559 and g0.memory_used_mib == 1
    assert g0.mig_current is False and g0.pcie_gen_max == 5 and g0.pcie_width_max == 16
    assert g0.power_w == pytest.approx(100.89) and g0.temperature_c == 30
    assert g0.fabric_clique == "0"
    assert inv.gpus[1].pci_bus_id == "0000:2a:00.0"


@pytest.mark.parametrize(
    "name,count,model,mib,mig",
    [
        ("nvidia-smi-q__a100-sxm4-80gb-x4.txt", 4, "NVIDIA A100-SXM4-80GB", 81920, False),
        ("nvidia-smi-q__h100-nvl-x2.txt", 2, "NVIDIA H100 NVL", 95830, False),
        ("nvidia-smi-q__l40s-x1.txt", 1, "NVIDIA L40S", 46068, None),
    ],
)
def test_smi_q_models(name, count, model, mib, mig):
    inv = parse_capture(capture(name))
    assert len(inv.gpus) == count and not inv.partial
    assert {g.name for g in inv.gpus} == {model} and inv.gpus[0].memory_total_mib == mib
    assert inv.gpus[0].mig_current is mig


@pytest.mark.parametrize(
    "name,count,model,mib",
    [
        ("nvidia-smi__a40-x10.txt", 10, "NVIDIA A40", 46068),
        ("nvidia-smi__rtx4090-x8.txt", 8, "NVIDIA GeForce RTX 4090", 24564),
        ("nvidia-smi__h100-sxm-x8.txt", 8, "NVIDIA H100 80GB HBM3", 81559),
        ("nvidia-smi__a100-sxm4-80gb-x4.txt", 4, "NVIDIA A100-SXM4-80GB", 81920),
    ],
)
def test_plain_smi_table(name, count, model, mib):
    inv = parse_capture(capture(name))
    assert [g.index for g in inv.gpus] == list(range(count))
    assert inv.gpus[-1].name == model and inv.gpus[-1].memory_total_mib == mib


def test_nvlink_status_elided_is_flagged():
    st = parse_capture(capture("nvidia-smi-nvlink-status__h100-elided.txt"))
    assert isinstance(st, NvlinkStatus) and st.partial
    assert st.gpus[0][2] == ((0, 26.562), (17, 26.562))


# ---- AMD and host captures ----------------------------------------------------------------------------


def test_rocm_showtoponuma_reversed_order():
    t = parse_capture(capture("rocm-smi-showtoponuma__mi210-x8-nps4.txt"))
    assert isinstance(t, Topology) and [d.numa_node for d in t.devices] == [3, 2, 1, 0, 7, 6, 5, 4]
    assert not t.links and t.warnings


def test_rocm_concise_tables():
    inv = parse_capture(capture("rocm-smi__mi210-x8.txt"))
    assert len(inv.gpus) == 8 and inv.gpus[0].name == "Instinct MI210" and inv.gpus[0].power_w == 43.0
    inv = parse_capture(capture("rocm-smi__mi300x-x4.txt"))
    assert len(inv.gpus) == 4 and inv.gpus[3].name == "AMD Instinct MI300X"
    full = parse_capture(capture("rocm-smi-a__mi300x-x4.txt"))
    assert len(full.gpus) == 4 and full.gpus[0].pci_bus_id == "0000:26:00.0"
    assert full.gpus[0].name == "AMD Instinct MI300X OAM"


def test_amd_smi_topology_mi300x():
    t = parse_topology(capture("amd-smi-topology__mi300x-8gpu.txt"))
    assert len(t.devices) == 8 and t.devices[0].pci_bus_id == "0000:0c:00.0"
    assert t.devices[7].pci_bus_id == "0000:df:00.0"
    assert len(t.links) == 28
    assert all(lk.kind == "XGMI" and lk.weight == 15 and lk.hops == 1 for lk in t.links)
    assert t.links[0].bandwidth_gbps == 50.0


def test_amd_smi_xgmi_and_cndz():
    x = parse_topology(capture("amd-smi-xgmi__mi300x-8gpu.txt"))
    assert len(x.devices) == 8 and {lk.kind for lk in x.links} == {"XGMI"} and x.links[0].bandwidth_gbps == 64
    c = parse_topology(capture("amd-smi-topology-cndz__8gpu-changelog.txt"))
    assert len(c.devices) == 8 and not c.links and c.partial  # no link types in -cndz: flagged, not guessed


def test_amd_smi_topology_old_json():
    t = parse_topology(capture("amd-smi-topology-json__2gpu-pcie-oldformat.txt"))
    assert len(t.devices) == 2
    (lk,) = t.links
    assert (lk.a, lk.b, lk.kind, lk.weight, lk.hops) == ("GPU0", "GPU1", "PCIE", 40, 2)


def test_amd_smi_list_static_truncated_flagged():
    inv = parse_capture(capture("amd-smi-list__mi300x.txt"))
    assert inv.partial and len(inv.gpus) == 3 and inv.gpus[2].pci_bus_id == "0000:46:00.0"
    st = parse_capture(capture("amd-smi-static__mi300x-truncated.txt"))
    assert st.partial and st.gpus[0].name == "MI300X-O"
    asic = parse_capture(capture("amd-smi-static-asic__mi308x.txt"))
    assert asic.gpus[0].gfx_target == "gfx942"
    vram = parse_capture(capture("amd-smi-static-json-vram__mi300x.txt"))
    assert vram.gpus[0].memory_total_mib == 196592


def test_numactl_and_lscpu():
    amd = parse_capture(capture("numactl-hardware__amd-epyc-2s-nps4-8numa.txt"))
    assert isinstance(amd, HostNuma) and len(amd.nodes) == 8 and amd.cpus == 256
    assert amd.nodes[3].cpus == parse_cpulist("48-63,176-191") and amd.nodes[0].distances[4] == 32
    h100 = parse_capture(capture("numactl-hardware__h100-sxm-8gpu-2socket.txt"))
    assert h100.nodes[1].cpus == parse_cpulist("56-111,168-223") and h100.nodes[0].memory_mib == 1031078
    vm = parse_capture(capture("numactl-hardware__h100-4gpu-vm-1node.txt"))
    assert len(vm.nodes) == 1 and vm.cpus == 96
    ls = parse_capture(capture("lscpu__xeon-8480-2s-h100x8.txt"))
    assert ls.sockets == 2 and ls.cpus == 224 and ls.nodes[1].cpus == parse_cpulist("56-111,168-223")
    snip = parse_capture(capture("lscpu__amd-epyc-2s-nps4-8x-mi210-snippet.txt"))
    assert len(snip.nodes) == 8 and snip.cores_per_socket == 64 and snip.node_of_cpu(200) == 4


# ---- inline edge cases ---------------------------------------------------------------------------------

K80_SOC = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\nGPU0\t X \tPIX\tSOC\tSOC\t0-11\nGPU1\tPIX\t X \tSOC\tSOC\t0-11\n"
    "GPU2\tSOC\tSOC\t X \tPIX\t12-23\nGPU3\tSOC\tSOC\tPIX\t X \t12-23\n\nLegend:\n\n  X   = Self\n"
    "  SOC  = Path traverses a socket-level link (e.g. QPI)\n  PHB  = Path traverses a PCIe host bridge\n"
)

GRACE = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tSYS\t0-71\t0,2-9\t\t2\n"
    "GPU1\tNV18\t X \tSYS\t72-143\t1,10-17\t\t10\n"
    "NIC0\tSYS\tSYS\t X \t\t\t\t\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def test_old_soc_legend_maps_to_sys():
    t = parse_topo_matrix(K80_SOC)
    assert kinds(t, "GPU0", "GPU2") == "SYS" and kinds(t, "GPU0", "GPU1") == "PIX"
    assert t.devices[2].cpu_affinity == tuple(range(12, 24))


def test_grace_numa_lists_and_gpu_numa_id():
    t = parse_topo_matrix(GRACE)
    g0, g1 = t.devices
    assert g0.numa_node == 0 and g0.numa_nodes == (0, 2, 3, 4, 5, 6, 7, 8, 9) and g0.gpu_numa_id == 2
    assert g1.numa_node == 1 and g1.gpu_numa_id == 10
    assert t.nics[0].device == "mlx5_0" and kinds(t, "GPU1", "NIC0") == "SYS"


def test_spaces_with_single_space_gap_cells():
    # tab expansion can leave one space between a 7-character cell and the next column
    text = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      NV4     0-7,9-11 0\n"
        "GPU1    NV4      X      0-7,9-11 0\n"
    )
    t = parse_topo_matrix(text)
    assert kinds(t, "GPU0", "GPU1") == "NV4" and t.devices[1].cpu_affinity == (
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        9,
        10,
        11,
    )


@pytest.mark.parametrize(
    "text,needle",
    [
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\n", "line 3"),  # row cut: cells missing
        ("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIXNODE\tNODE\nGPU1\tPIX\t X \tNODE\n", "PIXNODE"),  # paste damage
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV4\t X \n", "not symmetric"),
        ("\tGPU0\tGPU1\nGPU0\tNV2\t X \nGPU1\tNV2\t X \n", "diagonal"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-3\t7\nGPU1\tSYS\t X \t4-7\n", "affinity cells"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\tzero\nGPU1\tSYS\t X \t4-7\n", "CPU Affinity"),
        ("\tGPU0\tGPU1\n", "no rows"),
        ("hello world\n", "unrecognised"),
        ("", "unrecognised"),
    ],
)
def test_damaged_matrices_raise_clear_errors(text, needle):
    with pytest.raises(TopologyParseError) as ei:
        parse_topology(text, "cap.txt")
    msg = str(ei.value)
    assert needle in msg and msg.startswith("cap.txt") and "\n" not in msg
    assert isinstance(ei.value, UserError)


def test_missing_rows_give_a_flagged_partial_result():
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV2\tSYS\nGPU1\tNV2\t X \tSYS\n"
    t = parse_topology(text)
    assert t.partial and any("GPU2" in w for w in t.warnings)
    assert kinds(t, "GPU0", "GPU2") == "SYS"  # known from GPU0's row


def test_truncated_real_capture_is_flagged_or_refused():
    body = capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt")
    lines = body.splitlines()
    cut_rows = "\n".join(lines[:6]) + "\n"  # header + GPU0..GPU4
    t = parse_topology(cut_rows)
    assert t.partial and kinds(t, "GPU0", "GPU1") == "NV1"
    assert t.link("GPU5", "GPU6") is None  # unknown, not invented
    cut_mid = "\n".join(lines[:4]) + "\n" + lines[4][:20] + "\n"
    with pytest.raises(TopologyParseError, match="line 5"):
        parse_topology(cut_mid)


def test_read_topology_file_errors_name_the_file(tmp_path):
    with pytest.raises(TopologyParseError, match=r"nope\.txt: no such file"):
        read_topology_file(tmp_path / "nope.txt")
    with pytest.raises(TopologyParseError, match="directory"):
        read_topology_file(tmp_path)
    f = tmp_path / "csv.txt"
    f.write_text("index, name\n0, NVIDIA A10G\n")
    with pytest.raises(TopologyParseError, match="no device links"):
        read_topology_file(f)


def test_query_csv_with_and_without_header():
    with_units = (
        "index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], utilization.gpu [%]\n"
        "0, GPU-aaaa, NVIDIA A10G, 00000000:00:1E.0, 23028 MiB, 0 MiB, 3 %\n"
    )
    inv = parse_query_csv(with_units)
    g = inv.gpus[0]
    assert (g.name, g.pci_bus_id, g.memory_total_mib, g.utilization_gpu) == (
        "NVIDIA A10G",
        "0000:00:1e.0",
        23028,
        3,
    )
    bare = "0, GPU-x, NVIDIA GeForce RTX 2080 Ti, 00000000:01:00.0, 11264, 10, 0, 40, [N/A]\n"
    assert detect_format(bare) == "nvidia-smi --query-gpu csv"
    g = parse_query_csv(bare).gpus[0]
    assert g.name == "NVIDIA GeForce RTX 2080 Ti" and g.memory_used_mib == 10 and g.power_w is None
    # without a header only hsched's own 9-field query reads; any other is refused naming what to capture
    with pytest.raises(TopologyParseError, match="noheader"):
        parse_query_csv("0, GPU-x, short\n")


ROCM_SHOWTOPO = """

============================ ROCm System Management Interface ============================
================================ Weight between two GPUs =================================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            15           30           72
GPU1   15           0            15           72
GPU2   30           15           0            72
GPU3   72           72           72           0
================================= Hops between two GPUs ==================================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            1            1            3
GPU1   1            0            1            3
GPU2   1            1            0            3
GPU3   3            3            3            0
=============================== Link Type between two GPUs ===============================
       GPU0         GPU1         GPU2         GPU3
GPU0   0            XGMI         XGMI         PCIE
GPU1   XGMI         0            XGMI         PCIE
GPU2   XGMI         XGMI         0            PCIE
GPU3   PCIE         PCIE         PCIE         0
======================================= Numa Nodes =======================================
GPU[0]\t\t: (Topology) Numa Node: 0
GPU[0]\t\t: (Topology) Numa Affinity: 0
GPU[1]\t\t: (Topology) Numa Node: 0
GPU[1]\t\t: (Topology) Numa Affinity: 0
GPU[2]\t\t: (Topology) Numa Node: 1
GPU[2]\t\t: (Topology) Numa Affinity: 1
GPU[3]\t\t: (Topology) Numa Node: -1
GPU[3]\t\t: (Topology) Numa Affinity: -1
================================== End of ROCm SMI Log ===================================
"""


def test_rocm_showtopo_ranks_by_weight_not_hops():
    t = parse_topology(ROCM_SHOWTOPO)
    assert t.source_format == "rocm-smi --showtopo"
    assert [d.numa_node for d in t.devices] == [0, 0, 1, None]
    near, far = t.link("GPU0", "GPU1"), t.link("GPU0", "GPU2")
    assert near.hops == far.hops == 1  # rocm-smi says 1 hop for both ...
    assert near.strength > far.strength  # ... but the weight tells them apart
    assert far.strength > t.link("GPU0", "GPU3").strength


def test_amd_smi_new_json_links_layout():
    text = (
        '[{"gpu": 0, "bdf": "0000:0c:00.0", "links": [{"gpu": 1, "bdf": "0000:22:00.0", "weight": 15, '
        '"link_status": "ENABLED", "link_type": "XGMI", "num_hops": 1, "bandwidth": "50000-50000"}]},'
        '{"gpu": 1, "bdf": "0000:22:00.0", '
        '"links": [{"gpu": 0, "weight": 15, "link_type": "XGMI", "num_hops": 1}]}]'
    )
    t = parse_topology(text)
    assert [d.pci_bus_id for d in t.devices] == ["0000:0c:00.0", "0000:22:00.0"]
    assert t.links[0].kind == "XGMI" and t.links[0].weight == 15 and not t.partial
    with pytest.raises(TopologyParseError, match="invalid JSON"):
        parse_topology('[{"gpu": 0, ')


def test_cpulist_and_bus_ids():
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("6,14,22,30") == (6, 14, 22, 30) and parse_cpulist("N/A") == ()
    assert format_cpulist((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    with pytest.raises(ValueError):
        parse_cpulist("3-1")
    assert normalize_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bus_id("00000001:00:00.0") == "0001:00:00.0"


def test_to_json_matches_contract_shape():
    t = parse_topology(capture("nvidia-smi-topo__a100-sxm-8gpu-nv12-2numa.txt"))
    j = t.to_json()
    assert set(j) >= {"devices", "nics", "links"}
    assert {"name", "numa_node", "cpu_affinity"} <= set(j["devices"][0])
    assert j["devices"][0]["cpu_affinity"] == list(range(24))
    assert j["links"][0] == {"a": "GPU0", "b": "GPU1", "kind": "NV12"}
