"""Issue 27, point 6, live: the real controller, CLI and node helper as processes, the wall clock stepped under them.

The wall clock is stepped by a small preloaded library built here from SHIM (below): it adds the offset written in
a file the test rewrites to every reading of the wall clock (CLOCK_REALTIME, gettimeofday, time) in every hsched
process the test starts, and leaves the monotonic clock alone: what `date -s` or an NTP step does to a host. Nothing
in hsched knows about it. (Debian's libfaketime 0.9.10 cannot do this for Python 3.11: with the monotonic clock
left alone its clock_nanosleep makes every time.sleep fail with EINVAL, wolfcw/libfaketime#426.) Skipped, with
the reason, where no C compiler is installed.

Every bound below is a lower bound measured on this test's own monotonic clock between two observations, less how
late each observation may be (a loaded machine makes things later, never earlier); the only upper bound is the
safety net, which the code before the fix misses by an hour.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import SAFETY_S, Hs

pytestmark = pytest.mark.slow  # the CLI and the controller as real processes

LIMIT_S = 20.0
POLL_S = 0.1

FLEET = """
[[node]]
name = "a"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 4
topology = "nvswitch"
"""

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

/* seconds to add to the wall clock: the whole number in $WALL_OFFSET_FILE, read at every call (0 without it) */
static long long offset(void) {
    const char *path = getenv("WALL_OFFSET_FILE");
    long long off = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%lld", &off) != 1) off = 0;
        fclose(f);
    }
    return off;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *);
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int r = real(tv, tz);
    if (r == 0 && tv) tv->tv_sec += offset();
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"""


def build_shim(where: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the wall-clock shim that steps the wall clock under hsched")
    src, lib = where / "wallshift.c", where / "wallshift.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"], check=True,
                   capture_output=True, timeout=120)
    return lib


class Stepped(Hs):
    """`hsched` against one HSCHED_HOME, every process of it on a wall clock the test steps."""

    def __init__(self, home: Path, fleet: Path, shim: Path, offset_file: Path) -> None:
        super().__init__(home, fleet)
        self.offset_file = offset_file
        self.step_wall(0.0)
        self.env.update({"LD_PRELOAD": str(shim), "WALL_OFFSET_FILE": str(offset_file)})

    def step_wall(self, seconds: float) -> None:
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:.0f}\n")
        tmp.replace(self.offset_file)  # (whole: a process reading it never sees half an offset)

    def wall(self) -> float:
        """The wall clock as the hsched processes see it now."""
        out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], env=self.env,
                             capture_output=True, text=True, check=True, timeout=60)
        return float(out.stdout)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Stepped]:
    shim = build_shim(tmp_path)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "settings.toml").write_text(
        "poll_interval_s = 0.2\nkill_after_s = 2\nretry_backoff_s = 10\n")
    h = Stepped(tmp_path / "home", fleet, shim, tmp_path / "wall-offset")
    yield h
    h.step_wall(0.0)
    h.stop()


def test_the_shim_steps_the_wall_clock_and_leaves_the_monotonic_one(lab: Stepped) -> None:
    before = time.time()
    lab.step_wall(7200.0)
    assert lab.wall() - before >= 7200.0
    lab.step_wall(-3600.0)
    assert lab.wall() - time.time() <= -3600.0 + 60.0
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.01); print(time.monotonic())"],
                         env=lab.env, capture_output=True, text=True, check=True, timeout=60)
    assert abs(float(out.stdout) - time.monotonic()) < 60.0


def show(h: Hs, jid: str) -> dict:  # type: ignore[type-arg]
    return json.loads(h.run("show", jid, "--json", check=True).stdout)  # type: ignore[no-any-return]


def submit(h: Hs, *args: str) -> str:
    return h.run("submit", "--parsable", *args, check=True).stdout.strip()


def last_seen_before(cond: Callable[[], object]) -> tuple[float, float, float]:
    """Poll `cond` until it holds: (the monotonic time of the last look at which it did not, the first at which it
    did, how far either may be off the true moment: a poll's gap and the longest look). Fails only at the safety
    net."""
    before = time.monotonic()
    deadline = before + SAFETY_S
    longest = 0.0
    while True:
        start = time.monotonic()
        held = cond()
        now = time.monotonic()
        longest = max(longest, now - start)
        if held:
            return before, now, POLL_S + longest
        if now > deadline:
            raise AssertionError(f"still not so after {SAFETY_S:g} s")
        before = start
        time.sleep(POLL_S)


@pytest.mark.parametrize("step_s", [7200.0, -3600.0], ids=["plus-2h", "minus-1h"])
def test_a_time_limit_fires_after_its_seconds_whichever_way_the_wall_clock_steps(lab: Stepped,
                                                                                  step_s: float) -> None:
    jid = submit(lab, "--time", f"{LIMIT_S:g}s", "--checkpoint-signal", "TERM@1", "--", "sleep", "1000")
    # its attempt starts (the limit's zero) after `pending`, the last look at which it still waited: the RUNNING
    # state itself is seen a poll or more after the run's recorded start, so it is no lower bound
    pending, _, _ = last_seen_before(lambda: show(lab, jid)["state"] != "PENDING")
    last_seen_before(lambda: show(lab, jid)["state"] == "RUNNING")
    time.sleep(3.0)
    lab.step_wall(step_s)
    not_yet, _, off = last_seen_before(lambda: show(lab, jid)["state"] in ("COMPLETING", "TIMEOUT"))
    job = show(lab, jid)
    assert job["reason"] == "timeout" and job["restarts"] == 0, job
    # it fired after `not_yet` less a poll and two looks at most, and started after `pending`: the limit did not
    # fire before its seconds (the code before the fix fired it at the step, 3 s in, for +2 h; and not within the
    # safety net for -1 h)
    assert not_yet - pending >= LIMIT_S - 2 * off, (not_yet - pending, step_s)


def test_a_retry_waits_its_backoff_not_the_wall_clocks_step_back(lab: Stepped) -> None:
    jid = submit(lab, "--retries", "1", "--", "sh", "-c", '[ "$HSCHED_RUN" = 2 ] && exec sleep 1000; exit 3')
    left: list[float] = []

    def backing_off() -> bool:
        j = show(lab, jid)
        if j["reason"] == "BeginTime" and j["restarts"] == 1:
            # what is left of its backoff at this look, by the wall clock before the step (the backoff counts from
            # the run's exit, which the controller notices a little later: the look's own time is no reference)
            left.append(datetime.fromisoformat(j["begin_time"].replace("Z", "+00:00")).timestamp() - time.time())
            return True
        return False

    _, failed, off1 = last_seen_before(backing_off)
    assert 5.0 < left[0] <= 10.0, left  # its 10 s backoff, less the moments since the exit
    lab.step_wall(-3600.0)
    # (the code before the fix held it for the hour: past the safety net)
    not_yet, _, off2 = last_seen_before(lambda: (j := show(lab, jid))["state"] == "RUNNING" and j["restarts"] == 1)
    # what was left of its backoff at `failed`, still waiting at `not_yet`: it waited the rest
    assert not_yet - failed >= left[0] - off1 - off2, (not_yet - failed, left[0])
