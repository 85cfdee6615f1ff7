"""GPU samples through nvidia-smi where NVML is missing: one long-lived `nvidia-smi -lms` stream, restarted
when it stalls, and its compute processes asked for separately."""

import os
import signal
import subprocess
import threading
import time

from .children import _CLOSING, abandon, child_setup, kill_children, register, run_bounded, unregister
from .usage import gpu_process

SMI_GPU = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,utilization.memory"
"""nvidia-smi has no NVLink or PCIe throughput among its query fields: a node without NVML says neither."""


class SmiSampler(object):
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
            unregister(s)
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
                [self.exe, "--query-gpu=" + SMI_GPU, "--format=csv,noheader,nounits",
                 "-lms", str(max(100, int(self.interval_s * 1000)))],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True, preexec_fn=child_setup(False))
        except (OSError, subprocess.SubprocessError) as e:
            with self.lock:
                self.stream_error = "nvidia-smi could not start: %s" % e
            self.restart_at = time.monotonic() + max(5.0, self.interval_s)
            self.first.set()
            return
        register(proc)
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
                    procs.append(gpu_process(int(f[1]), f[0], int(used) if used is not None else None))
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
                abandon(s)
            unregister(s)

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
        kill_children()  # a query in flight ends now, not at its time limit (this process is a watch: all ours)
        self.manager.join(2.0)
