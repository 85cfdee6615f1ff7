"""The node helper's GPU samplers give what run profiles need (hsched.learn.profiles): memory-bandwidth utilization
from NVML and nvidia-smi, and NVLink and PCIe traffic as rates between two of NVML's cumulative counters; a
counter a GPU or driver lacks is left out of the sample (unknown), never 0. In-process, with a fake pynvml."""

from __future__ import annotations

import types
from typing import Any

from hsched.node import nvmlsampler, smisampler


class _Value:
    def __init__(self, ret: int, count: int, stamp_us: int, value_type: int = 3) -> None:
        self.nvmlReturn = ret
        self.valueType = value_type
        self.timestamp = stamp_us
        member = {1: "uiVal", 3: "ullVal"}[value_type]
        self.value = types.SimpleNamespace(**{member: count})


def fake_nvml(*, field_values: bool = True) -> Any:
    """Two GPUs: GPU 0 has NVLink and PCIe counters, GPU 1 has PCIe counters only (no NVLink)."""
    state = {"t": 0}
    nv: Any = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=90, memory=40 + h),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=1 << 30, total=80 << 30),
        nvmlDeviceGetTemperature=lambda h, k: 50, nvmlDeviceGetPowerUsage=lambda h: 300_000,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
    )
    asked: list[list[Any]] = []

    def get_fields(h: int, ids: list[Any]) -> list[_Value]:
        asked.append(ids)
        t = state["t"]
        stamp = 1_000_000 + t * 2_000_000  # NVML's clock: 2 s between samples
        out = []
        for f in ids:
            fid = f[0] if isinstance(f, tuple) else f
            if fid in (138, 139):  # NVLink KiB: 10 GiB per 2 s sent, 20 GiB received on GPU 0
                per = (10 if fid == 138 else 20) * (1 << 20)
                out.append(_Value(0 if h == 0 else 3, per * t, stamp))
            else:  # PCIe bytes: 1 GiB per 2 s each way, as an unsigned int on GPU 1
                out.append(_Value(0, (1 << 30) * t, stamp, 3 if h == 0 else 1))
        return out

    if field_values:
        nv.nvmlDeviceGetFieldValues = get_fields
    nv.asked = asked
    nv.state = state
    return nv


def test_nvml_gives_memory_bandwidth_and_link_traffic_from_the_second_sample_on() -> None:
    nv = fake_nvml()
    s = nvmlsampler.NvmlSampler(nv)
    first, _, err = s.sample()
    assert err is None and [d["utilization_memory"] for d in first] == [40.0, 41.0]
    assert not any(k.endswith("_mib_s") for d in first for k in d)  # one counter reading is no rate
    nv.state["t"] = 1
    d0, d1 = s.sample()[0]
    assert (d0["nvlink_tx_mib_s"], d0["nvlink_rx_mib_s"]) == (5 * 1024.0, 10 * 1024.0)
    assert (d0["pcie_tx_mib_s"], d0["pcie_rx_mib_s"]) == (512.0, 512.0)
    assert "nvlink_tx_mib_s" not in d1 and d1["pcie_rx_mib_s"] == 512.0  # no NVLink there: unknown, not 0
    # NVLink asked summed over every link; one call per GPU per sample
    assert nv.asked[0][:2] == [(138, 0xFFFFFFFF), (139, 0xFFFFFFFF)] and len(nv.asked) == 4


def test_a_counter_that_went_back_is_no_reading() -> None:
    nv = fake_nvml()
    s = nvmlsampler.NvmlSampler(nv)
    nv.state["t"] = 5
    s.sample()
    nv.state["t"] = 6
    assert s.sample()[0][0]["pcie_tx_mib_s"] == 512.0
    nv.state["t"] = 1  # a driver reload starts the counters again (and its clock)
    assert "pcie_tx_mib_s" not in s.sample()[0][0]


def test_without_field_values_nvml_gives_no_traffic() -> None:
    s = nvmlsampler.NvmlSampler(fake_nvml(field_values=False))
    devices = s.sample()[0] + s.sample()[0]
    assert all(d["utilization_memory"] is not None for d in devices)
    assert not any(k.endswith("_mib_s") for d in devices for k in d)


def test_a_driver_without_field_values_is_asked_once() -> None:
    nv = fake_nvml()
    calls = []

    def broken(h: int, ids: list[Any]) -> list[Any]:
        calls.append(h)
        raise RuntimeError("Function Not Found")

    nv.nvmlDeviceGetFieldValues = broken
    s = nvmlsampler.NvmlSampler(nv)
    s.sample()
    s.sample()
    assert calls == [0]


def test_nvidia_smi_reads_memory_bandwidth_when_it_gives_it() -> None:
    assert smisampler.SMI_GPU.endswith(",utilization.memory")
    s = smisampler.SmiSampler.__new__(smisampler.SmiSampler)
    s.lock, s.latest, s.stream = smisampler.threading.Lock(), {}, None
    s.first = smisampler.threading.Event()
    proc = types.SimpleNamespace(stdout=[b"0, GPU-a, 37, 1234, 81559, 45, 123.45, 61\n",
                                         b"1, GPU-b, 5, 10, 81559, 40, 60.0, [N/A]\n",
                                         b"2, GPU-c, 5, 10, 81559, 40, 60.0\n"])  # an older nvidia-smi's line
    s._read_gpus(proc)
    assert [s.latest[i]["utilization_memory"] for i in range(3)] == [61.0, None, None]
    assert s.latest[0]["utilization_gpu"] == 37.0 and s.latest[0]["power_w"] == 123.45
