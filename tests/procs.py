"""What /proc says about this machine's processes, for tests and benchmarks that look for helpers, watchers,
zombies and sshd children (read once per call; a process that ends meanwhile is simply left out)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class Proc(NamedTuple):
    pid: int
    ppid: int
    state: str
    """The state letter: R, S, Z (a zombie nobody reaped)..."""
    comm: str
    argv: tuple[bytes, ...]


def processes() -> list[Proc]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            argv = tuple(Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue
        # comm may hold spaces and parentheses: it ends at the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        out.append(Proc(int(name), int(fields[1]), fields[0], stat[stat.find("(") + 1:stat.rfind(")")], argv))
    return out


def with_args(*words: str, mentioning: str | None = None) -> list[int]:
    """Pids whose argv holds every one of `words` as a whole argument and, if given, an argument starting
    with `mentioning`."""
    want = [w.encode() for w in words]
    mark = mentioning.encode() if mentioning is not None else None
    return [p.pid for p in processes()
            if all(w in p.argv for w in want) and (mark is None or any(a.startswith(mark) for a in p.argv))]


def descendants(root: int, procs: list[Proc] | None = None) -> list[Proc]:
    """Every process below `root` (children, their children...)."""
    procs = processes() if procs is None else procs
    kids: dict[int, list[Proc]] = {}
    for p in procs:
        kids.setdefault(p.ppid, []).append(p)
    out, todo = [], [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out
