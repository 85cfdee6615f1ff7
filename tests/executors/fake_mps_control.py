"""A stand-in for NVIDIA's `nvidia-cuda-mps-control` (tests only; a test copies it onto PATH under that name).

What it copies from the real program (NVIDIA's MPS documentation and man page; the pipe folder's contents as the
k8s device plugin's MPS daemon shows them): `-d` forks a control daemon into the background and returns; the
daemon listens on a `control` UNIX socket (0666) in CUDA_MPS_PIPE_DIRECTORY and writes its pid to
`nvidia-cuda-mps-control.pid` there, which goes away when it quits (the socket stays); it logs to control.log in
CUDA_MPS_LOG_DIRECTORY. Without `-d` it is the client: each line of stdin is a command for the daemon of
CUDA_MPS_PIPE_DIRECTORY (`quit` stops it); no daemon there: "Cannot find MPS control daemon process", exit 1.

What it adds for the tests: the daemon writes started-<pid>.json into its log folder (its pid, uid and
environment), and `fake-mps.json` beside this program may hold {"ready_delay_s": S}: the daemon waits that long
before it listens, which widens the window in which two runs starting at once could both start one.
"""

import json
import os
import socket
import sys
import time

PID_FILE = "nvidia-cuda-mps-control.pid"


def _pipe() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"


def _log() -> str:
    return os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"


def _config() -> dict:
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "fake-mps.json")) as f:
            return json.load(f)
    except OSError:
        return {}


def _running() -> int | None:
    try:
        with open(os.path.join(_pipe(), PID_FILE)) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _append(name: str, line: str) -> None:
    with open(os.path.join(_log(), name), "a") as f:
        f.write(f"[{time.time():.6f}] {line}\n")


def daemon() -> int:
    if _running() is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if os.fork():
        return 0  # as -d: back at once, the daemon comes up meanwhile
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(float(_config().get("ready_delay_s", 0)))
    pipe, log = _pipe(), _log()
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(log, exist_ok=True)
    path = os.path.join(pipe, "control")
    if os.path.exists(path):
        os.unlink(path)  # a socket left by a daemon that quit
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o666)
    srv.listen(16)
    me = os.getpid()
    with open(os.path.join(log, f"started-{me}.json"), "w") as f:
        json.dump({"pid": me, "uid": os.getuid(), "env": dict(os.environ)}, f)
    _append("control.log", "Startup")
    tmp = os.path.join(pipe, PID_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{me}\n")
    os.chmod(tmp, 0o666)
    os.replace(tmp, os.path.join(pipe, PID_FILE))
    while True:
        conn, _ = srv.accept()
        with conn:
            command = conn.makefile("r").readline().strip()
            _append("control.log", f"Command {command!r}")
            if command == "quit":
                os.unlink(os.path.join(pipe, PID_FILE))
                _append("control.log", "Exit with status 0")
                conn.sendall(b"")
                os._exit(0)
            conn.sendall(b"\n" if command == "get_server_list" else b"Unknown command\n")


def client() -> int:
    for line in sys.stdin:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(os.path.join(_pipe(), "control"))
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        with s:
            s.sendall(line.encode())
            reply = s.makefile("rb").read()
        sys.stdout.write(reply.decode())
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:] == ["-d"] else client())
