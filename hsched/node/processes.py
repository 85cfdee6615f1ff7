"""A run's processes, whichever way it is contained (its cgroups, else its wrapper's descendants and the processes
carrying its marker), and ending them all: when the run's main process ends every other process of the run is
killed (at once, or after the stop grace when hsched had signalled the run) and the wrapper writes the exit record
only once none is left, so a reported exit means the run's GPUs are free to hand out again."""

import os
import signal
import time

from .cgroups import cg_write, cgroup_pids, tracking_cgroup
from .procfs import descendants, is_live, proc_table, run_pids

STUCK_AFTER_S = 10.0
"""How long the wrapper waits for killed processes to go (one in D state may never) before it records them as
stuck and writes the exit record anyway."""


def run_members(info, wrapper_pid=None, scan=True):
    """The live processes of a run: its cgroup's members, and with `scan` (or without a cgroup) the
    descendants of its wrapper (while that lives) and the processes carrying the run's marker."""
    pids = set()
    tracker = tracking_cgroup(info)
    if tracker:
        pids.update(p for p in cgroup_pids(tracker) if is_live(p))
    if scan or not tracker:
        table = proc_table()
        if wrapper_pid:
            pids.update(descendants(table, wrapper_pid))
        pids.update(run_pids(info["run_dir"], table))
    pids.discard(os.getpid())
    pids.discard(wrapper_pid)
    return sorted(pids)


def reap(reaped):
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
    scan = tracking_cgroup(info) is None
    killed = set(run_members(info, wrapper_pid, scan))
    v2 = ((info or {}).get("cgroups") or {}).get("v2")
    if v2 and killed:
        try:
            cg_write(v2, "cgroup.kill", 1)  # Linux >= 5.14: the whole cgroup at once, forks included
        except OSError:
            pass
    deadline = time.monotonic() + limit_s
    while True:
        reap(reaped)
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
        reap(reaped)
        if not run_members(info, wrapper_pid, scan=tracking_cgroup(info) is None):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
