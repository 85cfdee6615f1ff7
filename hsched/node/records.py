"""A run folder's durable JSON records and the small reads and writes every part of the helper uses: written
whole or not at all (fsync, rename, fsync of the folder), private (0600) from the start."""

import json
import os


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def private_fd(path, flags):
    """Open (creating it 0600) a file of a run: a job's output and environment are its owner's only."""
    return os.open(path, flags | os.O_CREAT, 0o600)


def write_json_atomic(path, obj):
    """Write, fsync, rename, fsync the folder: a reader sees the old file or the whole new one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with os.fdopen(private_fd(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def new_token():
    return "".join("%02x" % b for b in bytearray(os.urandom(16)))


def unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
