"""The node helper's commands and how they are asked: one per process (`nodehelper.py CMD`, the request as JSON
on stdin, the reply as JSON on stdout; a failure is a JSON `{"error": "..."}` and exit status 1) or many on
one pair of pipes (`serve`, what the executors use).

    probe           machine facts: CPUs, memory, NUMA nodes, NVIDIA GPUs (NVML, else nvidia-smi), boot id;
                    GPU discovery runs in a child process with a hard time limit (`gpu_timeout_s`)
    launch          start a run detached (new session); idempotent per run folder
    status          for each run: running / exited (with exit code, end time, OOM, GPU holders) / lost /
                    not_started
    signal          send a signal to a run (its main process, its process group, or every process of it)
    read            bytes of a file from an offset (a run's log), base64
    newest          the newest modification time under a folder (a checkpoint's age)
    watch           a monitoring stream: one JSON sample per interval
    serve           many requests on one pair of pipes, JSON lines with ids (what executors use)
    whoami          who runs this helper and where it is confined (the executors' first contact through sudo)
    pack            a folder (a checkpoint) as one tar file in the helper's transfer folder, read back with `read`
    append          bytes onto a tar file in the transfer folder (a checkpoint coming in)
    unpack          a tar file of the transfer folder into a folder, replacing it (regular files and folders only)
    drop            remove a transfer file
    data_scan       a dataset (a file or a folder tree): whether it is there, its bytes, files and newest mtime
    data_list       a dataset's files (relative path, size, mtime, mode) and folders
    data_free       bytes free where a dataset would go
    data_root       where this helper writes datasets (ROOT/data under --confine, else anywhere: null)
    data_read       up to 4 MiB of a dataset file from an offset, base64
    data_write      bytes into a dataset file at an offset (cut there first), no link on the way
    data_read_many  several small files of a dataset in one reply (4 MiB in all), base64
    data_write_many several small files into a claimed partial copy in one request, each fsynced
    data_claim      a partial copy made one attempt's: writes that carry another's claim are refused from then on
    data_commit     a finished copy (DEST.partial: manifest + data) put at DEST whole, modes and mtimes restored
    data_drop       remove a dataset or an abandoned copy
    data_hash       sha256 over a dataset's files (sorted relative paths, each path, size and bytes)
    _wrap RUN_DIR   (internal) the wrapper that owns a run, contains it and writes its exit record atomically
    _probe_gpus     (internal) the GPU discovery that `probe` runs in a child process

Options before the command: `--confine ROOT [--min-uid N]`, each at most once (a second one, an unknown option
or an argument after the command is one JSON error, exit status 2). A lab whose controller runs as a service
account (not root) installs this helper root-owned on every node with a sudo rule that lets the account run
exactly its launcher with one command (`hsched node helper-script`); the installed launcher always passes
`--confine` and `--min-uid` first, so they are final, and then the helper does nothing the account could
turn into root's powers: every path it reads, makes, packs or unpacks lies under ROOT (no symbolic link on the
way; `read` gives only a run's output.log or a transfer file), a run starts only as a named user with a uid of
at least N (default 1000: never root, never a system account), and the handles that `status` and `signal` act
on are the ones this helper wrote (handle.json in a root-owned run folder), never what a request says.
"""

import json
import os
import sys
import threading
import time

from .children import kill_children
from .confine import BadOptions, Refused, parse_options, whoami, why
from .dataread import data_free, data_hash, data_list, data_read, data_read_many, data_root, data_scan
from .datawrite import data_claim, data_commit, data_drop, data_write, data_write_many
from .files import append, drop, newest, pack, read_file, unpack
from .launch import launch
from .owners import users
from .probe import probe, probe_gpus
from .signals import send_signal
from .status import status
from .watch import watch
from .wrap import wrap

COMMANDS = {
    "probe": probe, "launch": launch, "status": status, "signal": send_signal, "users": users, "read": read_file,
    "watch": watch, "newest": newest, "whoami": whoami, "pack": pack, "append": append, "unpack": unpack, "drop": drop,
    "data_scan": data_scan, "data_list": data_list, "data_free": data_free, "data_read": data_read,
    "data_write": data_write, "data_claim": data_claim, "data_commit": data_commit, "data_drop": data_drop,
    "data_hash": data_hash, "data_root": data_root, "data_read_many": data_read_many,
    "data_write_many": data_write_many,
}
"""Every request a caller may make, by name (`_wrap` and `_probe_gpus` are the helper's own: not here)."""


def main(argv):
    """The helper run as a program (`argv`: sys.argv); its exit status."""
    try:
        argv = parse_options(argv)
    except BadOptions as e:
        sys.stdout.write(json.dumps({"error": "node helper: %s" % e}) + "\n")
        sys.stdout.flush()
        return 2
    if len(argv) >= 3 and argv[1] == "_wrap":
        try:
            return wrap(argv[2])
        except Refused as e:
            sys.stderr.write("hsched node helper: %s\n" % e)
            return 2
    if len(argv) >= 2 and argv[1] == "_probe_gpus":
        sys.stdout.write(json.dumps(probe_gpus()) + "\n")
        sys.stdout.flush()
        return 0
    if len(argv) >= 2 and argv[1] == "serve":
        return serve()
    if len(argv) < 2 or argv[1] not in COMMANDS:
        sys.stdout.write(json.dumps({"error": "usage: nodehelper.py %s" % "|".join(COMMANDS)}) + "\n")
        return 2
    raw = sys.stdin.read() if argv[1] != "probe" else (sys.stdin.read() if not sys.stdin.isatty() else "")
    try:
        req = json.loads(raw) if raw.strip() else {}
        reply = COMMANDS[argv[1]](req)
    except Exception as e:  # one JSON error line, never a traceback the controller must parse
        reply = {"error": why(e)}
    finally:
        kill_children()
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 1 if "error" in reply else 0


def serve():
    """Answer many requests on one channel: JSON lines {"id", "cmd", "req"} in, {"id", "reply"} out.

    The controller keeps one of these per node (a subprocess for this machine, an SSH channel for the
    others), so a status or probe costs a round trip, not a Python start. Requests run in threads (a
    launch may wait for its run to start) and replies may come out of order; the id matches them. The
    loop ends when the channel closes (stdin EOF): every probe child is killed and reaped at once (runs are
    detached: they go on), what else was asked is answered, and the helper exits.
    """
    out_lock = threading.Lock()

    def handle(line):
        try:
            msg = json.loads(line)
            rid, cmd, req = msg["id"], msg["cmd"], msg.get("req") or {}
        except (ValueError, KeyError, TypeError):
            return
        fn = COMMANDS.get(cmd)
        try:
            reply = fn(req) if fn is not None and cmd != "watch" else {"error": "unknown request %r" % cmd}
        except Exception as e:
            reply = {"error": why(e)}
        data = json.dumps({"id": rid, "reply": reply}) + "\n"
        with out_lock:
            try:
                sys.stdout.write(data)
                sys.stdout.flush()
            except (OSError, ValueError):
                kill_children()
                os._exit(0)  # the reader is gone

    workers = []
    for line in sys.stdin:
        t = threading.Thread(target=handle, args=(line,))
        t.start()
        workers.append(t)
        workers = [w for w in workers if w.is_alive()]
    kill_children()
    deadline = time.monotonic() + 30.0
    for w in workers:  # answer what was asked before the channel closed
        w.join(max(0.0, deadline - time.monotonic()))
    return 0
