"""The processes on a node's GPUs as a sample names them: their user, command, CPU and resident memory."""

import os
import time

from .procfs import run_marker, stat_fields
from .records import read_text


def proc_name(pid):
    return read_text("/proc/%d/comm" % pid)


def gpu_process(pid, uuid, used_mib):
    return {"pid": pid, "uuid": uuid, "used_memory_mib": used_mib, "name": proc_name(pid),
            "run_dir": run_marker(pid)}


class ProcessUsage(object):
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
        rest = stat_fields(pid)
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
