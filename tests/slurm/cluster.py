"""A real two-node Slurm cluster on this machine, for the Slurm executor's tests: its own munged, slurmctld and
two slurmd (`slurmd -N n1`, `-N n2`: Debian's build runs several on one host), GPUs as gres on fake device
files, everything in one temporary folder and on free ports, so that it disturbs no other Slurm or munge on
the machine and leaves nothing behind.

    with SlurmCluster(tmp_path) as cluster:     # or the session's `slurm` fixture (tests/slurm/conftest.py)
        cluster.env                              # SLURM_CONF for the client commands
        cluster.run("squeue")

Each node has `cpus` CPUs (2: two one-CPU jobs at once), 2000 MiB and `gpus` GPUs of type `gpu_type` (device
files `dev/nvidia<i>`, character devices of NVIDIA's major number, which is what slurmd's gres plugin checks),
in partition `debug`; partition `urgent` holds the same nodes at a higher PriorityTier, so that its jobs preempt
(cancel: PreemptMode=CANCEL) `debug`'s, as Slurm's preemption does on a real cluster. Slurm sets
CUDA_VISIBLE_DEVICES in each job from them. There is no accounting (no
slurmdbd): `sacct` fails and jobs stay in slurmctld's memory for MinJobAge after they end, as on a small
cluster without a database.

Needs root (slurmd runs jobs as their users, mknod) and Debian's slurmctld, slurmd, slurm-client and munge
(`.ci/run` installs them); `available()` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
PARTITION = "debug"
URGENT = "urgent"
"""A partition over the same nodes whose jobs preempt (cancel) jobs of PARTITION."""
START_S = 60.0
"""A safety net for the cluster to come up (about 2 s on a quiet 2-core machine)."""


def available() -> str | None:
    """None if a cluster can be started here, else why not (the skip reason)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd, mknod)"
    missing = [p for p in (SLURMCTLD, SLURMD, MUNGED) if not os.path.exists(p)]
    missing += [c for c in ("sbatch", "squeue", "scontrol", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd " \
               "slurm-client munge"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    def __init__(self, root: Path, *, nodes: tuple[str, ...] = ("n1", "n2"), gpus: int = 2, gpu_type: str = "a100",
                 cpus: int = 2, features: tuple[str, ...] = ("nvme",)) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.cpus = cpus
        self.features = features
        self.partition = PARTITION
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._pidfiles: list[Path] = []

    # ------------------------------------------------------------------------------------------- start

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        r = self.root
        for d in ("munge", "state", "log", "dev", *(f"spool/{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        self._munge()
        host = socket.gethostname().split(".")[0]
        ctl_port = free_port()
        lines = [
            "ClusterName=hschedtest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "GresTypes=gpu",
            "KillWait=2",  # scancel/time limit: SIGTERM, then SIGKILL 2 s later (30 s by default)
            "MinJobAge=600",  # ended jobs stay known for 10 minutes (there is no accounting to ask after)
            "InactiveLimit=0",
            "SlurmdTimeout=60",
            "SchedulerParameters=batch_sched_delay=0",
            "SlurmdParameters=config_overrides",  # the nodes' CPUs and memory as written here, whatever the machine
            "DefMemPerCPU=500",  # a job without --mem takes 500 MiB a CPU, not its node's whole memory
            # a job of partition `urgent` (same nodes, higher tier) preempts `debug`'s jobs: Slurm's own preemption
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
        ]
        feats = f" Feature={','.join(self.features)}" if self.features else ""
        gres_lines = ["AutoDetect=off"]
        for i, n in enumerate(self.nodes):
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={self.cpus} "
                         f"RealMemory=2000 Gres=gpu:{self.gpu_type}:{self.gpus}{feats} State=UNKNOWN")
            files = []
            for g in range(self.gpus):
                minor = i * self.gpus + g
                dev = r / "dev" / f"nvidia{minor}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(195, minor))  # a character device, as NVIDIA's
                files.append(str(dev))
            gres_lines.append(f"NodeName={n} Name=gpu Type={self.gpu_type} File={','.join(files)}")
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE "
                     "State=UP PriorityTier=1")
        lines.append(f"PartitionName={URGENT} Nodes={','.join(self.nodes)} MaxTime=INFINITE State=UP PriorityTier=2 "
                     "PreemptMode=OFF")
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        self._daemon([SLURMCTLD, "-f", str(self.conf)], r / "slurmctld.pid")
        for n in self.nodes:
            self._daemon([SLURMD, "-f", str(self.conf), "-N", n], r / f"slurmd-{n}.pid")
        self._wait_idle()

    def _munge(self) -> None:
        """A munged of our own (its own key and socket: AuthInfo above points Slurm at it)."""
        m = self.root / "munge"
        key = m / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m.chmod(0o700)
        self._daemon([MUNGED, "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                      f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
                      f"--seed-file={m / 'munged.seed'}"], m / "munged.pid")
        deadline = time.monotonic() + START_S
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {_tail(m / 'munged.log')}")
            time.sleep(0.02)

    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        if pidfile not in self._pidfiles:
            self._pidfiles.append(pidfile)
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_S
        while True:
            p = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
            if p.returncode == 0 and sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm test cluster did not come up: {p.stdout} {p.stderr}; slurmctld.log: "
                                   f"{_tail(self.root / 'log' / 'slurmctld.log')}")
            time.sleep(0.1)

    # --------------------------------------------------------------------------------------------- use

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        p = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def job(self, job_id: int | str, *, epochs: bool = False) -> dict[str, str]:
        """`scontrol show job` of one job, as key -> value (the first of each key); times as epochs with
        `epochs` (SLURM_TIME_FORMAT=%s, as the executor asks), else as Slurm prints them by default."""
        from hsched.executors.slurm.text import oneliner

        env = {**self.env, "SLURM_TIME_FORMAT": "%s"} if epochs else self.env
        p = subprocess.run(["scontrol", "-d", "-o", "show", "job", str(job_id)], env=env, capture_output=True,
                           text=True, timeout=60, check=True)
        return oneliner(p.stdout.strip())

    def start_time(self, job_id: int | str) -> float:
        """When Slurm started a job (its StartTime, an epoch)."""
        return float(self.job(job_id, epochs=True)["StartTime"])

    def cancel_all(self) -> None:
        """Cancel every job, of every partition, and bring back a node a test took down (between tests: none
        outlives its test)."""
        for part in (self.partition, URGENT):
            self.run("scancel", f"--partition={part}", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = self.run("squeue", "-h", "-o", "%i", check=False)
            if p.returncode == 0 and not p.stdout.strip():
                break
            time.sleep(0.1)
        self.wait_nodes_up()

    def node_states(self) -> dict[str, str]:
        p = self.run("sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %T", check=False)
        return dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)

    def node_down(self, node: str, reason: str = "test") -> None:
        """Take a node down as an administrator would (`scontrol update state=down`): Slurm ends the jobs on it
        as NODE_FAIL, as when the node dies. wait_nodes_up brings it back."""
        self.run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")

    def wait_nodes_up(self) -> None:
        """Every node idle or in use again: a node a test took down is resumed (ReturnToService=2 often brings
        it back on its own, as soon as its slurmd answers)."""
        deadline = time.monotonic() + START_S
        while True:
            states = self.node_states()
            down = [n for n, st in states.items() if st.rstrip("*~#!%$@^-").startswith(("down", "drain", "fail"))]
            if sorted(states) == sorted(self.nodes) and not down:
                return
            for n in down:
                self.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster's nodes did not come back: {states}")
            time.sleep(0.1)

    def stop_controller(self) -> None:
        """slurmctld goes away (an outage): its jobs run on under their slurmd, its state is on disk."""
        pid = _pid(self.root / "slurmctld.pid")
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid):
            if time.monotonic() > deadline:
                raise RuntimeError("slurmctld did not stop")
            time.sleep(0.02)

    def start_controller(self) -> None:
        """slurmctld back, recovering its jobs from its state folder."""
        self._daemon([SLURMCTLD, "-f", str(self.conf)], self.root / "slurmctld.pid")
        deadline = time.monotonic() + START_S
        while self.run("scontrol", "ping", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld did not come back: {self.log()}")
            time.sleep(0.05)

    def log(self, daemon: str = "slurmctld") -> str:
        return _tail(self.root / "log" / f"{daemon}.log", 4000)

    # -------------------------------------------------------------------------------------------- stop

    def stop(self) -> None:
        """Cancel what runs, then stop the daemons (slurmd, slurmctld, munged), waiting until each is gone."""
        with contextlib.suppress(Exception):
            if self.conf.exists():
                self.cancel_all()
        for pidfile in reversed(self._pidfiles):
            pid = _pid(pidfile)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._pidfiles.clear()


def _pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as e:
        return f"({e})"

