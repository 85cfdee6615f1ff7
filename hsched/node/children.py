"""The helper's own children with a hard time limit (GPU probes, samplers, nvidia-smi), killed with their
process group on timeout or when the helper goes away."""

import os
import signal
import subprocess
import threading
import time

from .libc import PR_SET_PDEATHSIG, prctl_fn
from .procfs import proc_table
from .records import read_text

# Every probe and sampler runs what may hang (NVML, nvidia-smi on a sick GPU) in a child process with a hard
# time limit, in a process group of its own that is SIGKILLed on timeout; a child that dies with its parent
# thread (PR_SET_PDEATHSIG) cannot outlive a helper that was itself killed. A child that cannot be reaped
# (D state: not even SIGKILL ends it) is left to a daemon thread and reported, never waited for.

_CHILDREN_LOCK = threading.Lock()
_CHILDREN = {}  # type: dict
"""pid -> Popen of the probe and sampler children this process has running."""
_CLOSING = threading.Event()
"""Set when this helper is going away: no child is started any more."""


def child_setup(own_group):
    """What a child does between fork and exec: its own process group (when not a new session), and death
    with the thread that started it. Everything is looked up before the fork, so the child only calls."""
    prctl = prctl_fn()
    setpgid = os.setpgid
    kill = signal.SIGKILL

    def setup():
        if own_group:
            setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)

    return setup


def register(proc):
    with _CHILDREN_LOCK:
        _CHILDREN[proc.pid] = proc


def unregister(proc):
    with _CHILDREN_LOCK:
        _CHILDREN.pop(proc.pid, None)


def _group_members(pgid):
    """{pid: name} of the live processes in process group `pgid`."""
    out = {}
    for pid, (state, _ppid, pgrp, _sid) in proc_table().items():
        if pgrp == pgid and state != "Z":
            out[pid] = read_text("/proc/%d/comm" % pid) or "?"
    return out


def abandon(proc):
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
        abandon(proc)
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
                                preexec_fn=child_setup(not new_session))
    except (OSError, subprocess.SubprocessError) as e:
        result["error"] = "%s could not start: %s" % (what, e)
        return result
    register(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result["error"] = "%s did not answer within %g s (%s)" % (what, timeout_s, _stop_group(proc))
        if proc.returncode is None:
            result["abandoned"] = proc
        return result
    finally:
        unregister(proc)
    result["rc"], result["out"] = proc.returncode, out
    result["err"] = err.decode("utf-8", "replace").strip()[-500:]
    if _CLOSING.is_set() and proc.returncode == -signal.SIGKILL:
        result["error"] = "%s stopped: the helper is closing" % what
    return result


def kill_children(wait_s=1.0):
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
            abandon(proc)
        unregister(proc)
