"""GPUs shared by several runs: the CUDA MPS control daemon of each shared GPU, started before its first shared
run's job and stopped after its last one."""

import hashlib
import os
import re
import shutil
import subprocess
import time

from . import confine
from .procfs import is_live, proc_start_ticks, run_marker
from .records import boot_id, read_json, read_text, unlink_quietly, write_json_atomic

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
    if confine.CONFINE is None and os.environ.get(MPS_BASE_ENV):
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
    text = read_text(os.path.join(pipe, MPS_PID_FILE))
    try:
        pid = int(text or "")
    except ValueError:
        return None
    if pid <= 0 or not is_live(pid):
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
            unlink_quietly(path)
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
    said = (read_text(out_path) or "")[-300:]
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
    while is_live(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if is_live(pid):
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
