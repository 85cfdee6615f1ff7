"""`launch`: a run started detached, once per run folder (the folder is the launch lock), by its wrapper
(`nodehelper.py _wrap RUN_DIR`, wrap.py)."""

import os
import subprocess
import threading
import time

from . import confine
from .confine import helper_argv, inside
from .owners import give, owner_of, passable_dirs
from .progress import PROGRESS_FILE
from .records import private_fd, read_json, write_json_atomic


def launch(req):
    """Start the run in req['run_dir'] detached. The folder is the launch lock: created once, never reused."""
    run_dir = inside(req["run_dir"])
    parent = os.path.dirname(run_dir.rstrip("/"))
    acct, refused = owner_of(req)
    if refused is not None:
        return refused
    ckpt = (req.get("env") or {}).get("HSCHED_CHECKPOINT_DIR")
    if confine.CONFINE is not None:
        # every path checked before anything is made; every folder from ROOT down is made (or checked to
        # be) root's, so the account cannot lay a link there
        req = dict(req, base_dir=inside(req.get("base_dir") or confine.CONFINE))
        ckpt = ckpt and inside(ckpt)
    if acct is not None:
        passable_dirs(req.get("base_dir") or parent, parent)
    else:
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        # launched before (a retried request after a lost reply): report that run, never start another
        return _existing(run_dir, wait_s=5.0)
    # whatever the umask: a run's output and environment are its owner's only (a user's run: its control files
    # root's, the folder passable so that its owner reaches the log in it)
    os.chmod(run_dir, 0o711 if acct is not None else 0o700)
    if acct is not None:
        give(os.path.join(run_dir, "output.log"), acct, 0o600)
        give(os.path.join(run_dir, PROGRESS_FILE), acct, 0o600)
        give(os.path.join(run_dir, "signals.log"), acct, 0o600)
        if ckpt:
            passable_dirs(req.get("base_dir") or os.path.dirname(ckpt), os.path.dirname(ckpt))
            give(ckpt, acct, 0o700)
    write_json_atomic(os.path.join(run_dir, "spec.json"), {
        "account": acct,
        "command": req["command"], "env": req.get("env") or {}, "workdir": req.get("workdir"),
        "inherit_env": bool(req.get("inherit_env", False)), "cpus": req.get("cpus") or [],
        "memory_mib": req.get("memory_mib"), "cpu_limit": req.get("cpu_limit"),
        "devices": list(req.get("devices") or []), "checkpoint_exit_code": req.get("checkpoint_exit_code"),
        "stop_grace_s": req.get("stop_grace_s", 30.0),
        # sbatch's --output/--error, expanded by the controller; the wrapper opens them as the run's user
        "output": req.get("output") or None, "error": req.get("error") or None,
        "truncate_output": bool(req.get("truncate_output", False)),
    })
    wlog = private_fd(os.path.join(run_dir, "wrapper.log"), os.O_WRONLY | os.O_APPEND)
    try:
        with open(os.devnull, "rb") as devnull_in:
            wrapper = subprocess.Popen(helper_argv("_wrap", run_dir), stdin=devnull_in, stdout=wlog,
                                       stderr=wlog, start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(wlog)
    # A long-lived helper (`serve`) stays the wrapper's parent: reap it when it ends, or every finished run
    # would leave a zombie behind until the server exits. A one-shot helper exits first and init adopts it.
    reaper = threading.Thread(target=wrapper.wait)
    reaper.daemon = True
    reaper.start()
    return _existing(run_dir, wait_s=15.0)


def _existing(run_dir, wait_s):
    deadline = time.monotonic() + wait_s
    while True:
        handle = read_json(os.path.join(run_dir, "handle.json"))
        if handle is not None:
            return {"handle": handle}
        if time.monotonic() > deadline:
            return {"error": "run %s did not start within %.0f s (see wrapper.log there)" % (run_dir, wait_s)}
        time.sleep(0.005)
