#!/usr/bin/env python3
"""hsched's node helper: probe a machine, launch detached runs, report on them and signal them.

Stdlib only and Python >= 3.8: the controller runs this one file on every node (as a subprocess here, over
SSH elsewhere), so nothing but python3 needs to be installed there. Requests are JSON on stdin, replies
JSON on stdout; a failure is a JSON `{"error": "..."}` and exit status 1.

    probe           machine facts: CPUs, memory, NUMA nodes, NVIDIA GPUs (NVML, else nvidia-smi), boot id
    launch          start a run detached (new session); idempotent per run folder
    status          for each run: running / exited (with exit code) / lost / not_started
    signal          send a signal to a run's process group (only if the run is still the same process)
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
        "inherit_env": bool(req.get("inherit_env", False)),
    })
    helper = os.path.abspath(__file__)
    with open(os.devnull, "rb") as devnull_in, open(os.path.join(run_dir, "wrapper.log"), "ab") as wlog:
        subprocess.Popen([sys.executable, helper, "_wrap", run_dir], stdin=devnull_in, stdout=wlog,
                         stderr=wlog, start_new_session=True, close_fds=True, cwd="/")
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
    env = dict(os.environ) if spec.get("inherit_env") else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env.update(spec.get("env") or {})
    env[RUN_MARKER] = run_dir
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)  # signals are for the job; the wrapper must live to write the code
    workdir = spec.get("workdir") or run_dir
    log_path = os.path.join(run_dir, "output.log")
    with open(log_path, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                spec["command"], cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True,
                preexec_fn=_restore_signals,
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
