"""`watch`: one long-lived monitoring stream per node (one JSON sample per interval: host CPU and memory, GPUs,
their processes, the runs' progress) instead of a new process and a new nvidia-smi every second."""

import json
import os
import signal
import sys
import threading
import time

from . import cgroupstats
from .children import kill_children
from .progress import ProgressReader, active_runs
from .records import boot_id, read_text
from .samplers import gpu_sampler
from .usage import ProcessUsage


def _cpu_times():
    """(busy, total) jiffies over all CPUs from the first line of /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    try:
        vals = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
    except ValueError:
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals)
    return total - idle, total


def _memory():
    info = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            try:
                info[key] = int(rest.split()[0]) // 1024
            except (IndexError, ValueError):
                pass
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    used = total - avail if total is not None and avail is not None else None
    return {"total_mib": total, "available_mib": avail, "used_mib": used}


class _Stop(Exception):
    """SIGTERM or SIGHUP: the watch is to end now (and take its nvidia-smi along)."""


def _stop_watch(_signum, _frame):
    raise _Stop()


def watch(req):
    """Stream one JSON line per interval until the reader goes away (or `count` samples were sent).

    Request: {"interval_s": 1.0, "count": null, "gpu_timeout_s": 10, "simulate": {"uuids": [...],
    "memory_mib": N} | null}. A sample: {"seq", "t", "boot_id", "cpu": {"util", "count", "loadavg"},
    "memory": {...}, "gpus": {"source", "devices": [...]}, "gpu_error": null or why the GPU numbers are
    missing or old (a hung NVML or nvidia-smi), "processes": [{"pid", "uuid", "used_memory_mib", "name",
    "run_dir", "user", "command", "cpu_percent", "rss_mib"}] or null where the GPU tools cannot list them per GPU
    (an AMD node with rocm-smi only), and "processes_error": why, or null}
    (cpu_percent: since the last sample, null
    in a process's first), and every `progress_every_s` (5 intervals) "progress": [{"run_dir", "step", "total",
    "samples", "loss", "t", "reports"}]: each active run's last report since the previous look. Every
    nvidia-smi it starts ends with it: on SIGTERM or SIGHUP, when the reader goes, when its parent goes, and
    (PR_SET_PDEATHSIG) when it is killed.
    """
    interval = max(0.05, float(req.get("interval_s") or 1.0))
    count = req.get("count")
    stall_limit = max(30.0, 10 * interval)
    state = {"writing_since": None, "gpus": None}
    parent = os.getppid()

    def leave():
        g = state["gpus"]
        if g is not None:
            g.close()
        kill_children()
        os._exit(0)

    def watchdog():
        # a cut-off network leaves sshd's socket open and our write blocked forever: give up instead
        while True:
            time.sleep(1.0)
            since = state["writing_since"]
            if since is not None and time.monotonic() - since > stall_limit:
                leave()
            if os.getppid() != parent:  # the ssh session (or process) that started us is gone
                leave()

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _stop_watch)
    wd = threading.Thread(target=watchdog)
    wd.daemon = True
    wd.start()
    seq = 0
    try:
        gpus = state["gpus"] = gpu_sampler(req, interval)
        bid = boot_id()
        ncpu = os.cpu_count()
        prev = _cpu_times()
        usage = ProcessUsage()
        # progress every fifth sample (5 s at the controller's usual second): a speed needs no finer grain
        progress = ProgressReader(float(req.get("progress_every_s") or 5 * interval))
        # each active run's cgroup CPU and memory as often (hsched eff; hsched/node/cgroupstats.py)
        run_usage = cgroupstats.Sampler(float(req.get("usage_every_s") or 5 * interval))
        next_t = time.monotonic()
        out = sys.stdout
        while count is None or seq < int(count):
            now = time.monotonic()
            if next_t > now:
                time.sleep(next_t - now)
            cur = _cpu_times()
            util = None
            if prev is not None and cur is not None and cur[1] > prev[1]:
                util = round(100.0 * (cur[0] - prev[0]) / (cur[1] - prev[1]), 1)
            prev = cur
            devices, procs, gpu_error = gpus.sample()
            reports = progress.read() if progress.due() else []
            sample = {
                "seq": seq, "t": time.time(), "boot_id": bid,
                "cpu": {"util": util, "count": ncpu,
                        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
                "memory": _memory(),
                "gpus": {"source": gpus.source, "devices": devices},
                "gpu_error": gpu_error,
                # None where the sampler cannot list GPU processes: "none listed", not "none there"
                "processes": usage.annotate(procs) if procs is not None and getattr(gpus, "lists_processes", True)
                else None,
                # why an AMD node's processes are None (amdprocs.py): its tools cannot say which GPU
                "processes_error": getattr(getattr(gpus, "inner", gpus), "processes_error", None),
            }
            if reports:
                sample["progress"] = reports
            if run_usage.due():
                sample["run_usage"] = run_usage.read(active_runs())
            state["writing_since"] = time.monotonic()
            out.write(json.dumps(sample) + "\n")
            out.flush()
            state["writing_since"] = None
            seq += 1
            next_t += interval
            now = time.monotonic()
            if next_t < now:  # a slow sample or a slow reader: skip the missed ticks rather than bunch up
                next_t += ((now - next_t) // interval + 1) * interval
    except (OSError, _Stop):
        # the reader closed the channel (that is how a watch ends), or we were told to stop: nobody is left
        # to read a reply
        leave()
    finally:
        g = state["gpus"]
        if g is not None:
            g.close()
        kill_children()
    return {"samples": seq}
