"""A run's stdout and stderr: its folder's output.log, and sbatch's --output/--error files beside it."""

import os
import threading
import time

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


class Outputs:
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
