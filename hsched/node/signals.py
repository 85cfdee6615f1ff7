"""`signal`: a signal sent to a run (its main process, its process group, or every process of it), recorded in
signals.log before it is sent; and the record read back (the wrapper's `sent_signals`)."""

import json
import os
import signal
import time

from . import confine
from .processes import run_members
from .procfs import proc_stat, proc_table
from .records import private_fd, read_text
from .status import disk_handle, handle_alive, run_info


def sent_signals(run_dir):
    """[(time, signal number)] of every signal hsched sent to the run to end it (signals.log); a checkpoint
    signal (`hsched checkpoint`: go on afterwards) is not one."""
    out = []
    try:
        with open(os.path.join(run_dir, "signals.log")) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    if rec.get("purpose") == "checkpoint":
                        continue
                    out.append((float(rec["t"]), int(rec["number"])))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def _record_signal(run_dir, name, number, batch_only, all_processes, purpose):
    """Append the signal to the run's signals.log before it is sent: the wrapper reads it to know that the
    run's end was asked for (let the rest finish, honour a checkpoint exit), never the other way round; the
    job itself may read its last line to learn why it got a signal (`purpose`: checkpoint, preempted, timeout,
    cancelled, rank_failed, warning)."""
    line = json.dumps({"t": time.time(), "signal": name, "number": number, "batch_only": batch_only,
                       "all_processes": all_processes, "purpose": purpose}) + "\n"
    fd = private_fd(os.path.join(run_dir, "signals.log"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _catches(pid, sig):
    """Whether process `pid` has a handler for signal `sig` (SigCgt in /proc/PID/status)."""
    text = read_text("/proc/%d/status" % pid) or ""
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def _signal_catchers(info, main, wrapper, sig, batch_only):
    targets = [main] if batch_only else run_members(info, wrapper)
    if not batch_only and _main_alive(main, info) and main not in targets:
        targets.append(main)
    sent = False
    skipped = 0
    for pid in targets:
        if not _catches(pid, sig):
            skipped += 1
            continue
        try:
            os.kill(pid, sig)
            sent = True
        except OSError:
            pass
    reply = {"sent": sent}
    if not sent:
        reply["detail"] = "no process of the run handles the signal (%d left alone)" % skipped
    return reply


def _main_alive(pid, info):
    """Whether the run's main process (the batch shell, the wrapper's child) is still the same process."""
    st = proc_stat(pid)
    if st is None or st[0] == "Z":
        return False
    ticks = info.get("child_start_ticks")
    if ticks is None:  # a run started by an older helper: it leads its own session, which a stranger seldom does
        return st[3] == pid
    return st[4] == int(ticks)


def send_signal(req):
    handle = req["handle"]
    signame = str(req["signal"]).upper()
    signame = signame if signame.startswith("SIG") else "SIG" + signame
    sig = getattr(signal, signame, None)
    if not isinstance(sig, int) or signame.startswith("SIG_"):
        return {"error": "unknown signal %s" % req["signal"]}
    if confine.CONFINE is not None:
        handle = disk_handle(handle["run_dir"])
        if handle is None:
            return {"sent": False, "detail": "no run there"}
    if not handle_alive(handle):
        # the wrapper is gone: the run ended (or the pid was reused); never signal a stranger
        return {"sent": False, "detail": "run not running"}
    run_dir = handle["run_dir"]
    info = run_info(run_dir, handle)
    batch_only = bool(req.get("batch_only"))
    everyone = bool(req.get("all_processes")) and not batch_only
    purpose = str(req.get("purpose") or "stop")
    _record_signal(run_dir, signame[3:], int(sig), batch_only, everyone, purpose)
    if purpose == "checkpoint":
        # "checkpoint and go on": only to the processes that handle the signal; one that would die of it (a
        # `bash -c` wrapper around the trainer) is left alone, or the run would end instead of checkpointing
        return _signal_catchers(info, int(handle["pgid"]), int(handle["pid"]), int(sig), batch_only)
    main, wrapper = int(handle["pgid"]), int(handle["pid"])
    if batch_only:
        if not _main_alive(main, info):
            return {"sent": False, "detail": "the run's main process has ended"}
        try:
            os.kill(main, sig)
        except ProcessLookupError:
            return {"sent": False, "detail": "the run's main process has ended"}
        except PermissionError as e:
            return {"error": "cannot signal the run: %s" % e}
        return {"sent": True}
    # each process gets the signal once: the group's members by killpg, the others one by one
    table = proc_table()
    members = run_members(info, wrapper) if everyone or not _main_alive(main, info) else []
    in_group = set(pid for pid, st in table.items() if st[2] == main)
    sent = False
    try:
        if _main_alive(main, info):
            os.killpg(main, sig)
            sent = True
        else:
            # the main process has ended and its group may live on: only the group's members that are the run's
            for pid in members:
                if pid in in_group:
                    os.kill(pid, sig)
                    sent = True
    except ProcessLookupError:
        pass
    except PermissionError as e:
        return {"error": "cannot signal the run: %s" % e}
    if everyone:
        for pid in members:
            if pid in in_group:
                continue
            try:
                os.kill(pid, sig)
                sent = True
            except OSError:
                pass
    return {"sent": sent}
