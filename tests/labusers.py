"""Real users for the lab-mode tests: accounts made with `useradd` (and removed after, unless they were there
before), an interpreter those users may run, and a way to run a command as one of them with a login's bare
environment (no HSCHED_* variables: the CLI must find the lab by itself).

Needs root (CI runs as root). The SSH test hosts share this machine's /etc/passwd, so the users exist there too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

USERS = ("hslab1", "hslab2", "hslabadm")
"""lab1, lab2 and an admin (member of ADMIN_GROUP); prefixed so that they never clash with real accounts."""
ADMIN_GROUP = "hsched-test-admins"


def _run(*cmd: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")


@dataclass
class LabUsers:
    made: list[str]
    made_group: bool

    @classmethod
    def create(cls) -> LabUsers:
        if os.geteuid() != 0:
            raise RuntimeError("the lab-mode tests make real users: run them as root (CI does)")
        made_group = False
        try:
            import grp

            grp.getgrnam(ADMIN_GROUP)
        except KeyError:
            _run("groupadd", ADMIN_GROUP)
            made_group = True
        made = []
        for name in USERS:
            try:
                pwd.getpwnam(name)
                continue
            except KeyError:
                pass
            extra = ["-G", ADMIN_GROUP] if name == "hslabadm" else []
            p = subprocess.run(["useradd", "-m", "-s", "/bin/sh", *extra, name], capture_output=True, text=True,
                               timeout=60)
            if p.returncode == 9:
                continue  # made meanwhile by another test process: theirs to remove
            if p.returncode != 0:
                raise RuntimeError(f"useradd {name}: {p.stderr.strip() or p.stdout.strip()}")
            made.append(name)
        return cls(made, made_group)

    def remove(self) -> None:
        for name in self.made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            subprocess.run(["userdel", "-r", name], capture_output=True)
        if self.made_group:
            subprocess.run(["groupdel", ADMIN_GROUP], capture_output=True)

    @staticmethod
    def uid(name: str) -> int:
        return pwd.getpwnam(name).pw_uid


def _usable_by_others(path: Path) -> bool:
    from hsched.labsetup import _closed

    return _closed(path, need_read=True) is None


def passable(path: Path) -> None:
    """Let other users through every folder above `path` (o+x): the checkout the editable install points at
    must be readable by the lab's users. A fresh CI machine may keep it under /root."""
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)


def lab_python(base: Path) -> Path:
    """An interpreter every user may run that imports this checkout's hsched and its dependencies: this one
    if others can already run it, else a venv (without pip) of the system's python3 of the same minor version
    whose one .pth adds this environment's site-packages (`site.addsitedir`, so the editable install's own
    .pth runs too)."""
    from hsched.labsetup import install_problem

    repo = Path(__file__).resolve().parents[1]
    site = Path(sysconfig.get_paths()["purelib"])
    for p in (repo, site):
        if not _usable_by_others(p):
            passable(p)
            os.chmod(p, stat.S_IMODE(p.stat().st_mode) | stat.S_IROTH | stat.S_IXOTH)
    if install_problem() is None:
        return Path(sys.executable)
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    system = shutil.which(minor, path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        raise RuntimeError(f"no {minor} that other users may run (this one is {sys.executable}); install it")
    venv = base / "labpy"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    target = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    (target / "hsched-test-lab.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    return venv / "bin" / "python"


def world_folder(prefix: str) -> Path:
    """A new folder under /tmp that every user may pass through (pytest's own tmp folders are root's only)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(d, 0o755)
    return d


def as_user(user: str, argv: list[str], *, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` as `user`, with what a fresh login has and nothing of ours (no HSCHED_* variables)."""
    home = pwd.getpwnam(user).pw_dir
    env = ["env", "-i", f"HOME={home}", f"USER={user}", f"LOGNAME={user}", "PATH=/usr/local/bin:/usr/bin:/bin",
           "LANG=C.UTF-8"]
    return subprocess.run(["runuser", "-u", user, "--", *env, *argv], capture_output=True, text=True,
                          timeout=timeout, input=input, cwd="/")
