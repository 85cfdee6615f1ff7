"""Issue 32: the NICs as real `ibstat`/`ibv_devinfo` captures print them (tests/fixtures/net, sources in
tests/fixtures/README.md), which GPUs are PCIe-near each NIC from real `nvidia-smi topo -m` captures' NIC columns,
and the node probe's sysfs reading of the same facts."""

from __future__ import annotations

import os
from pathlib import Path

from hsched.model import NicKind
from hsched.node.nics import probe_nics
from hsched.topo.parse_net import nics_near, parse_ibstat, parse_ibv_devinfo
from hsched.topo.parse_nvidia import parse_topo_matrix
from tests.conftest import FIXTURES
from tests.topo.captures import capture, strip_header


def net(name: str) -> str:
    return strip_header((FIXTURES / "net" / name).read_text(encoding="utf-8"))


def test_ibstat_roce_ports() -> None:
    nics = parse_ibstat(net("ibstat__cx6dx-2x100-roce.txt"))
    assert [(x.name, x.kind, x.rate_gbps, x.active) for x in nics] == [
        ("mlx5_0", NicKind.ROCE, 100.0, True), ("mlx5_1", NicKind.ROCE, 100.0, True)]


def test_ibstat_infiniband_in_partial_output() -> None:
    nics = parse_ibstat(net("ibstat__ib-200-partial-ibpanic.txt"))
    assert [(x.name, x.kind, x.rate_gbps, x.active) for x in nics] == [("mlx5_7", NicKind.IB, 200.0, True)]


def test_ibstat_a_port_cut_off_before_its_rate_is_left_out() -> None:
    nics = parse_ibstat(net("ibstat__cx7-roce-200-and-down-truncated.txt"))
    assert [(x.name, x.rate_gbps, x.active) for x in nics] == [("mlx5_0", 200.0, True), ("mlx5_1", 200.0, True)]


def test_ibv_devinfo_states_and_link_layers() -> None:
    nics = parse_ibv_devinfo(net("ibv_devinfo__cx6dx-down-cx7-truncated.txt"))
    assert [(x.name, x.kind, x.active) for x in nics] == [("mlx5_12", NicKind.ROCE, False)]


def test_near_gpus_from_the_nic_columns_of_an_h100_with_11_nics() -> None:
    topo = parse_topo_matrix(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    # the legend's names; NIC0/NIC1 under GPU0/GPU1's switches (PIX/PXB), NIC4/5 and NIC9/10 under no GPU's
    assert nics_near(topo) == {
        "mlx5_0": (0, 1), "mlx5_1": (0, 1), "mlx5_2": (2, 3), "mlx5_3": (2, 3), "mlx5_4": (), "mlx5_5": (),
        "mlx5_6": (4, 5), "mlx5_7": (4, 5), "mlx5_8": (6, 7), "mlx5_10": (), "mlx5_11": ()}


def test_near_gpus_on_an_old_driver_without_a_nic_legend() -> None:
    topo = parse_topo_matrix(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    assert nics_near(topo) == {"mlx5_0": (0, 1), "mlx5_1": (2, 3), "mlx5_2": (4, 5), "mlx5_3": (6, 7)}


def _dev(root: Path, path: str) -> Path:
    d = root / "devices" / path
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_the_probe_reads_nics_and_nearness_from_sysfs(tmp_path: Path) -> None:
    """A sysfs tree as a 2-GPU node has it: an IB HCA under GPU0's PCIe switch, a RoCE port on another root port
    that is down, an Ethernet interface, a bridge (no device: skipped)."""
    sysfs = tmp_path
    gpu0 = _dev(sysfs, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0")
    gpu1 = _dev(sysfs, "pci0000:00/0000:00:03.0/0000:05:00.0")
    hca = _dev(sysfs, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0")
    roce = _dev(sysfs, "pci0000:80/0000:80:01.0/0000:81:00.0")
    eth = _dev(sysfs, "pci0000:00/0000:00:03.0/0000:06:00.0")
    pci = sysfs / "bus" / "pci" / "devices"
    pci.mkdir(parents=True)
    os.symlink(gpu0, pci / "0000:03:00.0")
    os.symlink(gpu1, pci / "0000:05:00.0")
    for name, dev, state, rate, layer, netdev in (
            ("mlx5_0", hca, "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand", "ib0"),
            ("mlx5_1", roce, "1: DOWN", "100 Gb/sec (2X HDR)", "Ethernet", "ens2f0np0")):
        port = sysfs / "class" / "infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "rate").write_text(rate + "\n")
        (port / "link_layer").write_text(layer + "\n")
        os.symlink(dev, sysfs / "class" / "infiniband" / name / "device")
        (dev / "net" / netdev).mkdir(parents=True)
    for iface, dev, speed, state in (("eno1", eth, "25000", "up"), ("docker0", None, "-1", "up")):
        base = sysfs / "class" / "net" / iface
        base.mkdir(parents=True)
        (base / "type").write_text("1\n")
        (base / "speed").write_text(speed + "\n")
        (base / "operstate").write_text(state + "\n")
        if dev is not None:
            os.symlink(dev, base / "device")
    gpus = [{"index": 0, "pci_bus_id": "00000000:03:00.0"}, {"index": 1, "pci_bus_id": "00000000:05:00.0"}]
    got = probe_nics(gpus, sys_root=str(sysfs))
    assert got == [
        {"name": "mlx5_0", "kind": "ib", "rate_gbps": 400.0, "active": True, "netdev": "ib0", "near": [0]},
        {"name": "mlx5_1", "kind": "roce", "rate_gbps": 100.0, "active": False, "netdev": "ens2f0np0", "near": []},
        {"name": "eno1", "kind": "ethernet", "rate_gbps": 25.0, "active": True, "netdev": "eno1", "near": [1]},
    ]
