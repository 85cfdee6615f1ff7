"""Local file moves shared by the executors: whatever is copied lands under a temporary name beside its
target and is renamed into place only when complete, so a job resuming from a checkpoint never reads half
of one. Everything here blocks (call it in a thread) but `copy_off_loop`, which does that."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import threading

from hsched.node import safefiles


def temporary_beside(path: str) -> str:
    return f"{path}.part-{secrets.token_hex(4)}"


def move_into_place(tmp: str, path: str) -> None:
    """Rename `tmp` to `path`; a folder already there is moved aside first and removed after."""
    if os.path.isdir(path) and not os.path.islink(path):
        old = f"{path}.old-{secrets.token_hex(4)}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def remove(path: str) -> None:
    """Remove a file or a folder, if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def make_parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def copy_replacing(src: str, dst: str, given_up: threading.Event | None = None, user: str | None = None) -> None:
    """Copy a file or folder to `dst`, renamed into place when complete (a folder there is replaced as a
    whole) unless `given_up` is set by then; nothing to do when both are the same path. The copy is data only
    (hsched/node/safefiles.py): regular files and folders, permission bits without setuid, no link followed or made,
    no FIFO waited on; for `user` (a job's), when this process is root, owned by them from the first byte and
    only what they may give read."""
    if os.path.abspath(src) == os.path.abspath(dst):
        return
    owner = safefiles.owner_of(user)
    make_parent(dst)
    tmp = temporary_beside(dst)
    try:
        safefiles.copy_into(src, os.path.dirname(os.path.abspath(tmp)), os.path.basename(tmp), owner, given_up)
        if given_up is not None and given_up.is_set():
            raise TimeoutError("the copy was given up")  # a copy the caller no longer waits for stays out of place
        move_into_place(tmp, dst)
    except BaseException:
        remove(tmp)
        raise


async def copy_off_loop(label: str, what: str, src: str, dst: str, timeout_s: float, user: str | None = None) -> None:
    """`copy_replacing` in a thread, bounded: a copy not done within `timeout_s` is NodeUnreachable and is never
    renamed into place (the thread cannot be stopped midway, so it is told to give up); a file that cannot be
    copied is a TransferError. `label` starts the messages (the node's name); `user`: whose copy it is
    (`copy_replacing`)."""
    from hsched.errors import NodeUnreachable, TransferError

    given_up = threading.Event()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.to_thread(copy_replacing, src, dst, given_up, user)
    except TimeoutError:
        given_up.set()
        raise NodeUnreachable(f"{label}: {what} did not finish within {timeout_s:g} s") from None
    except OSError as e:
        raise TransferError(f"{label}: {what} {src} {dst}: {e}" if isinstance(e, safefiles.Unsafe)
                            else f"{label}: {what} {src} {dst}: {e.strerror or e}") from None
