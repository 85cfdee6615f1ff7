"""The controller process: single-instance lock, control socket, the main loop, a clean stop.

Started on demand by the CLI (`python -m hsched.controller.server HOME`, detached) or by
`hsched daemon start`. One per HSCHED_HOME: an flock on controller.lock decides who runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from hsched.config import load_fleet, load_settings
from hsched.controller.api import Api
from hsched.controller.core import Controller
from hsched.controller.health import monitor
from hsched.controller.loops import health_loop, run_loop, start
from hsched.errors import HschedError, UserError
from hsched.paths import Home
from hsched.protocol import MAX_LINE, encode, peer_uid
from hsched.store import Store

log = logging.getLogger("hsched.controller")


class AlreadyRunning(HschedError):
    pass


def acquire_lock(home: Home) -> int:
    fd = os.open(home.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"a controller already runs for {home.root}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.fsync(fd)
    return fd


async def _serve_client(api: Api, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    uid = peer_uid(sock) if sock is not None else None
    try:
        if uid is not None and uid != os.getuid():
            writer.write(encode({"ok": False, "kind": "failed",
                                 "error": f"permission denied: this controller serves uid {os.getuid()} only"}))
            await writer.drain()
            return
        while True:
            line = await reader.readline()
            if not line:
                return
            try:
                req = json.loads(line)
                op = str(req["op"])
                args = req.get("args") or {}
            except (ValueError, KeyError, TypeError):
                writer.write(encode({"ok": False, "kind": "user", "error": "malformed request"}))
                await writer.drain()
                continue
            if op == "subscribe":
                await _stream(api, writer, float(args.get("interval", 1.0)))
                return
            try:
                result = await api.handle(op, args, uid if uid is not None else os.getuid())
                reply: dict[str, Any] = {"ok": True, "result": result}
            except UserError as e:
                reply = {"ok": False, "kind": "user", "error": str(e), "problems": e.problems}
            except HschedError as e:
                reply = {"ok": False, "kind": "failed", "error": str(e)}
            except Exception as e:  # a bug in one handler must not take the controller down
                log.exception("request %s failed", op)
                reply = {"ok": False, "kind": "failed", "error": f"internal error: {type(e).__name__}: {e}"}
            writer.write(encode(reply))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _stream(api: Api, writer: asyncio.StreamWriter, interval: float) -> None:
    """A snapshot now, then one every `interval` (device utilization moves without any job changing)."""
    ctl = api.ctl
    try:
        while not ctl.stopping.is_set():
            snap = await api.op_snapshot({}, os.getuid())
            writer.write(encode({"type": "snapshot", **snap}))
            await writer.drain()
            await ctl.clock.wait(ctl.stopping, max(0.1, interval))
    except (ConnectionError, RuntimeError):
        return


async def serve(home: Home) -> int:
    home.ensure()
    lock_fd = acquire_lock(home)
    settings = load_settings(home.settings)
    fleet_cfg = load_fleet(home.fleet_file())
    store = Store(home.db)
    ctl = Controller(home, fleet_cfg, settings, store)
    ctl.lock_inode = os.fstat(lock_fd).st_ino
    api = Api(ctl)
    with contextlib.suppress(FileNotFoundError):
        home.socket.unlink()
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
    try:
        server = await asyncio.start_unix_server(lambda r, w: _serve_client(api, r, w), path=str(home.socket),
                                                 limit=MAX_LINE)
    finally:
        os.umask(old_umask)
    os.chmod(home.socket, 0o600)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctl.stopping.set)
    log.info("controller %s serving %s with fleet %s", os.getpid(), home.root, fleet_cfg.source)
    try:
        await start(ctl)
        async with server, asyncio.TaskGroup() as tg:
            loop_task = tg.create_task(run_loop(ctl))
            monitors = [tg.create_task(monitor(ctl, rt)) for rt in ctl.nodes.values() if ctl.wants_monitor(rt)]
            monitors.append(tg.create_task(health_loop(ctl)))
            await ctl.stopping.wait()
            ctl.poke()
            await loop_task
            for m in monitors:
                m.cancel()
            server.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            home.socket.unlink()
        await ctl.close_executors()
        ctl.close()
        store.close()
        log.info("controller %s stopped", os.getpid())
        os.close(lock_fd)
    return 0


def main(argv: list[str]) -> int:
    home = Home(Path(argv[1])) if len(argv) > 1 else Home.from_env()
    home.ensure()
    logging.basicConfig(
        filename=str(home.log), level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(serve(home))
    except AlreadyRunning as e:
        print(f"hsched: {e}", file=sys.stderr)
        return 3
    except UserError as e:
        for p in e.problems:
            print(f"hsched: error: {p}", file=sys.stderr)
        log.error("cannot start: %s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
