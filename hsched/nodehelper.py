#!/usr/bin/env python3
"""hsched's node helper: probe a machine, launch contained runs, report on them and signal them.

Stdlib only and Python >= 3.8: the controller runs this one file on every node (as a subprocess here, over
SSH elsewhere), so nothing but python3 needs to be installed there. Requests are JSON on stdin, replies
JSON on stdout; a failure is a JSON `{"error": "..."}` and exit status 1.

    probe           machine facts: CPUs, memory, NUMA nodes, NVIDIA GPUs (NVML, else nvidia-smi), boot id;
                    GPU discovery runs in a child process with a hard time limit (`gpu_timeout_s`)
    launch          start a run detached (new session); idempotent per run folder
    status          for each run: running / exited (with exit code, end time, OOM, GPU holders) / lost /
                    not_started
    signal          send a signal to a run (its main process, its process group, or every process of it)
    read            bytes of a file from an offset (a run's log), base64
    newest          the newest modification time under a folder (a checkpoint's age)
    watch           a monitoring stream: one JSON sample per interval
    serve           many requests on one pair of pipes, JSON lines with ids (what executors use)
    whoami          who runs this helper and where it is confined (the executors' first contact through sudo)
    pack            a folder (a checkpoint) as one tar file in the helper's transfer folder, read back with `read`
    append          bytes onto a tar file in the transfer folder (a checkpoint coming in)
    unpack          a tar file of the transfer folder into a folder, replacing it (regular files and folders only)
    drop            remove a transfer file
    data_scan       a dataset (a file or a folder tree): whether it is there, its bytes, files and newest mtime
    data_list       a dataset's files (relative path, size, mtime, mode) and folders
    data_free       bytes free where a dataset would go
    data_root       where this helper writes datasets (ROOT/data under --confine, else anywhere: null)
    data_read       up to 4 MiB of a dataset file from an offset, base64
    data_write      bytes into a dataset file at an offset (cut there first), no link on the way
    data_read_many  several small files of a dataset in one reply (4 MiB in all), base64
    data_write_many several small files into a claimed partial copy in one request, each fsynced
    data_claim      a partial copy made one attempt's: writes that carry another's claim are refused from then on
    data_commit     a finished copy (DEST.partial: manifest + data) put at DEST whole, modes and mtimes restored
    data_drop       remove a dataset or an abandoned copy
    data_hash       sha256 over a dataset's files (sorted relative paths, each path, size and bytes)
    _wrap RUN_DIR   (internal) the wrapper that owns a run, contains it and writes its exit record atomically
    _probe_gpus     (internal) the GPU discovery that `probe` runs in a child process

Options before the command: `--confine ROOT [--min-uid N]`, each at most once (a second one, an unknown option
or an argument after the command is one JSON error, exit status 2). A lab whose controller runs as a service
account (not root) installs this helper root-owned on every node with a sudo rule that lets the account run
exactly its launcher with one command (`hsched node helper-script`); the installed launcher always passes
`--confine` and `--min-uid` first, so they are final, and then the helper does nothing the account could
turn into root's powers: every path it reads, makes, packs or unpacks lies under ROOT (no symbolic link on the
way; `read` gives only a run's output.log or a transfer file), a run starts only as a named user with a uid of
at least N (default 1000: never root, never a system account), and the handles that `status` and `signal` act
on are the ones this helper wrote (handle.json in a root-owned run folder), never what a request says.

A run is found again by pid + process start time + boot id, which rules out pid reuse and reboots. The
wrapper runs the job in a session of its own, so signals sent to the job's process group leave the
wrapper alive to record how the job ended.

Containment. Each run gets a cgroup of its own where this machine lets us make one (root, or a delegated
cgroup v2 folder named by HSCHED_CGROUP_ROOT): cgroup v2 when mounted (`<mount>/hsched/run-<hash>`), plus the
v1 memory and cpu controllers (children of the helper's own v1 cgroups) for the limits v2 cannot enforce on a
hybrid machine. The job joins them before it executes, so everything it starts is inside; the wrapper stays
outside. Without cgroups (or with HSCHED_CONTAINMENT=pgroup) a run is its process group, the descendants of
its wrapper (a child subreaper, so orphans come back to it) and the processes carrying its marker variable.
Whichever it is, when the run's main process ends every other process of the run is killed (at once, or
after the stop grace when hsched had signalled the run) and the wrapper writes the exit record only once
none is left, so a reported exit means the run's GPUs are free to hand out again.

A shared run (HSCHED_SHARED_GPU=<uuid>: several runs on one GPU) gets the GPU's CUDA MPS control daemon started
before its job and stopped after the GPU's last shared run (see "GPUs shared by several runs" below).

Run folder (0700, files 0600):

    spec.json     the launch request (command, env, workdir, inherit_env, cpus, memory_mib, cpu_limit,
                  devices, checkpoint_exit_code, stop_grace_s, output, error, truncate_output: sbatch's -o/-e
                  files, which the wrapper also writes the job's output to, opened as the run's user)
    handle.json   run_dir, pid (the wrapper), pgid (= the main process's pid), start_ticks, boot_id,
                  child_start_ticks, containment ("cgroup" | "pgroup"), cgroups ({"v2", "memory", "cpu"}:
                  folders), enforced (["memory", "cpu"]: limits in force), subreaper, cgroup_errors, mps (a
                  shared run's: {gpu, state: started | joined | absent | failed | refused, daemon, detail}),
                  mps_swept (a run that is not shared: [{gpu, stopped | error}], daemons left by runs gone)
    signals.log   one JSON line per signal hsched sent ({t, signal, number, batch_only, all_processes, purpose}),
                  appended before it is sent
    exit.json     exit_code, signal, end_time (when the main process ended), oom, gpu_left ([{uuid, pid,
                  name}]), stuck_pids (killed but not gone after 10 s: D state), leftovers_killed,
                  containment, main_exit (the main process's own {exit_code, signal} when a checkpoint exit
                  replaced it), gpu_check_error (when nvidia-smi failed or hung), mps (a shared run's:
                  {gpu, runs_left, stopped: the daemon's pid when this run was the GPU's last, error})
    progress.log  the job's progress reports ($HSCHED_PROGRESS; the user's in a lab), read by `watch`
    output.log, wrapper.log
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time


def _sibling(name):
    """A module of this helper's own folder, loaded from there by path (a node has no hsched package, and a
    launcher that isolates Python from its environment leaves this folder off sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    if not os.path.exists(path):  # in the source tree the helper's own modules are in node/ (a bundle is flat)
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


if __package__:
    from . import safefiles
    from .node import cgroupstats
else:  # run as a script: on a node (the bundle's folder, the installed helper's prefix) or here
    safefiles = _sibling("safefiles")
    cgroupstats = _sibling("cgroupstats")

HELPER_VERSION = 3
"""The protocol this helper speaks, in `whoami` and `probe`; executors refuse a node whose helper says less
(an installed helper is not theirs to replace). 2: lab mode through an installed helper (issue 13);
3: sbatch's -o/-e written by the wrapper (a helper of 2 dropped them), datasets, the launcher's options final
and its commands listed one by one in the sudo rule, copies as data only (safefiles: pack/unpack take the job's
user, data_read a dataset's root and a relative path). Raise it whenever a request gains a key an older helper
would ignore."""
RUN_MARKER = "HSCHED_RUN_DIR"
PROGRESS_ENV = "HSCHED_PROGRESS"
PROGRESS_FILE = "progress.log"
"""A run's progress reports: one line each, `step=1200 total=50000` or a JSON object (hsched.progress)."""
"""Every process of a run inherits this variable; it finds processes that left the process group."""
CGROUP_ROOT_ENV = "HSCHED_CGROUP_ROOT"
"""A writable (delegated) cgroup v2 folder to create the runs' cgroups in, for a helper that is not root."""
CONTAINMENT_ENV = "HSCHED_CONTAINMENT"
"""`pgroup`: make no cgroups (the process group, the wrapper's descendants and the marker only)."""
STOP_MARGIN_S = 15.0
"""After a signalled run's main process ended, how long past the stop grace the rest may take before the
wrapper kills it itself (the controller's escalation normally comes first)."""
STUCK_AFTER_S = 10.0
"""How long the wrapper waits for killed processes to go (one in D state may never) before it records them as
stuck and writes the exit record anyway."""
GPU_CHECK_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CONFINE = None
"""`--confine ROOT`: the one folder this helper may touch (a service account's helper, run through sudo)."""
MIN_UID = 1000
"""`--min-uid N`: under --confine, the lowest uid a run may start as (login.defs' UID_MIN)."""


# ---------------------------------------------------------------------------------------------- basics


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None if there is no such process.
    The command name (field 2) may hold spaces and parentheses: the split is after the last ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def _proc_stat(pid):
    """(state, ppid, pgrp, session, start ticks) of a process from /proc/PID/stat, or None if there is none."""
    rest = _stat_fields(pid)
    if rest is None:
        return None
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_start_ticks(pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None if no such process."""
    st = _proc_stat(pid)
    if st is None or st[0] == "Z":  # a zombie has ended; its parent just has not reaped it yet
        return None
    return st[4]


def _live(pid):
    st = _proc_stat(pid)
    return st is not None and st[0] != "Z"


def _private_fd(path, flags):
    """Open (creating it 0600) a file of a run: a job's output and environment are its owner's only."""
    return os.open(path, flags | os.O_CREAT, 0o600)


def write_json_atomic(path, obj):
    """Write, fsync, rename, fsync the folder: a reader sees the old file or the whole new one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with os.fdopen(_private_fd(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
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


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# ------------------------------------------------------------------------------------------ confinement
# A service account's helper runs as root through sudo: whatever the account asks, the helper must not do
# anything with root's powers that the account could not do by running a job as a lab user.


class Refused(Exception):
    """What a confined helper will not do (a path outside its folder, a run as root): an error reply."""


class BadOptions(Exception):
    """The helper's command line is refused as a whole (one JSON error line, exit status 2)."""


def _options(argv):
    """argv without its leading options (`--confine ROOT`, `--min-uid N`), which set CONFINE and MIN_UID.

    Each option is final: the installed launcher passes both before whatever its caller adds, so a second
    one (`sudo LAUNCHER --confine / --min-uid 0 ...`) would widen the confinement the launcher set; it is
    refused, as is any option after the command (nothing but `_wrap RUN_DIR` takes an argument)."""
    global CONFINE, MIN_UID
    args = list(argv)
    seen = set()
    while len(args) >= 2 and args[1].startswith("--"):
        opt = args[1]
        if opt not in ("--confine", "--min-uid"):
            raise BadOptions("unknown option %s (options: --confine ROOT, --min-uid N, before the command)" % opt)
        if opt in seen:
            raise BadOptions("%s given twice: the first one (the launcher's) is final" % opt)
        seen.add(opt)
        if len(args) < 3:
            raise BadOptions("%s needs a value" % opt)
        if opt == "--confine":
            if not args[2].startswith("/"):
                raise BadOptions("--confine takes an absolute folder, not %r" % args[2])
            CONFINE = os.path.normpath(args[2])
        else:
            try:
                MIN_UID = int(args[2])
            except ValueError:
                raise BadOptions("--min-uid takes a number, not %r" % args[2]) from None
        del args[1:3]
    extra = args[3:] if len(args) >= 2 and args[1] == "_wrap" else args[2:]
    if extra:
        raise BadOptions("%s takes no arguments after it (its request goes on stdin), not %s"
                         % (args[1], " ".join(extra)[:200]))
    return args


def _helper_argv(*args):
    """This helper run again (the run's wrapper), confined as this one is: its launcher's isolation from the
    environment and user site included."""
    if CONFINE is None:
        return [sys.executable, os.path.abspath(__file__), *args]
    return [sys.executable, "-E", "-s", os.path.abspath(__file__), "--confine", CONFINE,
            "--min-uid", str(MIN_UID), *args]


def _inside(path):
    """`path` made absolute, when this helper may touch it: anything when unconfined; under --confine, only a
    path under ROOT with no symbolic link between ROOT and it (a user's own folder under ROOT may hold links
    laid to lead a root helper elsewhere)."""
    p = os.path.normpath(os.path.abspath(str(path)))
    if CONFINE is None:
        return p
    if p != CONFINE and not p.startswith(CONFINE.rstrip("/") + "/"):
        raise Refused("%s is outside this helper's folder %s" % (path, CONFINE))
    walked = CONFINE
    for part in os.path.relpath(p, CONFINE).split("/"):
        if part == ".":
            break
        walked = os.path.join(walked, part)
        if os.path.islink(walked):
            raise Refused("%s: %s is a symbolic link" % (path, walked))
    return p


def _open_inside(path, flags):
    """A descriptor of `path` (never following a link at its end); under --confine, the file it opened must
    still lie under ROOT (a folder on the way swapped for a link after _inside looked is caught here)."""
    fd = os.open(_inside(path), flags | getattr(os, "O_NOFOLLOW", 0))
    if CONFINE is None:
        return fd
    try:
        real = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        real = ""
    root = os.path.realpath(CONFINE)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        os.close(fd)
        raise Refused("%s leads outside this helper's folder" % path)
    return fd


def _own(path):
    """Under --confine: `path` must be this helper's own (root's, writable by no one else), as every run
    folder and spec it makes are; a folder a user or the account made is never taken for a run's."""
    if CONFINE is None:
        return
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise Refused("%s is not this helper's own" % path)


def _why(e):
    """An exception as an error reply's one line (a refusal says only why)."""
    return str(e) if isinstance(e, Refused) else "%s: %s" % (type(e).__name__, e)


def whoami(req):
    """Who runs this helper and how it is confined: the executors' first contact through sudo."""
    return {"uid": os.geteuid(), "confine": CONFINE, "min_uid": MIN_UID, "root": CONFINE,
            "python": list(sys.version_info[:3]), "helper_version": HELPER_VERSION}


_LIBC = {}  # type: dict


def _libc(name, argtypes):
    """libc's function `name` through ctypes (its errno kept), once; None where there is none (not Linux, an old
    libc, no ctypes). `argtypes`: a function of the ctypes module giving the argument types."""
    if name not in _LIBC:
        try:
            import ctypes

            fn = getattr(ctypes.CDLL(None, use_errno=True), name)
            fn.argtypes = argtypes(ctypes)
            fn.restype = ctypes.c_int
            _LIBC[name] = fn
        except Exception:
            _LIBC[name] = None
    return _LIBC[name]


def _prctl():
    """libc's prctl, or None where there is none."""
    return _libc("prctl", lambda c: [c.c_int, c.c_ulong, c.c_ulong, c.c_ulong, c.c_ulong])


# ------------------------------------------------------------------------- children with a time limit
# Every probe and sampler runs what may hang (NVML, nvidia-smi on a sick GPU) in a child process with a hard
# time limit, in a process group of its own that is SIGKILLed on timeout; a child that dies with its parent
# thread (PR_SET_PDEATHSIG) cannot outlive a helper that was itself killed. A child that cannot be reaped
# (D state: not even SIGKILL ends it) is left to a daemon thread and reported, never waited for.

_CHILDREN_LOCK = threading.Lock()
_CHILDREN = {}  # type: dict
"""pid -> Popen of the probe and sampler children this process has running."""
_CLOSING = threading.Event()
"""Set when this helper is going away: no child is started any more."""


def _child_setup(own_group):
    """What a child does between fork and exec: its own process group (when not a new session), and death
    with the thread that started it. Everything is looked up before the fork, so the child only calls."""
    prctl = _prctl()
    setpgid = os.setpgid
    kill = signal.SIGKILL

    def setup():
        if own_group:
            setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)

    return setup


def _register(proc):
    with _CHILDREN_LOCK:
        _CHILDREN[proc.pid] = proc


def _unregister(proc):
    with _CHILDREN_LOCK:
        _CHILDREN.pop(proc.pid, None)


def _group_members(pgid):
    """{pid: name} of the live processes in process group `pgid`."""
    out = {}
    for pid, (state, _ppid, pgrp, _sid) in _proc_table().items():
        if pgrp == pgid and state != "Z":
            out[pid] = _read("/proc/%d/comm" % pid) or "?"
    return out


def _abandon(proc):
    """Leave a child that cannot be reaped now to a daemon thread that reaps it whenever it ends."""
    t = threading.Thread(target=proc.wait)
    t.daemon = True
    t.start()


def _stop_group(proc, wait_s=1.0):
    """SIGKILL a child's process group and reap the child; say what was killed or, if something of the group
    is still there after `wait_s` (D state), what was abandoned."""
    before = _group_members(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + wait_s
    left = before
    while time.monotonic() < deadline:
        left = _group_members(proc.pid)
        if proc.poll() is not None and not left:
            break
        time.sleep(0.02)
    for f in (proc.stdout, proc.stderr):
        try:
            if f is not None:
                f.close()  # a stuck process may hold the other end open forever
        except OSError:
            pass
    if proc.poll() is None:
        _abandon(proc)
    # name the processes below the child first: the child is our python or the tool itself, what hangs is deeper
    named = left or before
    inner = dict((p, n) for p, n in named.items() if p != proc.pid) or named
    what = ", ".join("%s pid %d" % (n, p) for p, n in sorted(inner.items())) or "pid %d" % proc.pid
    return "%s %s" % (what, "abandoned" if left else "killed")


def run_bounded(argv, timeout_s, what, new_session=True):
    """Run argv with a hard time limit. Returns a dict: rc, out (bytes), err (text), error (None when it
    answered in time; else why not), abandoned (the Popen of a child that could not be reaped, or None)."""
    result = {"rc": None, "out": b"", "err": "", "error": None, "abandoned": None}
    if _CLOSING.is_set():
        result["error"] = "%s not started: the helper is closing" % what
        return result
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                close_fds=True, start_new_session=new_session,
                                preexec_fn=_child_setup(not new_session))
    except (OSError, subprocess.SubprocessError) as e:
        result["error"] = "%s could not start: %s" % (what, e)
        return result
    _register(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result["error"] = "%s did not answer within %g s (%s)" % (what, timeout_s, _stop_group(proc))
        if proc.returncode is None:
            result["abandoned"] = proc
        return result
    finally:
        _unregister(proc)
    result["rc"], result["out"] = proc.returncode, out
    result["err"] = err.decode("utf-8", "replace").strip()[-500:]
    if _CLOSING.is_set() and proc.returncode == -signal.SIGKILL:
        result["error"] = "%s stopped: the helper is closing" % what
    return result


def _kill_children(wait_s=1.0):
    """Kill every probe and sampler child of this helper (their whole process groups) and reap them; what
    cannot be reaped within wait_s is left to daemon threads. Runs are not children of this kind: untouched."""
    _CLOSING.set()
    with _CHILDREN_LOCK:
        procs = list(_CHILDREN.values())
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    for proc in procs:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.poll() is None:
            _abandon(proc)
        _unregister(proc)


# ----------------------------------------------------------------------------------------------- probe


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
        return {"source": None, "error": str(e), "devices": []}


_QUERY = ("index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,"
          "mig.mode.current")
_L_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)")
_L_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)")


def mig_listing(text):
    """GPU index -> its MIG devices, from `nvidia-smi -L` (R470+: "  MIG 1g.10gb Device 0: (UUID: MIG-...)"):
    [{"uuid", "profile", "name"}] in slot order. The fallback's view of MIG when NVML is missing."""
    out, gpu = {}, None
    for line in text.splitlines():
        m = _L_GPU.match(line)
        if m:
            gpu = int(m.group(1))
            continue
        m = _L_MIG.match(line)
        if m and gpu is not None:
            out.setdefault(gpu, []).append({"uuid": m.group(3), "profile": m.group(1), "name": "MIG " + m.group(1)})
    return out


def probe_nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        # the parent's hard limit bounds this whole probe; nvidia-smi dies with us if we are killed for it
        out = subprocess.run([exe, "--query-gpu=" + _QUERY, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, preexec_fn=_child_setup(False))
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"source": None, "error": str(e), "devices": []}
    if out.returncode != 0:
        return {"source": None, "error": (out.stderr or out.stdout).strip()[:500], "devices": []}

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
            # "Enabled" on a GPU in MIG mode; "Disabled" or "[N/A]" (no MIG) otherwise
            "mig_mode_current": len(f) > 9 and f[9].lower() == "enabled",
        })
    if any(d["mig_mode_current"] for d in devices):
        # a GPU in MIG mode is its instances (the controller never hands it out whole): `-L` lists them
        try:
            listing = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60,
                                     preexec_fn=_child_setup(False))
            migs = mig_listing(listing.stdout) if listing.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired):
            migs = {}
        for d in devices:
            if d["mig_mode_current"]:
                d["mig_devices"] = migs.get(d["index"], [])
    topo = None
    try:
        t = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60,
                           preexec_fn=_child_setup(False))
        if t.returncode == 0:
            topo = t.stdout
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"source": "nvidia-smi", "devices": devices, "topo_matrix": topo}


def probe_gpus():
    """GPU discovery in this process (what the `_probe_gpus` child runs): NVML, else nvidia-smi."""
    gpus = probe_nvml()
    if not gpus or not gpus.get("devices"):
        smi = probe_nvidia_smi()
        if smi is not None and (smi.get("devices") or not gpus):
            gpus = smi
    return gpus or {"source": None, "devices": []}


def _gpu_tools():
    """Whether this machine has anything to discover GPUs with (no child process is started otherwise)."""
    if shutil.which("nvidia-smi"):
        return True
    try:
        import importlib.util

        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def probe_gpus_bounded(timeout_s):
    """GPU discovery in a child process killed after timeout_s: a hung driver or nvidia-smi costs a bounded
    wait and an error in the reply, never a probe that does not answer."""
    if not _gpu_tools():
        return {"source": None, "devices": []}
    r = run_bounded([sys.executable, os.path.abspath(__file__), "_probe_gpus"], timeout_s, "GPU probe")
    if r["error"] is None:
        try:
            gpus = json.loads(r["out"].decode("utf-8", "replace").strip().splitlines()[-1])
            if isinstance(gpus, dict):
                gpus.setdefault("source", None)
                gpus.setdefault("devices", [])
                return gpus
        except (ValueError, IndexError):
            pass
        r["error"] = "GPU probe failed (exit status %s): %s" % (r["rc"], r["err"] or "no output")
    return {"source": None, "devices": [], "error": r["error"]}


def probe(req):
    import platform
    import socket

    timeout_s = max(0.1, float(req.get("gpu_timeout_s") or 10.0))
    return {
        "helper_version": HELPER_VERSION,
        "hostname": socket.gethostname(),
        "boot_id": boot_id(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_total_mib": memory_total_mib(),
        "numa": numa_nodes(),
        "gpus": probe_gpus_bounded(timeout_s),
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# ----------------------------------------------------------------------------------------------- /proc


def _proc_table():
    """{pid: (state, ppid, pgrp, session)} of every process (one that ends meanwhile is left out)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None:
                table[int(name)] = st[:4]
    return table


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


def run_pids(run_dir, table=None):
    """Every live process whose environment carries this run's marker (finds setsid'd escapees too)."""
    table = _proc_table() if table is None else table
    me = os.getpid()
    return [pid for pid, st in table.items() if pid != me and st[0] != "Z" and _proc_owner(pid) == run_dir]


def _descendants(table, root):
    """The live processes below `root` that are not in root's own session: a wrapper's job processes (its
    helper children, such as the GPU check's nvidia-smi, stay in the wrapper's session)."""
    kids = {}
    for pid, st in table.items():
        kids.setdefault(st[1], []).append(pid)
    root_sid = table[root][3] if root in table else None
    out, todo = [], [root]
    while todo:
        for pid in kids.get(todo.pop(), ()):
            todo.append(pid)
            state, _ppid, _pgrp, sid = table[pid]
            if state != "Z" and sid != root_sid:
                out.append(pid)
    return out


# --------------------------------------------------------------------------------------------- cgroups


def _unescape_mount(path):
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040)."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def cgroup_places(mountinfo=None, proc_cgroup=None):
    """Where this process's own cgroups are, by hierarchy: {"v2": {...}, "memory": {...}, "cpu": {...}} with
    `mount` (the hierarchy's mount point) and `own` (this process's cgroup folder); only those mounted here.
    From /proc/self/mountinfo and /proc/self/cgroup, or the texts given instead."""
    if mountinfo is None:
        mountinfo = _read("/proc/self/mountinfo") or ""
    if proc_cgroup is None:
        proc_cgroup = _read("/proc/self/cgroup") or ""
    own = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            own["v2"] = parts[2]
        else:
            for ctrl in parts[1].split(","):
                own[ctrl] = parts[2]
    places = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 3:
            continue
        root, mount = _unescape_mount(a[3]), _unescape_mount(a[4])
        if b[0] == "cgroup2":
            keys = ["v2"]
        elif b[0] == "cgroup":
            keys = [c for c in b[2].split(",") if c in ("memory", "cpu")]
        else:
            continue
        for key in keys:
            path = own.get(key)
            if key in places or path is None:
                continue
            if root != "/":  # only part of the hierarchy is mounted here: our cgroup must be inside it
                if path != root and not path.startswith(root.rstrip("/") + "/"):
                    continue
                path = path[len(root):]
            places[key] = {"mount": mount, "own": os.path.normpath(mount + "/" + path.lstrip("/"))}
    return places


def _cg_write(folder, name, value):
    with open(os.path.join(folder, name), "w") as f:
        f.write(str(value))


def _cg_controllers(folder):
    return (_read(os.path.join(folder, "cgroup.controllers")) or "").split()


def _enable_controllers(base, wanted, delegated):
    """Make `wanted` controllers (memory, cpu) available to cgroups created in `base` (cgroup v2), where this
    machine allows: in base's parent too unless base was delegated to us; failures leave them unavailable."""
    for ctrl in wanted:
        if not delegated and ctrl not in _cg_controllers(base):
            parent = os.path.dirname(base)
            if ctrl in _cg_controllers(parent):
                try:
                    _cg_write(parent, "cgroup.subtree_control", "+" + ctrl)
                except OSError:
                    pass
        try:
            _cg_write(base, "cgroup.subtree_control", "+" + ctrl)
        except OSError:
            pass


def _make_dir(path):
    try:
        os.mkdir(path)
    except FileExistsError:
        pass  # a run folder is launched once; a cgroup of the same name is a leftover of that very run


def make_cgroups(run_dir, spec):
    """Create the run's cgroups and set its limits. Returns (cgroups, enforced, errors): cgroups maps "v2",
    "memory", "cpu" to folders (only those made), enforced lists the limits in force ("memory", "cpu"),
    errors says why a wanted one is not."""
    if os.environ.get(CONTAINMENT_ENV) == "pgroup":
        return {}, [], []
    mem = spec.get("memory_mib")
    cpu = spec.get("cpu_limit")
    name = "run-" + hashlib.sha1(run_dir.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    places = cgroup_places()
    cgroups, enforced, errors = {}, [], []
    delegated = os.environ.get(CGROUP_ROOT_ENV) or None
    base = delegated or (places["v2"]["mount"] + "/hsched" if "v2" in places else None)
    if base is not None:
        try:
            if not delegated:
                _make_dir(base)
            # memory always (its accounting gives `hsched eff` the run's peak, hsched/node/cgroupstats.py)
            _enable_controllers(base, [c for c, v in (("memory", True), ("cpu", cpu)) if v], bool(delegated))
            _make_dir(base + "/" + name)
            cgroups["v2"] = base + "/" + name
        except OSError as e:  # not root and nothing delegated: no cgroup v2 for us
            errors.append("cgroup v2 in %s: %s" % (base, e.strerror or e))
    v2 = cgroups.get("v2")
    if v2 and mem and "memory" in _cg_controllers(v2):
        try:
            _cg_write(v2, "memory.max", int(mem) << 20)
            if os.path.exists(os.path.join(v2, "memory.swap.max")):
                _cg_write(v2, "memory.swap.max", 0)  # the limit is the run's memory, not memory plus swap
            enforced.append("memory")
        except OSError as e:
            errors.append("memory.max: %s" % (e.strerror or e))
    if v2 and cpu and "cpu" in _cg_controllers(v2):
        try:
            _cg_write(v2, "cpu.max", "%d 100000" % max(1000, int(float(cpu) * 100000)))
            enforced.append("cpu")
        except OSError as e:
            errors.append("cpu.max: %s" % (e.strerror or e))
    # cgroup v1 where v2 cannot: the memory controller (also the run's only cgroup on a v1 machine) and cpu
    if "memory" in places and "memory" not in enforced and (mem or not v2 or "memory" not in _cg_controllers(v2)):
        path = places["memory"]["own"] + "/hsched/" + name
        try:
            _make_dir(os.path.dirname(path))
            _make_dir(path)
            cgroups["memory"] = path
            if mem:
                _cg_write(path, "memory.limit_in_bytes", int(mem) << 20)
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _cg_write(path, "memory.memsw.limit_in_bytes", int(mem) << 20)
                enforced.append("memory")
        except OSError as e:
            errors.append("cgroup v1 memory in %s: %s" % (path, e.strerror or e))
    if "cpu" in places and cpu and "cpu" not in enforced:
        path = places["cpu"]["own"] + "/hsched/" + name
        try:
            _make_dir(os.path.dirname(path))
            _make_dir(path)
            cgroups["cpu"] = path
            _cg_write(path, "cpu.cfs_period_us", 100000)
            _cg_write(path, "cpu.cfs_quota_us", max(1000, int(float(cpu) * 100000)))
            enforced.append("cpu")
        except OSError as e:
            errors.append("cgroup v1 cpu in %s: %s" % (path, e.strerror or e))
    for what, value in (("memory", mem), ("cpu", cpu)):
        if value and what not in enforced:
            errors.append("the %s limit is not enforced: no %s controller hsched may use here" % (what, what))
    return cgroups, enforced, errors


def _tracker(info):
    """The cgroup that holds every process of the run (v2, else a v1 one), or None."""
    cgroups = (info or {}).get("cgroups") or {}
    for key in ("v2", "memory", "cpu"):
        if cgroups.get(key):
            return cgroups[key]
    return None


def cgroup_pids(folder):
    """The processes in a cgroup and the cgroups below it (a job may make its own)."""
    pids = set()
    for root, _dirs, _files in os.walk(folder):
        for line in (_read(os.path.join(root, "cgroup.procs")) or "").split():
            if line.isdigit():
                pids.add(int(line))
    return pids


def _remove_cgroups(cgroups):
    """Remove the run's cgroups, innermost first (an empty cgroup is removed with rmdir; a busy one stays)."""
    for path in (cgroups or {}).values():
        if not path or not os.path.isdir(path):
            continue
        for root, _dirs, _files in os.walk(path, topdown=False):
            try:
                os.rmdir(root)
            except OSError:
                pass


def _oom_killed(cgroups):
    """Whether the kernel's OOM killer killed a process of the run (its memory limit)."""
    for path, name in (((cgroups or {}).get("v2"), "memory.events"), ((cgroups or {}).get("memory"),
                                                                        "memory.oom_control")):
        for line in ((_read(os.path.join(path, name)) if path else None) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
    return False


# -------------------------------------------------------------------------------- a run's processes


def run_members(info, wrapper_pid=None, scan=True):
    """The live processes of a run: its cgroup's members, and with `scan` (or without a cgroup) the
    descendants of its wrapper (while that lives) and the processes carrying the run's marker."""
    pids = set()
    tracker = _tracker(info)
    if tracker:
        pids.update(p for p in cgroup_pids(tracker) if _live(p))
    if scan or not tracker:
        table = _proc_table()
        if wrapper_pid:
            pids.update(_descendants(table, wrapper_pid))
        pids.update(run_pids(info["run_dir"], table))
    pids.discard(os.getpid())
    pids.discard(wrapper_pid)
    return sorted(pids)


def _reap(reaped):
    """Reap every child that has ended (a subreaper gets the run's orphans), recording (time, pid, status).
    Only the wrapper reaps so: `reaped` None (a helper's status call) reaps nothing, as its children are
    Popen's to wait for."""
    while reaped is not None:
        try:
            pid, status_ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reaped.append((time.time(), pid, status_))


def kill_run(info, wrapper_pid=None, reaped=None, limit_s=STUCK_AFTER_S):
    """SIGKILL every process of the run until none is left (cgroup.kill where there is one, else each
    member, again until the cgroup and the scan find nobody). Returns (stuck, killed): the pids still alive
    after limit_s (D state), and every pid it killed."""
    scan = _tracker(info) is None
    killed = set(run_members(info, wrapper_pid, scan))
    v2 = ((info or {}).get("cgroups") or {}).get("v2")
    if v2 and killed:
        try:
            _cg_write(v2, "cgroup.kill", 1)  # Linux >= 5.14: the whole cgroup at once, forks included
        except OSError:
            pass
    deadline = time.monotonic() + limit_s
    while True:
        _reap(reaped)
        members = run_members(info, wrapper_pid, scan)
        if not members:
            if scan:
                return [], sorted(killed)
            scan = True  # the cgroup is empty: one look for processes that left it
            continue
        if time.monotonic() > deadline:
            return members, sorted(killed)
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.02)


def wait_for_rest(info, wrapper_pid, reaped, deadline):
    """Let the run's other processes end by themselves until `deadline` (after a stop signal: a trainer
    saving its checkpoint); True if none is left."""
    while True:
        _reap(reaped)
        if not run_members(info, wrapper_pid, scan=_tracker(info) is None):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------- launch


# ------------------------------------------------------------------------------------- lab mode: owners
# A lab's controller runs as root (or as a service account through sudo) and starts each run as the user who
# submitted it, looked up here BY NAME: uids may differ between machines, names are what a lab shares. The
# run's control files (spec, handle, exit record, signals) stay root's in a root-owned folder the user may
# pass through (0711) but not write, so nothing the user controls decides whom the wrapper runs as; the
# output log and the checkpoint folder are the user's (0600 / 0700).


def account(name):
    """The node's account `name` as a dict (uid, gid, groups, home, shell), or None if it has none."""
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        groups = sorted(set(os.getgrouplist(name, pw.pw_gid)))
    except OSError:
        groups = [pw.pw_gid]
    return {"name": name, "uid": pw.pw_uid, "gid": pw.pw_gid, "groups": groups, "home": pw.pw_dir,
            "shell": pw.pw_shell or "/bin/sh"}


def users(req):
    """Which of req['names'] exist on this node: {"present": {name: bool}}."""
    names = req.get("names") or []
    return {"present": dict((str(n), account(str(n)) is not None) for n in names)}


def _passable_dirs(base, leaf_parent):
    """Make every folder from `base` down to `leaf_parent` (creating the missing ones) 0711 and ours: a user
    passes through to their own run or checkpoint folder and lists nothing. Only folders under `base`."""
    base = os.path.abspath(base)
    target = os.path.abspath(leaf_parent)
    if target != base and not target.startswith(base.rstrip("/") + "/"):
        raise ValueError("%s is not under %s" % (target, base))
    parts = [base]
    rest = os.path.relpath(target, base)
    if rest != ".":
        for part in rest.split("/"):
            parts.append(os.path.join(parts[-1], part))
    for d in parts:
        try:
            os.mkdir(d, 0o711)
        except FileExistsError:
            pass
        st = os.lstat(d)
        if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid():
            raise ValueError("%s: not a folder of this account's" % d)
        if st.st_mode & 0o777 != 0o711:
            os.chmod(d, 0o711)


def _give(path, acct, mode):
    """Create `path` (a file if mode has no x bits, else a folder) owned by the account, with `mode`; an
    existing one is taken over, never followed if it is a link."""
    if mode & 0o111:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
        if os.path.islink(path) or not os.path.isdir(path):
            raise ValueError("%s: not a folder" % path)
        # what a checkpoint copy brought in as root becomes the user's. fwalk works on folder descriptors and
        # never follows a link, so a user who swaps a subfolder for a link to /etc meanwhile gains nothing
        for _top, dirs, files, top_fd in os.fwalk(path, follow_symlinks=False):
            for n in dirs + files:
                try:
                    if os.stat(n, dir_fd=top_fd, follow_symlinks=False).st_uid == os.geteuid():
                        os.chown(n, acct["uid"], acct["gid"], dir_fd=top_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), mode))
    os.chown(path, acct["uid"], acct["gid"], follow_symlinks=False)
    os.chmod(path, mode)


def _owner_of(req):
    """The account the run is for: None to run as this helper's own user; a dict to drop to; or an error."""
    name = req.get("user")
    if not name:
        if CONFINE is not None:
            raise Refused("this helper starts runs only as a named user")
        return None, None
    acct = account(name)
    if acct is None:
        return None, {"error": "user %s does not exist on this node" % name, "no_such_user": name}
    if CONFINE is not None and acct["uid"] < MIN_UID:
        # the service account may start jobs as the lab's users, never as root or a system account
        raise Refused("this helper starts no job as %s (uid %d): only as users with a uid of at least %d"
                      % (name, acct["uid"], MIN_UID))
    if acct["uid"] == os.geteuid():
        return None, None
    if os.geteuid() != 0:
        return None, {"error": "this node's helper runs as uid %d and cannot start a job as %s: connect as root "
                               "(or through the service account's sudo rule)" % (os.geteuid(), name)}
    return acct, None


def launch(req):
    """Start the run in req['run_dir'] detached. The folder is the launch lock: created once, never reused."""
    run_dir = _inside(req["run_dir"])
    parent = os.path.dirname(run_dir.rstrip("/"))
    acct, refused = _owner_of(req)
    if refused is not None:
        return refused
    ckpt = (req.get("env") or {}).get("HSCHED_CHECKPOINT_DIR")
    if CONFINE is not None:
        # every path checked before anything is made; every folder from ROOT down is made (or checked to
        # be) root's, so the account cannot lay a link there
        req = dict(req, base_dir=_inside(req.get("base_dir") or CONFINE))
        ckpt = ckpt and _inside(ckpt)
    if acct is not None:
        _passable_dirs(req.get("base_dir") or parent, parent)
    else:
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        # launched before (a retried request after a lost reply): report that run, never start another
        return _existing(run_dir, wait_s=5.0)
    # whatever the umask: a run's output and environment are its owner's only (a user's run: its control files
    # root's, the folder passable so that its owner reaches the log in it)
    os.chmod(run_dir, 0o711 if acct is not None else 0o700)
    if acct is not None:
        _give(os.path.join(run_dir, "output.log"), acct, 0o600)
        _give(os.path.join(run_dir, PROGRESS_FILE), acct, 0o600)
        _give(os.path.join(run_dir, "signals.log"), acct, 0o600)
        if ckpt:
            _passable_dirs(req.get("base_dir") or os.path.dirname(ckpt), os.path.dirname(ckpt))
            _give(ckpt, acct, 0o700)
    write_json_atomic(os.path.join(run_dir, "spec.json"), {
        "account": acct,
        "command": req["command"], "env": req.get("env") or {}, "workdir": req.get("workdir"),
        "inherit_env": bool(req.get("inherit_env", False)), "cpus": req.get("cpus") or [],
        "memory_mib": req.get("memory_mib"), "cpu_limit": req.get("cpu_limit"),
        "devices": list(req.get("devices") or []), "checkpoint_exit_code": req.get("checkpoint_exit_code"),
        "stop_grace_s": req.get("stop_grace_s", 30.0),
        # sbatch's --output/--error, expanded by the controller; the wrapper opens them as the run's user
        "output": req.get("output") or None, "error": req.get("error") or None,
        "truncate_output": bool(req.get("truncate_output", False)),
    })
    wlog = _private_fd(os.path.join(run_dir, "wrapper.log"), os.O_WRONLY | os.O_APPEND)
    try:
        with open(os.devnull, "rb") as devnull_in:
            wrapper = subprocess.Popen(_helper_argv("_wrap", run_dir), stdin=devnull_in, stdout=wlog,
                                       stderr=wlog, start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(wlog)
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


def _set_subreaper():
    """Orphans of the run come back to the wrapper (not to init), so it reaps them and sees their exit codes."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _start_job(spec, env, workdir, log_fd, cpus, cgroups, acct=None, err_fd=None):
    procs_files = [os.path.join(cgroups[k], "cgroup.procs") for k in ("v2", "memory", "cpu") if cgroups.get(k)]

    def prepare():
        # in the child, before exec: into the run's cgroups first, so everything it starts is inside; a
        # failure here fails the start, and the wrapper starts it again without cgroups
        pid = str(os.getpid())
        for path in procs_files:
            with open(path, "w") as f:
                f.write(pid)
        _restore_signals()
        if cpus:
            os.sched_setaffinity(0, cpus)
        if acct:
            # the user's identity last (joining the cgroups needed root's); then their working folder, entered
            # as them: a folder they may not enter fails the run as "cannot execute", never runs it elsewhere
            os.setgroups(acct["groups"])
            os.setresgid(acct["gid"], acct["gid"], acct["gid"])
            os.setresuid(acct["uid"], acct["uid"], acct["uid"])
            try:
                os.chdir(workdir)
            except OSError as e:
                os.write(1, ("hsched: cannot enter %s as %s: %s\n" % (workdir, acct["name"], e.strerror)).encode())
                os._exit(126)

    return subprocess.Popen(spec["command"], cwd=None if acct else workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=log_fd, stderr=log_fd if err_fd is None else err_fd, start_new_session=True,
                            close_fds=True, preexec_fn=prepare)


# ------------------------------------------------------------------- sbatch's --output and --error files
# The run's stdout and stderr always reach its folder's output.log (`hsched logs`, the GPU out-of-memory check).
# With --output/--error they also reach the user's files: the job writes into a pipe and a thread of the wrapper
# copies each chunk to output.log and to the file, at once, so `tail -f slurm-12.out` follows the job live. The
# files are opened with the user's own rights (a root wrapper takes their identity for the open only), so a
# pattern can never make root write where the user may not; they are opened to append, so a requeued run
# keeps what the first attempt wrote (the controller asks to empty them only for a job's first start).

PUMP_DRAIN_S = 5.0  # after the run ended, how long output still in the pipe may take to be copied
PIPE_BYTES = 1 << 20


def _open_as(path, workdir, acct, truncate):
    """The user's output file `path` (relative to the run's working folder), opened to append as the run's
    user: created 0644 (less the umask) when missing, emptied first if `truncate`."""
    full = os.path.join(workdir, path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
    if not acct:
        return os.open(full, flags, 0o644)
    groups, egid, euid = os.getgroups(), os.getegid(), os.geteuid()
    try:
        os.setgroups(acct["groups"])
        os.setegid(acct["gid"])
        os.seteuid(acct["uid"])
        return os.open(full, flags, 0o644)
    finally:
        os.seteuid(euid)
        os.setegid(egid)
        os.setgroups(groups)


def _pump(src, log_fd, path, fd):
    """Copy what the run writes to the pipe `src` onto output.log and the user's file `fd` until every writer
    is gone. A failing user file (a full disk, a quota) is said once in output.log and left; the log goes on."""
    broken = False
    while True:
        try:
            data = os.read(src, PIPE_BYTES)
        except OSError:
            break
        if not data:
            break
        for out in (log_fd, fd):
            if out == fd and broken:
                continue
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            except OSError as e:
                if out == fd:
                    broken = True
                    _write_quietly(log_fd, "hsched: writing %s failed (%s): the rest is in `hsched logs` only\n"
                                   % (path, e.strerror))
    os.close(src)


def _write_quietly(fd, text):
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


class _Outputs:
    """The run's stdout and stderr file descriptors, and the pumps behind them when the job has user files."""

    def __init__(self, spec, workdir, acct, log_fd):
        self.log_fd = log_fd
        self.stdout = self.stderr = log_fd
        self._pipes = []  # (read end, write end, user file path, user file fd)
        self._threads = []
        output, error = spec.get("output"), spec.get("error")
        if error == output:
            error = None  # one file for both streams: one pipe, so their lines stay in order
        truncate = bool(spec.get("truncate_output"))
        try:
            if output:
                self.stdout = self.stderr = self._pipe(output, _open_as(output, workdir, acct, truncate))
            if error:
                self.stderr = self._pipe(error, _open_as(error, workdir, acct, truncate))
        except OSError:
            self._close_pipes()  # the log stays open: the wrapper says there why the job did not start
            raise

    def _pipe(self, path, fd):
        r, w = os.pipe()
        try:
            # a bigger pipe: a job that prints a lot is copied in fewer, larger chunks (F_SETPIPE_SZ: Linux)
            import fcntl

            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        except (ImportError, OSError):
            pass  # over the unprivileged limit (/proc/sys/fs/pipe-max-size): the default 64 KiB does
        self._pipes.append((r, w, path, fd))
        return w

    def started(self):
        """The job has its copies of the write ends: drop ours (the pumps see the end when the run's are gone)
        and start copying."""
        for r, w, path, fd in self._pipes:
            os.close(w)
            t = threading.Thread(target=_pump, args=(r, self.log_fd, path, fd))
            t.daemon = True  # a writer stuck in the kernel must not keep the wrapper from exiting
            t.start()
            self._threads.append(t)
        self._pipes = [(None, None, path, fd) for _r, _w, path, fd in self._pipes]

    def drain(self, wait_s=PUMP_DRAIN_S):
        """Wait (bounded) for what is left in the pipes to be copied, once no process of the run is left."""
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def close(self):
        """Close what no pump uses any more (a pump still running keeps its files: the process ends soon)."""
        if any(t.is_alive() for t in self._threads):
            return
        self._close_pipes()
        os.close(self.log_fd)

    def _close_pipes(self):
        for r, w, _path, fd in self._pipes:
            for x in (r, w, fd):
                if x is not None:
                    os.close(x)
        self._pipes = []


def _decode(status_):
    """(exit code, signal) of a wait status: 128 + N and N for a death by signal N."""
    if os.WIFSIGNALED(status_):
        sig = os.WTERMSIG(status_)
        return 128 + sig, sig
    return os.WEXITSTATUS(status_), None


def sent_signals(run_dir):
    """[(time, signal number)] of every signal hsched sent to the run to end it (signals.log); a checkpoint
    signal (`hsched checkpoint`: go on afterwards) is not one."""
    out = []
    try:
        with open(os.path.join(run_dir, "signals.log")) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    if rec.get("purpose") == "checkpoint":
                        continue
                    out.append((float(rec["t"]), int(rec["number"])))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def wrap(run_dir):
    """The run's owner: start the job contained, wait for it and for every process it left, record the end."""
    if CONFINE is not None:
        # `_wrap` can be asked for through sudo too: only a run folder and spec this helper made, for a user
        run_dir = _inside(run_dir)
        _own(run_dir)
        _own(os.path.join(run_dir, "spec.json"))
    spec = read_json(os.path.join(run_dir, "spec.json")) or {}
    if CONFINE is not None:
        acct = spec.get("account")
        if not isinstance(acct, dict) or int(acct.get("uid", 0)) < MIN_UID:
            raise Refused("%s: this helper runs jobs only as users with a uid of at least %d" % (run_dir, MIN_UID))
    if spec.get("inherit_env"):
        env = dict(os.environ)
    else:
        # a login's basics on this node, never the controller machine's paths
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        for k in ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR"):
            if k in os.environ:
                env[k] = os.environ[k]
    acct = spec.get("account")
    if acct:
        # the user's own login basics, never root's
        env.update({"HOME": acct["home"], "USER": acct["name"], "LOGNAME": acct["name"], "SHELL": acct["shell"]})
    env.update(spec.get("env") or {})
    env[RUN_MARKER] = run_dir
    # where the job reports its progress (hsched.progress.report, or lines of its own); the watch reads it
    env.setdefault(PROGRESS_ENV, os.path.join(run_dir, PROGRESS_FILE))
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)  # signals are for the job; the wrapper must live to write the code
    # a shared run's GPU gets its MPS daemon before the wrapper becomes a subreaper (the daemon must not be
    # adopted by it: it is no process of this run) and before the job starts (CUDA looks for it at init)
    mps = mps_begin(run_dir, env)
    swept = mps_sweep(spec.get("devices") or []) if mps is None else []
    subreaper = _set_subreaper()
    # a user's run starts in their home (its folder is root's); hsched's own runs in the run folder
    workdir = spec.get("workdir") or (acct["home"] if acct and os.path.isdir(acct["home"]) else None) or run_dir
    if acct and workdir == run_dir:
        workdir = "/"
    cpus = _usable_cpus(spec.get("cpus") or [])
    if cpus:
        env["HSCHED_CPUS"] = ",".join(str(c) for c in cpus)
    cgroups, enforced, errors = make_cgroups(run_dir, spec)
    log_fd = _private_fd(os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_APPEND)
    try:
        outputs = _Outputs(spec, workdir, acct, log_fd)
    except OSError as e:
        # as sbatch: a job whose output file cannot be opened (a missing folder, no permission) fails at once
        line = "hsched: cannot open the output file %s%s: %s\n" % (
            e.filename or "", (" as %s" % acct["name"]) if acct else "", e.strerror)
        os.write(log_fd, line.encode())
        mps_end(run_dir, mps)
        return _not_started(run_dir, log_fd, cgroups, errors, e, 1)
    try:
        try:
            child = _start_job(spec, env, workdir, outputs.stdout, cpus, cgroups, acct, outputs.stderr)
        except subprocess.SubprocessError as e:  # the child could not join its cgroups: contain it without them
            errors.append("joining the run's cgroups failed (%s): process group only" % e)
            _remove_cgroups(cgroups)
            cgroups, enforced = {}, []
            child = _start_job(spec, env, workdir, outputs.stdout, cpus, cgroups, acct, outputs.stderr)
    except OSError as e:
        os.write(log_fd, ("hsched: cannot start %r: %s\n" % (spec["command"][0], e.strerror)).encode())
        outputs.close()
        mps_end(run_dir, mps)
        return _not_started(run_dir, None, cgroups, errors, e, 127 if isinstance(e, FileNotFoundError) else 126)
    outputs.started()
    info = _handle(run_dir, child.pid, proc_start_ticks(child.pid) or _stat_ticks(child.pid), cgroups, enforced,
                   errors)
    info["subreaper"] = subreaper
    if mps is not None:
        info["mps"] = mps  # recorded once: MPS started or joined, or why the GPU is time-sliced without it
    if swept:
        info["mps_swept"] = swept  # an MPS daemon no shared run needed any more, stopped before this job began
    write_json_atomic(os.path.join(run_dir, "handle.json"), info)
    me = os.getpid()
    reaped = []  # (time, pid, wait status) of every other process of the run that ended as our child
    main_status = None
    while main_status is None:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the child is ours; never spin on it
            main_status = 255 << 8
            break
        if pid == child.pid:
            main_status = st
        else:
            reaped.append((time.time(), pid, st))
    end_time = time.time()
    code, sig = _decode(main_status)
    child.returncode = -sig if sig else code  # reaped here, not by Popen: it must not wait for it again
    if sent_signals(run_dir):
        # hsched is stopping the run: the rest may be saving a checkpoint; the controller escalates if they
        # take too long, and we end them ourselves if it does not
        wait_for_rest(info, me, reaped, time.monotonic() + float(spec.get("stop_grace_s") or 0) + STOP_MARGIN_S)
    stuck, killed = kill_run(info, me, reaped)
    _reap(reaped)
    # every process of the run is gone: the last of its output reaches output.log and the user's files before
    # the log is read below and the end is recorded
    outputs.drain()
    outputs.close()
    record = {"exit_code": code, "signal": sig, "end_time": end_time}
    ckpt = spec.get("checkpoint_exit_code")
    sent = sent_signals(run_dir)
    if sig is not None and ckpt is not None and sig in [n for _t, n in sent]:
        # the main process (say `bash -c "python3 train.py; true"`) died of the signal hsched sent, and a
        # process of the run then saved its checkpoint and exited with the checkpoint code: the run did
        first = min(t for t, _n in sent)
        if any(t >= first and os.WIFEXITED(s) and os.WEXITSTATUS(s) == int(ckpt) for t, _p, s in reaped):
            record.update({"exit_code": int(ckpt), "signal": None, "main_exit": {"exit_code": code, "signal": sig}})
    record["oom"] = _oom_killed(cgroups)
    if code != 0 and not sent:
        line = gpu_oom_line(os.path.join(run_dir, "output.log"))
        if line is not None:
            record.update({"gpu_oom": True, "gpu_oom_line": line})
    record["usage"] = cgroupstats.final(cgroups)  # the cgroup's totals, read before it is removed
    _remove_cgroups(cgroups)
    mps_end_rec = mps_end(run_dir, mps)  # before the GPU check: the last shared run's daemon is gone by then
    if mps_end_rec is not None:
        record["mps"] = mps_end_rec
    holders, gpu_error = gpu_holders(spec.get("devices") or [])
    if mps is not None:
        holders = others_on_shared_gpu(holders, run_dir)  # the GPU's other runs are not left behind by this one
    record.update({"gpu_left": holders, "stuck_pids": stuck, "leftovers_killed": len(killed),
                   "containment": info["containment"]})
    if gpu_error:
        record["gpu_check_error"] = gpu_error
    # written last: a reported exit means no process of the run is left (but `stuck_pids`)
    write_json_atomic(os.path.join(run_dir, "exit.json"), record)
    return 0


def _not_started(run_dir, log_fd, cgroups, errors, e, code):
    """Record a run whose job never started (exit `code`): its handle, then its exit record."""
    if log_fd is not None:
        os.close(log_fd)
    _remove_cgroups(cgroups)
    write_json_atomic(os.path.join(run_dir, "handle.json"), _handle(run_dir, os.getpid(), None, {}, [], errors))
    write_json_atomic(os.path.join(run_dir, "exit.json"), {
        "exit_code": code, "signal": None, "end_time": time.time(), "error": str(e), "oom": False,
        "gpu_left": [], "stuck_pids": []})
    return 0


# what CUDA, PyTorch, TensorFlow and JAX print when a GPU runs out of memory
GPU_OOM_PATTERNS = ("CUDA out of memory", "CUDA error: out of memory", "OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY",
                    "cudaErrorMemoryAllocation", "RESOURCE_EXHAUSTED: Out of memory",
                    "HIP out of memory", "hipErrorOutOfMemory")
GPU_OOM_TAIL = 64 * 1024


def gpu_oom_line(path):
    """The last line of the log's tail that says a GPU ran out of memory, or None. Read without following a
    link (a lab user's log is theirs)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - GPU_OOM_TAIL), os.SEEK_SET)
        tail = os.read(fd, GPU_OOM_TAIL).decode("utf-8", "replace")
    finally:
        os.close(fd)
    for line in reversed(tail.splitlines()):
        low = line.lower()
        if any(p.lower() in low for p in GPU_OOM_PATTERNS) and ("memory" in low or "allocate" in low):
            return line.strip()[:300]
    return None


def _stat_ticks(pid):
    st = _proc_stat(pid)  # a child that already ended is a zombie until we reap it: its start time is there
    return st[4] if st is not None else None


def _usable_cpus(wanted):
    """The wanted cores this process may run on (a job is pinned to the cores local to its GPUs)."""
    if not wanted or not hasattr(os, "sched_getaffinity"):
        return []
    allowed = os.sched_getaffinity(0)
    return sorted(c for c in wanted if c in allowed)


def _restore_signals():
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)


def _handle(run_dir, child_pid, child_ticks, cgroups, enforced, errors):
    me = os.getpid()
    info = {"run_dir": run_dir, "pid": me, "pgid": child_pid, "start_ticks": proc_start_ticks(me) or 0,
            "boot_id": boot_id(), "child_start_ticks": child_ticks,
            "containment": "cgroup" if cgroups else "pgroup", "cgroups": cgroups, "enforced": enforced}
    if errors:
        info["cgroup_errors"] = errors
    return info


_COMPUTE_APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"


def parse_compute_apps(text):
    """[{uuid, pid, name, used_memory_mib}] from `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,
    used_memory --format=csv,noheader,nounits` (a process name may hold commas: it is what lies between)."""
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 3 or not f[1].isdigit():
            continue  # "No running processes found" and the like
        name = ",".join(f[2:-1]).strip() if len(f) >= 4 else f[2]
        try:
            used = int(float(f[-1])) if len(f) >= 4 else None
        except ValueError:
            used = None  # "[N/A]"
        out.append({"uuid": f[0], "pid": int(f[1]), "name": name, "used_memory_mib": used})
    return out


def gpu_holders(devices, timeout_s=GPU_CHECK_TIMEOUT_S):
    """The processes that hold any of `devices` (GPU UUIDs) now, and why the check failed if it did."""
    if not devices:
        return [], None
    exe = shutil.which("nvidia-smi")
    if not exe:
        return [], None
    r = run_bounded([exe, _COMPUTE_APPS, "--format=csv,noheader,nounits"], timeout_s, "nvidia-smi",
                    new_session=False)
    if r["error"] is not None:
        return [], r["error"]
    if r["rc"] != 0:
        return [], "nvidia-smi failed (exit status %s): %s" % (r["rc"], r["err"] or "no output")
    wanted = set(devices)
    apps = parse_compute_apps(r["out"].decode("utf-8", "replace"))
    return [{"uuid": a["uuid"], "pid": a["pid"], "name": a["name"]} for a in apps if a["uuid"] in wanted], None


# ------------------------------------------------------------------------- GPUs shared by several runs: MPS
# A shared run (`--shared`: several runs packed on one GPU by memory) carries HSCHED_SHARED_GPU=<uuid>, and the
# controller points its CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY at <base>/nvidia-mps[-log]-<uuid>: one
# MPS control daemon per GPU. The wrapper makes sure that daemon runs before the job starts and stops it when
# the GPU's last shared run has ended, so an exclusive job later gets the GPU without MPS. A node without
# nvidia-cuda-mps-control runs the job anyway: the runs of that GPU are time-sliced, and handle.json says so.
#
# Who runs the daemon: this helper's account, that is root in a lab. NVIDIA's multi-user recipe starts the
# control daemon as root: it spawns one MPS server per client uid, as that uid, which needs root's rights; a
# daemon of a dedicated unprivileged account could serve that account's own clients only. So the daemon is
# started as root but with an environment made here from nothing (never the job's: no LD_PRELOAD of a user's
# reaches a root process) and found on the helper's own PATH (never the job's). Its folders are root's, 0755:
# every user's client must reach the `control` socket in the pipe folder (the daemon makes that socket 0666
# itself), and nothing a user controls lies on the way (a folder someone else made first is refused, not used).
# A helper that is not root serves its own runs only: its folders are 0700.
#
# MPS serves one uid at a time per daemon: a client of another user waits until the running server's clients
# are done (NVIDIA's documented behaviour), so two users' shared runs on one GPU take turns rather than overlap.

SHARED_GPU_ENV = "HSCHED_SHARED_GPU"
MPS_BASE = "/tmp/hsched-mps"
"""Where the per-GPU pipe and log folders live (the controller's contract names the same folder)."""
MPS_BASE_ENV = "HSCHED_MPS_BASE"
"""Another base folder, read from the helper's own environment (tests); ignored under --confine."""
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_PID_FILE = "nvidia-cuda-mps-control.pid"
"""What the control daemon writes into its pipe folder while it runs (gone when it quits; `control` stays)."""
MPS_START_S = 10.0
MPS_QUIT_S = 10.0
_MPS_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,100}$")
"""A GPU (or MIG instance) UUID as NVML names it: it becomes part of folder names, so nothing else is taken."""


def mps_base():
    if CONFINE is None and os.environ.get(MPS_BASE_ENV):
        return os.path.abspath(os.environ[MPS_BASE_ENV])
    return MPS_BASE


def mps_dirs(uuid):
    """(pipe folder, log folder, hsched's own state folder) of the GPU's MPS control daemon."""
    base = mps_base()
    return (os.path.join(base, "nvidia-mps-" + uuid), os.path.join(base, "nvidia-mps-log-" + uuid),
            os.path.join(base, "hsched-" + uuid))


def _our_folder(path, mode):
    """Make `path` a folder of this account with `mode` (creating it); refuse one that another account made
    or a link (/tmp is everyone's: a user could lay either there first)."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if os.path.islink(path) or not os.path.isdir(path) or st.st_uid != os.geteuid():
        raise ValueError("%s is not a folder of uid %d (made by someone else?)" % (path, os.geteuid()))
    if st.st_mode & 0o7777 != mode:
        os.chmod(path, mode)


def mps_daemon_pid(pipe):
    """The pid of the live control daemon of this pipe folder (its pid file names a running
    nvidia-cuda-mps-control), or None."""
    text = _read(os.path.join(pipe, MPS_PID_FILE))
    try:
        pid = int(text or "")
    except ValueError:
        return None
    if pid <= 0 or not _live(pid):
        return None
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    return pid if MPS_CONTROL.encode() in cmdline else None  # a reused pid is some other program


class _FolderLock(object):
    """An exclusive flock on a file of the GPU's state folder: two shared runs starting at once on one GPU
    start one daemon, and a run that ends never stops the daemon a starting run has just counted on."""

    def __init__(self, folder):
        self.path = os.path.join(folder, "lock")
        self.fd = -1

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock
        return False


def _mps_users(state, drop=None):
    """The run folders of the live shared runs counted on the GPU (their wrappers alive); the entries of
    wrappers that are gone (killed, a reboot) and the one of `drop` are removed."""
    live = []
    for name in sorted(os.listdir(state)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(state, name)
        rec = read_json(path)
        ok = isinstance(rec, dict) and rec.get("run_dir") != drop and rec.get("boot_id") == boot_id()
        if ok:
            try:
                ok = proc_start_ticks(int(rec["pid"])) == int(rec["start_ticks"])
            except (KeyError, TypeError, ValueError):
                ok = False
        if ok:
            live.append(rec["run_dir"])
        else:
            _unlink(path)
    return live


def _mps_entry(state, run_dir):
    return os.path.join(state, hashlib.sha256(run_dir.encode()).hexdigest()[:24] + ".json")


def _mps_env(exe, uuid, pipe, log):
    """The daemon's environment, made here: none of the job's variables reaches a daemon that runs as root."""
    return {"PATH": os.path.dirname(exe) + os.pathsep + "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}


def _mps_control():
    """nvidia-cuda-mps-control on the helper's own PATH (never the job's: it runs with this helper's rights)."""
    return shutil.which(MPS_CONTROL, path=os.environ.get("PATH") or os.defpath)


def _start_mps_daemon(exe, uuid, pipe, log, state):
    """Start the GPU's control daemon (`-d`: it forks into the background) and wait until its pid file names
    it. Returns (pid, None) or (None, why not)."""
    out_path = os.path.join(state, "control-start.out")
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        # a session of its own, started before the wrapper becomes a subreaper: the daemon it forks is
        # adopted by init, so it is no process of this run (the run's end kills all of those) and outlives it
        proc = subprocess.Popen([exe, "-d"], env=_mps_env(exe, uuid, pipe, log), stdin=subprocess.DEVNULL,
                                stdout=fd, stderr=fd, start_new_session=True, close_fds=True, cwd="/")
    except OSError as e:
        return None, "%s -d could not start: %s" % (exe, e)
    finally:
        os.close(fd)
    deadline = time.monotonic() + MPS_START_S
    try:
        rc = proc.wait(timeout=MPS_START_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, "%s -d did not return within %g s" % (exe, MPS_START_S)
    said = (_read(out_path) or "")[-300:]
    if rc != 0:
        return None, "%s -d failed (exit status %s)%s" % (exe, rc, (": " + said) if said else "")
    while True:  # the daemon writes its pid file once it listens; polled, bounded
        pid = mps_daemon_pid(pipe)
        if pid is not None:
            return pid, None
        if time.monotonic() > deadline:
            return None, "the MPS control daemon wrote no %s in %s within %g s (see %s)" % (
                MPS_PID_FILE, pipe, MPS_START_S, log)
        time.sleep(0.01)


def mps_begin(run_dir, env):
    """Before a shared run's job starts: count the run on its GPU and make sure the GPU's MPS control daemon
    runs. Returns what handle.json records ({gpu, state: started | joined | absent | failed | refused, daemon,
    detail}), or None for a run that is not shared. Never fails the run: CUDA without a daemon runs the job
    without MPS (time-sliced), which the record says."""
    uuid = env.get(SHARED_GPU_ENV)
    if not uuid:
        return None
    rec = {"gpu": uuid}
    exe = _mps_control()
    if exe is None:
        rec.update(state="absent", detail="no %s on this node: the GPU's shared runs are time-sliced, without MPS"
                   % MPS_CONTROL)
        return rec
    if not _MPS_UUID.match(uuid):
        rec.update(state="refused", detail="%s=%r is no GPU UUID: no MPS daemon started" % (SHARED_GPU_ENV, uuid))
        return rec
    pipe, log, state = mps_dirs(uuid)
    for name, want in (("CUDA_MPS_PIPE_DIRECTORY", pipe), ("CUDA_MPS_LOG_DIRECTORY", log)):
        if env.get(name) != want:
            # the daemon's folders come from the UUID, never from a path the run's request names
            rec.update(state="refused", detail="the run's %s is %r, not %s: no MPS daemon started"
                       % (name, env.get(name), want))
            return rec
    mode = 0o755 if os.geteuid() == 0 else 0o700
    try:
        _our_folder(mps_base(), mode)
        _our_folder(pipe, mode)
        _our_folder(log, mode)
        _our_folder(state, 0o700)
        with _FolderLock(state):
            _mps_users(state)
            me = os.getpid()
            write_json_atomic(_mps_entry(state, run_dir), {"run_dir": run_dir, "pid": me, "boot_id": boot_id(),
                                                           "start_ticks": proc_start_ticks(me)})
            rec["counted"] = True
            pid = mps_daemon_pid(pipe)
            if pid is not None:
                rec.update(state="joined", daemon=pid)
                return rec
            pid, why = _start_mps_daemon(exe, uuid, pipe, log, state)
    except (OSError, ValueError) as e:
        rec.update(state="failed", detail="MPS for %s: %s" % (uuid, e))
        return rec
    if pid is None:
        rec.update(state="failed", detail=why)
    else:
        rec.update(state="started", daemon=pid)
    return rec


def _mps_quit(uuid, pipe, log, pid, out):
    """`echo quit | nvidia-cuda-mps-control` for the GPU's daemon `pid`, then wait for it to go (it quits once
    its servers have); `out` gets `stopped` (the pid) or `error`. Called under the GPU's lock."""
    exe = _mps_control()
    if exe is None:
        out["error"] = "%s is gone from PATH: daemon %d left running" % (MPS_CONTROL, pid)
        return out
    r = subprocess.run([exe], input=b"quit\n", env=_mps_env(exe, uuid, pipe, log), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=MPS_QUIT_S, close_fds=True, cwd="/", start_new_session=True)
    deadline = time.monotonic() + MPS_QUIT_S
    while _live(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if _live(pid):
        out["error"] = "daemon %d still runs %g s after quit (exit status %d: %s)" % (
            pid, MPS_QUIT_S, r.returncode, r.stdout.decode("utf-8", "replace").strip()[-300:])
    else:
        out["stopped"] = pid
    return out


def mps_end(run_dir, rec):
    """After every process of a shared run is gone: uncount it; the GPU's last shared run stops the daemon
    (`echo quit | nvidia-cuda-mps-control`) and waits for it to go, so that the exit record, once written,
    means an exclusive job may have the GPU without MPS. Returns what exit.json records (None: nothing)."""
    if not rec or not rec.get("counted"):
        return None
    uuid = rec["gpu"]
    pipe, log, state = mps_dirs(uuid)
    out = {"gpu": uuid}
    try:
        with _FolderLock(state):
            left = _mps_users(state, drop=run_dir)
            out["runs_left"] = len(left)
            pid = mps_daemon_pid(pipe)
            if not left and pid is not None:
                _mps_quit(uuid, pipe, log, pid, out)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        out["error"] = "stopping MPS for %s: %s" % (uuid, e)
    return out


def mps_sweep(devices):
    """Before a run that is not shared: stop hsched's MPS daemon on any of its GPUs that no live shared run
    counts on any more (theirs ended with their wrapper killed, or the node's helper went down mid-run), so
    the run gets its GPUs without MPS. A daemon some live shared run still counts on is left alone. Returns
    [{gpu, stopped | error}] for what it found."""
    out = []
    for uuid in devices:
        uuid = str(uuid)
        if not _MPS_UUID.match(uuid):
            continue
        pipe, log, state = mps_dirs(uuid)
        try:
            st = os.lstat(state)
        except OSError:
            continue  # no shared run of hsched's ever ran on this GPU (since the last boot)
        if not os.path.isdir(state) or os.path.islink(state) or st.st_uid != os.geteuid():
            continue  # not ours: never act on what someone else laid there
        rec = {"gpu": uuid}
        try:
            with _FolderLock(state):
                pid = mps_daemon_pid(pipe)
                if pid is None or _mps_users(state):
                    continue
                out.append(_mps_quit(uuid, pipe, log, pid, rec))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            rec["error"] = "stopping MPS for %s: %s" % (uuid, e)
            out.append(rec)
    return out


def run_marker(pid):
    """The HSCHED_RUN_DIR a process carries (the run it belongs to), or None (unreadable, or none)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    prefix = (RUN_MARKER + "=").encode()
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def others_on_shared_gpu(holders, run_dir):
    """The GPU holders left after a shared run, less those that are meant to be there: processes of the GPU's
    other runs (their marker names another run) and the MPS daemon and server. What is left is a stranger."""
    out = []
    for h in holders:
        name = os.path.basename(str(h.get("name") or ""))
        marker = run_marker(int(h["pid"]))
        if name.startswith("nvidia-cuda-mps") or (marker is not None and marker != run_dir):
            continue
        out.append(h)
    return out


# ---------------------------------------------------------------------------------------------- status


def _alive(handle):
    if handle.get("boot_id") != boot_id():
        return False
    ticks = proc_start_ticks(int(handle["pid"]))
    return ticks is not None and ticks == int(handle["start_ticks"])


def valid_exit_record(rec):
    """The exit record if it is one this helper could have written, else None: a dict whose exit code is an
    integer from 0 to 255 (not a boolean). A torn or hand-made file must never become an exit code (or crash
    the reply about every other run of the node)."""
    if not isinstance(rec, dict):
        return None
    code = rec.get("exit_code")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        return None
    return rec


def _number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _exited(exit_info, handle):
    """The report of a run with a sound exit code; what else the record says is passed on only if it is
    well formed (a garbage end time is no end time: the controller uses the moment it learnt of the end)."""
    left = exit_info.get("gpu_left")
    holders = [h for h in left if isinstance(h, dict)] if isinstance(left, list) else []
    sig = exit_info.get("signal")
    return {"status": "exited", "exit_code": exit_info["exit_code"],
            "signal": sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
            "end_time": _number(exit_info.get("end_time")), "oom": exit_info.get("oom") is True,
            "gpu_oom": exit_info.get("gpu_oom") is True,
            "gpu_oom_line": str(exit_info.get("gpu_oom_line") or "")[:300] or None,
            "gpu_left": holders, "handle": handle, "usage": cgroupstats.clean(exit_info.get("usage"))}


def _run_info(run_dir, handle):
    """handle.json of the run (its containment), if it is the record of this very run."""
    info = read_json(os.path.join(run_dir, "handle.json"))
    if not isinstance(info, dict) or int(info.get("pid", -1)) != int(handle["pid"]):
        info = dict(handle)
    info["run_dir"] = run_dir
    return info


def end_remains(run_dir, handle, wait_s=2.0):
    """Kill what is left of a run whose wrapper is gone (its cgroup, its marker) and wait up to wait_s for it
    to go; returns the pids still alive. Once none is, its cgroups are removed."""
    info = _run_info(run_dir, handle)
    stuck, _killed = kill_run(info, None, None, limit_s=wait_s)
    if not stuck:
        _remove_cgroups(info.get("cgroups"))
    return stuck


def _disk_handle(run_dir):
    """Under --confine: the handle this helper wrote for the run in `run_dir` (None: none there), never what a
    request says (a made-up handle would have root kill or signal any process)."""
    run_dir = _inside(run_dir)
    if not os.path.isdir(run_dir):
        return None
    _own(run_dir)
    handle = read_json(os.path.join(run_dir, "handle.json"))
    if not isinstance(handle, dict):
        return None
    handle["run_dir"] = run_dir
    return handle


def run_status(item):
    run_dir = item["run_dir"]
    if CONFINE is not None:
        handle = _disk_handle(run_dir)
    else:
        handle = item.get("handle") or read_json(os.path.join(run_dir, "handle.json"))
    if handle is None:
        if not os.path.isdir(run_dir):
            return {"status": "not_started"}
        spec_seen = os.path.exists(os.path.join(run_dir, "spec.json"))
        return {"status": "lost" if spec_seen else "not_started", "detail": "no handle recorded"}
    exit_info = valid_exit_record(read_json(os.path.join(run_dir, "exit.json")))
    if exit_info is not None:
        return _exited(exit_info, handle)
    if _alive(handle):
        return {"status": "running", "handle": handle}
    # the wrapper may have written exit.json between the two looks
    exit_info = valid_exit_record(read_json(os.path.join(run_dir, "exit.json")))
    if exit_info is not None:
        return _exited(exit_info, handle)
    # the wrapper is gone without an exit record: lost, but only once nothing of the run runs any more
    if handle.get("boot_id") == boot_id():
        left = end_remains(run_dir, handle)
        if left:
            return {"status": "running", "handle": handle,
                    "detail": "the run's wrapper is gone; killing what is left of it: pids %s" % left}
    return {"status": "lost", "handle": handle, "detail": "process gone without an exit code"}


def status(req):
    return {"runs": [_one_status(item) for item in req.get("runs", [])]}


def _one_status(item):
    """One run's report; a failure reading it is that run's, never the whole reply's (every other run of the
    node would stay unreported)."""
    try:
        return run_status(item)
    except Exception as e:
        return {"status": "unknown", "detail": "%s: %s" % (type(e).__name__, e)}


# ---------------------------------------------------------------------------------------------- signal


def _record_signal(run_dir, name, number, batch_only, all_processes, purpose):
    """Append the signal to the run's signals.log before it is sent: the wrapper reads it to know that the
    run's end was asked for (let the rest finish, honour a checkpoint exit), never the other way round; the
    job itself may read its last line to learn why it got a signal (`purpose`: checkpoint, preempted, timeout,
    cancelled, rank_failed, warning)."""
    line = json.dumps({"t": time.time(), "signal": name, "number": number, "batch_only": batch_only,
                       "all_processes": all_processes, "purpose": purpose}) + "\n"
    fd = _private_fd(os.path.join(run_dir, "signals.log"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _catches(pid, sig):
    """Whether process `pid` has a handler for signal `sig` (SigCgt in /proc/PID/status)."""
    text = _read("/proc/%d/status" % pid) or ""
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def _signal_catchers(info, main, wrapper, sig, batch_only):
    targets = [main] if batch_only else run_members(info, wrapper)
    if not batch_only and _main_alive(main, info) and main not in targets:
        targets.append(main)
    sent = False
    skipped = 0
    for pid in targets:
        if not _catches(pid, sig):
            skipped += 1
            continue
        try:
            os.kill(pid, sig)
            sent = True
        except OSError:
            pass
    reply = {"sent": sent}
    if not sent:
        reply["detail"] = "no process of the run handles the signal (%d left alone)" % skipped
    return reply


def _main_alive(pid, info):
    """Whether the run's main process (the batch shell, the wrapper's child) is still the same process."""
    st = _proc_stat(pid)
    if st is None or st[0] == "Z":
        return False
    ticks = info.get("child_start_ticks")
    if ticks is None:  # a run started by an older helper: it leads its own session, which a stranger seldom does
        return st[3] == pid
    return st[4] == int(ticks)


def send_signal(req):
    handle = req["handle"]
    signame = str(req["signal"]).upper()
    signame = signame if signame.startswith("SIG") else "SIG" + signame
    sig = getattr(signal, signame, None)
    if not isinstance(sig, int) or signame.startswith("SIG_"):
        return {"error": "unknown signal %s" % req["signal"]}
    if CONFINE is not None:
        handle = _disk_handle(handle["run_dir"])
        if handle is None:
            return {"sent": False, "detail": "no run there"}
    if not _alive(handle):
        # the wrapper is gone: the run ended (or the pid was reused); never signal a stranger
        return {"sent": False, "detail": "run not running"}
    run_dir = handle["run_dir"]
    info = _run_info(run_dir, handle)
    batch_only = bool(req.get("batch_only"))
    everyone = bool(req.get("all_processes")) and not batch_only
    purpose = str(req.get("purpose") or "stop")
    _record_signal(run_dir, signame[3:], int(sig), batch_only, everyone, purpose)
    if purpose == "checkpoint":
        # "checkpoint and go on": only to the processes that handle the signal; one that would die of it (a
        # `bash -c` wrapper around the trainer) is left alone, or the run would end instead of checkpointing
        return _signal_catchers(info, int(handle["pgid"]), int(handle["pid"]), int(sig), batch_only)
    main, wrapper = int(handle["pgid"]), int(handle["pid"])
    if batch_only:
        if not _main_alive(main, info):
            return {"sent": False, "detail": "the run's main process has ended"}
        try:
            os.kill(main, sig)
        except ProcessLookupError:
            return {"sent": False, "detail": "the run's main process has ended"}
        except PermissionError as e:
            return {"error": "cannot signal the run: %s" % e}
        return {"sent": True}
    # each process gets the signal once: the group's members by killpg, the others one by one
    table = _proc_table()
    members = run_members(info, wrapper) if everyone or not _main_alive(main, info) else []
    in_group = set(pid for pid, st in table.items() if st[2] == main)
    sent = False
    try:
        if _main_alive(main, info):
            os.killpg(main, sig)
            sent = True
        else:
            # the main process has ended and its group may live on: only the group's members that are the run's
            for pid in members:
                if pid in in_group:
                    os.kill(pid, sig)
                    sent = True
    except ProcessLookupError:
        pass
    except PermissionError as e:
        return {"error": "cannot signal the run: %s" % e}
    if everyone:
        for pid in members:
            if pid in in_group:
                continue
            try:
                os.kill(pid, sig)
                sent = True
            except OSError:
                pass
    return {"sent": sent}


# ------------------------------------------------------------------------------------------------ main

COMMANDS = {"probe": probe, "launch": launch, "status": status, "signal": send_signal, "users": users}


def main(argv):
    try:
        argv = _options(argv)
    except BadOptions as e:
        sys.stdout.write(json.dumps({"error": "node helper: %s" % e}) + "\n")
        sys.stdout.flush()
        return 2
    if len(argv) >= 3 and argv[1] == "_wrap":
        try:
            return wrap(argv[2])
        except Refused as e:
            sys.stderr.write("hsched node helper: %s\n" % e)
            return 2
    if len(argv) >= 2 and argv[1] == "_probe_gpus":
        sys.stdout.write(json.dumps(probe_gpus()) + "\n")
        sys.stdout.flush()
        return 0
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
        reply = {"error": _why(e)}
    finally:
        _kill_children()
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 1 if "error" in reply else 0



# ------------------------------------------------------------------------------------- read and watch
# Added for remote nodes (the SSH executor): reading a run's log without SFTP, and one long-lived
# monitoring stream per node instead of a new process (and a new nvidia-smi) every second.


_TOKEN_TAR = re.compile(r"^[0-9a-f]{32}\.tar$")


def _readable(path):
    """Under --confine, what `read` may give the service account (docs/lab.md: a user's logs and checkpoints stay
    theirs): a run's log, to serve `hsched logs`, from a run folder this helper made (ROOT/runs/A/B, root's),
    or a transfer file a `pack` left in ROOT/xfer (named as `_xfer_path` names them). Nothing else of a user's:
    not a file of a checkpoint folder, not a run's progress or signals (a dataset is `data_read`'s)."""
    p = _inside(path)
    if CONFINE is None:
        return p
    rel = os.path.relpath(p, CONFINE).split("/")
    if len(rel) == 2 and rel[0] == "xfer" and _TOKEN_TAR.match(rel[1]):
        return p
    if len(rel) == 4 and rel[0] == "runs" and rel[3] == "output.log":
        try:
            _own(os.path.dirname(p))  # only the helper writes under ROOT/runs: root's, 0711
        except FileNotFoundError:
            pass  # no such run (yet): the open says so (no log)
        return p
    raise Refused("%s: this helper reads only a run's output.log and its own transfer files" % path)


def read_file(req):
    """Up to max_bytes of req['path'] from req['offset'], base64 (logs are bytes, not always UTF-8); under
    --confine only what `_readable` allows."""
    import base64

    path = _readable(req["path"])
    offset = max(0, int(req.get("offset", 0)))
    max_bytes = max(0, min(int(req.get("max_bytes", 1 << 20)), 16 << 20))
    try:
        # O_NONBLOCK, then a regular file only: a FIFO laid where a log was must not hang this helper, which serves
        # every request of its node (issue 27)
        with os.fdopen(_open_inside(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_mode & 0o170000) != 0o100000:  # S_ISREG (this module imports `stat` only where it needs it)
                raise Refused("%s is not a regular file" % path)
            size = st.st_size
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


def _proc_name(pid):
    return _read("/proc/%d/comm" % pid)


def _gpu_process(pid, uuid, used_mib):
    return {"pid": pid, "uuid": uuid, "used_memory_mib": used_mib, "name": _proc_name(pid),
            "run_dir": _proc_owner(pid)}


class _ProcessUsage(object):
    """What nvitop shows of a GPU process besides its GPU memory: its user, command line, CPU % (since the
    last sample, so the first sample of a process has none) and resident host memory. Read from /proc for
    the few GPU processes a sample lists; the user and command are kept per process (pid and start time,
    so a reused pid is a new process), as a user lookup may go to LDAP."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.page_mib = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / float(1 << 20)
        self.last = {}  # pid -> (start ticks, cpu ticks, monotonic time)
        self.known = {}  # (pid, start ticks) -> (user, command)
        self.users = {}  # uid -> name

    @staticmethod
    def _stat(pid):
        """(start ticks, utime + stime ticks, rss pages) from /proc/PID/stat, or None."""
        rest = _stat_fields(pid)
        if rest is None:
            return None
        try:
            return int(rest[19]), int(rest[11]) + int(rest[12]), int(rest[21])
        except (IndexError, ValueError):
            return None

    def _user(self, pid):
        try:
            uid = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            return None
        name = self.users.get(uid)
        if name is None:
            import pwd

            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self.users[uid] = name
        return name

    @staticmethod
    def _command(pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                raw = f.read(4096)
        except OSError:
            return None
        words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
        return " ".join(words)[:512] or None

    def annotate(self, procs):
        """Copies of `procs` (the sampler's own dicts stay as they are) with user, command, cpu_percent and
        rss_mib; None where /proc does not say (a process that just ended, another user's under hidepid)."""
        now = time.monotonic()
        this = {}  # pid -> its figures, once per sample (a process on two GPUs is listed twice)
        out = []
        for p in procs:
            pid = p.get("pid")
            if pid not in this:
                this[pid] = self._figures(pid, now) if isinstance(pid, int) else None
            figures = this[pid]
            extra = figures[1] if figures is not None else {}
            out.append(dict(p, user=extra.get("user"), command=extra.get("command"),
                            cpu_percent=extra.get("cpu_percent"), rss_mib=extra.get("rss_mib")))
        self.last = dict((pid, f[0]) for pid, f in this.items() if f is not None)
        self.known = dict((k, v) for k, v in self.known.items() if k[0] in self.last)
        return out

    def _figures(self, pid, now):
        st = self._stat(pid)
        if st is None:
            return None
        start, ticks, rss = st
        key = (pid, start)
        if key not in self.known:
            self.known[key] = (self._user(pid), self._command(pid))
        user, command = self.known[key]
        cpu = None
        before = self.last.get(pid)
        if before is not None and before[0] == start and now > before[2]:
            cpu = round(100.0 * (ticks - before[1]) / self.hz / (now - before[2]), 1)
        return (start, ticks, now), {"user": user, "command": command, "cpu_percent": cpu,
                                     "rss_mib": int(rss * self.page_mib)}


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


class _NvmlSampler(object):
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
                    procs.append(_gpu_process(p.pid, uuid, used // (1 << 20) if isinstance(used, int) else None))
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


class _Bounded(object):
    """A sampler that may block (NVML on a sick GPU) asked from a worker thread of its own: a sample that
    does not come within timeout_s is the last one with an error, and no second one is asked for until the
    first returns, so a hung driver costs one thread and a stream that goes on, never a pile of threads."""

    def __init__(self, inner, timeout_s):
        self.inner = inner
        self.source = inner.source
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


_SMI_GPU = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,utilization.memory"
"""nvidia-smi has no NVLink or PCIe throughput among its query fields: a node without NVML says neither."""


class _SmiSampler(object):
    """Device metrics from one long-running `nvidia-smi -lms` (no process start per sample), and the GPU
    processes from a one-shot query every few seconds (they change rarely; the query is costly).

    Nothing here can hang a sample: one manager thread starts every nvidia-smi (each dies with that thread)
    and bounds each query in time; a stream that falls silent is killed and started again once it is gone;
    a query is never started while an earlier one still runs (one that cannot be killed is abandoned and
    blocks the next ones, never piles up). What went wrong is the sample's `error`."""

    source = "nvidia-smi"

    def __init__(self, exe, interval_s, timeout_s):
        self.exe = exe
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_s = max(timeout_s, 5 * interval_s)
        self.apps_every = max(5.0, interval_s)
        self.lock = threading.Lock()
        self.latest = {}
        self.procs = []
        self.stream = None
        self.stream_since = self.last_line = 0.0
        self.stream_error = None
        self.stream_killed = False
        self.killed_at = 0.0
        self.restart_at = 0.0
        self.apps_error = None
        self.apps_stuck = None
        self.first = threading.Event()
        self.apps_seen = threading.Event()
        self.stopping = threading.Event()
        self.manager = threading.Thread(target=self._manage)
        self.manager.daemon = True
        self.manager.start()

    @staticmethod
    def _num(v):
        try:
            return float(v)
        except ValueError:
            return None  # "[N/A]", "[Not Supported]"

    def _manage(self):
        next_apps = time.monotonic()
        while not self.stopping.is_set():
            self._tend_stream()
            if time.monotonic() >= next_apps:
                self._query_apps()
                next_apps = time.monotonic() + self.apps_every
            self.stopping.wait(min(0.5, self.interval_s))
        self._stop_stream()

    def _tend_stream(self):
        now = time.monotonic()
        s = self.stream
        if s is None:
            if now >= self.restart_at and not _CLOSING.is_set():
                self._start_stream()
        elif s.poll() is not None:
            with self.lock:
                if not self.stream_killed:
                    self.stream_error = "nvidia-smi (pid %d) ended with exit status %s" % (s.pid, s.returncode)
            _unregister(s)
            self.stream = None
            self.restart_at = now + max(5.0, self.interval_s)
            self.first.set()
        elif self.stream_killed:
            if now - self.killed_at > 2.0:
                with self.lock:
                    self.stream_error = "nvidia-smi (pid %d) sent nothing for %.0f s and does not die: abandoned" % (
                        s.pid, now - max(self.last_line, self.stream_since))
        elif now - max(self.last_line, self.stream_since) > self.stale_s:
            with self.lock:
                self.stream_error = "nvidia-smi (pid %d) sent nothing for %.0f s: killed" % (
                    s.pid, now - max(self.last_line, self.stream_since))
            self.stream_killed, self.killed_at = True, now
            try:
                os.killpg(s.pid, signal.SIGKILL)  # gone: started again; stuck (D state): nothing more is started
            except OSError:
                pass
            self.first.set()

    def _start_stream(self):
        try:
            proc = subprocess.Popen(
                [self.exe, "--query-gpu=" + _SMI_GPU, "--format=csv,noheader,nounits",
                 "-lms", str(max(100, int(self.interval_s * 1000)))],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True, preexec_fn=_child_setup(False))
        except (OSError, subprocess.SubprocessError) as e:
            with self.lock:
                self.stream_error = "nvidia-smi could not start: %s" % e
            self.restart_at = time.monotonic() + max(5.0, self.interval_s)
            self.first.set()
            return
        _register(proc)
        self.stream, self.stream_since, self.stream_killed = proc, time.monotonic(), False
        t = threading.Thread(target=self._read_gpus, args=(proc,))
        t.daemon = True
        t.start()

    def _read_gpus(self, proc):
        for raw in proc.stdout:
            f = [x.strip() for x in raw.decode("utf-8", "replace").split(",")]
            if len(f) < 7 or not f[0].isdigit():
                continue
            used, total = self._num(f[3]), self._num(f[4])
            temp, power = self._num(f[5]), self._num(f[6])
            dev = {"index": int(f[0]), "uuid": f[1], "utilization_gpu": self._num(f[2]),
                   "memory_used_mib": int(used) if used is not None else None,
                   "memory_total_mib": int(total) if total is not None else None,
                   "temperature_c": temp, "power_w": power,
                   # an older nvidia-smi (or a fake) that stops at power.draw: memory bandwidth unknown
                   "utilization_memory": self._num(f[7]) if len(f) > 7 else None}
            with self.lock:
                self.latest[dev["index"]] = dev
                self.last_line = time.monotonic()
                if self.stream is proc:
                    self.stream_error = None
            self.first.set()
        self.first.set()  # nvidia-smi ended: no sample waits for it any more

    def _query_apps(self):
        stuck = self.apps_stuck
        if stuck is not None and stuck.returncode is None:
            return  # the last query is still there (D state): another would only join it
        self.apps_stuck = None
        r = run_bounded([self.exe, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                        self.timeout_s, "nvidia-smi --query-compute-apps")
        error = r["error"]
        if error is None and r["rc"] != 0:
            error = "nvidia-smi --query-compute-apps failed (exit status %s): %s" % (r["rc"], r["err"] or "no output")
        procs = None
        if error is None:
            procs = []
            for line in r["out"].decode("utf-8", "replace").splitlines():
                f = [x.strip() for x in line.split(",")]
                if len(f) >= 3 and f[1].isdigit():
                    used = self._num(f[2])
                    procs.append(_gpu_process(int(f[1]), f[0], int(used) if used is not None else None))
        with self.lock:
            self.apps_error = error
            if procs is not None:
                self.procs = procs
        self.apps_stuck = r["abandoned"]
        self.apps_seen.set()

    def _stop_stream(self):
        s = self.stream
        if s is not None:
            try:
                os.killpg(s.pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 1.0
            while s.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if s.poll() is None:
                _abandon(s)
            _unregister(s)

    def sample(self):
        # the first sample waits a moment for nvidia-smi's first answers (devices, then their processes: a
        # sample without the processes would show a busy device as free); later ones never wait
        if not self.apps_seen.is_set():
            deadline = time.monotonic() + 3.0
            self.first.wait(3.0)
            self.apps_seen.wait(max(0.0, deadline - time.monotonic()))
        with self.lock:
            errors = [e for e in (self.stream_error, self.apps_error) if e]
            return [self.latest[i] for i in sorted(self.latest)], list(self.procs), "; ".join(errors) or None

    def close(self):
        self.stopping.set()
        _kill_children()  # a query in flight ends now, not at its time limit (this process is a watch: all ours)
        self.manager.join(2.0)


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


def _gpu_sampler(req, interval_s):
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
                made["sampler"] = _NvmlSampler(pynvml)
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
        return _SmiSampler(exe, interval_s, timeout_s)
    return _NoGpuSampler()


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
    "run_dir", "user", "command", "cpu_percent", "rss_mib"}]} (cpu_percent: since the last sample, null
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
        _kill_children()
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
        gpus = state["gpus"] = _gpu_sampler(req, interval)
        bid = boot_id()
        ncpu = os.cpu_count()
        prev = _cpu_times()
        usage = _ProcessUsage()
        # progress every fifth sample (5 s at the controller's usual second): a speed needs no finer grain
        progress = _ProgressReader(float(req.get("progress_every_s") or 5 * interval))
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
                "processes": usage.annotate(procs),
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
        _kill_children()
    return {"samples": seq}


# ------------------------------------------------------------------------------------------------ progress
# A run's progress file, read by the watch stream (no round trip of its own): what each active run reported
# since the last look, its last report only. Active runs are found by their wrappers (this helper's own
# processes, `_wrap RUN_DIR`), never by anything a job's process could claim; only numbers come out of a file.

PROGRESS_FIELDS = ("step", "total", "samples", "loss", "t")
PROGRESS_READ_MAX = 1 << 20


def parse_progress(line):
    """A report line as {field: number} (only PROGRESS_FIELDS), or None: a JSON object, or `key=value`
    words (`step=1200 total=50000`, commas or spaces between)."""
    line = line.strip()
    if not line:
        return None
    raw = None
    if line.startswith("{"):
        try:
            raw = json.loads(line)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
    else:
        raw = {}
        for word in line.replace(",", " ").split():
            if "=" in word:
                k, _, v = word.partition("=")
                raw[k.strip().lower()] = v.strip()
    out = {}
    for k in PROGRESS_FIELDS:
        v = raw.get(k)
        if isinstance(v, bool):
            continue
        try:
            f = float(v) if v is not None else None
        except (TypeError, ValueError):
            continue
        if f is not None and f == f and abs(f) != float("inf"):
            out[k] = f
    return out if "step" in out or "samples" in out else None


def active_runs():
    """The run folders of the runs this helper's wrappers own right now (wrappers run as this helper's user)."""
    me = os.geteuid()
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != me:
                continue
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"_wrap" in argv:
            i = argv.index(b"_wrap")
            if i + 1 < len(argv) and argv[i + 1]:
                out.append(argv[i + 1].decode("utf-8", "surrogateescape"))
    return sorted(set(out))


class _ProgressReader(object):
    """New progress lines of the active runs, at most every `every_s`."""

    def __init__(self, every_s):
        self.every_s = max(0.2, every_s)
        self.next_t = 0.0
        self.offsets = {}

    def due(self):
        now = time.monotonic()
        if now < self.next_t:
            return False
        self.next_t = now + self.every_s
        return True

    def read(self):
        reports = []
        runs = active_runs()
        for run_dir in runs:
            rep = self._one(run_dir)
            if rep is not None:
                reports.append(rep)
        for gone in set(self.offsets) - set(runs):
            del self.offsets[gone]
        return reports

    def _one(self, run_dir):
        try:
            fd = os.open(os.path.join(run_dir, PROGRESS_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            start, last, lines = self.offsets.get(run_dir, (0, None, 0))
            if st.st_size < start:  # written anew: read it from the start
                start, lines = 0, 0
            if st.st_size == start:
                return None
            if st.st_size - start > PROGRESS_READ_MAX:
                start = st.st_size - PROGRESS_READ_MAX  # a flood: its last part is what counts
            os.lseek(fd, start, os.SEEK_SET)
            data = os.read(fd, st.st_size - start)
        finally:
            os.close(fd)
        end = data.rfind(b"\n")
        if end < 0:
            return None  # a line still being written
        for raw in data[:end].split(b"\n"):
            rep = parse_progress(raw.decode("utf-8", "replace"))
            if rep is not None:
                last, lines = rep, lines + 1
        self.offsets[run_dir] = (start + end + 1, last, lines)
        if last is None:
            return None
        out = dict(last)
        out.setdefault("t", st.st_mtime)
        out.update({"run_dir": run_dir, "reports": lines})
        return out


def newest(req):
    """The newest modification time of any file under req["path"] (None if there is none)."""
    best = None
    for root, _dirs, files in os.walk(_inside(req["path"])):
        for name in files:
            try:
                # confined: never a link's target (a user's folder may hold one to anywhere)
                t = os.stat(os.path.join(root, name), follow_symlinks=CONFINE is None).st_mtime
            except OSError:
                continue
            if best is None or t > best:
                best = t
    return {"newest": best}


# --------------------------------------------------------------------------------------------- transfer
# A checkpoint moving between nodes of a service account's lab: the folder is the user's (0700), so neither
# the account nor SFTP in its name can read or write it. The helper (root) packs it into a tar file under
# ROOT/xfer, the controller reads that back with `read`, sends it to the other node's helper with `append`,
# and `unpack` puts it in place there: regular files and folders only, no link, no device, no setuid bit.

XFER_CHUNK_MAX = 16 << 20


def _xfer_dir(req):
    root = CONFINE or req.get("root")
    if not root:
        raise Refused("a transfer needs the node's hsched folder (root)")
    d = os.path.join(_inside(root), "xfer")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid():
        raise Refused("%s: not a folder of this account's" % d)
    return d


def _xfer_path(req, token=None):
    token = str(req.get("token") if token is None else token)
    if len(token) != 32 or any(c not in "0123456789abcdef" for c in token):
        raise Refused("not a transfer: %r" % token)
    return os.path.join(_xfer_dir(req), token + ".tar")


def _new_token():
    return "".join("%02x" % b for b in bytearray(os.urandom(16)))


def _copy_owner(req):
    """(uid, gid) of req['user'], the account a transfer is for (its files are read and written as its), or
    None for none; a user this node lacks, or under --confine one below --min-uid, is refused."""
    name = req.get("user")
    if not name:
        return None
    acct = account(str(name))
    if acct is None:
        raise Refused("user %s does not exist on this node" % name)
    if CONFINE is not None and acct["uid"] < MIN_UID:
        raise Refused("this helper copies nothing for %s (uid %d): only for users with a uid of at least %d"
                      % (name, acct["uid"], MIN_UID))
    return acct["uid"], acct["gid"]


def pack(req):
    """The folder req['path'] as a tar file in the transfer folder: {"token", "path", "size", "files", "bytes",
    "dropped"}. Only its folders and regular files, with their permission bits (safefiles.py: no link followed,
    no FIFO opened to wait on, setuid and the like left out); with req['user'], only what that user may give."""
    src = _inside(req["path"])
    owner = _copy_owner(req)
    token = _new_token()
    path = _xfer_path(req, token)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            src_fd = _open_inside(src, os.O_RDONLY | os.O_NONBLOCK)
            try:
                counts = safefiles.pack_fd(src_fd, f, owner, shown=src)
            finally:
                os.close(src_fd)
    except FileNotFoundError:
        _unlink(path)
        raise Refused("%s: no such folder" % src) from None
    except safefiles.Unsafe as e:
        _unlink(path)
        raise Refused(str(e)) from None
    except BaseException:
        _unlink(path)
        raise
    return {"token": token, "path": path, "size": os.path.getsize(path), "files": counts.files,
            "bytes": counts.bytes, "dropped": counts.dropped}


def append(req):
    """Bytes (base64 `data`) onto transfer `token` at `offset` (a new transfer when there is no token):
    {"token", "size"}. An offset other than the file's size is refused: a retried chunk never lands twice."""
    import base64

    data = base64.b64decode(req.get("data") or "")
    if len(data) > XFER_CHUNK_MAX:
        raise Refused("a transfer chunk is at most %d bytes" % XFER_CHUNK_MAX)
    token = req.get("token")
    if not token:
        token = _new_token()
        fd = os.open(_xfer_path(req, token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        fd = os.open(_xfer_path(req, token), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if int(req.get("offset") or 0) != size:
            raise Refused("transfer %s has %d bytes, not %s" % (token, size, req.get("offset")))
        os.lseek(fd, size, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        return {"token": token, "size": size + len(data)}
    finally:
        os.close(fd)


def unpack(req):
    """Transfer `token` into the folder req['dest'], which it replaces whole (renamed into place: a reader
    never sees half of it); then the transfer file is gone. Only regular files and folders come out, with
    their permission bits (no setuid, no link, no device: safefiles.py), each owned by req['user'] before its
    first byte when there is one (else by this helper, until a launch gives them to the run's user)."""
    dest = _inside(req["dest"])
    owner = _copy_owner(req)
    path = _xfer_path(req)
    parent = os.path.dirname(dest)
    if CONFINE is not None:
        _passable_dirs(CONFINE, parent)
    else:
        os.makedirs(parent, 0o700, exist_ok=True)
    stage = path[:-4] + ".d"
    try:
        try:
            with open(path, "rb") as tar_in:
                counts = safefiles.unpack(tar_in, os.path.dirname(stage), os.path.basename(stage), owner)
        except safefiles.Unsafe as e:
            raise Refused("%s: %s" % (req["dest"], e)) from None
        if os.path.lexists(dest):
            old = path[:-4] + ".old"
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(stage, dest)
    finally:
        if os.path.lexists(stage):
            shutil.rmtree(stage, ignore_errors=True)
        _unlink(path)
    return {"dest": dest, "files": counts.files, "bytes": counts.bytes, "dropped": counts.dropped}


def drop(req):
    """Forget transfer `token` (what is left of a failed or finished one)."""
    _unlink(_xfer_path(req))
    return {"dropped": True}


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------------------------- datasets
# A dataset (one file or a folder tree) copied from node to node by the controller (hsched/datacopy.py): it
# reads chunks from one node's helper and writes them through another's into a partial folder beside the
# destination, `DEST.partial/` = the copy's manifest (`.hsched-copy.json`: the source's files, sizes, mtimes
# and modes, written by the controller before any byte), its claim (`.hsched-claim`: the attempt it is now) and
# `data` (the tree, or the file, so far). A copy that stopped resumes from there; `data_commit` checks it against
# its manifest and renames it into place whole.
#
# Writing never follows a link: every folder on the way is opened by name with O_NOFOLLOW from / (from ROOT
# under --confine), so a link laid anywhere on the path cannot send bytes elsewhere. Under --confine, reading
# may name anything under ROOT (as `read` and `pack` may), but writing, committing and dropping only folders
# under ROOT/data: the run folders beside it are root's own, and a handle.json the service account could
# write would be one this helper signals as root.

DATA_CHUNK_MAX = 4 << 20
"""The most bytes one data_read answers or one data_write takes."""
DATA_MANIFEST = ".hsched-copy.json"
"""In a partial folder: what the copy is of (the controller writes it, data_commit reads and removes it)."""
DATA_TREE = "data"
"""In a partial folder: the tree (or the file) being copied."""
DATA_CLAIM = ".hsched-claim"
"""In a partial folder: the attempt whose copy it is now (data_claim), fencing off late writes of earlier ones."""
DATA_FOLDER = "data"
"""Under --confine: ROOT/data holds every dataset this helper writes."""
_RENAME_EXCHANGE = 2
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
# O_PATH: passing through a folder needs only its x bit, as a path does (a lab's /scratch may be 0711)
_WALK_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def _data_path(path):
    """An absolute path a data request names, normalized; relative ones and `..` are refused (under --confine
    also anything outside ROOT/data or through a link, as `_inside` refuses them)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise Refused("%r is not an absolute path" % (path,))
    if ".." in path.split("/"):
        raise Refused("%s: a path with '..' is refused" % path)
    p = _inside(path)
    if CONFINE is not None:
        # under --confine datasets live in ROOT/data alone: elsewhere under ROOT are the members' checkpoints and
        # runs, which a data request must not read back for the service account (`read` serves only run logs)
        base = os.path.join(CONFINE, DATA_FOLDER)
        if p != base and not p.startswith(base + "/"):
            raise Refused("%s: this helper reads and writes datasets only under %s" % (path, base))
    return p


def _data_writable(path):
    """`_data_path`, and under --confine only a path below ROOT/data."""
    p = _data_path(path)
    if CONFINE is not None:
        base = os.path.join(CONFINE, DATA_FOLDER)
        if not p.startswith(base + "/"):
            raise Refused("%s: this helper writes datasets only under %s" % (path, base))
    if p == "/":
        raise Refused("/ is not a dataset")
    return p


def _rel_parts(rel):
    """The names of a relative path from a manifest (the controller's word, so checked): no '', '.' or '..'."""
    parts = str(rel).split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts) or "\0" in str(rel):
        raise Refused("%r is not a path inside the copy" % (rel,))
    return parts


def _descend(fd, parts, create, shown, start=""):
    """A new descriptor of the folder `parts` below the folder `fd` (left open), opened one name at a time
    without following links; a missing folder is made 0755 when `create`. `shown` names the path in errors,
    `start` the folder `fd` is."""
    import errno
    import stat as stat_

    cur = os.dup(fd)
    try:
        for i, part in enumerate(parts):
            made = False
            try:
                nfd = os.open(part, _WALK_FLAGS, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=cur)
                    made = True
                except FileExistsError:
                    pass
                nfd = os.open(part, _WALK_FLAGS, dir_fd=cur)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    try:
                        link = stat_.S_ISLNK(os.stat(part, dir_fd=cur, follow_symlinks=False).st_mode)
                    except OSError:
                        link = False
                    if link:
                        raise Refused("%s: %s is a symbolic link (name the real path)"
                                      % (shown, os.path.join(start, *parts[:i + 1]))) from None
                raise
            if made:  # 0755 whatever the helper's umask: a job of any user reads a dataset
                ours = os.open(part, _DIR_FLAGS, dir_fd=cur)
                try:
                    os.fchmod(ours, 0o755)
                finally:
                    os.close(ours)
            os.close(cur)
            cur = nfd
        return cur
    except BaseException:
        os.close(cur)
        raise


def _folder_fd(path, create=False):
    """A descriptor of the folder `path` (absolute, normalized), opened from / (from ROOT under --confine,
    which its launcher names) without following any link on the way: a path through a link is refused."""
    start = "/"
    if CONFINE is not None and (path == CONFINE or path.startswith(CONFINE.rstrip("/") + "/")):
        start = CONFINE
    rest = os.path.relpath(path, start)
    top = os.open(start, getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0))
    try:
        return _descend(top, [] if rest == "." else rest.split("/"), create, path, start)
    finally:
        os.close(top)


def _sync_folder(fd):
    """fsync a folder held as a path (O_PATH) where it can be read: the names renamed in it are on the disk."""
    try:
        readable = os.open(".", os.O_RDONLY, dir_fd=fd)
    except OSError:
        return  # a folder we may write but not read: the rename stands, its durability is the file system's
    try:
        os.fsync(readable)
    finally:
        os.close(readable)


def _open_below(fd, parts, flags, shown, mode=0o600):
    """A descriptor of the file `parts` below the folder `fd`, no link followed on the way or at its end."""
    import errno

    parent = _descend(fd, parts[:-1], flags & os.O_CREAT, shown)
    try:
        return os.open(parts[-1], flags | getattr(os, "O_NOFOLLOW", 0), mode, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("%s is a symbolic link" % shown) from None
        raise
    finally:
        os.close(parent)


def _tree(path):
    """What is at `path`: (None, [], []) for nothing, ("file", [("", stat)], []) for a file, ("dir", files, dirs)
    for a folder: its regular files as [(rel, stat)] and its folders as [rel], sorted. Links below `path` are
    not followed and are left out, as are devices, sockets and pipes; a link at `path` itself is followed
    (unconfined: a dataset folder may be a link to a big disk; under --confine `_inside` refuses it)."""
    import stat as stat_

    p = _data_path(path)
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None, [], []
    if stat_.S_ISREG(st.st_mode):
        return "file", [("", st)], []
    if not stat_.S_ISDIR(st.st_mode):
        return None, [], []
    files, dirs = [], []

    def walk(fd, prefix):
        for name in os.listdir(fd):
            try:
                est = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone meanwhile
            rel = prefix + name
            if stat_.S_ISREG(est.st_mode):
                files.append((rel, est))
            elif stat_.S_ISDIR(est.st_mode):
                dirs.append(rel)
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    walk(sub, rel + "/")
                finally:
                    os.close(sub)

    top = os.open(os.path.realpath(p) if CONFINE is None else p, _DIR_FLAGS)
    try:
        walk(top, "")
    finally:
        os.close(top)
    files.sort(key=lambda f: f[0])
    dirs.sort()
    return "dir", files, dirs


def data_scan(req):
    """The size of the file or folder req['path']: {exists, bytes, files, newest, is_dir} (regular files only;
    `newest` the latest mtime of one, None for none)."""
    kind, files, _dirs = _tree(req["path"])
    return {"exists": kind is not None, "bytes": sum(st.st_size for _rel, st in files), "files": len(files),
            "newest": max((st.st_mtime for _rel, st in files), default=None), "is_dir": kind == "dir"}


def data_list(req):
    """Every regular file of req['path'] ({rel, size, mtime, mode}; a file alone has rel "") and every folder
    below it (rel), sorted; `is_dir` tells an empty folder from nothing. With `limit`, one page: the files from
    index `start` (`total_files` says how many there are; the folders come with the first page only), so that a
    tree of a million files does not make one reply line of a hundred MB."""
    kind, files, dirs = _tree(req["path"])
    start = max(0, int(req.get("start") or 0))
    limit = req.get("limit")
    page = files[start:start + int(limit)] if limit is not None else files[start:]
    return {"exists": kind is not None, "is_dir": kind == "dir", "dirs": dirs if start == 0 else [],
            "total_files": len(files),
            "files": [{"rel": rel, "size": st.st_size, "mtime": st.st_mtime, "mode": st.st_mode & 0o7777}
                      for rel, st in page]}


def data_root(req):
    """Where this helper writes datasets: ROOT/data under --confine, None (anywhere) otherwise. {root}."""
    return {"root": os.path.join(CONFINE, DATA_FOLDER) if CONFINE is not None else None}


def data_free(req):
    """Bytes free to this helper's user where req['path'] is (or would be made): its nearest existing folder."""
    p = _data_path(req["path"])
    while not os.path.isdir(p) and p != "/":
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return {"free": st.f_bavail * st.f_frsize, "at": p}


def _data_root(root):
    """The dataset `root` as `_tree` takes it: a link at the root itself followed when unconfined (a dataset
    folder may be a link to a big disk), nothing below it."""
    p = _data_path(root)
    return os.path.realpath(p) if CONFINE is None else p


def _data_file_fd(req):
    """(descriptor, shown) of the file a data_read names: req['root'] and req['rel'] below it (a link at the root
    followed as `_tree` does, none below it: a folder of the dataset swapped for a link mid-copy is refused,
    never entered), or req['path'] alone, no link followed anywhere on it. Opened O_NONBLOCK: a pipe laid where
    a file was never hangs the helper."""
    if req.get("root") is not None:
        root = _data_root(req["root"])
        parts = _rel_parts(req.get("rel") or "")
        if not parts:
            return _open_inside(root, os.O_RDONLY | os.O_NONBLOCK), root
        shown = os.path.join(root, *parts)
        top = _open_inside(root, _DIR_FLAGS)
        try:
            return _open_below(top, parts, os.O_RDONLY | os.O_NONBLOCK, shown), shown
        finally:
            os.close(top)
    path = _data_path(req["path"])
    if path == "/":
        raise Refused("/ is not a file")
    top = _folder_fd(os.path.dirname(path))
    try:
        return _open_below(top, [os.path.basename(path)], os.O_RDONLY | os.O_NONBLOCK, path), path
    finally:
        os.close(top)


def data_read(req):
    """Up to max_bytes (at most 4 MiB) of a file from req['offset'], base64: {data, eof}. The file: req['rel']
    below the dataset req['root'], or req['path'] (`_data_file_fd`: no link followed below the root)."""
    import base64
    import stat as stat_

    offset = max(0, int(req.get("offset") or 0))
    max_bytes = max(0, min(int(req.get("max_bytes", DATA_CHUNK_MAX)), DATA_CHUNK_MAX))
    fd, shown = _data_file_fd(req)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat_.S_ISREG(st.st_mode):
            raise Refused("%s is not a regular file" % shown)
        f.seek(offset)
        data = f.read(max_bytes)
    return {"data": base64.b64encode(data).decode("ascii"), "eof": offset + len(data) >= st.st_size}


def _claim_fd(partial, create):
    """A descriptor of the partial folder's claim file (made, with the folder, when `create`)."""
    top = _folder_fd(partial, create=create)
    try:
        return _open_below(top, [DATA_CLAIM], os.O_RDWR | (os.O_CREAT if create else 0),
                           "%s/%s" % (partial, DATA_CLAIM))
    finally:
        os.close(top)


def _token(value):
    token = str(value or "")
    if not 8 <= len(token) <= 64 or any(c not in "0123456789abcdef" for c in token):
        raise Refused("%r is not a copy's claim" % (value,))
    return token


def data_claim(req):
    """Make req['partial'] (made if missing) the copy of attempt req['token']: once this answers, a data_write
    carrying another attempt's claim is refused, and none is still under way. A request of an earlier attempt
    can reach the node late (a helper still working through what a lost connection had sent it); it must not
    land in the files this attempt resumes. {claimed}."""
    import fcntl

    partial = _data_writable(req["partial"])
    token = _token(req.get("token"))
    fd = _claim_fd(partial, True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the writes under way (each holds it shared)
        os.ftruncate(fd, 0)
        os.pwrite(fd, token.encode("ascii"), 0)
        os.fsync(fd)
    finally:
        os.close(fd)  # and the lock with it
    return {"claimed": token}


def data_write(req):
    """Base64 `data` into the file req['path'] at req['offset']: a longer file is cut there first (a resumed
    chunk lands exactly), a shorter one refused (no hole); missing folders are made 0755; a link anywhere on
    the path is refused. With `claim` ({partial, token}), only while that partial folder is still that
    attempt's (data_claim). {size}: the file's size after."""
    import base64

    path = _data_writable(req["path"])
    offset = int(req.get("offset") or 0)
    data = base64.b64decode(req.get("data") or "")
    if len(data) > DATA_CHUNK_MAX:
        raise Refused("a data_write takes at most %d bytes" % DATA_CHUNK_MAX)
    if offset < 0:
        raise Refused("offset %d is negative" % offset)
    claim = req.get("claim")
    if claim is None:
        return _write_at(path, offset, data)
    import fcntl

    partial = _data_writable(claim.get("partial") if isinstance(claim, dict) else None)
    token = _token(claim.get("token"))
    try:
        cfd = _claim_fd(partial, False)
    except FileNotFoundError:
        raise Refused("%s is no copy's now (claim %s)" % (partial, token)) from None
    try:
        fcntl.flock(cfd, fcntl.LOCK_SH)
        held = os.pread(cfd, 128, 0).decode("ascii", "replace")
        if held != token:
            raise Refused("%s is another attempt's copy now (%s, not %s)" % (partial, held, token))
        return _write_at(path, offset, data)
    finally:
        os.close(cfd)


def _write_at(path, offset, data):
    top = _folder_fd(os.path.dirname(path), create=True)
    try:
        return {"size": _write_below(top, [os.path.basename(path)], offset, data, path)}
    finally:
        os.close(top)


# Many small files in one request each way (issue #15: a tree of 10,000 files of 4 KiB cost two round trips a
# file). The controller batches files it would read in one chunk anyway; big files keep data_read/data_write.
DATA_BATCH_FILES = 4096
"""The most files one data_read_many answers or one data_write_many takes (bytes: DATA_CHUNK_MAX in all)."""


def _batch(req, key):
    items = req.get(key)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise Refused("%s must be a list of objects" % key)
    if len(items) > DATA_BATCH_FILES:
        raise Refused("one request takes at most %d files, not %d" % (DATA_BATCH_FILES, len(items)))
    return items


def data_read_many(req):
    """Several files of the tree req['root'] at once: for each of req['files'] ({rel, offset, max_bytes}; rel ""
    names the root itself, a file), up to max_bytes from offset, base64, and the file's size now (a file that
    changed since it was listed shows it). At most DATA_CHUNK_MAX bytes asked in all. The root is taken as
    data_list takes it (a link at the root followed, unconfined); below it no link is followed (data_list leaves
    links out: none is asked for). {files: [{data, size}]}, in the order asked."""
    import base64
    import stat as stat_

    items = _batch(req, "files")
    wanted = [max(0, int(i.get("max_bytes") or 0)) for i in items]
    if sum(wanted) > DATA_CHUNK_MAX:
        raise Refused("a data_read_many answers at most %d bytes" % DATA_CHUNK_MAX)
    root = _data_root(req.get("root"))
    top = None
    out = []
    try:
        for i, item in enumerate(items):  # no zip(strict=): Python 3.8
            want = wanted[i]
            rel = str(item.get("rel") or "")
            offset = max(0, int(item.get("offset") or 0))
            parts = _rel_parts(rel)
            shown = os.path.join(root, rel) if rel else root
            if not parts:  # the dataset is this one file
                fd = _open_inside(root, os.O_RDONLY | os.O_NONBLOCK)
            else:
                if top is None:
                    top = _open_inside(root, _DIR_FLAGS)
                fd = _open_below(top, parts, os.O_RDONLY | os.O_NONBLOCK, shown)
            try:
                st = os.fstat(fd)
                if not stat_.S_ISREG(st.st_mode):  # O_NONBLOCK: a pipe laid where a file was does not hang
                    raise Refused("%s is not a regular file" % shown)
                data = os.pread(fd, want, offset) if want else b""
            finally:
                os.close(fd)
            out.append({"data": base64.b64encode(data).decode("ascii"), "size": st.st_size})
    finally:
        if top is not None:
            os.close(top)
    return {"files": out}


def data_write_many(req):
    """Several files into the claimed partial folder at once: req['claim'] ({partial, token}, as data_write's),
    req['files'] ([{rel, offset, data}]: base64 `data` into PARTIAL/data/rel at offset, as data_write writes one:
    cut there first, no hole, missing folders made 0755, no link followed; rel "" is PARTIAL/data itself, a
    dataset of one file). At most DATA_CHUNK_MAX bytes in all. Every file is fsynced before the reply, as
    data_write's is: a resumed copy trusts the lengths it finds. (One after another: the controller keeps
    several batches under way, so that as many fsyncs as the per-file path had are in flight for the file system
    to commit together; threads of the request's own measured slower where an fsync costs nothing, a tmpfs,
    contending for the interpreter.) While it runs the claim is held: a data_claim waits for it, and once another
    attempt claimed the folder the request is refused whole. {sizes}: each file's size after, in order; a file
    that fails stops the batch there (the files before it stay written, as a batch cut short by a lost node
    leaves them)."""
    import base64
    import fcntl

    items = _batch(req, "files")
    claim = req.get("claim")
    if not isinstance(claim, dict):
        raise Refused("a data_write_many needs the copy's claim {partial, token}")
    partial = _data_writable(claim.get("partial"))
    token = _token(claim.get("token"))
    writes = []
    total = 0
    for item in items:
        rel = str(item.get("rel") or "")
        offset = int(item.get("offset") or 0)
        if offset < 0:
            raise Refused("offset %d is negative" % offset)
        data = base64.b64decode(item.get("data") or "")
        total += len(data)
        if total > DATA_CHUNK_MAX:
            raise Refused("a data_write_many takes at most %d bytes" % DATA_CHUNK_MAX)
        writes.append(([DATA_TREE, *_rel_parts(rel)], offset, data))
    try:
        cfd = _claim_fd(partial, False)
    except FileNotFoundError:
        raise Refused("%s is no copy's now (claim %s)" % (partial, token)) from None
    try:
        fcntl.flock(cfd, fcntl.LOCK_SH)
        held = os.pread(cfd, 128, 0).decode("ascii", "replace")
        if held != token:
            raise Refused("%s is another attempt's copy now (%s, not %s)" % (partial, held, token))
        top = _folder_fd(partial)
        try:
            sizes = [_write_below(top, parts, offset, data, "%s/%s" % (partial, "/".join(parts)))
                     for parts, offset, data in writes]
        finally:
            os.close(top)
    finally:
        os.close(cfd)
    return {"sizes": sizes}


def _write_below(top, parts, offset, data, shown):
    """data_write's write of one file, below the folder `top`: cut at `offset`, written, fsynced. Its size."""
    import stat as stat_

    fd = _open_below(top, parts, os.O_WRONLY | os.O_CREAT, shown)
    try:
        st = os.fstat(fd)
        if not stat_.S_ISREG(st.st_mode) or (CONFINE is not None and st.st_nlink > 1):
            raise Refused("%s is not a file of its own" % shown)
        if st.st_size < offset:
            raise Refused("%s has %d bytes: a write at %d would leave a hole" % (shown, st.st_size, offset))
        if st.st_size > offset:
            os.ftruncate(fd, offset)
        view = memoryview(data)
        at = offset
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n
        os.fsync(fd)  # a resumed copy trusts the partial file's length: what it counts must be on the disk
        return offset + len(data)
    finally:
        os.close(fd)


def _exchange(fd_a, name_a, fd_b, name_b):
    """renameat2(RENAME_EXCHANGE): swap two names at once. False where this kernel, libc or file system cannot."""
    import errno

    fn = _libc("renameat2", lambda c: [c.c_int, c.c_char_p, c.c_int, c.c_char_p, c.c_uint])
    if fn is None:
        return False
    import ctypes

    if fn(fd_a, os.fsencode(name_a), fd_b, os.fsencode(name_b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), name_b)


def _read_manifest(part_fd, shown):
    """The partial folder's manifest, None if it has none; a manifest that does not read is refused."""
    try:
        fd = os.open(DATA_MANIFEST, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=part_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            m = json.loads(f.read().decode("utf-8", "surrogateescape"))
        except ValueError:
            m = None
    if not isinstance(m, dict) or m.get("kind") not in ("file", "dir") or not isinstance(m.get("files"), list):
        raise Refused("%s: its manifest does not read; drop it and copy again" % shown)
    return m


def _finish(part_fd, manifest, shown):
    """Check the partial tree against its manifest (every file there, at its size) and give files the modes and
    mtimes the source had (no setuid; under --confine no write for others either). (files, bytes)."""
    import stat as stat_

    mask = 0o755 if CONFINE is not None else 0o777
    total = 0
    if manifest["kind"] == "dir":
        os.close(_descend(part_fd, [DATA_TREE], True, shown))  # an empty source folder has no file to make it
        for rel in manifest.get("dirs") or []:
            os.close(_descend(part_fd, [DATA_TREE, *_rel_parts(rel)], True, shown))
    for entry in manifest["files"]:
        rel = entry.get("rel", "") if isinstance(entry, dict) else None
        if rel is None or (manifest["kind"] == "file") != (rel == ""):
            raise Refused("%s: its manifest names %r" % (shown, entry))
        parts = [DATA_TREE, *_rel_parts(rel)]
        try:
            fd = _open_below(part_fd, parts, os.O_RDONLY | os.O_NONBLOCK, "%s/%s" % (shown, "/".join(parts)))
        except FileNotFoundError:
            raise Refused("%s: %s is missing: the copy is not finished" % (shown, rel or DATA_TREE)) from None
        try:
            st = os.fstat(fd)
            size = int(entry.get("size", -1))
            if not stat_.S_ISREG(st.st_mode) or st.st_size != size:
                raise Refused("%s: %s has %d of %d bytes: the copy is not finished"
                              % (shown, rel or DATA_TREE, st.st_size, size))
            os.fchmod(fd, int(entry.get("mode", 0o644)) & mask)
            mtime = entry.get("mtime")
            if isinstance(mtime, (int, float)):
                os.utime(fd, (mtime, mtime))
            total += size
        finally:
            os.close(fd)
    return len(manifest["files"]), total


def data_commit(req):
    """Put the finished copy req['partial'] at req['dest'] at once: with a manifest (a copy by the controller),
    its `data` checked against it, given its modes and mtimes, the manifest removed, and then swapped with
    what `dest` held (renameat2 RENAME_EXCHANGE: a reader sees the old tree or the new one, never none; where
    the file system cannot, the old one is renamed aside first, as `unpack` does); without one, `partial`
    itself. The partial folder (then holding the old tree) is removed after. {dest, files, bytes}."""
    import stat as stat_

    partial = _data_writable(req["partial"])
    dest = _data_writable(req["dest"])
    if partial == dest or dest.startswith(partial + "/") or partial.startswith(dest + "/"):
        raise Refused("%s and %s: one lies in the other" % (partial, dest))
    files, size, part_fd, aside = 0, 0, None, None
    try:
        pfd = _folder_fd(os.path.dirname(partial))
    except FileNotFoundError:
        raise Refused("%s: no such copy to commit" % partial) from None
    try:
        dfd = _folder_fd(os.path.dirname(dest), create=True)
        try:
            pname, dname = os.path.basename(partial), os.path.basename(dest)
            try:
                pst = os.stat(pname, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                raise Refused("%s: no such copy to commit" % partial) from None
            src_fd, src_name = pfd, pname
            if stat_.S_ISDIR(pst.st_mode):
                part_fd = os.open(pname, _DIR_FLAGS, dir_fd=pfd)
                manifest = _read_manifest(part_fd, partial)
                if manifest is not None:
                    files, size = _finish(part_fd, manifest, partial)
                    # gone before the swap: a partial folder left holding the old tree must never pass for a copy
                    os.unlink(DATA_MANIFEST, dir_fd=part_fd)
                    os.fsync(part_fd)
                    src_fd, src_name = part_fd, DATA_TREE
            elif not stat_.S_ISREG(pst.st_mode):
                raise Refused("%s is neither a file nor a folder" % partial)
            try:
                dst = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                dst = None
            if dst is None:
                os.rename(src_name, dname, src_dir_fd=src_fd, dst_dir_fd=dfd)
            elif not _exchange(src_fd, src_name, dfd, dname):
                both_files = not stat_.S_ISDIR(dst.st_mode) and not stat_.S_ISDIR(
                    os.stat(src_name, dir_fd=src_fd, follow_symlinks=False).st_mode)
                if not both_files:  # a folder cannot be replaced by one rename: the old one goes aside first
                    aside = "%s.old-%s" % (dname, _new_token()[:8])
                    os.rename(dname, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
                os.rename(src_name, dname, src_dir_fd=src_fd, dst_dir_fd=dfd)
            _sync_folder(dfd)
        finally:
            if part_fd is not None:
                os.close(part_fd)
            os.close(dfd)
    finally:
        os.close(pfd)
    # what is left: the partial folder (with the old tree after a swap), the old tree set aside
    for left in ([partial] if os.path.lexists(partial) else []) + ([os.path.join(os.path.dirname(dest), aside)]
                                                                 if aside else []):
        if os.path.isdir(left) and not os.path.islink(left):
            shutil.rmtree(left, ignore_errors=True)
        else:
            _unlink(left)
    return {"dest": dest, "files": files, "bytes": size}


def data_drop(req):
    """Remove the file or folder req['path'] (a dataset evicted, a copy abandoned); a link is removed, never
    followed. {dropped}: whether there was something."""
    import stat as stat_

    path = _data_writable(req["path"])
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"dropped": False}
    if stat_.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # descriptor-based: a link inside is removed, not followed
    else:
        os.unlink(path)
    return {"dropped": True}


def data_hash(req):
    """sha256 over the tree req['path']: for each regular file in the order of its relative path (a file
    alone: ""), the path (UTF-8), NUL, its size in decimal, NUL, its bytes. {sha256, files, bytes}. Each file is
    opened below the tree's folder as `_tree` listed it, no link followed (one laid meanwhile is refused)."""
    import stat as stat_

    kind, files, _dirs = _tree(req["path"])
    if kind is None:
        raise Refused("%s: no such file or folder" % req["path"])
    base = _data_root(req["path"])
    h = hashlib.sha256()
    total = 0
    top = _open_inside(base, _DIR_FLAGS) if kind == "dir" else None
    try:
        for rel, _st in files:
            path = os.path.join(base, rel) if rel else base
            if top is None:
                fd = _open_inside(base, os.O_RDONLY | os.O_NONBLOCK)
            else:
                fd = _open_below(top, _rel_parts(rel), os.O_RDONLY | os.O_NONBLOCK, path)
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                if not stat_.S_ISREG(fst.st_mode):
                    raise Refused("%s is not a regular file" % path)
                h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(fst.st_size).encode() + b"\0")
                n = 0
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    n += len(chunk)
                    h.update(chunk)
                if n != fst.st_size:
                    raise Refused("%s changed while it was hashed" % path)
            total += n
    finally:
        if top is not None:
            os.close(top)
    return {"sha256": h.hexdigest(), "files": len(files), "bytes": total}


def serve():
    """Answer many requests on one channel: JSON lines {"id", "cmd", "req"} in, {"id", "reply"} out.

    The controller keeps one of these per node (a subprocess for this machine, an SSH channel for the
    others), so a status or probe costs a round trip, not a Python start. Requests run in threads (a
    launch may wait for its run to start) and replies may come out of order; the id matches them. The
    loop ends when the channel closes (stdin EOF): every probe child is killed and reaped at once (runs are
    detached: they go on), what else was asked is answered, and the helper exits.
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
            reply = {"error": _why(e)}
        data = json.dumps({"id": rid, "reply": reply}) + "\n"
        with out_lock:
            try:
                sys.stdout.write(data)
                sys.stdout.flush()
            except (OSError, ValueError):
                _kill_children()
                os._exit(0)  # the reader is gone

    workers = []
    for line in sys.stdin:
        t = threading.Thread(target=handle, args=(line,))
        t.start()
        workers.append(t)
        workers = [w for w in workers if w.is_alive()]
    _kill_children()
    deadline = time.monotonic() + 30.0
    for w in workers:  # answer what was asked before the channel closed
        w.join(max(0.0, deadline - time.monotonic()))
    return 0


COMMANDS["read"] = read_file
COMMANDS["watch"] = watch
COMMANDS["newest"] = newest
COMMANDS.update({"whoami": whoami, "pack": pack, "append": append, "unpack": unpack, "drop": drop})
COMMANDS.update({"data_scan": data_scan, "data_list": data_list, "data_free": data_free, "data_read": data_read,
                 "data_write": data_write, "data_claim": data_claim, "data_commit": data_commit,
                 "data_drop": data_drop, "data_hash": data_hash, "data_root": data_root,
                 "data_read_many": data_read_many, "data_write_many": data_write_many})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
