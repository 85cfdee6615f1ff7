"""GPU samples through NVML (pynvml): utilisation, memory, temperature, power, processes, and NVLink and PCIe
traffic per GPU."""

import time

from .usage import gpu_process

_ALL_LINKS = 0xFFFFFFFF
"""A field value's scopeId for the sum over every NVLink of the GPU."""
_TRAFFIC_FIELDS = (
    # (sample key, pynvml constant, its number in nvml.h, MiB per counted unit): cumulative counters, so a rate
    # is the difference between two samples over their NVML timestamps
    ("nvlink_tx_mib_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138, 1.0 / 1024),  # KiB, payload only
    ("nvlink_rx_mib_s", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139, 1.0 / 1024),
    ("pcie_tx_mib_s", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197, 1.0 / (1 << 20)),  # bytes (recent drivers only)
    ("pcie_rx_mib_s", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198, 1.0 / (1 << 20)),
)
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""nvmlValueType_t -> the member of the value union that holds it."""


class NvmlSampler(object):
    """Device metrics through NVML: one init, then a few cheap calls per device per sample.

    Besides utilization (kernels and memory bandwidth), memory, temperature and power, each GPU's NVLink and PCIe
    traffic (MiB/s sent and received since the last sample) from NVML's cumulative counters, all asked in one
    nvmlDeviceGetFieldValues call per GPU. A counter this GPU, driver or pynvml does not have is left out of the
    sample (unknown, never 0). nvmlDeviceGetPcieThroughput is not used: it samples for 20 ms per call inside the
    driver, which on an 8-GPU node would make every sample a third of a second slower."""

    source = "nvml"

    def __init__(self, pynvml):
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self.handles.append((i, h, self._call(pynvml.nvmlDeviceGetUUID, h)))
        self.fields = [(key, getattr(pynvml, name, number), unit) for key, name, number, unit in _TRAFFIC_FIELDS]
        self.fields_ok = hasattr(pynvml, "nvmlDeviceGetFieldValues")
        self.counters = {}  # (GPU index, key) -> (timestamp in s, counter) of the last sample

    @staticmethod
    def _call(fn, *args):
        try:
            v = fn(*args)
        except Exception:  # an unsupported field is N/A, never a failed sample
            return None
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v

    def sample(self):
        nv = self.nvml
        devices, procs = [], []
        for i, h, uuid in self.handles:
            util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
            temp = self._call(nv.nvmlDeviceGetTemperature, h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            power = self._call(nv.nvmlDeviceGetPowerUsage, h)
            dev = {
                "index": i, "uuid": uuid,
                "utilization_gpu": float(util.gpu) if util is not None else None,
                "memory_used_mib": mem.used // (1 << 20) if mem is not None else None,
                "memory_total_mib": mem.total // (1 << 20) if mem is not None else None,
                "temperature_c": float(temp) if temp is not None else None,
                "power_w": power / 1000.0 if power is not None else None,
                "utilization_memory": float(util.memory)
                if util is not None and getattr(util, "memory", None) is not None else None,
            }
            dev.update(self._traffic(i, h))
            devices.append(dev)
            seen = set()
            for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(nv, fn_name, None)
                for p in (self._call(fn, h) if fn else None) or []:
                    if p.pid in seen:
                        continue
                    seen.add(p.pid)
                    used = getattr(p, "usedGpuMemory", None)
                    procs.append(gpu_process(p.pid, uuid, used // (1 << 20) if isinstance(used, int) else None))
        return devices, procs, None

    def _traffic(self, i, h):
        """{key: MiB/s} of this GPU's interconnect counters that NVML gives, since the last sample."""
        if not self.fields_ok:
            return {}
        nv = self.nvml
        ids = [(number, _ALL_LINKS) if key.startswith("nvlink") else number for key, number, _ in self.fields]
        try:
            values = nv.nvmlDeviceGetFieldValues(h, ids)
        except Exception:  # an old driver without field values: ask no more
            self.fields_ok = False
            return {}
        out = {}
        now = time.monotonic()
        for k, (key, _, unit) in enumerate(self.fields):
            v = values[k]  # one value per field asked, in order (no zip(strict=): Python 3.8)
            if getattr(v, "nvmlReturn", 1) != 0:  # NVML_SUCCESS; anything else: not on this GPU
                continue
            member = _VALUE_MEMBER.get(getattr(v, "valueType", 3), "ullVal")
            count = getattr(getattr(v, "value", None), member, None)
            if not isinstance(count, (int, float)):
                continue
            stamp = v.timestamp / 1e6 if getattr(v, "timestamp", 0) else now
            before = self.counters.get((i, key))
            self.counters[(i, key)] = (stamp, count)
            if before is not None and stamp > before[0] and count >= before[1]:  # a reset is no reading
                out[key] = round((count - before[1]) * unit / (stamp - before[0]), 1)
        return out

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass
