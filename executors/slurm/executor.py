"""The Slurm executor: a Slurm partition as one hsched node, jobs submitted with sbatch and followed in Slurm.

    [[node]]
    name = "cluster-a100"
    executor = "slurm"
    partition = "gpu"          # required
    account = "lab-ml"         # optional: sbatch --account
    qos = "normal"             # optional: sbatch --qos (Slurm's QoS, not hsched's class)
    cluster = "dept"           # optional: --clusters, for a multi-cluster Slurm (needs slurmdbd)
    login = "me@login1"        # optional: run Slurm's commands on this login node over SSH
    login_dir = "/scratch/$USER/hsched"   # optional, with login: hsched's folder on the login node

Slurm is reached through the client commands installed on this machine (sbatch, squeue, scontrol, scancel;
`SLURM_CONF` as for any user of them). Each command is an asyncio subprocess with its own timeout, never a
shell: every value is one argv word. With `login` (and the entry's `port`, `identity_file`, `known_hosts`, as
an ssh node's), the same commands run on that login node over the SSH executor's connection, host key verified,
every word shlex-quoted, and run folders live on the login node's disk (executors/slurm/login.py). Both ways
are a Site (executors/slurm/site.py): everything below is the same for either.

**Who decides what (two levels of scheduling).** The partition is one node of hsched's fleet, a *node group*:
its devices are every GPU of the partition's usable nodes (`gres`, one device per GPU, named
`slurm-<fleet name>-<slurm node>-gpu<index>`, model = the gres type). hsched's scheduler decides whether a job
goes to this group or to another node (its QoS classes, fair share, preemption, the GPU model it picked), and
how many GPUs of which model it gets; Slurm decides the exact nodes and GPU indices inside the partition (no
`--nodelist`: Slurm's own scheduler, limits, cgroups and accounting stay in charge). The GPU model hsched
picked travels as `--gres=gpu:TYPE:N` when the chosen devices share one type, else `--gpus-per-node=N`.
One hsched node per Slurm node (hsched passing `--nodelist`) was the other choice; it was not taken because
it makes hsched a second cluster manager over nodes Slurm already schedules (other users' jobs, reservations,
drains would race with hsched's placements), and because the fleet file then has to list every Slurm node by
hand (one `[[node]]` per partition is what scales). Counting stays honest: a device name says which Slurm
node the GPU is on, but hsched counts each of its jobs on the devices it placed it on, wherever Slurm put it;
the monitoring samples then report the GPUs other jobs hold (`GresUsed`) on devices none of hsched's jobs is
counted on, so the group's busy devices number exactly the GPUs Slurm has given out, and hsched hands the
group no more GPUs than Slurm has free (a job that still does not fit waits in Slurm's queue).

**A run is one Slurm batch job.** launch writes the run folder:

    slurm.sh      the batch script: `export NAME='value'` per environment variable, then `exec` of the argv,
                  each word single-quoted (executors/slurm/text.batch_script): no shell reinterprets anything
    slurm.json    {comment, cluster, partition, devices} before sbatch (devices: what hsched counts the run
                  on), {job_id, submitted, argv} added as soon as sbatch answered (each write fsync, rename);
                  then `final` once the job has ended: {state, exit_status, exit_signal, end_time, nodes,
                  reason}, so its end is known even after Slurm forgot the job (MinJobAge, no accounting)
    output.log    stdout and stderr of the job (sbatch --output/--error), what `hsched logs` reads; a job
                  with `-o`/`-e` gives sbatch its own files instead (expanded by the controller: hsched's job id;
                  relative to its working folder), with `--open-mode=truncate` at its first start and `append`
                  for a requeued run, and `hsched logs` reads its `-o` file (slurm.json's `log`)
    signals.log   one JSON line per signal hsched sent, as the node helper writes it ($HSCHED_RUN_DIR)

and submits `sbatch --parsable --export=NONE --no-requeue --comment=hsched:<job>:<token> ...`. The run's handle
carries Slurm's job id as its `pid` (`pgid` 0, `start_ticks` the submit time, `boot_id`
`slurm:<cluster>:<partition>`); the controller stores it like any handle. The token (a hash of the run folder)
in the job's comment proves that a Slurm job id still names this run (a cluster whose state was wiped reuses
ids). A controller restarted at any moment finds every run again: by the handle, else by slurm.json, else (it
died between sbatch and slurm.json, or sbatch's answer was lost) by the comment in `squeue -u`; launch is
idempotent per run folder (the folder is the lock, as on other nodes).

**Status** comes from one `squeue -h -t all -j ID,... -o FORMAT` per poll (cached for `poll_s`, 1 s: the
controller asks twice a second, Slurm asks its users not to poll that often), and `scontrol
-d -o show job ID` once per run when it starts (which GPU indices where) and once when it ends (ExitCode=N:S;
a run killed by signal S exits 128 + S, as elsewhere in hsched). A job pending in Slurm's queue is a RUNNING run
for hsched (it has been handed to the group; Slurm decides when it starts), reported `queued`; once Slurm started
it, its reports carry `started_at`, Slurm's StartTime: the job's time limit counts from there, not from sbatch
(the wait in Slurm's queue is not the job's running time). Slurm states: COMPLETED, FAILED, CANCELLED, TIMEOUT,
DEADLINE -> EXITED with Slurm's exit code (a job cancelled before it started: signal 15); OUT_OF_MEMORY -> EXITED
with `oom`; NODE_FAIL, BOOT_FAIL -> LOST with cause NODE_LOST, PREEMPTED (Slurm's own preemption) -> LOST with
cause PREEMPTED: Slurm took the job away through no fault of its own, so hsched requeues it without using a
retry (the attempt gets a new sbatch; `--no-requeue` keeps Slurm from running it again behind hsched's back, and
makes `scontrol requeue` of it refused). A job Slurm no longer knows, with no end recorded in slurm.json, is
LOST without a cause. `sacct` is asked about jobs squeue no longer knows, where accounting exists. The
controller reads these three fields of RunReport (hsched.controller.watching: note_start, run_taken).

**Slurm away**: a failed command is followed by `scontrol ping`; when slurmctld does not answer, the call raises
SlurmUnreachable (a NodeUnreachable) and monitoring stops, so the group turns UNREACHABLE on the controller's
heartbeat; its jobs run on in Slurm and are reported again when it is back.

**Signals**: `scancel --signal=SIG --full` (the batch step's main process, which is the run's command itself,
its children, and every srun step), `--batch` for sbatch's `B:` and for a checkpoint request (only the main
process: a child without a handler, e.g. a spawned data loader worker, would die of USR1). A job still pending
in Slurm cannot get a signal: a stop (cancel, preemption, time limit) then cancels it outright (`scancel ID`),
a checkpoint or warning is not sent. Every signal is recorded in signals.log first.

**Files**: run folders and checkpoint folders are used where they are: the controller's folder (HSCHED_HOME)
must be on a filesystem the Slurm nodes share, as any sbatch user's home is (`remote_path` is the identity,
`put`/`get` copy locally). Over SSH, a run folder is `<root>/runs/<hash>/<name>` on the login node (root:
the entry's `login_dir`, else `$HSCHED_NODE_ROOT` there, else `~/.cache/hsched`, on the filesystem its compute
nodes share), written and read over SFTP, slurm.json included; a checkpoint folder is `<root>/files/...`, moved
with SFTP (`put`/`get`).

**A job of several ranks** (`--nodes` N, `--tasks-per-node` T: the controller launches one run per rank, each
with its torchrun/Slurm environment) is one Slurm job per attempt, not one per rank. The ranks' launches gather
per (job, attempt) for up to GATHER_S; the last to come submits `sbatch --nodes=N --ntasks-per-node=T`, whose
batch script (slurm-job.sh in rank 0's folder) sets MASTER_ADDR to the job's first node and runs `srun
--kill-on-bad-exit=1`, which starts slurm-ranks.sh as every task: task SLURM_PROCID execs rank SLURM_PROCID's
own script (its folder's slurm.sh, output to its output.log). Every rank has its run folder, log, slurm.json and
handle (the shared Slurm job id; the comment carries rank 0's token, named in each rank's `token_dir`). A rank's
exit code is its task's, from srun's messages (slurm-job.log: `task 1: Exited with exit code 3`, `task 0:
Terminated`); a rank that failed ends the others (srun's kill-on-bad-exit, as hsched does with a gang). A signal
goes to every task of the job (`scancel --signal` without `--batch`: srun is the batch step's process), once
for all ranks (the other ranks' calls within GANG_SIGNAL_S record it in their signals.log only), and to every
process of each task. All ranks must be placed on the group (a gang across the group and another node is
refused with one line). hsched's round (hsched.sched.live) places a gang of N nodes whole on one group, each
node's share on devices of another Slurm node (`sbatch --nodes=N --gpus-per-node=G`: Slurm picks which N), and
never across a group and another node; any job's share of a group is on one Slurm node's devices, as
`--gpus-per-node` asks.

**Lab mode** (a run for another user, `LaunchRequest.user`): submitted as its owner, by name, where the Slurm
commands run as root (the controller here, or `login = "root@..."`): `sbatch --uid=USER --gid=GID` where this
Slurm's sbatch has them (asked once, `sbatch --usage`), else `runuser -u USER -- sbatch`; Slurm then runs the job
as that user, in their home unless the job names a folder. Its run folder is made as the node helper makes a
user's: root's and passable (0711) from the controller's folder (over SSH: from hsched's folder on the login node)
down, slurm.json root's, the log, signals.log and the scripts Slurm's steps read the user's (0600), the checkpoint
folder theirs (0700, what a copy brought in too). The folders above hsched's (HSCHED_HOME, `login_dir`) must let
users through, as on any lab node. A user the site lacks, or a site whose user is not root, is refused in one line.

Not yet (issue 17): sbatch's `--signal` and `--constraint` from the job spec (hsched sends the warning signal
itself, by scancel, and its constraints name the fleet file's labels, not Slurm's features; the time limit goes
to sbatch's `--time` only as a safety net past hsched's own stop); lab mode over SSH through a login user that is
not root (sudo -u on the login node).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pwd
import signal as signals
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsched.config import NodeConfig
from hsched.errors import ExecutorError, HelperError
from hsched.model import EndReason, RunHandle, RunReport, RunStatus

from .._contact import recorded
from ..base import Executor, LaunchRequest, StatusQuery
from . import text
from .site import LOG, SIGNALS, Account, LocalSite, Result, Site, SlurmError, SlurmUnreachable

SCRIPT = "slurm.sh"
RECORD = "slurm.json"
BATCH = 200
"""Job ids per squeue call (its command line stays short)."""
DETAIL_CALLS = 8
"""`scontrol show job` calls at once."""
GANG_SIGNAL_S = 2.0
"""A signal sent to a gang's Slurm job for one rank serves the other ranks' calls within this long (the
controller sends each step of a stop to every rank at once)."""
GATHER_S = 60.0
"""How long a gang rank's launch waits for the other ranks' launches (the controller starts them together)."""
GANG_SCRIPT = "slurm-job.sh"
"""In a gang's rank 0 folder: the batch script of the one Slurm job of every rank (srun)."""
GANG_LOG = "slurm-job.log"
"""In a gang's rank 0 folder: the batch script's own output (srun's messages); each rank's is its output.log."""
RANKS = "slurm-ranks.sh"
"""In a gang's rank 0 folder: what srun runs as every task, starting the rank whose number SLURM_PROCID is."""
ENDING_STATES = frozenset({"COMPLETING", "STAGE_OUT"})
"""The job's script has ended; Slurm is cleaning up: nothing left to signal."""
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES",)
"""Slurm sets these in the job from what it allocated; hsched's values name its own view of the group."""
KEPT_SLURM_ENV = frozenset({"SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                            "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX"})
"""SLURM_ variables the run keeps from hsched (every other one is Slurm's to set): hsched's array, which Slurm never
sees (each task is a Slurm job of its own), so Slurm sets none of them and a task would read an empty
SLURM_ARRAY_TASK_ID."""


def _passed(env: Mapping[str, str], also_dropped: tuple[str, ...]) -> dict[str, str]:
    """The run's environment as its batch script exports it: without what Slurm sets itself."""
    return {k: v for k, v in env.items()
            if k not in DROPPED_ENV and k not in also_dropped and (not k.startswith("SLURM_") or k in KEPT_SLURM_ENV)}
TAKEN: Mapping[str, EndReason] = {"NODE_FAIL": EndReason.NODE_LOST, "BOOT_FAIL": EndReason.NODE_LOST,
                                  "PREEMPTED": EndReason.PREEMPTED}
"""Slurm states in which Slurm ended the job itself, through no fault of the run: its node failed (or never
booted), or Slurm's own preemption cancelled it for a job of a higher partition or QoS. Such a run is LOST with
this cause; the job is to be requeued without using one of its retries (a retry is for a run that failed)."""


SlurmRunReport = RunReport
"""Kept for the tests: its fields (queued, started_at, cause) are RunReport's now."""


__all__ = ["LOG", "SIGNALS", "SlurmError", "SlurmExecutor", "SlurmUnreachable"]


@dataclass(frozen=True, slots=True)
class _Ref:
    """Which Slurm job a run is, as far as the run folder and the handle tell."""

    run_dir: str
    job_id: int | None
    comment: str
    final: dict[str, Any] | None = None
    devices: tuple[str, ...] = ()
    """The group's devices hsched placed the run on (its view; Slurm picks the real ones)."""
    token_dir: str = ""
    """The run folder whose token the Slurm job's comment carries: a gang's rank 0's for every rank ("": its
    own)."""
    gang: bool = False
    """A rank of a job of several ranks: one Slurm job (one sbatch, srun starting the ranks) for all of them."""

    @property
    def owner(self) -> str:
        return self.token_dir or self.run_dir


@dataclass(slots=True)
class _Gang:
    """The launches of one attempt's ranks, gathered until all have come: one sbatch for all of them."""

    world: int
    reqs: dict[int, LaunchRequest]
    submitted: asyncio.Future[int]
    """Slurm's job id once sbatch answered, or the launch's error: every rank's launch waits on it."""


@dataclass(frozen=True, slots=True)
class _Ours:
    """One of our live Slurm jobs: its run folder and the devices hsched counts it on."""

    run_dir: str
    devices: tuple[str, ...]


class SlurmExecutor:
    """The executor protocol over one Slurm partition (see this module's docstring and executors/base.py).

    Args:
        name: the node's name in the fleet.
        partition: the Slurm partition the jobs go to and whose nodes make the group.
        account, qos, cluster: sbatch's --account, --qos, --clusters (None: Slurm's defaults).
        env: the environment of the Slurm commands (None: this process's; tests pass SLURM_CONF); with `login`,
            only these variables are set for the commands on the login node (None: none but SLURM_TIME_FORMAT).
        timeout_s: one Slurm command.
        poll_s: how long squeue's answer serves status calls, and how often monitoring asks Slurm.
        login: reach Slurm over SSH on this login node (an ssh node's settings: host, user, port, identity_file,
            known_hosts; executors/slurm/login.py); None: the client commands of this machine.
        ssh_config: with `login`, an ssh config file to read instead of ~/.ssh/config (as SSHExecutor's).
        login_dir: with `login`, hsched's folder on the login node (`~`, `$HOME`, `$USER` expanded there); None:
            $HSCHED_NODE_ROOT there, else ~/.cache/hsched.
    """

    kind = "slurm"
    home_shared = False

    def __init__(self, *, name: str, partition: str, account: str | None = None, qos: str | None = None,
                 cluster: str | None = None, env: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 poll_s: float = 1.0, login: NodeConfig | None = None, ssh_config: str | Path | None = None,
                 login_dir: str | None = None) -> None:
        self.name = name
        self.partition = partition
        self.account = account
        self.qos = qos
        self.cluster = cluster
        self.login = login
        site: Site
        if login is None:
            self.env = dict(os.environ if env is None else env)
            self.env["SLURM_TIME_FORMAT"] = "%s"  # every time Slurm prints is an epoch
            site = LocalSite(name, self.env)
        else:
            # imported here: asyncssh costs a Slurm group reached from this machine nothing
            from .login import LoginSite

            self.env = {**(env or {}), "SLURM_TIME_FORMAT": "%s"}
            # one bound for a command and a file call alike; the connect has its own (the SSH executor's)
            site = LoginSite(name, login, self.env, ssh_config=ssh_config, login_dir=login_dir,
                             command_timeout_s=timeout_s)
        self._site = site
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.last_contact: float | None = None
        self.last_error: ExecutorError | None = None
        self._queue: dict[int, text.QueueEntry] = {}
        self._queue_at = float("-inf")
        self._queue_lock = asyncio.Lock()
        self._gpus: dict[int, Mapping[str, tuple[int, ...]]] = {}
        """Slurm job id -> the GPU indices it holds per Slurm node (our running jobs)."""
        self._ours: dict[int, _Ours] = {}
        """Slurm job id -> our live job's run folder and hsched devices (launched, or seen live by status)."""
        self._nodes_expr: str | None = None
        self._slurm_nodes: list[text.SlurmNode] = []
        self._gangs: dict[tuple[str, str], _Gang] = {}
        """(hsched job id, attempt) -> the ranks whose launches have come so far."""
        self._gang_signals: dict[tuple[int, str, str], float] = {}
        self._logs: dict[str, str] = {}
        """Run folder -> the file its stdout goes to (slurm.json's `log`), once known."""
        self._uid_flag: bool | None = None
        """Whether this Slurm's sbatch has --uid/--gid (asked once, in lab mode)."""

    @classmethod
    def from_config(cls, cfg: NodeConfig, **kw: Any) -> SlurmExecutor:
        """The executor of a fleet file's slurm node group (its `login`, if any, through the ssh keys)."""
        return cls(name=cfg.name, partition=cfg.partition or "", account=cfg.account, qos=cfg.slurm_qos,
                   cluster=cfg.cluster, login=login_config(cfg) if cfg.login else None,
                   login_dir=cfg.login_dir if cfg.login else None, **kw)

    @property
    def boot_id(self) -> str:
        """Stable for the partition: Slurm's jobs survive a restart of any of its daemons."""
        return f"slurm:{self.cluster or ''}:{self.partition}"

    # ------------------------------------------------------------------------------------------ commands

    def _scoped(self, argv: Sequence[str]) -> list[str]:
        return [argv[0], f"--clusters={self.cluster}", *argv[1:]] if self.cluster else list(argv)

    async def _run(self, *argv: str, check: bool = True, as_user: str | None = None) -> Result:
        """Run one Slurm command (never through a shell), as `as_user` through runuser (root) where given. A
        failure is a SlurmError when slurmctld answers `scontrol ping`, else SlurmUnreachable: chosen by exit
        statuses, not by Slurm's wording."""
        words = self._scoped(argv)
        res = await self._exec(["runuser", "-u", as_user, "--", *words] if as_user else words)
        if res.rc == 0:
            self.last_contact = time.monotonic()
            return res
        if not check:
            return res
        line = _first_line(res.err or res.out) or f"exit status {res.rc}"
        ping = await self._exec(self._scoped(["scontrol", "ping"]))
        if ping.rc != 0:
            raise SlurmUnreachable(f"{self.name}: slurmctld does not answer ({argv[0]}: {line})")
        self.last_contact = time.monotonic()
        raise SlurmError(f"{self.name}: {argv[0]} failed: {line}", argv[0])

    async def _exec(self, argv: list[str]) -> Result:
        return await self._site.exec(argv, self.timeout_s)

    # ---------------------------------------------------------------------------------- run folder files

    async def _dir(self, run_dir: str) -> str:
        """The site's folder of the run the controller names `run_dir` (the same path on this machine)."""
        return await self._site.run_dir(run_dir)

    async def _file(self, run_dir: str, name: str) -> str:
        return os.path.join(await self._dir(run_dir), name)

    async def _read_ref(self, run_dir: str) -> _Ref:
        return _ref_of(run_dir, await self._site.read_json(await self._file(run_dir, RECORD)))

    async def _submitted(self, run_dir: str) -> float | None:
        rec = await self._site.read_json(await self._file(run_dir, RECORD))
        value = rec.get("submitted") if isinstance(rec, dict) else None
        return float(value) if isinstance(value, int | float) else None

    async def _merge_record(self, run_dir: str, fields: Mapping[str, Any]) -> None:
        path = await self._file(run_dir, RECORD)
        rec = await self._site.read_json(path)
        rec = dict(rec) if isinstance(rec, dict) else {}
        rec.update(fields)
        await self._site.write_json(path, rec)

    async def _record_signal(self, run_dir: str, name: str, number: int, batch_only: bool, all_processes: bool,
                             purpose: str) -> None:
        """signals.log's line, as the node helper writes it: the job reads why it got a signal from the last one."""
        line = json.dumps({"t": time.time(), "signal": name, "number": number, "batch_only": batch_only,
                           "all_processes": all_processes, "purpose": purpose}) + "\n"
        await self._site.append(await self._file(run_dir, SIGNALS), line.encode())

    async def _rank_final(self, ref: _Ref, final: dict[str, Any]) -> dict[str, Any]:
        """A gang rank's own end: the Slurm job's exit code is srun's (the worst of its tasks'), so each rank's
        comes from srun's messages about its task (GANG_LOG); a rank srun says nothing of exited 0, once srun ran."""
        rec = await self._site.read_json(await self._file(ref.run_dir, RECORD))
        rank = _int(rec.get("rank")) if isinstance(rec, dict) else None
        try:
            log = (await self._site.read_at(await self._file(ref.owner, GANG_LOG), 0, 1 << 20)).decode(
                errors="replace")
        except (ExecutorError, OSError):
            return final
        return _rank_end(log, rank, final)

    # ------------------------------------------------------------------------------------------ discovery

    async def _discover(self) -> tuple[dict[str, str], list[text.SlurmNode]]:
        part = text.oneliner((await self._run("scontrol", "-o", "show", "partition", self.partition)).out.strip())
        expr = text.null(part.get("Nodes"))
        nodes: list[text.SlurmNode] = []
        if expr:
            out = (await self._run("scontrol", "-d", "-o", "show", "node", expr)).out
            nodes = [text.parse_node(line) for line in out.splitlines() if line.startswith("NodeName=")]
        self._nodes_expr = expr
        self._slurm_nodes = nodes
        return part, nodes

    def device_uuid(self, slurm_node: str, index: int) -> str:
        return f"slurm-{self.name}-{slurm_node}-gpu{index}"

    def _devices(self, nodes: Sequence[text.SlurmNode]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n in nodes:
            if not n.usable:
                continue
            for idx, gtype in n.gpus():
                out.append({"index": len(out), "uuid": self.device_uuid(n.name, idx), "name": gtype or "gpu",
                            "memory_total_mib": None, "slurm_node": n.name, "gres_index": idx})
        return out

    @recorded
    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        """The partition's usable nodes as one machine: their CPUs and memory summed, their GPUs (gres) as
        devices; `slurm` holds every node of the partition as Slurm describes it (state, features, gres).
        A partition that is not UP is a HelperError (the group is then unhealthy: nothing new goes there); one
        without a usable node reports its GPU discovery as failed, naming each node's state."""
        part, nodes = await self._discover()
        state = part.get("State", "UNKNOWN")
        if state != "UP":
            raise SlurmError(f"{self.name}: partition {self.partition} is {state}: Slurm starts no job there",
                             "scontrol")
        usable = [n for n in nodes if n.usable]
        gpus: dict[str, Any] = {"source": "slurm", "devices": self._devices(nodes)}
        if not usable:
            gpus["error"] = (f"no node of partition {self.partition} takes jobs: "
                             + (", ".join(f"{n.name} {n.state}" for n in nodes) or "it has no nodes"))
        return {
            "helper_version": None, "hostname": f"{self.cluster or 'slurm'}/{self.partition}",
            "boot_id": self.boot_id, "python": None,
            "cpus": sum(n.cpus or 0 for n in usable) or None,
            "memory_total_mib": sum(n.memory_mib or 0 for n in usable) or None,
            "numa": [], "gpus": gpus, "loadavg": None,
            "slurm": {"partition": self.partition, "cluster": self.cluster, "state": state,
                      "nodes": [_node_dict(n) for n in nodes]},
        }

    # ------------------------------------------------------------------------------------------- launch

    def _comment(self, run_dir: str, env: Mapping[str, str]) -> str:
        return f"hsched:{env.get('HSCHED_JOB_ID', '')}:{_token(run_dir)}"

    @recorded
    async def launch(self, req: LaunchRequest) -> RunHandle:
        world = _int(req.env.get("WORLD_SIZE")) or 1
        owner = await self._owner(req)
        if world > 1:
            return await self._launch_rank(req, world, owner)
        comment = self._comment(req.run_dir, req.env)
        rdir = await self._dir(req.run_dir)
        created = await self._site.make_run_dir(rdir)
        if not created:
            # launched before (a retried launch, a restarted controller): that run, never a second sbatch
            ref = await self._read_ref(req.run_dir)
            if ref.job_id is None:
                ref = await self._find(req.run_dir)
            if ref.job_id is not None:
                return self._handle(req.run_dir, ref.job_id, await self._submitted(req.run_dir))
        gpu_types = {self._gpu_type(d) for d in req.devices}
        gpu_type = next(iter(gpu_types)) if len(gpu_types) == 1 else None
        # HSCHED_RUN_DIR: the batch script sets it to the run's folder where the job runs (the site's)
        env = _passed(req.env, ("HSCHED_RUN_DIR",))
        # a user's run starts in their home when the job names no folder (as the node helper's)
        workdir = req.workdir or (owner.home if owner is not None else rdir)
        script, skipped = text.batch_script(req.command, env, workdir, rdir)
        if skipped:
            raise SlurmError(f"{self.name}: environment names a shell cannot export: {', '.join(skipped)}", "launch")
        path = os.path.join(rdir, SCRIPT)
        await self._site.write_file(path, script, 0o700)
        await self._checkpoint_dir(req)
        if owner is not None:
            await self._hand_over(req, owner, rdir, [SCRIPT])
        out, err = _out_files(req, workdir, rdir)
        # what is known before sbatch: a restarted controller finds the job by this comment, and counts it on these;
        # `log`: where its stdout goes (what `hsched logs` reads); `user`: whose job it is in Slurm (lab mode)
        record = {"job_id": None, "comment": comment, "cluster": self.cluster, "partition": self.partition,
                  "devices": list(req.devices), "submitted": None, "log": out,
                  "user": owner.name if owner is not None else None}
        await self._merge_record(req.run_dir, record)
        sb = text.SbatchRequest(
            script=path, output=out, error=err, workdir=workdir,
            job_name=text.job_name(req.env.get("HSCHED_JOB_NAME") or "hsched"), comment=comment,
            partition=self.partition, account=self.account, qos=self.qos, cluster=self.cluster,
            gpus_per_node=len(req.devices), gpu_type=gpu_type,
            cpus_per_task=-(-int(req.cpu_limit * 1000) // 1000) if req.cpu_limit else None,
            memory_mib=req.memory_mib, time_limit_s=req.time_limit_s,
            # the job's own files: emptied at its first start, appended to by a requeued run (hsched's rule, as
            # the node helper's); the run folder's log is new for every run
            open_mode=("truncate" if req.truncate_output else "append") if req.output or req.error else None)
        submitted = time.time()
        try:
            res = await self._sbatch(sb, owner)
        except SlurmUnreachable:
            # no answer: the job may have been queued all the same (its answer lost); if Slurm has it, it is this run
            with contextlib.suppress(ExecutorError):
                ref = await self._find(req.run_dir)
                if ref.job_id is not None:
                    self._ours[ref.job_id] = _Ours(req.run_dir, tuple(req.devices))
                    return self._handle(req.run_dir, ref.job_id, submitted)
            raise
        job_id = _int(res.out.strip().split(";", 1)[0])
        if job_id is None:
            raise SlurmError(f"{self.name}: sbatch answered {_first_line(res.out)!r}, not a job id", "sbatch")
        await self._merge_record(req.run_dir, {"job_id": job_id, "submitted": submitted, "argv": text.sbatch_argv(sb)})
        self._ours[job_id] = _Ours(req.run_dir, tuple(req.devices))
        self._queue_at = float("-inf")  # the next status asks Slurm: this job is not in the last answer
        return self._handle(req.run_dir, job_id, submitted)

    async def _launch_rank(self, req: LaunchRequest, world: int, owner: Account | None) -> RunHandle:
        """One rank of a job of several ranks. The ranks of an attempt gather here (the controller launches them
        together); the last to come submits one sbatch for all (`--nodes N --ntasks-per-node T`), whose batch
        script runs srun, which starts every rank's own script as task SLURM_PROCID = RANK. Each rank keeps its
        run folder, log and handle (the Slurm job id, shared); the comment carries rank 0's token."""
        placed = [n for n in (req.env.get("HSCHED_GANG_NODES") or "").split(",") if n]
        if not placed:
            raise SlurmError(f"{self.name}: a job of {world} ranks without HSCHED_GANG_NODES (where its ranks are "
                             "placed): not a launch of hsched's controller", "launch")
        if any(n != self.name for n in placed):
            raise SlurmError(f"{self.name}: a job of {world} ranks placed on {', '.join(dict.fromkeys(placed))}: "
                             "all its ranks must be on the Slurm node group (one sbatch starts them all)", "launch")
        rank = _int(req.env.get("RANK"))
        tpn = _int(req.env.get("LOCAL_WORLD_SIZE")) or 1
        if rank is None or not 0 <= rank < world or world % tpn:
            raise SlurmError(f"{self.name}: RANK {req.env.get('RANK')!r} of WORLD_SIZE {world} with LOCAL_WORLD_SIZE "
                             f"{tpn}: not a rank of a job of whole nodes", "launch")
        rdir = await self._dir(req.run_dir)
        created = await self._site.make_run_dir(rdir)
        if not created:
            # launched before: that rank's job, never a second sbatch
            ref = await self._read_ref(req.run_dir)
            if ref.job_id is None and ref.token_dir:
                ref = await self._find(req.run_dir)
            if ref.job_id is not None:
                return self._handle(req.run_dir, ref.job_id, await self._submitted(req.run_dir))
        # MASTER_ADDR: the gang's batch script sets it to the job's first node (hsched's names the group)
        env = _passed(req.env, ("MASTER_ADDR", "HSCHED_RUN_DIR"))
        workdir = req.workdir or (owner.home if owner is not None else rdir)
        script, skipped = text.batch_script(req.command, env, workdir, rdir)
        if skipped:
            raise SlurmError(f"{self.name}: environment names a shell cannot export: {', '.join(skipped)}", "launch")
        await self._site.write_file(os.path.join(rdir, SCRIPT), script, 0o700)
        await self._checkpoint_dir(req)
        if owner is not None:
            await self._hand_over(req, owner, rdir, [SCRIPT])
        key = (req.env.get("HSCHED_JOB_ID", ""), req.env.get("HSCHED_RUN", ""))
        gang = self._gangs.get(key)
        if gang is None or gang.world != world or gang.submitted.done():
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure nobody waits on is no warning
            gang = self._gangs[key] = _Gang(world, {}, fut)
        gang.reqs[rank] = req
        if len(gang.reqs) == world:
            del self._gangs[key]
            try:
                job_id = await self._submit_gang(gang, world // tpn, tpn, owner)
            except asyncio.CancelledError:
                gang.submitted.cancel()
                raise
            except Exception as e:
                gang.submitted.set_exception(e)
                raise
            gang.submitted.set_result(job_id)
        else:
            try:
                async with asyncio.timeout(GATHER_S):
                    job_id = await asyncio.shield(gang.submitted)
            except TimeoutError:
                raise SlurmError(f"{self.name}: rank {rank} of job {key[0]} waited {GATHER_S:g} s for the launches of "
                                 f"its other ranks ({len(gang.reqs)} of {world} came)", "launch") from None
        return self._handle(req.run_dir, job_id, await self._submitted(req.run_dir))

    async def _owner(self, req: LaunchRequest) -> Account | None:
        """Lab mode: the account the run is submitted as (None: as the site's own user, personal mode or the
        user's own). Submitting as another user takes root where the Slurm commands run (as a lab's node helper
        runs as root): else the run is refused in one line rather than run as the wrong user."""
        if req.user is None:
            return None
        me = await self._site.user()
        if req.user == me:
            return None
        acct = await self._site.account(req.user)
        if acct is None:
            raise SlurmError(f"{self.name}: user {req.user} does not exist on {self._site.where}", "launch")
        mine = await self._site.account(me)
        if mine is None or mine.uid != 0:
            runs_as = "the login node's user" if self.login is not None else "the controller"
            raise SlurmError(f"{self.name}: lab mode: a run as {req.user} is submitted as its owner, which takes "
                             f"root; {runs_as} runs as {me}" + (" (login = \"root@...\")" if self.login else ""),
                             "launch")
        return acct

    async def _give(self, path: str, owner: Account, mode: int) -> None:
        try:
            await self._site.give(path, owner, mode)
        except (ValueError, OSError) as e:
            raise SlurmError(f"{self.name}: cannot hand {path} to {owner.name}: {e}", "launch") from None

    async def _hand_over(self, req: LaunchRequest, owner: Account, rdir: str, scripts: Sequence[str]) -> None:
        """Lab mode: the run folder as the node helper makes a user's: root's and passable (0711) from the
        controller's folder down, its control files (slurm.json) root's; the log, the signals file and the scripts
        Slurm runs as the user theirs; the checkpoint folder theirs (0700)."""
        base = req.base_dir if self.login is None else None  # (over SSH: hsched's folder on the login node)
        try:
            await self._site.passable(base, rdir)
            ckpt = req.env.get("HSCHED_CHECKPOINT_DIR")
            if ckpt:
                there = await self._site.path(ckpt)
                await self._site.passable(base, os.path.dirname(there.rstrip("/")))
                await self._site.give(there, owner, 0o700)
        except (ValueError, OSError) as e:
            raise SlurmError(f"{self.name}: cannot make {rdir} {owner.name}'s: {e}", "launch") from None
        # (the scripts are read by sbatch and /bin/sh, never executed themselves: 0600 like the log)
        for name, mode in ((LOG, 0o600), (SIGNALS, 0o600), *((n, 0o600) for n in scripts)):
            await self._give(os.path.join(rdir, name), owner, mode)

    async def _sbatch(self, sb: text.SbatchRequest, owner: Account | None) -> Result:
        """sbatch of `sb`, as `owner` in lab mode: `--uid/--gid` where this Slurm's sbatch has them (as root),
        else through `runuser -u USER --` (util-linux, root only)."""
        argv = text.sbatch_argv(sb)
        if owner is None:
            return await self._run(*argv)
        if self._uid_flag is None:
            usage = await self._run("sbatch", "--usage", check=False)
            self._uid_flag = "--uid" in usage.out + usage.err
        if self._uid_flag:
            return await self._run(argv[0], f"--uid={owner.name}", f"--gid={owner.gid}", *argv[1:])
        return await self._run(*argv, as_user=owner.name)

    async def _checkpoint_dir(self, req: LaunchRequest) -> None:
        """The job's checkpoint folder, there before it starts (the controller makes its own; over SSH, the
        login node's is made here, as a job on this machine finds its folder made)."""
        ckpt = req.env.get("HSCHED_CHECKPOINT_DIR")
        if ckpt and self.login is not None:
            await self._site.make_dirs(ckpt)

    async def _submit_gang(self, gang: _Gang, nodes: int, tpn: int, owner: Account | None) -> int:
        """One sbatch for every rank of `gang` (each rank's folder and script are written)."""
        r0 = gang.reqs[0]
        dirs = [gang.reqs[r].run_dir for r in range(gang.world)]
        there = [await self._dir(d) for d in dirs]  # the ranks' folders where the job runs (the site's)
        comment = self._comment(r0.run_dir, r0.env)
        # each rank's stdout and stderr: its folder's log, or the job's own -o/-e files (appended: ranks may share one)
        home = owner.home if owner is not None else None
        files = [_out_files(gang.reqs[r], gang.reqs[r].workdir or home or there[r], there[r])
                 for r in range(gang.world)]
        for r, rq in gang.reqs.items():
            # what is known before sbatch: every rank names the job by rank 0's token
            await self._merge_record(rq.run_dir, {
                "job_id": None, "comment": comment, "cluster": self.cluster, "partition": self.partition,
                "devices": list(rq.devices), "submitted": None, "token_dir": r0.run_dir, "ranks": dirs, "rank": r,
                "log": files[r][0], "user": owner.name if owner is not None else None})
        dispatch = os.path.join(there[0], RANKS)
        await self._site.write_file(dispatch, text.rank_dispatch(
            [(os.path.join(d, SCRIPT), out) for d, (out, _err) in zip(there, files, strict=True)],
            [err for _out, err in files]), 0o700)
        batch = os.path.join(there[0], GANG_SCRIPT)
        workdir = r0.workdir or home or there[0]
        await self._site.write_file(batch, text.gang_script(dispatch, workdir, there[0], nodes, tpn), 0o700)
        if owner is not None:
            # srun's tasks run the dispatch as the user; slurmstepd opens the batch script's log as the user
            for name in (RANKS, GANG_SCRIPT, GANG_LOG):
                await self._give(os.path.join(there[0], name), owner, 0o600)
        gpu_types = {self._gpu_type(d) for d in r0.devices}
        sb = text.SbatchRequest(
            script=batch, output=os.path.join(there[0], GANG_LOG), workdir=workdir,
            job_name=text.job_name(r0.env.get("HSCHED_JOB_NAME") or "hsched"), comment=comment,
            partition=self.partition, account=self.account, qos=self.qos, cluster=self.cluster, nodes=nodes,
            ntasks_per_node=tpn, gpus_per_node=len(r0.devices),
            gpu_type=next(iter(gpu_types)) if len(gpu_types) == 1 else None,
            cpus_per_task=-(-int(r0.cpu_limit * 1000) // 1000) if r0.cpu_limit else None,
            memory_mib=r0.memory_mib * tpn if r0.memory_mib else None,  # the ranks' share: sbatch's --mem is per node
            time_limit_s=r0.time_limit_s)
        submitted = time.time()
        job_id: int | None
        try:
            job_id = _int((await self._sbatch(sb, owner)).out.strip().split(";", 1)[0])
        except SlurmUnreachable:
            with contextlib.suppress(ExecutorError):  # sbatch's answer lost: the job may be queued all the same
                job_id = (await self._find(r0.run_dir)).job_id
                if job_id is not None:
                    return await self._gang_submitted(gang, job_id, submitted, None)
            raise
        if job_id is None:
            raise SlurmError(f"{self.name}: sbatch did not answer with a job id", "sbatch")
        return await self._gang_submitted(gang, job_id, submitted, text.sbatch_argv(sb))

    async def _gang_submitted(self, gang: _Gang, job_id: int, submitted: float, argv: list[str] | None) -> int:
        for rq in gang.reqs.values():
            await self._merge_record(rq.run_dir, {"job_id": job_id, "submitted": submitted, "argv": argv})
        self._ours[job_id] = _Ours(gang.reqs[0].run_dir, tuple(gang.reqs[0].devices))
        self._queue_at = float("-inf")
        return job_id

    def _gpu_type(self, uuid: str) -> str | None:
        for n in self._slurm_nodes:
            for idx, gtype in n.gpus():
                if self.device_uuid(n.name, idx) == uuid:
                    return gtype
        return None

    def _handle(self, run_dir: str, job_id: int, submitted: float | None) -> RunHandle:
        return RunHandle(run_dir=run_dir, pid=job_id, pgid=0, start_ticks=int(submitted or 0), boot_id=self.boot_id)

    async def _find(self, run_dir: str) -> _Ref:
        """A run whose sbatch may have gone through with no slurm.json written (the controller died while
        sbatch answered): the token in its comment, among the jobs of ours that squeue still knows."""
        owner = (await self._read_ref(run_dir)).owner
        rec = await self._site.read_json(await self._file(run_dir, RECORD))
        user = rec.get("user") if isinstance(rec, dict) and isinstance(rec.get("user"), str) else None
        res = await self._run("squeue", "-h", "-t", "all", "-u", user or await self._site.user(), "-o",
                              text.SQUEUE_FORMAT)
        for entry in text.parse_squeue(res.out).values():
            if _same_job(entry.comment, owner):
                await self._merge_record(run_dir, {
                    "job_id": entry.job_id, "comment": entry.comment, "cluster": self.cluster,
                    "partition": self.partition})
                return await self._read_ref(run_dir)
        return _Ref(run_dir, None, "")

    # ------------------------------------------------------------------------------------------- status

    async def _queue_view(self, ids: Sequence[int], *, fresh: bool = False) -> dict[int, text.QueueEntry]:
        """squeue's line for each of `ids` it knows, from one call per BATCH ids; a view younger than poll_s
        serves again when it holds every id asked for."""
        async with self._queue_lock:
            now = time.monotonic()
            wanted = sorted(set(ids))
            if not fresh and now - self._queue_at < self.poll_s and all(i in self._queue for i in wanted):
                return {i: self._queue[i] for i in wanted}
            view: dict[int, text.QueueEntry] = {}
            for k in range(0, len(wanted), BATCH):
                chunk = wanted[k:k + BATCH]
                res = await self._run("squeue", "-h", "-t", "all", "-j", ",".join(map(str, chunk)),
                                      "-o", text.SQUEUE_FORMAT, check=False)
                if res.rc != 0:
                    # squeue fails when it knows none of the ids (all forgotten), or when slurmctld is away
                    ping = await self._run("scontrol", "ping", check=False)
                    if ping.rc != 0:
                        raise SlurmUnreachable(f"{self.name}: slurmctld does not answer "
                                               f"(squeue: {_first_line(res.err) or res.rc})")
                    continue
                view.update(text.parse_squeue(res.out))
            self._queue = view
            self._queue_at = now
            return {i: view[i] for i in wanted if i in view}

    async def _detail(self, job_id: int) -> text.JobDetail | None:
        res = await self._run("scontrol", "-d", "-o", "show", "job", str(job_id), check=False)
        lines = [ln for ln in res.out.splitlines() if ln.startswith("JobId=")]
        return text.parse_job(lines[0]) if res.rc == 0 and lines else None

    async def _accounting(self, job_id: int) -> dict[str, Any] | None:
        """What sacct says of an ended job Slurm's controller forgot; None without accounting."""
        res = await self._run("sacct", "-n", "-P", "-X", "-j", str(job_id), "-o",
                              "JobID,State,ExitCode,Start,End,NodeList", check=False)
        for line in res.out.splitlines() if res.rc == 0 else []:
            f = line.split("|")
            if len(f) >= 6 and f[0] == str(job_id):
                state = f[1].split()[0] if f[1] else "UNKNOWN"
                status, sig = (int(x) for x in f[2].split(":")) if ":" in f[2] else (None, None)
                nodes = text.null(f[5])
                began = nodes is not None and nodes != "None assigned"
                return {"state": state, "exit_status": status, "exit_signal": sig,
                        "end_time": float(f[4]) if f[4].isdigit() else None, "nodes": nodes if began else None,
                        "reason": None, "started": began,
                        "start_time": float(f[3]) if began and f[3].isdigit() else None}
        return None

    @recorded
    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        if not queries:
            return []
        refs = await asyncio.gather(*(self._ref(q) for q in queries))
        ids = [r.job_id for r in refs if r.job_id is not None and r.final is None]
        view = await self._queue_view(ids) if ids else {}
        sem = asyncio.Semaphore(DETAIL_CALLS)

        async def one(ref: _Ref) -> RunReport:
            async with sem:
                return await self._report(ref, view)

        return list(await asyncio.gather(*(one(r) for r in refs)))

    async def _ref(self, q: StatusQuery) -> _Ref:
        ref = await self._read_ref(q.run_dir)
        if ref.job_id is None and q.handle is not None and q.handle.boot_id == self.boot_id:
            ref = _Ref(q.run_dir, q.handle.pid, ref.comment, ref.final, ref.devices, ref.token_dir, ref.gang)
        if ref.job_id is None and await self._site.isdir(await self._dir(q.run_dir)):
            # the folder exists but no job id was written: sbatch may have answered a controller that died
            ref = await self._find(q.run_dir)
        return ref

    async def _report(self, ref: _Ref, view: Mapping[int, text.QueueEntry]) -> RunReport:
        if ref.job_id is None:
            return SlurmRunReport(RunStatus.NOT_STARTED)
        job_id = ref.job_id
        handle = self._handle(ref.run_dir, job_id, await self._submitted(ref.run_dir))
        if ref.final is not None:
            return _final_report(ref.final, handle)
        entry = view.get(job_id)
        # that id names another job now (Slurm's state was wiped and ids start again): ours is gone
        reused = entry is not None and not _same_job(entry.comment, ref.owner)
        state = entry.state if entry is not None and not reused else None
        detail: text.JobDetail | None = None
        if entry is None:
            # squeue did not list it: Slurm forgot it, or squeue failed for this batch; scontrol has the last word
            detail = await self._detail(job_id)
            if detail is not None and _same_job(detail.comment, ref.owner):
                state = detail.state
            else:
                detail = None
        if state in text.LIVE_STATES:
            self._ours[job_id] = _Ours(ref.run_dir, ref.devices)
            if state not in text.STARTED_STATES:
                return SlurmRunReport(RunStatus.RUNNING, handle=handle, queued=True)
            if job_id not in self._gpus:
                detail = detail or await self._detail(job_id)
                if detail is not None:
                    self._gpus[job_id] = detail.gpus
            # a pending job's StartTime is Slurm's guess; a started one's is when its batch script began
            started = entry.start_time if entry is not None else detail.start_time if detail is not None else None
            return SlurmRunReport(RunStatus.RUNNING, handle=handle, started_at=started)
        final: dict[str, Any] | None = None
        if state is not None:
            detail = detail or await self._detail(job_id)
            if detail is None or detail.state != state:
                return SlurmRunReport(RunStatus.RUNNING, handle=handle)  # changed between two looks: ask again
            final = _final_of(detail)
            if ref.gang:
                final = await self._rank_final(ref, final)
        elif not reused:
            final = await self._accounting(job_id)
        self._gpus.pop(job_id, None)
        self._ours.pop(job_id, None)
        if final is None:
            return SlurmRunReport(RunStatus.LOST, handle=handle)
        await self._merge_record(ref.run_dir, {"final": final})
        return _final_report(final, handle)

    # ------------------------------------------------------------------------------------------- signal

    @recorded
    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False,
                     batch_only: bool = False, purpose: str = "stop") -> bool:
        name = signal.upper().removeprefix("SIG")
        number = getattr(signals, f"SIG{name}", None)
        if not isinstance(number, int) or name.startswith("_"):
            raise SlurmError(f"{self.name}: unknown signal {signal}", "signal")
        if handle.boot_id != self.boot_id:
            return False  # not a run of this partition
        job_id = handle.pid
        ref = await self._read_ref(handle.run_dir)
        entry = (await self._queue_view([job_id], fresh=True)).get(job_id)
        if entry is None or not entry.live or not _same_job(entry.comment, ref.owner):
            return False
        if entry.state in ENDING_STATES:
            return False  # its processes are already being ended and cleaned up
        if ref.gang:
            # the controller signals every rank, and one scancel reaches every rank's task: the first rank's call
            # sends it, the others within GANG_SIGNAL_S only record it (each rank's signals.log says why)
            key = (job_id, name, purpose)
            if time.monotonic() - self._gang_signals.get(key, float("-inf")) < GANG_SIGNAL_S:
                await self._record_signal(handle.run_dir, name, int(number), batch_only, all_processes, purpose)
                return True
            self._gang_signals[key] = time.monotonic()
        goes_on = purpose in ("checkpoint", "warning")
        if not entry.started:
            if goes_on:
                return False  # nothing runs yet that could checkpoint
            await self._record_signal(handle.run_dir, name, int(number), batch_only, all_processes, purpose)
            res = await self._run("scancel", str(job_id), check=False)  # pending in Slurm: cancelled outright
        else:
            await self._record_signal(handle.run_dir, name, int(number), batch_only, all_processes, purpose)
            # a gang's batch script is srun, which relays signals to the tasks itself: the steps' tasks get it
            # directly (no flag), once; else the run's command is the batch step's main process
            whom = [] if ref.gang else ["--batch"] if batch_only or purpose == "checkpoint" else ["--full"]
            res = await self._run("scancel", f"--signal={name}", *whom, str(job_id), check=False)
        self._queue_at = float("-inf")
        if res.rc == 0:
            return True
        # it may have ended in between (then nothing was sent); anything else is an error worth a line
        entry = (await self._queue_view([job_id], fresh=True)).get(job_id)
        if entry is None or not entry.live or entry.state in ENDING_STATES:
            return False
        raise SlurmError(f"{self.name}: scancel {job_id} failed: {_first_line(res.err) or res.rc}", "scancel")

    # --------------------------------------------------------------------------------------------- files

    @recorded
    async def users(self, names: Sequence[str]) -> dict[str, bool]:
        if self.login is not None:
            # the accounts of the login node, where the jobs run (`getent passwd` exits 2 when one is missing)
            res = await self._exec(["getent", "passwd", *names]) if names else Result(0, "", "")
            known = {line.split(":", 1)[0] for line in res.out.splitlines()}
            return {n: n in known for n in names}

        def look() -> dict[str, bool]:
            out = {}
            for n in names:
                try:
                    pwd.getpwnam(n)
                    out[n] = True
                except KeyError:
                    out[n] = False
            return out

        return await asyncio.to_thread(look)

    @recorded
    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """The run's stdout: its folder's output.log, or the job's own `-o` file where Slurm wrote it instead
        (slurm.json's `log`). With `-e` the run's stderr is in the job's error file only."""
        try:
            path = self._logs.get(run_dir)
            if path is None:
                rec = await self._site.read_json(await self._file(run_dir, RECORD))
                log = rec.get("log") if isinstance(rec, dict) else None
                path = log if isinstance(log, str) and log else await self._file(run_dir, LOG)
                if isinstance(rec, dict) and rec.get("submitted") is not None:
                    if len(self._logs) > 10000:
                        self._logs.clear()  # (a long-lived controller's ended runs: read again if asked)
                    self._logs[run_dir] = path  # (settled once sbatch answered: before, a launch may be under way)
            return await self._site.read_at(path, offset, max_bytes)
        except OSError as e:
            raise HelperError(f"{self.name}: cannot read the log of {run_dir}: {e.strerror or e}", "read") from None

    @recorded
    async def newest_mtime(self, path: str) -> float | None:
        return await self._site.newest(path)

    @recorded
    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        """Refused: a Slurm group's jobs land on whichever of its nodes Slurm picks, so hsched places no dataset
        on one of them; its datasets live on the group's shared file system."""
        raise HelperError(f"{self.name}: a Slurm group keeps its datasets on its shared file system, not on one "
                          "node: declare the dataset shared for this group (no copy to it)", f"data_{op}")

    @recorded
    async def remote_path(self, local_path: str) -> str:
        """Where Slurm's jobs see a controller path (a checkpoint folder): the path itself when the Slurm nodes
        share the controller's folder (client commands here), else a folder under hsched's on the login node."""
        return await self._site.path(local_path)

    @recorded
    async def put(self, local: str | Path, remote: str, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        await self._site.put(str(local), remote, timeout_s)

    @recorded
    async def get(self, remote: str, local: str | Path, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        await self._site.get(remote, str(local), timeout_s)

    # -------------------------------------------------------------------------------------------- watch

    async def watch(self, interval_s: float = 1.0, *, count: int | None = None,
                    stale_after_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """A sample every `interval_s` from what Slurm said at most `poll_s` ago (`scontrol -d show node` of
        the partition): per GPU, which job holds it (`GresUsed`); our own jobs' GPUs carry their run folder,
        other jobs' are foreign (busy for hsched). Host figures are Slurm's allocation (CPUs, memory), not
        utilization. Raises SlurmUnreachable when Slurm has not answered for `stale_after_s`."""
        stale = stale_after_s if stale_after_s is not None else max(5.0, 3 * interval_s)
        seq = 0
        answered = float("-inf")
        asked = float("-inf")
        sample: dict[str, Any] | None = None
        while count is None or seq < count:
            now = time.monotonic()
            if now - asked >= max(self.poll_s, interval_s) or sample is None:
                asked = now
                try:
                    async with asyncio.timeout(stale):
                        nodes = await self._watch_nodes()
                except TimeoutError:
                    nodes = None
                except ExecutorError as e:
                    self.last_error = e
                    raise
                if nodes is not None:
                    answered = time.monotonic()
                    sample = self._sample(nodes)
                    self.last_error = None
            if sample is None or time.monotonic() - answered > stale:
                e2 = SlurmUnreachable(f"{self.name}: no answer from Slurm for {stale:g} s")
                self.last_error = e2
                raise e2
            yield dict(sample, seq=seq, t=time.time())
            seq += 1
            if count is None or seq < count:
                await asyncio.sleep(interval_s)

    async def _watch_nodes(self) -> list[text.SlurmNode]:
        if self._nodes_expr is None:
            _part, nodes = await self._discover()
        else:
            out = (await self._run("scontrol", "-d", "-o", "show", "node", self._nodes_expr)).out
            nodes = [text.parse_node(line) for line in out.splitlines() if line.startswith("NodeName=")]
        if any(n.gpus_used for n in nodes):
            # our live jobs whose GPUs are not known yet (they started since status last looked): ask where
            # Slurm put them, or their GPUs would count as someone else's
            for job_id in [j for j in self._ours if j not in self._gpus]:
                detail = await self._detail(job_id)
                if detail is None or detail.state not in text.LIVE_STATES:
                    continue
                if detail.state in text.STARTED_STATES:
                    self._gpus[job_id] = detail.gpus
        return nodes

    def _sample(self, nodes: Sequence[text.SlurmNode]) -> dict[str, Any]:
        """A monitoring sample in hsched's terms. hsched counts each of our jobs on the devices it placed it on,
        while Slurm put it where it chose; so the GPUs other jobs hold are reported as foreign on devices no job
        of ours is counted on (the very GPU where that is free, else one of that node, else one of that type):
        the group's busy devices then number exactly the GPUs Slurm has given out, never fewer."""
        devices = self._devices(nodes)
        ours_real = {(node, idx) for per_node in self._gpus.values() for node, idxs in per_node.items() for idx in idxs}
        placed = {u for o in self._ours.values() for u in o.devices}
        # other jobs' GPUs on the group's usable nodes (a drained node's are not in the group at all)
        others = [(n.name, self.device_uuid(n.name, idx), gtype or "gpu") for n in nodes if n.usable
                  for idx, gtype in n.gpus() if idx in n.gpus_used and (n.name, idx) not in ours_real]
        foreign = _spread(others, [d for d in devices if d["uuid"] not in placed])
        processes = [{"uuid": u, "pid": 0, "name": "slurm job", "run_dir": None, "job_run_dir": None} for u in foreign]
        for job, o in self._ours.items():
            processes.extend({"uuid": u, "pid": job, "name": f"slurm job {job}", "run_dir": o.run_dir,
                              "job_run_dir": o.run_dir} for u in o.devices)
        usable = [n for n in nodes if n.usable]
        cpus = sum(n.cpus or 0 for n in usable)
        mem = sum(n.memory_mib or 0 for n in usable)
        used_mem = sum(n.memory_allocated_mib or 0 for n in usable)
        alloc = sum(n.cpus_allocated or 0 for n in usable)
        readings = [{"index": d["index"], "uuid": d["uuid"], "utilization_gpu": None, "memory_used_mib": None,
                     "memory_total_mib": None, "temperature_c": None, "power_w": None} for d in devices]
        return {"boot_id": self.boot_id, "node": self.name,
                "cpu": {"util": 100.0 * alloc / cpus if cpus else None, "count": cpus or None, "loadavg": None},
                "memory": {"total_mib": mem or None, "used_mib": used_mem, "available_mib": max(0, mem - used_mem)},
                "gpus": {"source": "slurm", "devices": readings}, "gpu_error": None, "processes": processes}

    async def close(self) -> None:
        """Let the login node's connection go (here: nothing, every call is a command of its own)."""
        await self._site.close()


# ------------------------------------------------------------------------------------ the run folder


def _token(run_dir: str) -> str:
    return hashlib.sha256(os.path.abspath(run_dir).encode(errors="surrogateescape")).hexdigest()[:16]


def _same_job(comment: str | None, run_dir: str) -> bool:
    """Whether a Slurm job's comment names this run (ends with its token)."""
    return comment is not None and comment.endswith(":" + _token(run_dir))


def _ref_of(run_dir: str, rec: Any) -> _Ref:
    """What slurm.json (`rec`, None if missing) says of the run the controller names `run_dir`."""
    if not isinstance(rec, dict):
        return _Ref(run_dir, None, "")
    final = rec.get("final") if isinstance(rec.get("final"), dict) else None
    devices = rec.get("devices")
    return _Ref(run_dir, _int(rec.get("job_id")), str(rec.get("comment") or ""), final,
                tuple(str(d) for d in devices) if isinstance(devices, list) else (), str(rec.get("token_dir") or ""),
                isinstance(rec.get("ranks"), list))


# ----------------------------------------------------------------------------------------------- values


def _final_of(detail: text.JobDetail) -> dict[str, Any]:
    """What slurm.json keeps of an ended job (`final`), from `scontrol show job`."""
    began = detail.nodes is not None  # a job cancelled while pending has a StartTime (Slurm's guess) but no node
    return {"state": detail.state, "exit_status": detail.exit_status, "exit_signal": detail.exit_signal,
            "end_time": detail.end_time, "nodes": detail.nodes, "reason": detail.reason, "started": began,
            "start_time": detail.start_time if began else None}


def _rank_end(log: str, rank: int | None, final: dict[str, Any]) -> dict[str, Any]:
    """A gang rank's end from the batch script's output (`log`, srun's messages) and the Slurm job's `final`."""
    if rank is None or "srun: " not in log or final.get("state") not in ("COMPLETED", "FAILED"):
        return final  # srun never ran, or Slurm ended the job (cancel, time limit, node failure): the job's end
    ends = text.srun_task_ends(log)
    if not ends and final.get("state") == "FAILED":
        return final  # srun failed before any task ended (no allocation, no credential): every rank failed with it
    code, sig = ends.get(rank, (0, None))
    return {**final, "exit_status": 0 if sig else code, "exit_signal": sig or 0}


def _final_report(final: Mapping[str, Any], handle: RunHandle) -> SlurmRunReport:
    """The report of an ended job from its end as slurm.json keeps it (`final`)."""
    state = str(final.get("state") or "UNKNOWN")
    end, start = final.get("end_time"), final.get("start_time")
    end_time = float(end) if isinstance(end, int | float) else None
    started_at = float(start) if isinstance(start, int | float) else None
    if state in text.GONE_STATES:
        return SlurmRunReport(RunStatus.LOST, handle=handle, end_time=end_time, started_at=started_at,
                              cause=TAKEN.get(state))
    status, sig = final.get("exit_status"), final.get("exit_signal")
    if state == "CANCELLED" and not final.get("started", True) and not sig:
        sig = int(signals.SIGTERM)  # cancelled before it started: as killed by the stop signal
    code, signal = text.exit_code(status if isinstance(status, int) else None, sig if isinstance(sig, int) else None)
    if code is None:
        return SlurmRunReport(RunStatus.LOST, handle=handle, end_time=end_time, started_at=started_at)
    return SlurmRunReport(RunStatus.EXITED, exit_code=code, signal=signal, handle=handle, end_time=end_time,
                          oom=state == "OUT_OF_MEMORY", started_at=started_at)


def _spread(others: Sequence[tuple[str, str, str]], free: Sequence[Mapping[str, Any]]) -> list[str]:
    """Devices to mark as held by other jobs: for each GPU another job holds (slurm node, device, type), that
    device if no job of ours is counted on it, else one of the same node and type, else one of the same type;
    each device once. `free`: the group's devices no job of ours is counted on."""
    left = list(free)
    chosen: list[str] = []
    pending = list(others)
    stages = (lambda o, d: d["uuid"] == o[1],
              lambda o, d: d["slurm_node"] == o[0] and d["name"] == o[2],
              lambda o, d: d["name"] == o[2])
    for matches in stages:
        unplaced = []
        for o in pending:
            got = next((d for d in left if matches(o, d)), None)
            if got is None:
                unplaced.append(o)
            else:
                left.remove(got)
                chosen.append(str(got["uuid"]))
        pending = unplaced
    return chosen


def _node_dict(n: text.SlurmNode) -> dict[str, Any]:
    return {"name": n.name, "state": n.state, "usable": n.usable, "cpus": n.cpus, "memory_mib": n.memory_mib,
            "gres": [{"name": g.name, "type": g.type, "count": g.count} for g in n.gres],
            "gpus_used": list(n.gpus_used), "features": list(n.features), "active_features": list(n.active_features),
            "reason": n.reason}


def _out_files(req: LaunchRequest, workdir: str, rdir: str) -> tuple[str, str | None]:
    """sbatch's --output and --error for a run: the job's own `-o`/`-e` files (expanded by the controller, hsched's
    ids; relative to its working folder, as a node makes them) where it gave them, else the run folder's log (stdout
    and stderr both, what `hsched logs` reads); error None: with the output."""
    out = os.path.join(workdir, req.output) if req.output else os.path.join(rdir, LOG)
    err = os.path.join(workdir, req.error) if req.error and req.error != req.output else None
    return out, err


def _first_line(s: str) -> str:
    for line in s.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and str(value).strip() != "" else None
    except (TypeError, ValueError):
        return None


def login_config(cfg: NodeConfig) -> NodeConfig:
    """The ssh settings of a slurm group's `login` ("user@host" or "host", which may be an ~/.ssh/config alias;
    the entry's `user`, `port`, `identity_file`, `known_hosts` complete it), as an ssh node's."""
    user, _, host = (cfg.login or "").rpartition("@")
    return NodeConfig(name=cfg.name, executor="ssh", host=host, user=user or cfg.user, port=cfg.port,
                      identity_file=cfg.identity_file, known_hosts=cfg.known_hosts)


def _conforms(ex: SlurmExecutor) -> Executor:
    return ex  # mypy checks SlurmExecutor against the protocol here
