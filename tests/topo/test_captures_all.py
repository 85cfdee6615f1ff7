"""Every captured tool output in tests/fixtures/topo and every written one in tests/fixtures/topo-written is read
(issue 19): devices, or the host facts it holds; never a refusal of a real capture, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.topo.inventory import HostNuma, Inventory, NvlinkStatus, P2PMatrix
from hsched.topo.parse import detect_format, parse_capture, read_capture
from hsched.topo.topology import Topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = sorted((FIXTURES / "topo").glob("*.txt"))
# the kinds shared/topo has no capture of, written in their documented layout (tests/fixtures/README.md); the
# `mig -lgi` one is refused on purpose (test_captures_kinds.py)
WRITTEN = sorted(p for p in (FIXTURES / "topo-written").glob("*.txt") if "mig-lgi" not in p.name)


@pytest.mark.parametrize("path", CAPTURES + WRITTEN, ids=lambda p: p.name)
def test_every_capture_is_read(path: Path) -> None:
    result = read_capture(path)
    if isinstance(result, Topology):
        assert result.devices
    elif isinstance(result, Inventory):
        assert result.gpus
    else:
        assert isinstance(result, HostNuma | P2PMatrix | NvlinkStatus)


def test_captures_with_a_header_and_json_body_are_read() -> None:
    # the capture's own "# source: ..." lines come before the JSON document; both were refused
    topo = read_capture(next(p for p in CAPTURES if p.name.startswith("amd-smi-topology-json")))
    assert isinstance(topo, Topology) and len(topo.devices) == 2
    vram = read_capture(next(p for p in CAPTURES if p.name.startswith("amd-smi-static-json-vram")))
    assert isinstance(vram, Inventory) and vram.gpus[0].memory_total_mib == 196592


NVIDIA_SMI_L = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-e91edf3b-b297-37c1-a2a7-7601c98b2a19)
  MIG 3g.20gb     Device  0: (UUID: MIG-2b3aa0c1-2b4b-5d2b-9a5b-8ad1d9b1b0a1)
  MIG 2g.10gb     Device  1: (UUID: MIG-7f1f3e0b-0c3a-5b6e-8d1c-1e2f3a4b5c6d)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d)
"""


def test_nvidia_smi_L_with_mig_devices() -> None:
    assert detect_format(NVIDIA_SMI_L) == "nvidia-smi -L"
    inv = parse_capture(NVIDIA_SMI_L, "gpus.txt")
    assert isinstance(inv, Inventory)
    # each MIG device under its GPU, numbered as the controller numbers them (test_captures_kinds.py has more)
    assert [(g.index, g.name, g.uuid, g.mig_current, g.mig_parent) for g in inv.gpus] == [
        (0, "NVIDIA A100-SXM4-40GB", "GPU-e91edf3b-b297-37c1-a2a7-7601c98b2a19", True, None),
        (100, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-2b3aa0c1-2b4b-5d2b-9a5b-8ad1d9b1b0a1", None, 0),
        (101, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", "MIG-7f1f3e0b-0c3a-5b6e-8d1c-1e2f3a4b5c6d", None, 0),
        (1, "NVIDIA A100-SXM4-40GB", "GPU-0d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d", None, None),
    ]
