"""A randomised hostile checkpoint or dataset folder (issue #27), and what a copy of one may never hold.

`make` lays out a tree as a lab member would to turn a root copy against the lab: symbolic links (absolute,
relative, dangling, to another member's file and folder, to /etc/shadow), FIFOs, sockets, device nodes (mknod,
as root: the test plays a careless admin's leftovers too), setuid, setgid and sticky files and folders, hard links
to another member's file (as root: a machine whose protected_hardlinks is off), deep trees, and one folder that a
racing thread swaps for a link to the victim's folder (holding files of the same names and sizes) while the copy
runs. `gains` looks at a copy for what would give the attacker more than their own files' bytes.
"""

from __future__ import annotations

import os
import random
import socket
import stat
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SECRET = b"VICTIM-SECRET-"
"""Every byte the victim owns starts with this: found in a copy the attacker can read, it is a leak."""
ID_PROGRAM = "/usr/bin/id"
"""A real program to make setuid: `id -u` prints the effective uid it ran with."""
SWAPPED = "swapme"
"""The folder the racing thread swaps for a link to the victim's folder."""
KINDS = ("file", "file", "dir", "setuid", "setgid", "sticky_dir", "setgid_dir", "link_victim_file",
         "link_victim_dir", "link_relative_up", "link_dangling", "link_shadow", "fifo", "socket", "char_device",
         "block_device", "hardlink_victim", "deep")


@dataclass
class Victim:
    folder: Path
    """The victim's own folder (0700): their secret files, and a twin of the swapped folder."""
    uid: int
    gid: int

    @property
    def secret_file(self) -> Path:
        return self.folder / "secret.txt"


@dataclass
class Tree:
    root: Path
    made: Counter[str] = field(default_factory=Counter)
    twin: Path | None = None
    """The victim's folder the racing thread links in place of root/SWAPPED."""

    @property
    def tried(self) -> int:
        return sum(self.made.values())

    @property
    def hostile(self) -> int:
        return sum(n for k, n in self.made.items() if k not in ("file", "dir"))


def make_victim(base: Path, uid: int, gid: int) -> Victim:
    folder = base / "victim"
    folder.mkdir(mode=0o700)
    (folder / "secret.txt").write_bytes(SECRET + os.urandom(64).hex().encode())
    os.chmod(folder / "secret.txt", 0o600)
    for p in (folder, folder / "secret.txt"):
        os.chown(p, uid, gid)
    return Victim(folder, uid, gid)


def _file(p: Path, rng: random.Random, size: int | None = None) -> None:
    n = rng.choice((0, 1, 100, 4096, 70_000)) if size is None else size
    p.write_bytes(b"attacker-" + rng.randbytes(max(0, n - 9)))


def make(root: Path, rng: random.Random, victim: Victim, uid: int, gid: int, *, max_depth: int = 4,
         big: bool = False, swapped_files: int | None = None) -> Tree:
    """A hostile tree at `root` (made here, the attacker's: `uid`, `gid`), and its twin in the victim's folder.
    `big`: the swapped folder holds a file over the dataset copy's batch size (read with data_read);
    `swapped_files`: how many files it holds (else 1 to 3)."""
    tree = Tree(root)
    root.mkdir(mode=0o755)
    devices_ok = [True]

    def fill(d: Path, depth: int) -> None:
        for i in range(rng.randint(2, 7)):
            kind = rng.choice(KINDS)
            p = d / f"{kind[:6]}{i}"
            if kind == "file":
                _file(p, rng)
                os.chmod(p, rng.choice((0o600, 0o644, 0o755, 0o640)))
            elif kind == "dir":
                p.mkdir()
                if depth < max_depth:
                    fill(p, depth + 1)
            elif kind in ("setuid", "setgid"):
                p.write_bytes(Path(ID_PROGRAM).read_bytes())
                os.chmod(p, 0o4755 if kind == "setuid" else 0o2755)
            elif kind in ("sticky_dir", "setgid_dir"):
                p.mkdir()
                _file(p / "inside", rng)
                os.chmod(p, 0o1777 if kind == "sticky_dir" else 0o2775)
            elif kind == "link_victim_file":
                p.symlink_to(victim.secret_file)
            elif kind == "link_victim_dir":
                p.symlink_to(victim.folder)
            elif kind == "link_relative_up":
                p.symlink_to("../" * (depth + 8) + str(victim.secret_file).lstrip("/"))
            elif kind == "link_dangling":
                p.symlink_to(d / "nothing-here")
            elif kind == "link_shadow":
                p.symlink_to("/etc/shadow")
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "socket":
                if len(str(p)) > 100:  # sun_path's limit
                    continue
                s = socket.socket(socket.AF_UNIX)
                s.bind(str(p))
                s.close()
            elif kind in ("char_device", "block_device"):
                if not devices_ok[0]:
                    continue
                mode = stat.S_IFCHR if kind == "char_device" else stat.S_IFBLK
                dev = os.makedev(1, 3) if kind == "char_device" else os.makedev(7, 0)  # /dev/null, /dev/loop0
                try:
                    os.mknod(p, mode | 0o666, dev)
                except PermissionError:
                    devices_ok[0] = False  # a container without CAP_MKNOD
                    continue
            elif kind == "hardlink_victim":
                os.link(victim.secret_file, p)
            elif kind == "deep":
                q = p
                for j in range(rng.randint(8, 40)):
                    q = q / f"d{j}"
                q.mkdir(parents=True)
                _file(q / "bottom", rng)
            tree.made[kind] += 1

    fill(root, 0)
    # the folder a racing thread swaps for a link to the victim's twin of it (same names, same sizes)
    sw = root / SWAPPED
    sw.mkdir(mode=0o755)
    twin = victim.folder / f"twin-{root.name}"
    twin.mkdir(mode=0o700)
    for j in range(swapped_files or rng.randint(1, 3)):
        size = 300_000 if big and j == 0 else rng.choice((100, 5000))
        (sw / f"f{j}").write_bytes(b"a" * size)
        os.chmod(sw / f"f{j}", 0o644)
        (twin / f"f{j}").write_bytes((SECRET + b"x" * size)[:size])
        os.chmod(twin / f"f{j}", 0o600)
        os.chown(twin / f"f{j}", victim.uid, victim.gid)
        tree.made["swapped_file"] += 1
    os.chown(twin, victim.uid, victim.gid)
    tree.twin = twin
    # everything the attacker's (never through a link; a hard link is the victim's file itself: left alone)
    for top, dirs, files in os.walk(root):
        for n in (*dirs, *files):
            q = Path(top) / n
            if q.is_symlink() or q.lstat().st_nlink == 1 or q.is_dir():
                os.chown(q, uid, gid, follow_symlinks=False)
                if not q.is_symlink():
                    os.chmod(q, stat.S_IMODE(q.lstat().st_mode))  # chown cleared setuid: set it again
    os.chown(root, uid, gid)
    return tree


class Swapper:
    """While running: root/SWAPPED is swapped for a link to the victim's twin and back, again and again (what a
    member who owns the folder can do at any moment of a copy)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.restore()

    def restore(self) -> None:
        sw, aside = self.tree.root / SWAPPED, self.tree.root / (SWAPPED + ".real")
        if sw.is_symlink():
            sw.unlink()
        if aside.exists():
            aside.rename(sw)

    def swap_in(self) -> None:
        sw, aside = self.tree.root / SWAPPED, self.tree.root / (SWAPPED + ".real")
        sw.rename(aside)
        sw.symlink_to(self.tree.twin or "/nonexistent")
        self.swaps += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            self.swap_in()
            self.stop.wait(0.0005)
            self.restore()
            self.stop.wait(0.0005)


@dataclass
class Gains:
    roots: list[str] = field(default_factory=list)
    """setuid/setgid files owned by root, device nodes: what gives root."""
    leaks: list[str] = field(default_factory=list)
    """The victim's bytes where the attacker can read them."""
    specials: list[str] = field(default_factory=list)
    """Links, FIFOs, sockets, setuid bits of any owner: what a data-only copy never makes."""
    foreign: list[str] = field(default_factory=list)
    """Entries owned by someone other than the job's user (checked when the copy is for one)."""

    def add(self, other: Gains) -> None:
        for name in ("roots", "leaks", "specials", "foreign"):
            getattr(self, name).extend(getattr(other, name))


def gains(dest: Path, attacker_uid: int, attacker_gid: int, owner_checked: bool) -> Gains:
    g = Gains()
    if not dest.exists() and not dest.is_symlink():
        return g
    entries = [dest] + [Path(t) / n for t, ds, fs in os.walk(dest) for n in (*ds, *fs)]
    for p in entries:
        st = p.lstat()
        m = st.st_mode
        if stat.S_ISCHR(m) or stat.S_ISBLK(m):
            g.roots.append(f"{p}: device node")
        elif stat.S_ISLNK(m) or stat.S_ISFIFO(m) or stat.S_ISSOCK(m):
            g.specials.append(f"{p}: {stat.filemode(m)}")
        if m & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISDIR(m):
            (g.roots if st.st_uid == 0 else g.specials).append(f"{p}: {stat.filemode(m)} uid {st.st_uid}")
        if m & stat.S_ISVTX or (stat.S_ISDIR(m) and m & stat.S_ISGID):
            g.specials.append(f"{p}: {stat.filemode(m)}")
        if owner_checked and st.st_uid != attacker_uid:
            g.foreign.append(f"{p}: uid {st.st_uid}")
        if stat.S_ISREG(m):
            readable = st.st_uid == attacker_uid or m & 0o004 or (m & 0o040 and st.st_gid == attacker_gid)
            if readable and SECRET in p.read_bytes():
                g.leaks.append(f"{p}: the victim's bytes, {stat.filemode(m)} uid {st.st_uid}")
    return g
