"""The wrapper (`nodehelper.py _wrap RUN_DIR`): the run's owner. It starts the job contained, waits for it and for
every process it left, and records the end.

The wrapper runs the job in a session of its own, so signals sent to the job's process group leave the wrapper
alive to record how the job ended. Run folder (0700, files 0600):

    spec.json     the launch request (command, env, workdir, inherit_env, cpus, memory_mib, cpu_limit,
                  devices, checkpoint_exit_code, stop_grace_s, output, error, truncate_output: sbatch's -o/-e
                  files, which the wrapper also writes the job's output to, opened as the run's user)
    handle.json   run_dir, pid (the wrapper), pgid (= the main process's pid), start_ticks, boot_id,
                  child_start_ticks, containment ("cgroup" | "pgroup"), cgroups ({"v2", "memory", "cpu"}:
                  folders), enforced (["memory", "cpu"]: limits in force), subreaper, cgroup_errors, mps (a
                  shared run's: {gpu, state: started | joined | absent | failed | refused, daemon, detail}),
                  mps_swept (a run that is not shared: [{gpu, stopped | error}], daemons left by runs gone)
    signals.log   one JSON line per signal hsched sent ({t, signal, number, batch_only, all_processes, purpose}),
                  appended before it is sent
    exit.json     exit_code, signal, end_time (when the main process ended), oom, gpu_left ([{uuid, pid,
                  name}]), stuck_pids (killed but not gone after 10 s: D state), leftovers_killed,
                  containment, main_exit (the main process's own {exit_code, signal} when a checkpoint exit
                  replaced it), gpu_check_error (when nvidia-smi failed or hung), mps (a shared run's:
                  {gpu, runs_left, stopped: the daemon's pid when this run was the GPU's last, error})
    progress.log  the job's progress reports ($HSCHED_PROGRESS; the user's in a lab), read by `watch`
    output.log, wrapper.log"""

import os
import signal
import subprocess
import time

from . import cgroupstats, confine
from .cgroups import make_cgroups, oom_killed, remove_cgroups
from .confine import Refused, inside, own
from .gpucheck import gpu_holders, gpu_oom_line
from .libc import PR_SET_CHILD_SUBREAPER, prctl_fn
from .mps import mps_begin, mps_end, mps_sweep, others_on_shared_gpu
from .outputs import Outputs
from .processes import kill_run, reap, wait_for_rest
from .procfs import RUN_MARKER, proc_start_ticks, proc_stat
from .progress import PROGRESS_ENV, PROGRESS_FILE
from .records import boot_id, private_fd, read_json, write_json_atomic
from .signals import sent_signals

STOP_MARGIN_S = 15.0
"""After a signalled run's main process ended, how long past the stop grace the rest may take before the
wrapper kills it itself (the controller's escalation normally comes first)."""


def set_subreaper():
    """Orphans of the run come back to the wrapper (not to init), so it reaps them and sees their exit codes."""
    prctl = prctl_fn()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def start_job(spec, env, workdir, log_fd, cpus, cgroups, acct=None, err_fd=None):
    procs_files = [os.path.join(cgroups[k], "cgroup.procs") for k in ("v2", "memory", "cpu") if cgroups.get(k)]

    def prepare():
        # in the child, before exec: into the run's cgroups first, so everything it starts is inside; a
        # failure here fails the start, and the wrapper starts it again without cgroups
        pid = str(os.getpid())
        for path in procs_files:
            with open(path, "w") as f:
                f.write(pid)
        _restore_signals()
        if cpus:
            os.sched_setaffinity(0, cpus)
        if acct:
            # the user's identity last (joining the cgroups needed root's); then their working folder, entered
            # as them: a folder they may not enter fails the run as "cannot execute", never runs it elsewhere
            os.setgroups(acct["groups"])
            os.setresgid(acct["gid"], acct["gid"], acct["gid"])
            os.setresuid(acct["uid"], acct["uid"], acct["uid"])
            try:
                os.chdir(workdir)
            except OSError as e:
                os.write(1, ("hsched: cannot enter %s as %s: %s\n" % (workdir, acct["name"], e.strerror)).encode())
                os._exit(126)

    return subprocess.Popen(spec["command"], cwd=None if acct else workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=log_fd, stderr=log_fd if err_fd is None else err_fd, start_new_session=True,
                            close_fds=True, preexec_fn=prepare)


def _decode(status_):
    """(exit code, signal) of a wait status: 128 + N and N for a death by signal N."""
    if os.WIFSIGNALED(status_):
        sig = os.WTERMSIG(status_)
        return 128 + sig, sig
    return os.WEXITSTATUS(status_), None


def wrap(run_dir):
    """The run's owner: start the job contained, wait for it and for every process it left, record the end."""
    if confine.CONFINE is not None:
        # `_wrap` can be asked for through sudo too: only a run folder and spec this helper made, for a user
        run_dir = inside(run_dir)
        own(run_dir)
        own(os.path.join(run_dir, "spec.json"))
    spec = read_json(os.path.join(run_dir, "spec.json")) or {}
    if confine.CONFINE is not None:
        acct = spec.get("account")
        if not isinstance(acct, dict) or int(acct.get("uid", 0)) < confine.MIN_UID:
            raise Refused("%s: this helper runs jobs only as users with a uid of at least %d"
                          % (run_dir, confine.MIN_UID))
    if spec.get("inherit_env"):
        env = dict(os.environ)
    else:
        # a login's basics on this node, never the controller machine's paths
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        for k in ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR"):
            if k in os.environ:
                env[k] = os.environ[k]
    acct = spec.get("account")
    if acct:
        # the user's own login basics, never root's
        env.update({"HOME": acct["home"], "USER": acct["name"], "LOGNAME": acct["name"], "SHELL": acct["shell"]})
    env.update(spec.get("env") or {})
    env[RUN_MARKER] = run_dir
    # where the job reports its progress (hsched.progress.report, or lines of its own); the watch reads it
    env.setdefault(PROGRESS_ENV, os.path.join(run_dir, PROGRESS_FILE))
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)  # signals are for the job; the wrapper must live to write the code
    # a shared run's GPU gets its MPS daemon before the wrapper becomes a subreaper (the daemon must not be
    # adopted by it: it is no process of this run) and before the job starts (CUDA looks for it at init)
    mps = mps_begin(run_dir, env)
    swept = mps_sweep(spec.get("devices") or []) if mps is None else []
    subreaper = set_subreaper()
    # a user's run starts in their home (its folder is root's); hsched's own runs in the run folder
    workdir = spec.get("workdir") or (acct["home"] if acct and os.path.isdir(acct["home"]) else None) or run_dir
    if acct and workdir == run_dir:
        workdir = "/"
    cpus = _usable_cpus(spec.get("cpus") or [])
    if cpus:
        env["HSCHED_CPUS"] = ",".join(str(c) for c in cpus)
    cgroups, enforced, errors = make_cgroups(run_dir, spec)
    log_fd = private_fd(os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_APPEND)
    try:
        outputs = Outputs(spec, workdir, acct, log_fd)
    except OSError as e:
        # as sbatch: a job whose output file cannot be opened (a missing folder, no permission) fails at once
        line = "hsched: cannot open the output file %s%s: %s\n" % (
            e.filename or "", (" as %s" % acct["name"]) if acct else "", e.strerror)
        os.write(log_fd, line.encode())
        mps_end(run_dir, mps)
        return _not_started(run_dir, log_fd, cgroups, errors, e, 1)
    try:
        try:
            child = start_job(spec, env, workdir, outputs.stdout, cpus, cgroups, acct, outputs.stderr)
        except subprocess.SubprocessError as e:  # the child could not join its cgroups: contain it without them
            errors.append("joining the run's cgroups failed (%s): process group only" % e)
            remove_cgroups(cgroups)
            cgroups, enforced = {}, []
            child = start_job(spec, env, workdir, outputs.stdout, cpus, cgroups, acct, outputs.stderr)
    except OSError as e:
        os.write(log_fd, ("hsched: cannot start %r: %s\n" % (spec["command"][0], e.strerror)).encode())
        outputs.close()
        mps_end(run_dir, mps)
        return _not_started(run_dir, None, cgroups, errors, e, 127 if isinstance(e, FileNotFoundError) else 126)
    outputs.started()
    info = _handle(run_dir, child.pid, proc_start_ticks(child.pid) or _stat_ticks(child.pid), cgroups, enforced,
                   errors)
    info["subreaper"] = subreaper
    if mps is not None:
        info["mps"] = mps  # recorded once: MPS started or joined, or why the GPU is time-sliced without it
    if swept:
        info["mps_swept"] = swept  # an MPS daemon no shared run needed any more, stopped before this job began
    write_json_atomic(os.path.join(run_dir, "handle.json"), info)
    me = os.getpid()
    reaped = []  # (time, pid, wait status) of every other process of the run that ended as our child
    main_status = None
    while main_status is None:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot happen while the child is ours; never spin on it
            main_status = 255 << 8
            break
        if pid == child.pid:
            main_status = st
        else:
            reaped.append((time.time(), pid, st))
    end_time = time.time()
    code, sig = _decode(main_status)
    child.returncode = -sig if sig else code  # reaped here, not by Popen: it must not wait for it again
    if sent_signals(run_dir):
        # hsched is stopping the run: the rest may be saving a checkpoint; the controller escalates if they
        # take too long, and we end them ourselves if it does not
        wait_for_rest(info, me, reaped, time.monotonic() + float(spec.get("stop_grace_s") or 0) + STOP_MARGIN_S)
    stuck, killed = kill_run(info, me, reaped)
    reap(reaped)
    # every process of the run is gone: the last of its output reaches output.log and the user's files before
    # the log is read below and the end is recorded
    outputs.drain()
    outputs.close()
    record = {"exit_code": code, "signal": sig, "end_time": end_time}
    ckpt = spec.get("checkpoint_exit_code")
    sent = sent_signals(run_dir)
    if sig is not None and ckpt is not None and sig in [n for _t, n in sent]:
        # the main process (say `bash -c "python3 train.py; true"`) died of the signal hsched sent, and a
        # process of the run then saved its checkpoint and exited with the checkpoint code: the run did
        first = min(t for t, _n in sent)
        if any(t >= first and os.WIFEXITED(s) and os.WEXITSTATUS(s) == int(ckpt) for t, _p, s in reaped):
            record.update({"exit_code": int(ckpt), "signal": None, "main_exit": {"exit_code": code, "signal": sig}})
    record["oom"] = oom_killed(cgroups)
    if code != 0 and not sent:
        line = gpu_oom_line(os.path.join(run_dir, "output.log"))
        if line is not None:
            record.update({"gpu_oom": True, "gpu_oom_line": line})
    record["usage"] = cgroupstats.final(cgroups)  # the cgroup's totals, read before it is removed
    remove_cgroups(cgroups)
    mps_end_rec = mps_end(run_dir, mps)  # before the GPU check: the last shared run's daemon is gone by then
    if mps_end_rec is not None:
        record["mps"] = mps_end_rec
    holders, gpu_error = gpu_holders(spec.get("devices") or [])
    if mps is not None:
        holders = others_on_shared_gpu(holders, run_dir)  # the GPU's other runs are not left behind by this one
    record.update({"gpu_left": holders, "stuck_pids": stuck, "leftovers_killed": len(killed),
                   "containment": info["containment"]})
    if gpu_error:
        record["gpu_check_error"] = gpu_error
    # written last: a reported exit means no process of the run is left (but `stuck_pids`)
    write_json_atomic(os.path.join(run_dir, "exit.json"), record)
    return 0


def _not_started(run_dir, log_fd, cgroups, errors, e, code):
    """Record a run whose job never started (exit `code`): its handle, then its exit record."""
    if log_fd is not None:
        os.close(log_fd)
    remove_cgroups(cgroups)
    write_json_atomic(os.path.join(run_dir, "handle.json"), _handle(run_dir, os.getpid(), None, {}, [], errors))
    write_json_atomic(os.path.join(run_dir, "exit.json"), {
        "exit_code": code, "signal": None, "end_time": time.time(), "error": str(e), "oom": False,
        "gpu_left": [], "stuck_pids": []})
    return 0


def _stat_ticks(pid):
    st = proc_stat(pid)  # a child that already ended is a zombie until we reap it: its start time is there
    return st[4] if st is not None else None


def _usable_cpus(wanted):
    """The wanted cores this process may run on (a job is pinned to the cores local to its GPUs)."""
    if not wanted or not hasattr(os, "sched_getaffinity"):
        return []
    allowed = os.sched_getaffinity(0)
    return sorted(c for c in wanted if c in allowed)


def _restore_signals():
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_DFL)


def _handle(run_dir, child_pid, child_ticks, cgroups, enforced, errors):
    me = os.getpid()
    info = {"run_dir": run_dir, "pid": me, "pgid": child_pid, "start_ticks": proc_start_ticks(me) or 0,
            "boot_id": boot_id(), "child_start_ticks": child_ticks,
            "containment": "cgroup" if cgroups else "pgroup", "cgroups": cgroups, "enforced": enforced}
    if errors:
        info["cgroup_errors"] = errors
    return info
