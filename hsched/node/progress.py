"""Runs' progress reports: the file a job writes to ($HSCHED_PROGRESS, `step=1200 total=50000` or JSON lines;
hsched.progress) and its newest report, read by the watch stream."""

import json
import os
import time

PROGRESS_ENV = "HSCHED_PROGRESS"
PROGRESS_FILE = "progress.log"
"""A run's progress reports: one line each, `step=1200 total=50000` or a JSON object (hsched.progress)."""


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


class ProgressReader(object):
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
