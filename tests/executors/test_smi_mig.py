"""Without NVML, the node helper's nvidia-smi fallback still sees MIG (issue 15, item 5): a GPU in MIG mode
(`mig.mode.current` Enabled) becomes its instances from `nvidia-smi -L`, never a whole GPU. A real nvidia-smi-shaped
executable on PATH answers in the layouts of R470+ drivers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hsched.controller.fleet import _real_devices
from hsched.node import probe

QUERY = ("0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920, 0, 0, 35, "
         "60.1, Enabled\n"
         "1, GPU-bbbbbbbb-1111-2222-3333-444444444444, NVIDIA A100-SXM4-80GB, 00000000:0F:00.0, 81920, 10, 3, 36, "
         "61.0, Disabled\n")
LISTING = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaaaaaa-1111-2222-3333-444444444444)
  MIG 3g.40gb     Device  0: (UUID: MIG-11111111-aaaa-bbbb-cccc-000000000000)
  MIG 1g.10gb     Device  1: (UUID: MIG-22222222-aaaa-bbbb-cccc-000000000000)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbbbbbb-1111-2222-3333-444444444444)
"""


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\nimport sys\na = sys.argv[1:]\n"
                   f"if a and a[0].startswith('--query-gpu='):\n    sys.stdout.write({QUERY!r})\n"
                   f"elif a == ['-L']:\n    sys.stdout.write({LISTING!r})\n"
                   "else:\n    sys.exit(9)\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.mark.slow
def test_the_fallback_lists_a_mig_gpus_instances(smi: None) -> None:
    gpus = probe.probe_nvidia_smi()
    assert gpus is not None and gpus["source"] == "nvidia-smi"
    d0, d1 = gpus["devices"]
    assert d0["mig_mode_current"] is True and d1["mig_mode_current"] is False
    assert [m["profile"] for m in d0["mig_devices"]] == ["3g.40gb", "1g.10gb"]
    devices, _links = _real_devices({"gpus": gpus})
    assert [d.uuid for d in devices] == ["MIG-11111111-aaaa-bbbb-cccc-000000000000",
                                         "MIG-22222222-aaaa-bbbb-cccc-000000000000",
                                         "GPU-bbbbbbbb-1111-2222-3333-444444444444"]
    assert devices[0].model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb" and devices[0].mig_profile == "3g.40gb"
    assert devices[0].memory_total_mib == 40 * 1000**3 // (1 << 20)  # the profile's 40 GB
    assert devices[1].index == 101 and devices[0].mig_parent == "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def test_the_listing_is_read_by_gpu() -> None:
    assert probe.mig_listing(LISTING) == {0: [
        {"uuid": "MIG-11111111-aaaa-bbbb-cccc-000000000000", "profile": "3g.40gb", "name": "MIG 3g.40gb"},
        {"uuid": "MIG-22222222-aaaa-bbbb-cccc-000000000000", "profile": "1g.10gb", "name": "MIG 1g.10gb"}]}
