"""Processes as /proc shows them: their state, start time, process group, session and parent, and the run marker
(HSCHED_RUN_DIR) a process of a run carries in its environment.

A run is found again by pid + process start time + boot id, which rules out pid reuse and reboots."""

import os

RUN_MARKER = "HSCHED_RUN_DIR"
"""Every process of a run inherits this variable; it finds processes that left the process group."""


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None if there is no such process.
    The command name (field 2) may hold spaces and parentheses: the split is after the last ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def proc_stat(pid):
    """(state, ppid, pgrp, session, start ticks) of a process from /proc/PID/stat, or None if there is none."""
    rest = stat_fields(pid)
    if rest is None:
        return None
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_start_ticks(pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None if no such process."""
    st = proc_stat(pid)
    if st is None or st[0] == "Z":  # a zombie has ended; its parent just has not reaped it yet
        return None
    return st[4]


def is_live(pid):
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def proc_table():
    """{pid: (state, ppid, pgrp, session)} of every process (one that ends meanwhile is left out)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                table[int(name)] = st[:4]
    return table


def run_pids(run_dir, table=None):
    """Every live process whose environment carries this run's marker (finds setsid'd escapees too)."""
    table = proc_table() if table is None else table
    me = os.getpid()
    return [pid for pid, st in table.items() if pid != me and st[0] != "Z" and run_marker(pid) == run_dir]


def descendants(table, root):
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
