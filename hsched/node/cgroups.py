"""A run's cgroups: made, limited, listed, checked for the OOM killer and removed.

Each run gets a cgroup of its own where this machine lets us make one (root, or a delegated cgroup v2 folder
named by HSCHED_CGROUP_ROOT): cgroup v2 when mounted (`<mount>/hsched/run-<hash>`), plus the v1 memory and cpu
controllers (children of the helper's own v1 cgroups) for the limits v2 cannot enforce on a hybrid machine. The
job joins them before it executes, so everything it starts is inside; the wrapper stays outside. Without cgroups
(or with HSCHED_CONTAINMENT=pgroup) a run is its process group, the descendants of its wrapper (a child
subreaper, so orphans come back to it) and the processes carrying its marker variable (processes.py)."""

import hashlib
import os

from .records import read_text

CGROUP_ROOT_ENV = "HSCHED_CGROUP_ROOT"
"""A writable (delegated) cgroup v2 folder to create the runs' cgroups in, for a helper that is not root."""
CONTAINMENT_ENV = "HSCHED_CONTAINMENT"
"""`pgroup`: make no cgroups (the process group, the wrapper's descendants and the marker only)."""


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
        mountinfo = read_text("/proc/self/mountinfo") or ""
    if proc_cgroup is None:
        proc_cgroup = read_text("/proc/self/cgroup") or ""
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


def cg_write(folder, name, value):
    with open(os.path.join(folder, name), "w") as f:
        f.write(str(value))


def _cg_controllers(folder):
    return (read_text(os.path.join(folder, "cgroup.controllers")) or "").split()


def _enable_controllers(base, wanted, delegated):
    """Make `wanted` controllers (memory, cpu) available to cgroups created in `base` (cgroup v2), where this
    machine allows: in base's parent too unless base was delegated to us; failures leave them unavailable."""
    for ctrl in wanted:
        if not delegated and ctrl not in _cg_controllers(base):
            parent = os.path.dirname(base)
            if ctrl in _cg_controllers(parent):
                try:
                    cg_write(parent, "cgroup.subtree_control", "+" + ctrl)
                except OSError:
                    pass
        try:
            cg_write(base, "cgroup.subtree_control", "+" + ctrl)
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
            cg_write(v2, "memory.max", int(mem) << 20)
            if os.path.exists(os.path.join(v2, "memory.swap.max")):
                cg_write(v2, "memory.swap.max", 0)  # the limit is the run's memory, not memory plus swap
            enforced.append("memory")
        except OSError as e:
            errors.append("memory.max: %s" % (e.strerror or e))
    if v2 and cpu and "cpu" in _cg_controllers(v2):
        try:
            cg_write(v2, "cpu.max", "%d 100000" % max(1000, int(float(cpu) * 100000)))
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
                cg_write(path, "memory.limit_in_bytes", int(mem) << 20)
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    cg_write(path, "memory.memsw.limit_in_bytes", int(mem) << 20)
                enforced.append("memory")
        except OSError as e:
            errors.append("cgroup v1 memory in %s: %s" % (path, e.strerror or e))
    if "cpu" in places and cpu and "cpu" not in enforced:
        path = places["cpu"]["own"] + "/hsched/" + name
        try:
            _make_dir(os.path.dirname(path))
            _make_dir(path)
            cgroups["cpu"] = path
            cg_write(path, "cpu.cfs_period_us", 100000)
            cg_write(path, "cpu.cfs_quota_us", max(1000, int(float(cpu) * 100000)))
            enforced.append("cpu")
        except OSError as e:
            errors.append("cgroup v1 cpu in %s: %s" % (path, e.strerror or e))
    for what, value in (("memory", mem), ("cpu", cpu)):
        if value and what not in enforced:
            errors.append("the %s limit is not enforced: no %s controller hsched may use here" % (what, what))
    return cgroups, enforced, errors


def tracking_cgroup(info):
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
        for line in (read_text(os.path.join(root, "cgroup.procs")) or "").split():
            if line.isdigit():
                pids.add(int(line))
    return pids


def remove_cgroups(cgroups):
    """Remove the run's cgroups, innermost first (an empty cgroup is removed with rmdir; a busy one stays)."""
    for path in (cgroups or {}).values():
        if not path or not os.path.isdir(path):
            continue
        for root, _dirs, _files in os.walk(path, topdown=False):
            try:
                os.rmdir(root)
            except OSError:
                pass


def oom_killed(cgroups):
    """Whether the kernel's OOM killer killed a process of the run (its memory limit)."""
    for path, name in (((cgroups or {}).get("v2"), "memory.events"), ((cgroups or {}).get("memory"),
                                                                        "memory.oom_control")):
        for line in ((read_text(os.path.join(path, name)) if path else None) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
    return False
