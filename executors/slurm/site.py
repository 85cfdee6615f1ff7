"""Where the Slurm executor's commands run and its run folders live: this machine (the default), or a login
node over SSH (executors/slurm/login.py). The executor speaks only to a Site, so the two ways of reaching Slurm
share every line of its logic (submission, status, signals, restart) and differ only in these primitives.

A Site's paths are its own: the executor maps each run folder the controller names to the site's folder for it
(`run_dir`) and passes that to every file call; tokens and handles keep the controller's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hsched.errors import HelperError, NodeRefused, NodeUnreachable, Refusal
from hsched.node import files, owners, records

from .._files import copy_off_loop

LOG = "output.log"
SIGNALS = "signals.log"


class SlurmError(HelperError):
    """One Slurm command failed while slurmctld answers (`scontrol ping` says it is up): a refused submission
    (no such partition, a request the partition cannot ever satisfy), an unknown job. The message is one line:
    the node, the command and Slurm's first line of error."""


class SlurmUnreachable(NodeUnreachable):
    """slurmctld does not answer (down, unreachable, munge failing), or the login node does not: the group is
    away; its jobs are not lost (they run on in Slurm), and the next call tries again."""


@dataclass(frozen=True, slots=True)
class Result:
    """One Slurm command's end: its exit status (-1: killed by a signal) and its output, decoded."""

    rc: int
    out: str
    err: str


class Site(Protocol):
    """What the Slurm executor needs of the place where Slurm's client commands run."""

    where: str
    """For messages: "the controller's machine", "login node user@host"."""

    async def exec(self, argv: Sequence[str], timeout_s: float) -> Result:
        """Run one command (argv exactly: never reinterpreted by a shell)."""

    async def user(self) -> str:
        """The user the commands run as (squeue -u)."""

    async def run_dir(self, local_run_dir: str) -> str:
        """The site's folder for a run the controller names by `local_run_dir`."""

    async def path(self, local_path: str) -> str:
        """The site's path for any other controller path (a checkpoint folder)."""

    async def make_run_dir(self, path: str) -> bool:
        """Make the run folder (0700) with an empty output.log and signals.log; False if it was there."""

    async def make_dirs(self, path: str) -> None:
        """Make a folder and its parents (0700 each new one); nothing if it is there."""

    async def write_file(self, path: str, data: str, mode: int) -> None:
        """Write a whole file (synced before it is used)."""

    async def read_json(self, path: str) -> Any:
        """A JSON file's value; None if it is missing or not JSON."""

    async def write_json(self, path: str, value: Any) -> None:
        """Replace a JSON file atomically (written beside it, then renamed)."""

    async def append(self, path: str, data: bytes) -> None:
        """Append to a file (made if missing); nothing if its folder is gone."""

    async def read_at(self, path: str, offset: int, max_bytes: int) -> bytes:
        """Bytes from `offset`; b"" for a missing file."""

    async def isdir(self, path: str) -> bool: ...

    async def newest(self, path: str) -> float | None:
        """The newest modification time of any file under `path`."""

    async def put(self, local: str, remote: str, timeout_s: float) -> None: ...

    async def get(self, remote: str, local: str, timeout_s: float) -> None: ...

    async def account(self, name: str) -> Account | None:
        """Lab mode: the site's account `name` (by name, as a lab shares them), None if it has none."""

    async def passable(self, base: str | None, leaf: str) -> None:
        """Lab mode: every folder from `base` (None: the site's hsched folder) down to `leaf`, made if missing,
        this account's and 0711: a user passes through to their own files and lists nothing."""

    async def give(self, path: str, acct: Account, mode: int) -> None:
        """Lab mode: `path` (a folder if `mode` has x bits, else a file), made if missing, the account's with
        `mode`; a folder's content the site's user put there (a checkpoint copied in) becomes the account's too.
        A link is never followed."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Account:
    """Lab mode: a user a run is submitted as, as the Slurm site knows them."""

    name: str
    uid: int
    gid: int
    home: str


class LocalSite:
    """Slurm's client commands installed on the controller's machine, run folders on its disk (which the Slurm
    nodes must share). Each command is an asyncio subprocess, never a shell."""

    where = "the controller's machine"

    def __init__(self, name: str, env: Mapping[str, str]) -> None:
        self.name = name
        self.env = dict(env)

    async def exec(self, argv: Sequence[str], timeout_s: float) -> Result:
        try:
            async with asyncio.timeout(timeout_s):
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=self.env)
                try:
                    out, err = await proc.communicate()
                finally:
                    if proc.returncode is None:  # timed out or cancelled: the command must not outlive the call
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        await proc.wait()
        except TimeoutError:
            raise SlurmUnreachable(f"{self.name}: {argv[0]} did not answer within {timeout_s:g} s") from None
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            raise NodeRefused(f"{self.name}: cannot run {argv[0]} ({e.strerror or e}): install Slurm's client "
                              "commands (Debian: slurm-client) on the controller's machine", Refusal.CONFIG) from None
        except OSError as e:  # out of processes or memory here: may recover
            raise NodeUnreachable(f"{self.name}: cannot run {argv[0]}: {e.strerror or e}") from None
        return Result(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))

    async def user(self) -> str:
        return nodehelper_user()

    async def run_dir(self, local_run_dir: str) -> str:
        return local_run_dir

    async def path(self, local_path: str) -> str:
        return local_path  # the Slurm nodes share the controller's folder

    async def make_run_dir(self, path: str) -> bool:
        return await asyncio.to_thread(_make_run_dir, path)

    async def make_dirs(self, path: str) -> None:
        await asyncio.to_thread(os.makedirs, path, 0o700, True)

    async def write_file(self, path: str, data: str, mode: int) -> None:
        await asyncio.to_thread(_write_file, path, data, mode)

    async def read_json(self, path: str) -> Any:
        return await asyncio.to_thread(records.read_json, path)

    async def write_json(self, path: str, value: Any) -> None:
        await asyncio.to_thread(records.write_json_atomic, path, value)

    async def append(self, path: str, data: bytes) -> None:
        await asyncio.to_thread(_append, path, data)

    async def read_at(self, path: str, offset: int, max_bytes: int) -> bytes:
        return await asyncio.to_thread(_read_at, path, offset, max_bytes)

    async def isdir(self, path: str) -> bool:
        return await asyncio.to_thread(os.path.isdir, path)

    async def newest(self, path: str) -> float | None:
        newest = (await asyncio.to_thread(files.newest, {"path": path})).get("newest")
        return float(newest) if newest is not None else None

    async def put(self, local: str, remote: str, timeout_s: float) -> None:
        await copy_off_loop(self.name, "put", local, remote, timeout_s)

    async def get(self, remote: str, local: str, timeout_s: float) -> None:
        await copy_off_loop(self.name, "get", remote, local, timeout_s)

    async def account(self, name: str) -> Account | None:
        acct = await asyncio.to_thread(owners.account, name)
        return None if acct is None else Account(name, int(acct["uid"]), int(acct["gid"]), str(acct["home"]))

    async def passable(self, base: str | None, leaf: str) -> None:
        # the node helper's own (a lab's run folders are made so on its nodes too)
        await asyncio.to_thread(owners.passable_dirs, base or os.path.dirname(leaf.rstrip("/")), leaf)

    async def give(self, path: str, acct: Account, mode: int) -> None:
        await asyncio.to_thread(owners.give, path, {"uid": acct.uid, "gid": acct.gid}, mode)

    async def close(self) -> None:
        """Nothing to let go of: every call is a command of its own."""


# ------------------------------------------------------------------------ this machine's files (blocking)


def nodehelper_user() -> str:
    import getpass
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return getpass.getuser()


def _make_run_dir(run_dir: str) -> bool:
    """Make the run folder (0700: a run's output and environment are its owner's); False if it was there (the
    folder is the launch lock, as on the node helper's nodes)."""
    os.makedirs(os.path.dirname(run_dir.rstrip("/")), 0o700, exist_ok=True)
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        return False
    os.chmod(run_dir, 0o700)  # whatever the umask
    for name in (LOG, SIGNALS):
        os.close(os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return True


def _write_file(path: str, data: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _append(path: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _read_at(path: str, offset: int, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""
