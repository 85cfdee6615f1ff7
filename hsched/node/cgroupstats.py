"""What a run used of its node, read where the kernel keeps it: the run's cgroup (the node helper makes one per
run, hsched/nodehelper.py make_cgroups), else the process accounting of the run's processes.

Stdlib only and Python >= 3.8: this file is shipped to nodes beside nodehelper.py (executors/ssh.py's bundle)
and loaded from the helper's own folder.

A reading is {"cpu_s", "memory_peak_mib", "memory_mib", "source"} (a figure the node cannot give is None):

- cpu_s: CPU-seconds the run's processes used since it started, user and system, every process it ever had
  (cgroup v2 `cpu.stat` usage_usec, which cgroup v2 keeps without the cpu controller; v1 `cpuacct.usage`);
- memory_peak_mib: the most memory the run held at once (v2 `memory.peak`, Linux >= 5.19; v1
  `memory.max_usage_in_bytes`; else the highest `memory.current` this reader saw). A cgroup charges page cache
  too, as Slurm's cgroup accounting does: a job that streams files may read higher than its resident memory;
- memory_mib: what it holds now;
- source: "cgroup" or "processes". Without a cgroup (HSCHED_CONTAINMENT=pgroup, a machine that gives none),
  the run's processes are read from /proc while it runs (the wrapper's descendants: their CPU time, children
  they reaped included, and their summed resident memory), and at its end from the wrapper's own
  getrusage(RUSAGE_CHILDREN): every process the wrapper reaped, and the largest resident size of any one of
  them (Linux keeps no sum), so a floor.

The watch stream (nodehelper.watch) sends one reading per active run every few samples (`Sampler`); the
wrapper reads once more when every process of the run is gone, before it removes the cgroup (`final`), into
the run's exit record.
"""

import json
import os
import time

MIB = float(1 << 20)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text):
    try:
        return int((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def _keyed(text, key):
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return _int(v)
    return None


def _mib(n):
    return None if n is None else round(n / MIB, 1)


def from_cgroups(cgroups):
    """A reading of the run's cgroups ({"v2", "memory", "cpu"}: folders, as handle.json names them), or None when
    none of them is there (gone, or never made)."""
    cgroups = cgroups or {}
    v2, mem1, cpu1 = cgroups.get("v2"), cgroups.get("memory"), cgroups.get("cpu")
    cpu_s = peak = current = None
    if v2 and os.path.isdir(v2):
        usec = _keyed(_read(os.path.join(v2, "cpu.stat")), "usage_usec")
        cpu_s = None if usec is None else usec / 1e6
        peak = _int(_read(os.path.join(v2, "memory.peak")))
        current = _int(_read(os.path.join(v2, "memory.current")))
    if cpu_s is None and cpu1 and os.path.isdir(cpu1):
        ns = _int(_read(os.path.join(cpu1, "cpuacct.usage")))  # cpu and cpuacct mounted together
        cpu_s = None if ns is None else ns / 1e9
    if (peak is None or current is None) and mem1 and os.path.isdir(mem1):
        if peak is None:
            peak = _int(_read(os.path.join(mem1, "memory.max_usage_in_bytes")))
        if current is None:
            current = _int(_read(os.path.join(mem1, "memory.usage_in_bytes")))
    if cpu_s is None and peak is None and current is None:
        return None
    return {"cpu_s": None if cpu_s is None else round(cpu_s, 3), "memory_peak_mib": _mib(peak),
            "memory_mib": _mib(current), "source": "cgroup"}


def _stat(pid):
    """(ppid, utime + stime + cutime + cstime ticks, rss pages) of a process from /proc, or None."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return int(rest[1]), sum(int(x) for x in rest[11:15]), int(rest[21])
    except (IndexError, ValueError):
        return None


def from_processes(wrapper_pid):
    """A reading of the run's processes while it runs: the wrapper's descendants (their CPU time, with what they
    reaped of theirs, and their summed resident memory) plus what the wrapper itself reaped. None: no such
    wrapper."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st
    me = table.get(wrapper_pid)
    if me is None:
        return None
    raw = _read(f"/proc/{wrapper_pid}/stat") or ""
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        ticks = int(rest[13]) + int(rest[14])  # the wrapper's cutime + cstime: the run's processes it reaped
    except (IndexError, ValueError):
        ticks = 0
    children = {}
    for pid, (ppid, _t, _r) in table.items():
        children.setdefault(ppid, []).append(pid)
    rss = 0
    todo = list(children.get(wrapper_pid, ()))
    while todo:
        pid = todo.pop()
        _ppid, t, r = table[pid]
        ticks += t
        rss += r
        todo.extend(children.get(pid, ()))
    return {"cpu_s": round(ticks / float(hz), 3), "memory_peak_mib": None, "memory_mib": _mib(rss * page),
            "source": "processes"}


def from_rusage():
    """The wrapper's children, once every process of the run is gone: CPU time of every process it reaped (and
    what they reaped), and the largest resident size any one of them reached."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "memory_peak_mib": round(ru.ru_maxrss / 1024.0, 1),
            "memory_mib": 0.0, "source": "processes"}


def final(cgroups):
    """The run's last reading, in the wrapper once none of its processes is left and before its cgroups are
    removed: the cgroup's totals, else the wrapper's reaped children's."""
    got = from_cgroups(cgroups)
    if got is not None and got.get("memory_peak_mib") is None:
        # no memory cgroup (a hybrid machine's v2 without the memory controller, and no limit asked): the
        # largest process's peak is still a floor worth saying
        got["memory_peak_mib"] = from_rusage()["memory_peak_mib"]
    reading = got if got is not None else from_rusage()
    reading["t"] = time.time()
    reading["final"] = True
    return reading


def clean(reading):
    """A reading from an exit record as the helper passes it on: numbers only, or None."""
    if not isinstance(reading, dict):
        return None
    out = {}
    for k in ("cpu_s", "memory_peak_mib", "memory_mib", "t"):
        v = reading.get(k)
        out[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0 else None
    out["source"] = reading.get("source") if reading.get("source") in ("cgroup", "processes") else None
    out["final"] = reading.get("final") is True
    return out


class Sampler:
    """One reading per active run, at most every `every_s`; keeps each run's highest `memory_mib` seen, the
    peak where the kernel keeps none. handle.json is this helper's own record of the run (its cgroups, its
    wrapper), read once per run."""

    def __init__(self, every_s):
        self.every_s = max(0.2, every_s)
        self.next_t = 0.0
        self.handles = {}  # run_dir -> handle.json (None: not written yet)
        self.peaks = {}  # run_dir -> highest memory_mib seen

    def due(self):
        now = time.monotonic()
        if now < self.next_t:
            return False
        self.next_t = now + self.every_s
        return True

    def _handle(self, run_dir):
        h = self.handles.get(run_dir)
        if h is None:
            try:
                with open(os.path.join(run_dir, "handle.json")) as f:
                    h = json.load(f)
            except (OSError, ValueError):
                return None
            if not isinstance(h, dict):
                return None
            self.handles[run_dir] = h
        return h

    def read(self, run_dirs):
        """[{run_dir, t, cpu_s, memory_peak_mib, memory_mib, source}] of the runs named (the active ones)."""
        out = []
        for run_dir in run_dirs:
            h = self._handle(run_dir)
            if h is None:
                continue
            try:
                got = from_cgroups(h.get("cgroups")) if h.get("cgroups") else None
                if got is None and isinstance(h.get("pid"), int):
                    got = from_processes(h["pid"])
            except Exception:  # a reading is a figure; it must never stop the stream
                got = None
            if got is None:
                continue
            seen = max(self.peaks.get(run_dir) or 0.0, got.get("memory_mib") or 0.0)
            self.peaks[run_dir] = seen
            if got.get("memory_peak_mib") is None and got.get("memory_mib") is not None:
                got["memory_peak_mib"] = seen
            got["run_dir"] = run_dir
            got["t"] = time.time()
            out.append(got)
        for gone in set(self.handles) - set(run_dirs):
            self.handles.pop(gone, None)
            self.peaks.pop(gone, None)
        return out
