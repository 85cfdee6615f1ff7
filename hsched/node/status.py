"""`status`: for each run, running / exited (with its exit record) / lost / not_started, from its handle, the
processes that carry it and the records its wrapper wrote."""

import os

from . import cgroupstats, confine
from .cgroups import remove_cgroups
from .confine import inside, own
from .processes import kill_run
from .procfs import proc_start_ticks
from .records import boot_id, read_json


def handle_alive(handle):
    if handle.get("boot_id") != boot_id():
        return False
    ticks = proc_start_ticks(int(handle["pid"]))
    return ticks is not None and ticks == int(handle["start_ticks"])


def valid_exit_record(rec):
    """The exit record if it is one this helper could have written, else None: a dict whose exit code is an
    integer from 0 to 255 (not a boolean). A torn or hand-made file must never become an exit code (or crash
    the reply about every other run of the node)."""
    if not isinstance(rec, dict):
        return None
    code = rec.get("exit_code")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        return None
    return rec


def _number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def exited(exit_info, handle):
    """The report of a run with a sound exit code; what else the record says is passed on only if it is
    well formed (a garbage end time is no end time: the controller uses the moment it learnt of the end)."""
    left = exit_info.get("gpu_left")
    holders = [h for h in left if isinstance(h, dict)] if isinstance(left, list) else []
    sig = exit_info.get("signal")
    return {"status": "exited", "exit_code": exit_info["exit_code"],
            "signal": sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
            "end_time": _number(exit_info.get("end_time")), "oom": exit_info.get("oom") is True,
            "gpu_oom": exit_info.get("gpu_oom") is True,
            "gpu_oom_line": str(exit_info.get("gpu_oom_line") or "")[:300] or None,
            "gpu_left": holders, "handle": handle, "usage": cgroupstats.clean(exit_info.get("usage"))}


def run_info(run_dir, handle):
    """handle.json of the run (its containment), if it is the record of this very run."""
    info = read_json(os.path.join(run_dir, "handle.json"))
    if not isinstance(info, dict) or int(info.get("pid", -1)) != int(handle["pid"]):
        info = dict(handle)
    info["run_dir"] = run_dir
    return info


def end_remains(run_dir, handle, wait_s=2.0):
    """Kill what is left of a run whose wrapper is gone (its cgroup, its marker) and wait up to wait_s for it
    to go; returns the pids still alive. Once none is, its cgroups are removed."""
    info = run_info(run_dir, handle)
    stuck, _killed = kill_run(info, None, None, limit_s=wait_s)
    if not stuck:
        remove_cgroups(info.get("cgroups"))
    return stuck


def disk_handle(run_dir):
    """Under --confine: the handle this helper wrote for the run in `run_dir` (None: none there), never what a
    request says (a made-up handle would have root kill or signal any process)."""
    run_dir = inside(run_dir)
    if not os.path.isdir(run_dir):
        return None
    own(run_dir)
    handle = read_json(os.path.join(run_dir, "handle.json"))
    if not isinstance(handle, dict):
        return None
    handle["run_dir"] = run_dir
    return handle


def run_status(item):
    run_dir = item["run_dir"]
    if confine.CONFINE is not None:
        handle = disk_handle(run_dir)
    else:
        handle = item.get("handle") or read_json(os.path.join(run_dir, "handle.json"))
    if handle is None:
        if not os.path.isdir(run_dir):
            return {"status": "not_started"}
        spec_seen = os.path.exists(os.path.join(run_dir, "spec.json"))
        return {"status": "lost" if spec_seen else "not_started", "detail": "no handle recorded"}
    exit_info = valid_exit_record(read_json(os.path.join(run_dir, "exit.json")))
    if exit_info is not None:
        return exited(exit_info, handle)
    if handle_alive(handle):
        return {"status": "running", "handle": handle}
    # the wrapper may have written exit.json between the two looks
    exit_info = valid_exit_record(read_json(os.path.join(run_dir, "exit.json")))
    if exit_info is not None:
        return exited(exit_info, handle)
    # the wrapper is gone without an exit record: lost, but only once nothing of the run runs any more
    if handle.get("boot_id") == boot_id():
        left = end_remains(run_dir, handle)
        if left:
            return {"status": "running", "handle": handle,
                    "detail": "the run's wrapper is gone; killing what is left of it: pids %s" % left}
    return {"status": "lost", "handle": handle, "detail": "process gone without an exit code"}


def status(req):
    return {"runs": [one_status(item) for item in req.get("runs", [])]}


def one_status(item):
    """One run's report; a failure reading it is that run's, never the whole reply's (every other run of the
    node would stay unreported)."""
    try:
        return run_status(item)
    except Exception as e:
        return {"status": "unknown", "detail": "%s: %s" % (type(e).__name__, e)}
