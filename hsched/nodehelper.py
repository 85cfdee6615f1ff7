#!/usr/bin/env python3
"""hsched's node helper: probe a machine, launch detached runs, report on them and signal them.

Stdlib only and Python >= 3.8: the controller runs this one file on every node (as a subprocess here, over
SSH elsewhere), so nothing but python3 needs to be installed there. Requests are JSON on stdin, replies
JSON on stdout; a failure is a JSON `{"error": "..."}` and exit status 1.

    probe           machine facts: CPUs, memory, NUMA nodes, NVIDIA GPUs (NVML, else nvidia-smi), boot id
    launch          start a run detached (new session); idempotent per run folder
    status          for each run: running / exited (with exit code) / lost / not_started
    signal          send a signal to a run's process group (only if the run is still the same process)
    read            bytes of a file from an offset (a run's log), base64
    newest          the newest modification time under a folder (a checkpoint's age)
    watch           a monitoring stream: one JSON sample per interval
    serve           many requests on one pair of pipes, JSON lines with ids (what executors use)
    _wrap RUN_DIR   (internal) the small wrapper that owns a run and writes its exit code atomically

A run is found again by pid + process start time + boot id, which rules out pid reuse and reboots. The
wrapper runs the job in a session of its own, so signals sent to the job's process group leave the
wrapper alive to record how the job ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HELPER_VERSION = 1
RUN_MARKER = "HSCHED_RUN_DIR"
"""Every process of a run inherits this variable; it finds processes that left the process group."""


# ---------------------------------------------------------------------------------------------- basics


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def proc_start_ticks(pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None if no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = data[data.rfind(")") + 2:].split()
    try:
        if rest[0] == "Z":  # a zombie has ended; its parent just has not reaped it yet
            return None
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def write_json_atomic(path, obj):
    """Write, fsync, rename, fsync the folder: a reader sees the old file or the whole new one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------- probe


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def parse_cpulist(text):
    cpus = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def numa_nodes():
    base = "/sys/devices/system/node"
    out = []
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return out
    for n in names:
        mem_kib = None
        meminfo = _read(os.path.join(base, n, "meminfo")) or ""
        for line in meminfo.splitlines():
            if "MemTotal:" in line:
                try:
                    mem_kib = int(line.split("MemTotal:")[1].split()[0])
                except (IndexError, ValueError):
                    pass
        out.append({
            "id": int(n[4:]),
            "cpus": parse_cpulist(_read(os.path.join(base, n, "cpulist"))),
            "memory_mib": mem_kib // 1024 if mem_kib else None,
        })
    return out


def memory_total_mib():
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def pci_numa_node(bus_id):
    """NUMA node of a PCI device from sysfs ('00000000:1B:00.0' -> /sys/bus/pci/devices/0000:1b:00.0)."""
    if not bus_id:
        return None
    bid = bus_id.lower()
    if len(bid.split(":")[0]) == 8:
        bid = bid[4:]
    val = _read("/sys/bus/pci/devices/%s/numa_node" % bid)
    try:
        n = int(val) if val is not None else None
    except ValueError:
        return None
    return n if n is not None and n >= 0 else None


def probe_nvml():
    try:
        import pynvml
    except Exception:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "topo"), here]
    for c in candidates:
        if os.path.exists(os.path.join(c, "nvml_probe.py")) and c not in sys.path:
            sys.path.insert(0, c)
    try:
        import nvml_probe  # the sibling module, also stdlib-only
    except Exception:
        nvml_probe = None
    try:
        if nvml_probe is not None:
            raw = nvml_probe.probe_nvml(pynvml)
            raw["source"] = "nvml"
            for dev in raw.get("devices", []):
                aff = dev.get("numa_affinity") or []
                if dev.get("numa_node") is None:
                    dev["numa_node"] = aff[0] if len(aff) == 1 else pci_numa_node(dev.get("pci_bus_id"))
            return raw
        return None
    except Exception as e:  # no driver, no GPU: NVML raises on init
        return {"error": str(e), "devices": []}


_QUERY = "index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw"


def probe_nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=" + _QUERY, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e), "devices": []}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[:500], "devices": []}

    def num(v, cast=float):
        v = v.strip()
        try:
            return cast(float(v)) if cast is int else cast(v)
        except ValueError:
            return None

    devices = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 9:
            continue
        devices.append({
            "index": num(f[0], int), "uuid": f[1], "name": f[2], "pci_bus_id": f[3],
            "memory_total_mib": num(f[4], int), "memory_used_mib": num(f[5], int),
            "utilization_gpu": num(f[6]), "temperature_c": num(f[7]), "power_w": num(f[8]),
            "numa_node": pci_numa_node(f[3]),
        })
    topo = None
    try:
        t = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
        if t.returncode == 0:
            topo = t.stdout
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"source": "nvidia-smi", "devices": devices, "topo_matrix": topo}


def probe(_req):
    import platform
    import socket

    gpus = probe_nvml()
    if not gpus or not gpus.get("devices"):
        smi = probe_nvidia_smi()
        if smi is not None and (smi.get("devices") or not gpus):
            gpus = smi
    return {
        "helper_version": HELPER_VERSION,
        "hostname": socket.gethostname(),
        "boot_id": boot_id(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_total_mib": memory_total_mib(),
        "numa": numa_nodes(),
        "gpus": gpus or {"source": None, "devices": []},
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# ---------------------------------------------------------------------------------------------- launch


def launch(req):
    """Start the run in req['run_dir'] detached. The folder is the launch lock: created once, never reused."""
    run_dir = req["run_dir"]
    parent = os.path.dirname(run_dir.rstrip("/"))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        # launched before (a retried request after a lost reply): report that run, never start another
        return _existing(run_dir, wait_s=5.0)
    write_json_atomic(os.path.join(run_dir, "spec.json"), {
        "command": req["command"], "env": req.get("env") or {}, "workdir": req.get("workdir"),
        "inherit_env": bool(req.get("inherit_env", False)), "cpus": req.get("cpus") or [],
    })
    helper = os.path.abspath(__file__)
    with open(os.devnull, "rb") as devnull_in, open(os.path.join(run_dir, "wrapper.log"), "ab") as wlog:
        wrapper = subprocess.Popen([sys.executable, helper, "_wrap", run_dir], stdin=devnull_in, stdout=wlog,
                                   stderr=wlog, start_new_session=True, close_fds=True, cwd="/")
    # A long-lived helper (`serve`) stays the wrapper's parent: reap it when it ends, or every finished run
    # would leave a zombie behind until the server exits. A one-shot helper exits first and init adopts it.
    reaper = threading.Thread(target=wrapper.wait)
    reaper.daemon = True
    reaper.start()
    return _existing(run_dir, wait_s=15.0)


def _existing(run_dir, wait_s):
    deadline = time.monotonic() + wait_s
    while True:
        handle = read_json(os.path.join(run_dir, "handle.json"))
        if handle is not None:
            return {"handle": handle}
        if time.monotonic() > deadline:
            return {"error": "run %s did not start within %.0f s (see wrapper.log there)" % (run_dir, wait_s)}
        time.sleep(0.005)


def wrap(run_dir):
    """The run's owner: start the job in its own session, wait, record the exit code atomically."""
    spec = read_json(os.path.join(run_dir, "spec.json"))
    if spec.get("inherit_env"):
        env = dict(os.environ)
    else:
        # a login's basics on this node, never the controller machine's paths
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        for k in ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR"):
            if k in os.environ:
                env[k] = os.environ[k]
    env.update(spec.get("env") or {})
    env[RUN_MARKER] = run_dir
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)  # signals are for the job; the wrapper must live to write the code
    workdir = spec.get("workdir") or run_dir
    log_path = os.path.join(run_dir, "output.log")
    with open(log_path, "ab", buffering=0) as log:
        cpus = _usable_cpus(spec.get("cpus") or [])
        if cpus:
            env["HSCHED_CPUS"] = ",".join(str(c) for c in cpus)
        try:
            child = subprocess.Popen(
                spec["command"], cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True,
                preexec_fn=lambda: _prepare_child(cpus),
            )
        except OSError as e:
            log.write(("hsched: cannot start %r: %s\n" % (spec["command"][0], e.strerror)).encode())
            write_json_atomic(os.path.join(run_dir, "handle.json"), _handle(run_dir, os.getpid()))
            write_json_atomic(os.path.join(run_dir, "exit.json"), {
                "exit_code": 127 if isinstance(e, FileNotFoundError) else 126, "signal": None,
                "end_time": time.time(), "error": str(e)})
            return 0
        write_json_atomic(os.path.join(run_dir, "handle.json"), _handle(run_dir, child.pid))
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:
                continue
    sig = -rc if rc < 0 else None
    code = 128 + sig if sig else rc
    write_json_atomic(os.path.join(run_dir, "exit.json"),
                      {"exit_code": code, "signal": sig, "end_time": time.time()})
    return 0


def _usable_cpus(wanted):
    """The wanted cores this process may run on (a job is pinned to the cores local to its GPUs)."""
    if not wanted or not hasattr(os, "sched_getaffinity"):
        return []
    allowed = os.sched_getaffinity(0)
    return sorted(c for c in wanted if c in allowed)


def _prepare_child(cpus):
    _restore_signals()
    if cpus:
        os.sched_setaffinity(0, cpus)


def _restore_signals():
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)


def _handle(run_dir, child_pid):
    me = os.getpid()
    return {"run_dir": run_dir, "pid": me, "pgid": child_pid, "start_ticks": proc_start_ticks(me) or 0,
            "boot_id": boot_id()}


# ---------------------------------------------------------------------------------------------- status


def _alive(handle):
    if handle.get("boot_id") != boot_id():
        return False
    ticks = proc_start_ticks(int(handle["pid"]))
    return ticks is not None and ticks == int(handle["start_ticks"])


def run_status(item):
    run_dir = item["run_dir"]
    handle = item.get("handle") or read_json(os.path.join(run_dir, "handle.json"))
    if handle is None:
        if not os.path.isdir(run_dir):
            return {"status": "not_started"}
        spec_seen = os.path.exists(os.path.join(run_dir, "spec.json"))
        return {"status": "lost" if spec_seen else "not_started", "detail": "no handle recorded"}
    exit_info = read_json(os.path.join(run_dir, "exit.json"))
    if exit_info is not None:
        return {"status": "exited", "exit_code": exit_info.get("exit_code"), "signal": exit_info.get("signal"),
                "end_time": exit_info.get("end_time"), "handle": handle}
    if _alive(handle):
        return {"status": "running", "handle": handle}
    # the wrapper may have written exit.json between the two looks
    exit_info = read_json(os.path.join(run_dir, "exit.json"))
    if exit_info is not None:
        return {"status": "exited", "exit_code": exit_info.get("exit_code"), "signal": exit_info.get("signal"),
                "end_time": exit_info.get("end_time"), "handle": handle}
    return {"status": "lost", "handle": handle, "detail": "process gone without an exit code"}


def status(req):
    return {"runs": [run_status(item) for item in req.get("runs", [])]}


# ---------------------------------------------------------------------------------------------- signal


def run_pids(run_dir):
    """Every process whose environment carries this run's marker (finds setsid'd escapees too)."""
    marker = ("%s=%s" % (RUN_MARKER, run_dir)).encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def send_signal(req):
    handle = req["handle"]
    signame = str(req["signal"]).upper()
    signame = signame if signame.startswith("SIG") else "SIG" + signame
    sig = getattr(signal, signame, None)
    if sig is None:
        return {"error": "unknown signal %s" % req["signal"]}
    if not _alive(handle):
        # the wrapper is gone: the run ended (or the pid was reused); never signal a stranger
        return {"sent": False, "detail": "run not running"}
    sent = False
    try:
        os.killpg(int(handle["pgid"]), sig)
        sent = True
    except ProcessLookupError:
        pass
    except PermissionError as e:
        return {"error": "cannot signal the run: %s" % e}
    if req.get("all_processes"):
        wrapper = int(handle["pid"])
        for pid in run_pids(handle["run_dir"]):
            if pid == wrapper:
                continue
            try:
                os.kill(pid, sig)
                sent = True
            except OSError:
                pass
    return {"sent": sent}


# ------------------------------------------------------------------------------------------------ main

COMMANDS = {"probe": probe, "launch": launch, "status": status, "signal": send_signal}


def main(argv):
    if len(argv) >= 3 and argv[1] == "_wrap":
        return wrap(argv[2])
    if len(argv) >= 2 and argv[1] == "serve":
        return serve()
    if len(argv) < 2 or argv[1] not in COMMANDS:
        sys.stdout.write(json.dumps({"error": "usage: nodehelper.py %s" % "|".join(COMMANDS)}) + "\n")
        return 2
    raw = sys.stdin.read() if argv[1] != "probe" else (sys.stdin.read() if not sys.stdin.isatty() else "")
    try:
        req = json.loads(raw) if raw.strip() else {}
        reply = COMMANDS[argv[1]](req)
    except Exception as e:  # one JSON error line, never a traceback the controller must parse
        reply = {"error": "%s: %s" % (type(e).__name__, e)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 1 if "error" in reply else 0



# ------------------------------------------------------------------------------------- read and watch
# Added for remote nodes (the SSH executor): reading a run's log without SFTP, and one long-lived
# monitoring stream per node instead of a new process (and a new nvidia-smi) every second.


def read_file(req):
    """Up to max_bytes of req['path'] from req['offset'], base64 (logs are bytes, not always UTF-8)."""
    import base64

    path = req["path"]
    offset = max(0, int(req.get("offset", 0)))
    max_bytes = max(0, min(int(req.get("max_bytes", 1 << 20)), 16 << 20))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return {"data": "", "size": None}
    return {"data": base64.b64encode(data).decode("ascii"), "size": size}


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
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            try:
                info[key] = int(rest.split()[0]) // 1024
            except (IndexError, ValueError):
                pass
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    used = total - avail if total is not None and avail is not None else None
    return {"total_mib": total, "available_mib": avail, "used_mib": used}


def _proc_owner(pid):
    """The hsched run folder a process belongs to (from its environment), or None if none or unreadable."""
    prefix = (RUN_MARKER + "=").encode()
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix):].decode("utf-8", "replace")
    except OSError:
        return None
    return None


def _proc_name(pid):
    return _read("/proc/%d/comm" % pid)


def _gpu_process(pid, uuid, used_mib):
    return {"pid": pid, "uuid": uuid, "used_memory_mib": used_mib, "name": _proc_name(pid),
            "run_dir": _proc_owner(pid)}


class _NvmlSampler(object):
    """Device metrics through NVML: one init, then a few cheap calls per device per sample."""

    source = "nvml"

    def __init__(self, pynvml):
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self.handles.append((i, h, self._call(pynvml.nvmlDeviceGetUUID, h)))

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
            devices.append({
                "index": i, "uuid": uuid,
                "utilization_gpu": float(util.gpu) if util is not None else None,
                "memory_used_mib": mem.used // (1 << 20) if mem is not None else None,
                "memory_total_mib": mem.total // (1 << 20) if mem is not None else None,
                "temperature_c": float(temp) if temp is not None else None,
                "power_w": power / 1000.0 if power is not None else None,
            })
            seen = set()
            for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(nv, fn_name, None)
                for p in (self._call(fn, h) if fn else None) or []:
                    if p.pid in seen:
                        continue
                    seen.add(p.pid)
                    used = getattr(p, "usedGpuMemory", None)
                    procs.append(_gpu_process(p.pid, uuid, used // (1 << 20) if isinstance(used, int) else None))
        return devices, procs

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


_SMI_GPU = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"


class _SmiSampler(object):
    """Device metrics from one long-running `nvidia-smi -lms` (no process start per sample), and the
    GPU processes from a one-shot query every few seconds (they change rarely; the query is costly)."""

    source = "nvidia-smi"

    def __init__(self, exe, interval_s):
        self.exe = exe
        self.latest = {}
        self.procs = []
        self.lock = threading.Lock()
        self.first = threading.Event()
        self.apps_seen = threading.Event()
        self.proc = subprocess.Popen(
            [exe, "--query-gpu=" + _SMI_GPU, "--format=csv,noheader,nounits",
             "-lms", str(max(100, int(interval_s * 1000)))],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self.apps_every = max(5.0, interval_s)
        for target in (self._read_gpus, self._poll_apps):
            t = threading.Thread(target=target)
            t.daemon = True
            t.start()

    @staticmethod
    def _num(v):
        try:
            return float(v)
        except ValueError:
            return None  # "[N/A]", "[Not Supported]"

    def _read_gpus(self):
        for raw in self.proc.stdout:
            f = [x.strip() for x in raw.decode("utf-8", "replace").split(",")]
            if len(f) < 7 or not f[0].isdigit():
                continue
            used, total = self._num(f[3]), self._num(f[4])
            temp, power = self._num(f[5]), self._num(f[6])
            dev = {"index": int(f[0]), "uuid": f[1], "utilization_gpu": self._num(f[2]),
                   "memory_used_mib": int(used) if used is not None else None,
                   "memory_total_mib": int(total) if total is not None else None,
                   "temperature_c": temp, "power_w": power}
            with self.lock:
                self.latest[dev["index"]] = dev
            self.first.set()
        self.first.set()  # nvidia-smi ended: no sample waits for it any more

    def _poll_apps(self):
        try:
            self._poll_apps_until_smi_ends()
        finally:
            self.apps_seen.set()  # never leave a sample waiting on a poll that will not come

    def _poll_apps_until_smi_ends(self):
        while self.proc.poll() is None:
            try:
                out = subprocess.run([self.exe, "--query-compute-apps=gpu_uuid,pid,used_memory",
                                      "--format=csv,noheader,nounits"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20)
                procs = []
                for line in out.stdout.decode("utf-8", "replace").splitlines():
                    f = [x.strip() for x in line.split(",")]
                    if len(f) >= 3 and f[1].isdigit():
                        used = self._num(f[2])
                        procs.append(_gpu_process(int(f[1]), f[0], int(used) if used is not None else None))
                with self.lock:
                    self.procs = procs
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.apps_seen.set()
            time.sleep(self.apps_every)

    def sample(self):
        # the first sample waits for nvidia-smi's first answers (devices, then their processes: a sample
        # without the processes would show a busy device as free), later ones never do
        self.first.wait(3.0)
        self.apps_seen.wait(3.0)
        with self.lock:
            return [self.latest[i] for i in sorted(self.latest)], list(self.procs)

    def close(self):
        try:
            self.proc.kill()
        except OSError:
            pass


class _SimSampler(object):
    """Simulated devices: idle, nothing running on them (their jobs are ordinary processes)."""

    source = "simulated"  # type: str | None

    def __init__(self, sim):
        self.devices = [{"index": i, "uuid": u, "utilization_gpu": 0.0, "memory_used_mib": 0,
                         "memory_total_mib": sim.get("memory_mib"), "temperature_c": None, "power_w": None}
                        for i, u in enumerate(sim.get("uuids") or [])]

    def sample(self):
        return [dict(d) for d in self.devices], []

    def close(self):
        pass


class _NoGpuSampler(_SimSampler):
    source = None

    def __init__(self):
        self.devices = []


def _gpu_sampler(req, interval_s):
    if req.get("simulate") is not None:
        return _SimSampler(req["simulate"])
    try:
        import pynvml

        return _NvmlSampler(pynvml)
    except Exception:  # no pynvml, no driver: fall back to nvidia-smi
        pass
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            return _SmiSampler(exe, interval_s)
        except OSError:
            pass
    return _NoGpuSampler()


def watch(req):
    """Stream one JSON line per interval until the reader goes away (or `count` samples were sent).

    Request: {"interval_s": 1.0, "count": null, "simulate": {"uuids": [...], "memory_mib": N} | null}.
    A sample: {"seq", "t", "boot_id", "cpu": {"util", "count", "loadavg"}, "memory": {...},
    "gpus": {"source", "devices": [...]}, "processes": [{"pid", "uuid", "used_memory_mib", "name", "run_dir"}]}.
    """
    interval = max(0.05, float(req.get("interval_s") or 1.0))
    count = req.get("count")
    stall_limit = max(30.0, 10 * interval)
    state = {"writing_since": None}
    parent = os.getppid()

    def watchdog():
        # a cut-off network leaves sshd's socket open and our write blocked forever: give up instead
        while True:
            time.sleep(1.0)
            since = state["writing_since"]
            if since is not None and time.monotonic() - since > stall_limit:
                os._exit(0)
            if os.getppid() != parent:  # the ssh session (or process) that started us is gone
                os._exit(0)

    wd = threading.Thread(target=watchdog)
    wd.daemon = True
    wd.start()
    gpus = _gpu_sampler(req, interval)
    bid = boot_id()
    ncpu = os.cpu_count()
    prev = _cpu_times()
    next_t = time.monotonic()
    seq = 0
    out = sys.stdout
    try:
        while count is None or seq < int(count):
            now = time.monotonic()
            if next_t > now:
                time.sleep(next_t - now)
            cur = _cpu_times()
            util = None
            if prev is not None and cur is not None and cur[1] > prev[1]:
                util = round(100.0 * (cur[0] - prev[0]) / (cur[1] - prev[1]), 1)
            prev = cur
            devices, procs = gpus.sample()
            sample = {
                "seq": seq, "t": time.time(), "boot_id": bid,
                "cpu": {"util": util, "count": ncpu,
                        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
                "memory": _memory(),
                "gpus": {"source": gpus.source, "devices": devices},
                "processes": procs,
            }
            state["writing_since"] = time.monotonic()
            out.write(json.dumps(sample) + "\n")
            out.flush()
            state["writing_since"] = None
            seq += 1
            next_t += interval
            now = time.monotonic()
            if next_t < now:  # a slow sample or a slow reader: skip the missed ticks rather than bunch up
                next_t += ((now - next_t) // interval + 1) * interval
    except OSError:
        # the reader closed the channel: that is how a watch ends; nobody is left to read a reply
        gpus.close()
        os._exit(0)
    gpus.close()
    return {"samples": seq}


def newest(req):
    """The newest modification time of any file under req["path"] (None if there is none)."""
    best = None
    for root, _dirs, files in os.walk(req["path"]):
        for name in files:
            try:
                t = os.stat(os.path.join(root, name)).st_mtime
            except OSError:
                continue
            if best is None or t > best:
                best = t
    return {"newest": best}


def serve():
    """Answer many requests on one channel: JSON lines {"id", "cmd", "req"} in, {"id", "reply"} out.

    The controller keeps one of these per node (a subprocess for this machine, an SSH channel for the
    others), so a status or probe costs a round trip, not a Python start. Requests run in threads (a
    launch may wait for its run to start) and replies may come out of order; the id matches them. The
    loop ends when the channel closes (stdin EOF).
    """
    out_lock = threading.Lock()

    def handle(line):
        try:
            msg = json.loads(line)
            rid, cmd, req = msg["id"], msg["cmd"], msg.get("req") or {}
        except (ValueError, KeyError, TypeError):
            return
        fn = COMMANDS.get(cmd)
        try:
            reply = fn(req) if fn is not None and cmd != "watch" else {"error": "unknown request %r" % cmd}
        except Exception as e:
            reply = {"error": "%s: %s" % (type(e).__name__, e)}
        data = json.dumps({"id": rid, "reply": reply}) + "\n"
        with out_lock:
            try:
                sys.stdout.write(data)
                sys.stdout.flush()
            except (OSError, ValueError):
                os._exit(0)  # the reader is gone

    workers = []
    for line in sys.stdin:
        t = threading.Thread(target=handle, args=(line,))
        t.start()
        workers.append(t)
        workers = [w for w in workers if w.is_alive()]
    for w in workers:  # answer what was asked before the channel closed
        w.join(30)
    return 0


COMMANDS["read"] = read_file
COMMANDS["watch"] = watch
COMMANDS["newest"] = newest


if __name__ == "__main__":
    sys.exit(main(sys.argv))
