"""Issue #27, points 1, 3 and 5a: files that cross a trust boundary are copied as data, never as privileges.

Attacked as a lab member would: real users (made here with useradd: an attacker and a victim), real setuid
programs (a copy of /usr/bin/id, whose `-u` prints the effective uid it ran with), real sshd hosts (SFTP and the
helpers' pack/unpack as root), a real node helper process for datasets. Then a randomised hostile tree generator
(tests/security/hostile.py) is run against every copy path hsched makes as root, with a thread swapping a folder
for a link to the victim's folder while each copy runs; every copy is searched for what it may never hold (a
setuid file, a device, a link, a FIFO, a socket, the victim's bytes where the attacker can read them, a file not
the job's user's), and the counts are printed: contents tried, roots gained (0), leaks (0).

Each test passes `user=` only where the code under test takes it, so that the same test runs against the
starting commit (13532c2), where it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.labusers import as_user, passable, world_folder
from tests.security import hostile

pytestmark = [pytest.mark.slow,  # real users, real processes, real sshd
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: real users, setuid files, mknod")]

ATTACKER, VICTIM = "hscpatk", "hscpvic"
"""Users of this file's own (not tests/labusers.py's): the suites that make and remove those may run alongside."""
SEED = int(os.environ.get("HSCHED_HOSTILE_SEED") or random.SystemRandom().randrange(1 << 30))


def _useradd(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True, capture_output=True, timeout=60)
        return True


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    made = [n for n in (ATTACKER, VICTIM) if _useradd(n)]
    try:
        yield pwd.getpwnam(ATTACKER), pwd.getpwnam(VICTIM)
    finally:
        for n in made:
            subprocess.run(["pkill", "-KILL", "-u", n], capture_output=True)
            subprocess.run(["userdel", n], capture_output=True)


@pytest.fixture
def base() -> Iterator[Path]:
    d = world_folder("hscopy-")  # every user passes through (pytest's tmp folders are root's only)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.e2e.ssh.hosts import TestHosts, sshd_available

    if not sshd_available():
        pytest.skip("sshd and ssh-keygen are needed (apt-get install openssh-server)")
    with TestHosts(tmp_path_factory.mktemp("copyhosts"), count=1, prefix="cp") as h:
        yield h


def _as(fn: Callable[..., Any], user: str | None) -> dict[str, Any]:
    """`user=` for `fn` where it takes one (this commit), nothing where it does not (the starting commit)."""
    return {"user": user} if "user" in inspect.signature(fn).parameters else {}


def _setuid_checkpoint(folder: Path, acct: pwd.struct_passwd) -> None:
    """A checkpoint folder a member could make: their data, and a setuid copy of `id` (setuid *them*: harmless
    as long as it stays theirs). 0755: the member lets anyone read it, as many do."""
    folder.mkdir(mode=0o755)
    (folder / "step").write_text("1200\n")
    evil = folder / "evil"
    evil.write_bytes(Path(hostile.ID_PROGRAM).read_bytes())
    for p in (folder, folder / "step", evil):
        os.chown(p, acct.pw_uid, acct.pw_gid)
    os.chmod(evil, 0o4755)


def _euid_of(program: Path, user: str) -> str:
    """The effective uid `program` (a copy of id) runs with when `user` runs it."""
    p = as_user(user, [str(program), "-u"], timeout=60)
    return p.stdout.strip() or f"(did not run: {p.stderr.strip()})"


def _run(coro: Any, timeout: float = 300) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


# ------------------------------------------------------------------------------------ 1. a setuid checkpoint


def test_a_setuid_program_in_a_local_checkpoint_copy_stays_the_members(users: Any, base: Path) -> None:
    from hsched.executors import _files

    attacker, _victim = users
    src, dst = base / "ckpt", base / "moved" / "ckpt"
    _setuid_checkpoint(src, attacker)
    _files.copy_replacing(str(src), str(dst), **_as(_files.copy_replacing, ATTACKER))
    st = (dst / "evil").lstat()
    assert _euid_of(dst / "evil", ATTACKER) == str(attacker.pw_uid), "the copy ran as root"
    assert st.st_uid == attacker.pw_uid and not st.st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert all(p.lstat().st_uid == attacker.pw_uid for p in (dst, dst / "step"))  # the member's, not root's
    assert (dst / "step").read_text() == "1200\n"


def test_a_setuid_program_moved_over_ssh_as_root_stays_the_members(users: Any, base: Path, hosts: Any) -> None:
    """The reported attack: a checkpoint moved to a node over SSH as root arrived root-owned setuid."""
    attacker, _victim = users
    src = base / "ckpt"
    _setuid_checkpoint(src, attacker)
    h = hosts[0]

    async def main() -> str:
        ex = hosts.executor(h)
        try:
            dest = await ex.remote_path(str(base / "home" / "checkpoints" / "7"))
            await ex.put(src, dest, **_as(ex.put, ATTACKER))
            await ex.get(dest, base / "back", **_as(ex.get, ATTACKER))  # and back to the controller
            return str(dest)
        finally:
            await ex.close()

    dest = Path(_run(main()))
    passable(dest)  # a lab's node folder is passable (0711): the member reaches their checkpoint there
    for copy in (dest, base / "back"):
        st = (copy / "evil").lstat()
        assert _euid_of(copy / "evil", ATTACKER) == str(attacker.pw_uid), f"{copy}/evil ran as root"
        assert st.st_uid == attacker.pw_uid and not st.st_mode & (stat.S_ISUID | stat.S_ISGID), stat.filemode(
            st.st_mode)
        assert (copy / "step").read_text() == "1200\n"


# ----------------------------------------------------------------- 3. a dataset folder swapped mid-copy


class _SwapOnRead:
    """A real executor (its helper a real process) whose source folder is swapped for a link to the victim's
    folder exactly while one file of it is read, and swapped back after: the reported race, made certain."""

    def __init__(self, inner: Any, swapper: hostile.Swapper, rel: str) -> None:
        self.inner, self.swapper, self.rel = inner, swapper, rel
        self.name = inner.name
        self.swapped_reads = 0

    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        hit = op == "read" and (req.get("rel") == self.rel or str(req.get("path", "")).endswith("/" + self.rel))
        if not hit:
            return dict(await self.inner.data(op, req, timeout_s=timeout_s))
        self.swapper.swap_in()
        self.swapped_reads += 1
        try:
            return dict(await self.inner.data(op, req, timeout_s=timeout_s))
        finally:
            self.swapper.restore()


def test_a_dataset_folder_swapped_for_a_link_mid_copy_is_refused(users: Any, base: Path) -> None:
    from hsched.executors.local import LocalExecutor

    from hsched.controller import datacopy
    from hsched.errors import ExecutorError

    attacker, victim_acct = users
    victim = hostile.make_victim(base, victim_acct.pw_uid, victim_acct.pw_gid)
    tree = hostile.make(base / "ds", random.Random(SEED), victim, attacker.pw_uid, attacker.pw_gid, max_depth=0,
                        big=True, swapped_files=1)  # one file there: no other read crosses the swap
    dest = base / "copies" / "ds"
    dest.parent.mkdir()

    async def main() -> str:
        a, b = LocalExecutor(node="a"), LocalExecutor(node="b")
        src = _SwapOnRead(a, hostile.Swapper(tree), f"{hostile.SWAPPED}/f0")
        try:
            await datacopy.copy_tree(src, str(tree.root), b, str(dest), chunk=1 << 20)  # type: ignore[arg-type]
            return "copied"
        except ExecutorError as e:
            return str(e)
        finally:
            assert src.swapped_reads >= 1  # the race happened
            await a.close()
            await b.close()

    outcome = _run(main())
    g = hostile.gains(dest, attacker.pw_uid, attacker.pw_gid, owner_checked=False)
    assert g.leaks == [], g.leaks
    assert outcome != "copied" and "symbolic link" in outcome, outcome
    assert not dest.exists()


# ------------------------------------------------------------------------- 5a. a FIFO in a checkpoint


def test_a_fifo_in_a_checkpoint_never_stops_the_event_loop(users: Any, base: Path, hosts: Any) -> None:
    """The move runs on the controller's event loop; a FIFO in the folder (no writer, ever) must neither block
    it nor travel. Proven by the event that the move finished while the FIFO had no writer; the wait on it is
    a safety net only (past it a writer is opened, so that the stuck loop can end and the test fail)."""
    from hsched.executors import _files

    attacker, _victim = users
    src = base / "ckpt"
    src.mkdir(mode=0o755)
    (src / "model.bin").write_bytes(os.urandom(200_000))
    os.mkfifo(src / "pipe")
    for p in (src, src / "model.bin", src / "pipe"):
        os.chown(p, attacker.pw_uid, attacker.pw_gid)
    h = hosts[0]
    outcome: dict[str, Any] = {}
    done = threading.Event()
    beats: list[int] = []

    async def main() -> None:
        async def heartbeat() -> None:  # the loop's own sign of life while the moves run
            while True:
                beats.append(1)
                await asyncio.sleep(0.01)

        beat = asyncio.create_task(heartbeat())
        ex = hosts.executor(h)
        try:
            dest = await ex.remote_path(str(base / "home" / "checkpoints" / "9"))
            await ex.put(src, dest, **_as(ex.put, ATTACKER))
            outcome["ssh"] = dest
            await _files.copy_off_loop("here", "put", str(src), str(base / "local" / "9"), 120.0,
                                       **_as(_files.copy_off_loop, ATTACKER))
            outcome["local"] = str(base / "local" / "9")
        except Exception as e:
            outcome["error"] = f"{type(e).__name__}: {e}"
        finally:
            beat.cancel()
            await ex.close()

    t = threading.Thread(target=lambda: (asyncio.run(main()), done.set()), daemon=True)
    t.start()
    finished = done.wait(240)
    if not finished:  # the loop is stuck in open(): a writer releases it so that the thread ends
        with contextlib.suppress(OSError):
            os.close(os.open(src / "pipe", os.O_WRONLY | os.O_NONBLOCK))
        t.join(60)
    assert finished, "the move did not finish while the FIFO had no writer: the event loop was blocked"
    assert "error" not in outcome, outcome
    assert beats  # the loop ran its other tasks
    for where in (outcome["ssh"], outcome["local"]):
        assert (Path(where) / "model.bin").read_bytes() == (src / "model.bin").read_bytes()
        assert not os.path.lexists(Path(where) / "pipe")  # dropped: a FIFO carries no checkpoint's bytes


# ------------------------------------------------------------------- the randomised hostile generator


class Tally:
    def __init__(self) -> None:
        self.trees = Counter[str]()
        self.tried = Counter[str]()
        self.hostile = Counter[str]()
        self.refused = Counter[str]()
        self.swaps = Counter[str]()
        self.gains = hostile.Gains()

    def line(self) -> str:
        return (f"hostile copies (seed {SEED}): {sum(self.trees.values())} trees, {sum(self.tried.values())} "
                f"contents tried ({sum(self.hostile.values())} hostile), {sum(self.swaps.values())} folder swaps "
                f"while copying, {sum(self.refused.values())} copies refused whole; roots gained "
                f"{len(self.gains.roots)}, leaks {len(self.gains.leaks)}, links/FIFOs/sockets/special bits made "
                f"{len(self.gains.specials)}, files not the job user's {len(self.gains.foreign)}; per path: "
                + ", ".join(f"{k} {self.trees[k]} trees / {self.tried[k]} contents" for k in sorted(self.trees)))


def _helper(cmd: str, req: dict[str, Any]) -> dict[str, Any]:
    """One request to a real node helper process, as root, unconfined (an SSH node's helper)."""
    from hsched.executors.local import HELPER_PATH

    p = subprocess.run([sys.executable, str(HELPER_PATH), cmd], input=json.dumps(req), capture_output=True,
                       text=True, timeout=300)
    reply: dict[str, Any] = json.loads(p.stdout)
    if "error" in reply:
        raise RuntimeError(reply["error"])
    return reply


def _copy_local(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
    from hsched.executors import _files

    _files.copy_replacing(str(src), str(dst), **_as(_files.copy_replacing, user))


def _copy_controller_tar(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
    from hsched.executors import _confined

    tar = dst.parent / f"{dst.name}.tar"
    _confined._tar(src, tar, **_as(_confined._tar, user))
    try:
        _confined._untar_replacing(tar, dst, **_as(_confined._untar_replacing, user))
    finally:
        tar.unlink()


def _copy_helper(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
    xroot = dst.parent / "node-root"
    xroot.mkdir(mode=0o700, exist_ok=True)
    packed = _helper("pack", {"path": str(src), "root": str(xroot), "user": user})
    _helper("unpack", {"token": packed["token"], "dest": str(dst), "root": str(xroot), "user": user})


def _copy_hostile_tar(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
    """What a hostile node could send the controller: a tar file of links, hard links, devices, FIFOs, setuid
    files and names outside the folder, unpacked by the controller (executors/_confined.py)."""
    from hsched.executors import _confined

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # the tree as tar itself would take it: links, devices and all (but not the victim's bytes: this node's
        # tar is built here as root, and what a hostile node sends is its own anyway; the race is another path's)
        for top, dirs, files in os.walk(src):
            for n in (*dirs, *files):
                p = Path(top) / n
                if hostile.SWAPPED in p.relative_to(src).parts or p.lstat().st_uid != os.lstat(src).st_uid:
                    continue
                tar.add(p, arcname=str(p.relative_to(src)), recursive=False)
        for name, kind in (("abs-link", tarfile.SYMTYPE), ("hard-link", tarfile.LNKTYPE), ("dev", tarfile.CHRTYPE),
                           ("fifo", tarfile.FIFOTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, "/etc/shadow"
            info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
        info = tarfile.TarInfo("suid")
        info.mode, info.size, info.uid = 0o4755, 4, 0
        tar.addfile(info, io.BytesIO(b"\x7fELF"))
    tar_path = dst.parent / f"{dst.name}.tar"
    tar_path.write_bytes(buf.getvalue())
    try:
        _confined._untar_replacing(tar_path, dst, **_as(_confined._untar_replacing, user))
    finally:
        tar_path.unlink()


Copy = Callable[[Path, Path, str, list[Path]], None]
COPIES: dict[str, Copy] = {
    "local copy": _copy_local, "controller tar": _copy_controller_tar, "node helper pack/unpack": _copy_helper,
    "tar from a hostile node": _copy_hostile_tar}


def _one(tally: Tally, path: str, rng: random.Random, base: Path, users: Any, i: int,
         copy: Copy, owner_checked: bool = True, big: bool = False) -> None:
    attacker, victim_acct = users
    work = base / f"{path.replace(' ', '-').replace('/', '-')}-{i}"
    work.mkdir(mode=0o755)
    victim = hostile.make_victim(work, victim_acct.pw_uid, victim_acct.pw_gid)
    tree = hostile.make(work / "src", rng, victim, attacker.pw_uid, attacker.pw_gid,
                        max_depth=rng.randint(1, 4), big=big)
    dst = work / "out" / "copy"
    dst.parent.mkdir(mode=0o755)
    tally.trees[path] += 1
    tally.tried[path] += tree.tried
    tally.hostile[path] += tree.hostile
    landed: list[Path] = [dst]  # where the copy lands (a copy to a node appends the node's path)
    with hostile.Swapper(tree) as swapper:
        try:
            copy(tree.root, dst, ATTACKER, landed)
        except Exception:  # a copy refused whole (the source changed under it, a link on its way): nothing gained
            tally.refused[path] += 1
    tally.swaps[path] += swapper.swaps
    for where in landed:
        tally.gains.add(hostile.gains(where, attacker.pw_uid, attacker.pw_gid, owner_checked))
        if where != dst:
            shutil.rmtree(where, ignore_errors=True)
    assert (victim.secret_file.lstat().st_uid, stat.S_IMODE(victim.secret_file.lstat().st_mode)) == (
        victim_acct.pw_uid, 0o600)  # nothing done to the victim's own file either
    shutil.rmtree(work, ignore_errors=True)


def test_randomised_hostile_trees_gain_nothing_on_any_copy_path(users: Any, base: Path, hosts: Any) -> None:
    from hsched.executors.local import LocalExecutor

    from hsched.controller import datacopy

    rng = random.Random(SEED)
    tally = Tally()
    rounds = int(os.environ.get("HSCHED_HOSTILE_ROUNDS") or 8)
    for name, copy in COPIES.items():
        for i in range(rounds):
            _one(tally, name, rng, base, users, i, copy)
    # over SSH, as root: to the node and back (the executor's put and get)
    h = hosts[0]

    def ssh(direction: str) -> Copy:
        def copy(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
            async def main() -> None:
                ex = hosts.executor(h)
                try:
                    remote = await ex.remote_path(str(dst))
                    landed.append(Path(remote))  # the node shares this machine's disk: looked at where it is
                    await ex.put(src, remote, **_as(ex.put, user))
                    if direction == "get":
                        await ex.get(remote, dst, **_as(ex.get, user))
                finally:
                    await ex.close()

            _run(main())

        return copy

    for direction in ("put", "get"):
        for i in range(max(2, rounds // 2)):
            _one(tally, f"ssh {direction}", rng, base, users, i, ssh(direction))
    # datasets: a real helper process at each end, root, reading the member's folder
    def dataset(src: Path, dst: Path, user: str, landed: list[Path]) -> None:
        async def main() -> None:
            a, b = LocalExecutor(node="a"), LocalExecutor(node="b")
            try:
                await datacopy.copy_tree(a, str(src), b, str(dst), chunk=1 << 20)
            finally:
                await a.close()
                await b.close()

        _run(main())

    for i in range(rounds):
        _one(tally, "dataset copy", rng, base, users, i, dataset, owner_checked=False, big=True)
    print(tally.line())
    assert tally.gains.roots == [], tally.gains.roots
    assert tally.gains.leaks == [], tally.gains.leaks
    assert tally.gains.specials == [], tally.gains.specials
    assert tally.gains.foreign == [], tally.gains.foreign
    assert sum(tally.swaps.values()) > 0 and sum(tally.hostile.values()) > 0
