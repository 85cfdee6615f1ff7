"""MIG (issue 15, item 5): a GPU in MIG mode is its instances. NVML's MIG calls (a fake shaped like pynvml's)
give each instance's UUID, name and memory; the controller makes each one a schedulable device named by its
profile, and never hands the GPU out whole; `--gpu-type 1g.10gb` asks for a slice, and only a slice."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_topo_nvml import FakeNVML, h100_fake

from hsched.controller.fleet import _real_devices
from hsched.model import Resources
from hsched.topo import nvml_probe

SLICES = 7


class MigNVML(FakeNVML):
    """The H100 fake with GPU 0 in MIG mode, cut into seven 1g.10gb instances (handles ("mig", gpu, slot))."""

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        return [1, 1] if h == 0 else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return SLICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, k: int) -> Any:
        return ("mig", h, k)

    def nvmlDeviceGetUUID(self, h: Any) -> Any:
        if isinstance(h, tuple):
            return f"MIG-{h[1]}-{h[2]}-5a1b".encode()
        return super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetName(self, h: Any) -> Any:
        if isinstance(h, tuple):
            return b"NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if isinstance(h, tuple):
            return SimpleNamespace(total=9984 << 20, used=0, free=9984 << 20)
        return super().nvmlDeviceGetMemoryInfo(h)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return 7 + h[2]

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        return 0


def mig_fake() -> MigNVML:
    base = h100_fake()
    return MigNVML(base.gpus, base.links, base.ancestors)


def test_nvml_lists_the_instances_with_their_profiles() -> None:
    raw = nvml_probe.probe_nvml(mig_fake(), cpu_count=224)
    d0, d1 = raw["devices"][:2]
    assert d0["mig_mode_current"] is True and d1["mig_devices"] is None
    assert [m["profile"] for m in d0["mig_devices"]] == ["1g.10gb"] * SLICES
    assert d0["mig_devices"][3]["uuid"] == "MIG-0-3-5a1b" and d0["mig_devices"][3]["memory_total"] == 9984 << 20


def _devices() -> tuple[Any, ...]:
    raw = nvml_probe.probe_nvml(mig_fake(), cpu_count=224)
    devices, _links = _real_devices({"gpus": {"source": "nvml", "devices": raw["devices"]}})
    return devices


def test_a_mig_mode_gpu_is_its_instances() -> None:
    devices = _devices()
    migs = [d for d in devices if d.mig_parent]
    whole = [d for d in devices if not d.mig_parent]
    parent = nvml_probe.probe_nvml(mig_fake(), cpu_count=224)["devices"][0]["uuid"]
    assert len(migs) == SLICES and len(whole) == 7 and all(d.uuid != parent for d in devices)
    assert {d.mig_parent for d in migs} == {parent} and migs[0].model == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert migs[0].memory_total_mib == 9984 and migs[0].numa_node == whole[0].numa_node
    assert len({d.index for d in devices}) == len(devices)  # every index (and topology name) its own


def test_a_mig_mode_gpu_without_instances_offers_nothing() -> None:
    """Enabled MIG with no instance made yet: the GPU is not a whole GPU either (a whole-GPU job never gets it)."""
    raw = nvml_probe.probe_nvml(mig_fake(), cpu_count=224)["devices"]
    raw[0] = {**raw[0], "mig_devices": []}
    devices, _links = _real_devices({"gpus": {"source": "nvml", "devices": raw}})
    assert len(devices) == 7 and raw[0]["uuid"] not in {d.uuid for d in devices}


def test_who_may_have_a_slice() -> None:
    mig, full = "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3"
    assert Resources(gpus=1, gpu_types=("1g.10gb",)).matches_model(mig)
    assert not Resources(gpus=1, gpu_types=("1g.10gb",)).matches_model(full)
    assert not Resources(gpus=1).matches_model(mig) and Resources(gpus=1).matches_model(full)
    assert not Resources(gpus=1, gpu_types=("h100",)).matches_model(mig)
    assert not Resources(gpus=1, gpu_types=("2g.20gb",)).matches_model(mig)
