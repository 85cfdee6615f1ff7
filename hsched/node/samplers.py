"""The GPU sampler a watch uses: NVML in a thread with a time limit, else nvidia-smi, else AMD's amd-smi or
rocm-smi, else a simulated node's numbers (tests) or none."""

import shutil
import threading
import time

from .amd import amd_tools, probe_amd
from .amdprocs import amd_gpu_processes
from .nvmlsampler import NvmlSampler
from .smisampler import SmiSampler


class _Bounded(object):
    """A sampler that may block (NVML on a sick GPU) asked from a worker thread of its own: a sample that
    does not come within timeout_s is the last one with an error, and no second one is asked for until the
    first returns, so a hung driver costs one thread and a stream that goes on, never a pile of threads."""

    def __init__(self, inner, timeout_s):
        self.inner = inner
        self.source = inner.source
        self.lists_processes = getattr(inner, "lists_processes", True)
        self.timeout_s = timeout_s
        self.cv = threading.Condition()
        self.asked = self.answered = 0
        self.since = 0.0
        self.closed = False
        self.result = ([], [], None)
        t = threading.Thread(target=self._work)
        t.daemon = True
        t.start()

    def _work(self):
        while True:
            with self.cv:
                while self.asked == self.answered and not self.closed:
                    self.cv.wait()
                if self.closed:
                    return
            try:
                result = self.inner.sample()
            except Exception as e:
                result = (self.result[0], self.result[1], "%s: %s" % (type(e).__name__, e))
            with self.cv:
                self.result = result
                self.answered = self.asked
                self.cv.notify_all()

    def sample(self):
        with self.cv:
            if self.asked == self.answered:
                self.asked += 1
                self.since = time.monotonic()
                self.cv.notify_all()
            deadline = self.since + self.timeout_s
            while self.asked != self.answered and time.monotonic() < deadline:
                self.cv.wait(max(0.0, deadline - time.monotonic()))
            if self.asked == self.answered:
                return self.result
            devices, procs, _ = self.result
            return devices, procs, "%s has not answered for %.0f s" % (self.source, time.monotonic() - self.since)

    def close(self):
        with self.cv:
            busy = self.asked != self.answered
            self.closed = True
            self.cv.notify_all()
        if not busy:  # shutting down a driver that hangs would hang us too
            self.inner.close()


class _SimSampler(object):
    """Simulated devices: idle, nothing running on them (their jobs are ordinary processes)."""

    source = "simulated"  # type: str | None

    def __init__(self, sim):
        self.devices = [{"index": i, "uuid": u, "utilization_gpu": 0.0, "memory_used_mib": 0,
                         "memory_total_mib": sim.get("memory_mib"), "temperature_c": None, "power_w": None}
                        for i, u in enumerate(sim.get("uuids") or [])]

    def sample(self):
        return [dict(d) for d in self.devices], [], None

    def close(self):
        pass


class _NoGpuSampler(_SimSampler):
    """No GPU numbers: none here, or (with `error`) a driver that did not even answer its initialisation."""

    def __init__(self, source=None, error=None):
        self.devices = []
        self.source = source
        self.error = error

    def sample(self):
        return [], [], self.error


class AmdSampler(object):
    """AMD GPUs' numbers: amd-smi (static and metric) or rocm-smi asked once per sample, without the topology,
    and their processes (amdprocs.py). Where the tools cannot say which GPU a process is on, the sample's
    processes are None ("not listed"), never [] ("none there"), and `processes_error` says why (the GPUs'
    numbers themselves are fine: `gpu_error` stays None)."""

    processes_error = None

    def __init__(self, timeout_s):
        self.timeout_s = timeout_s
        self.source = amd_tools()[0]

    def sample(self):
        found = probe_amd(self.timeout_s, topology=False)
        if found is None or not found["devices"]:
            return [], [], (found or {}).get("error") or "%s found no GPU" % self.source
        keys = ("index", "uuid", "utilization_gpu", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w")
        procs, self.processes_error = amd_gpu_processes(found["devices"], self.timeout_s)
        return [dict((k, d.get(k)) for k in keys) for d in found["devices"]], procs, None

    def close(self):
        pass


def gpu_sampler(req, interval_s):
    if req.get("simulate") is not None:
        return _SimSampler(req["simulate"])
    timeout_s = max(0.1, float(req.get("gpu_timeout_s") or 10.0))
    # a sample must come well before the reader calls the stream stale (3 intervals, at least 5 s)
    sample_s = min(timeout_s, max(1.0, 2 * interval_s))
    try:
        import pynvml
    except Exception:  # no pynvml: nvidia-smi
        pynvml = None
    if pynvml is not None:
        made = {}

        def init():
            try:
                made["sampler"] = NvmlSampler(pynvml)
            except Exception:  # no driver: nvidia-smi, as without pynvml
                pass

        t = threading.Thread(target=init)
        t.daemon = True
        t.start()
        t.join(sample_s)
        if "sampler" in made:
            return _Bounded(made["sampler"], sample_s)
        if t.is_alive():
            return _NoGpuSampler("nvml", "NVML did not initialise within %g s" % sample_s)
    exe = shutil.which("nvidia-smi")
    if exe:
        return SmiSampler(exe, interval_s, timeout_s)
    if amd_tools():
        return _Bounded(AmdSampler(sample_s), sample_s)
    return _NoGpuSampler()
