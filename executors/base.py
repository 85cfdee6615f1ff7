"""The executor protocol: everything the controller asks of a node, whatever the transport.

One small async protocol, several transports (as httpx's transports): `local` runs the node helper on this
machine (one long-lived helper process), `ssh` runs it on a remote machine over one SSH connection, `fake`
keeps everything in memory for tests. The conformance check (hsched.testing.conformance) holds every executor
to the same behaviour (tests/executors/test_conformance.py and tests/slurm/test_slurm_conformance.py run it).

Errors: every method raises ExecutorError subclasses only (hsched/errors.py), chosen from what failed, never
from message text:

    NodeUnreachable   cannot reach the node now (refused, reset, timed out, no route, DNS); retry later
    NodeRefused       refused in a way a person must fix (host key, login, python3); `reason` says which
    HelperError       the helper answered this one request with an error; the node is fine
    TransferError     put/get failed on a file (no such file, no space); the node is fine

Every method is bounded in time by the executor's own timeouts and may also be bounded by the caller's
`asyncio.timeout`; a node that cannot answer raises, which the controller turns into a node state, never a
crash. `last_contact` and `last_error` say how the node answered lately, for the controller's health check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hsched.errors import ExecutorError
from hsched.model import RunHandle, RunReport


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    run_dir: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    inherit_env: bool = False
    """Start from the helper's own environment (local runs) rather than a bare PATH (remote runs)."""
    cpus: tuple[int, ...] = ()
    """Pin the run to these CPU cores (those local to its GPUs); empty: no pinning."""
    memory_mib: int | None = None
    """The run's memory limit (its cgroup's), where the node has cgroups; going over it is an OOM kill."""
    cpu_limit: float | None = None
    """CPU cores' worth of time the run may use (its cgroup's CPU quota)."""
    devices: tuple[str, ...] = ()
    """The run's GPU UUIDs: once its processes are gone, the node checks nothing else still uses them."""
    checkpoint_exit_code: int | None = None
    """When the main process dies of a signal hsched sent and a process of the run then exits with this code
    (a trainer behind `bash -c`), it is the run's exit code."""
    stop_grace_s: float = 30.0
    """After a stop signal, how long the run's remaining processes may take to finish on their own (plus a
    margin) once its main process ended; the node then kills them itself."""
    user: str | None = None
    """Lab mode: the account (by name, as it is named on the node) the run's processes run as; the helper, run
    as root, drops to it. None: as the helper's own user (personal mode)."""
    base_dir: str | None = None
    """Lab mode: the controller folder under which the run folder and checkpoint folder are made passable
    (0711) for the user; an executor that maps paths gives the node's own."""
    time_limit_s: float | None = None
    """A hard limit a backend with its own (Slurm's `--time`) may enforce as a safety net: the job's limit plus
    its grace and the kill delay, so that hsched's own stop (signal, grace, kill) always comes first."""
    output: str | None = None
    """sbatch's --output, expanded (hsched.spec.outfiles): the node also writes the run's stdout (and stderr, without
    `error`) to this file as the run's user, relative to its working folder. None: the run folder's log only."""
    error: str | None = None
    """sbatch's --error, expanded: the file the node also writes the run's stderr to."""
    truncate_output: bool = False
    """Empty those files when opening them (the job's first start, one rank): a requeued run appends."""


@dataclass(frozen=True, slots=True)
class StatusQuery:
    run_dir: str
    handle: RunHandle | None = None


@runtime_checkable
class Executor(Protocol):
    """How the controller probes a node, runs jobs there, follows them and moves their files.

    Paths: run folders (`LaunchRequest.run_dir`, `StatusQuery.run_dir`, `RunHandle.run_dir`, `read_log`) are
    always the controller's local paths; an executor whose node has another disk maps them itself, and the
    handles it returns carry the local path again. Other paths on the node (`newest_mtime`, the `remote`
    side of `put`/`get`) are the node's own, as `remote_path` gives them.
    """

    kind: str
    """"local", "ssh", "slurm" or "fake"."""

    @property
    def home_shared(self) -> bool:
        """Whether the node sees the controller's own files (its checkpoint folders) as they are: this
        machine's helper does; a remote node, or this machine through a service account's installed helper,
        does not."""
        ...

    name: str
    """The node's name (error messages start with it where the transport adds one)."""
    last_contact: float | None
    """time.monotonic() of the last exchange in which the node answered (a reply, an error reply, a monitoring
    sample, a finished transfer); None before the first. The controller's heartbeat reads it: on the monotonic
    clock, so a step of the wall clock never makes a node that answered look silent (issue 27)."""
    last_error: ExecutorError | None
    """The ExecutorError the last call raised, typed (NodeUnreachable, NodeRefused, HelperError...); None
    once a call has succeeded since. `isinstance(ex.last_error, NodeRefused)`: a person must act."""

    async def probe(self, *, gpu_timeout_s: float = 10.0) -> dict[str, Any]:
        """Machine facts as the node helper reports them (hsched/node/probe.py `probe`): `helper_version`,
        `hostname`, `boot_id`, `python`, `cpus`, `memory_total_mib`, `numa` ([{id, cpus, memory_mib}]),
        `gpus` ({source, devices: [...]}, optionally `topo_matrix`), `loadavg`; ssh adds `remote_root`.

        GPU discovery (NVML, nvidia-smi) runs in a child process on the node, killed after `gpu_timeout_s`:
        a hung driver or nvidia-smi makes `gpus` {source: None, devices: [], error: "GPU probe did not answer
        within 10 s (nvidia-smi pid N killed)"}, never a probe that does not answer. Keep it below the
        executor's own call timeout."""
        ...

    async def launch(self, req: LaunchRequest) -> RunHandle:
        """Start a run detached; idempotent per run_dir (a second call returns the first run's handle and
        starts nothing)."""
        ...

    async def status(self, queries: Sequence[StatusQuery]) -> list[RunReport]:
        """One report per query, in order: NOT_STARTED (no such run), RUNNING, EXITED or LOST (gone without an
        exit code; the node first kills what is left of a run whose wrapper died, and says LOST only once
        nothing of it runs).

        EXITED is the node's exit record, written once no process of the run is left: `exit_code` (128 + N
        and `signal` N for a run killed by signal N; the checkpoint code when the main process died of a
        signal hsched sent and a process of the run then exited with it), `end_time` (the node's clock when
        the main process ended), `oom` (the kernel's OOM killer struck the run's cgroup), `gpu_left` (the
        processes still using the run's GPUs after it, from nvidia-smi)."""
        ...

    async def signal(self, handle: RunHandle, signal: str, *, all_processes: bool = False,
                     batch_only: bool = False, purpose: str = "stop") -> bool:
        """Send `signal` ('TERM', 'KILL', 'USR1'...) to the run's process group; with `all_processes` also to
        every process of the run (its cgroup, and every process that carries the run's marker: children that
        left the group); with `batch_only` to the run's main process alone (sbatch's `B:`). `purpose` says why
        (preempted, timeout, cancelled, rank_failed, warning, or checkpoint: go on afterwards, so only the processes
        that handle the signal get it, and the run's end is not taken as asked for); the node records it, where
        the job may read it (the last line of `$HSCHED_RUN_DIR/signals.log`). The node records
        each signal in the run's folder before sending it (its wrapper then lets the run's other processes
        finish within `stop_grace_s`). False if the run is not running; HelperError for a signal name the node
        does not know."""
        ...

    async def users(self, names: Sequence[str]) -> dict[str, bool]:
        """Which of these accounts exist on the node (lab mode: a user's jobs go only where the user exists)."""
        ...

    async def read_log(self, run_dir: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Up to `max_bytes` of the run's output log from `offset` (b'' at the end, or if there is none)."""
        ...

    async def newest_mtime(self, path: str) -> float | None:
        """When a file under `path` (a folder on the node, e.g. a checkpoint folder) last changed; None if
        there is no file there."""
        ...

    def watch(self, interval_s: float = 1.0, *, count: int | None = None,
              stale_after_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Monitoring samples from the node every `interval_s` (an async generator; see nodehelper.watch for
        the shape: seq, t, boot_id, cpu, memory, gpus, gpu_error, processes, and now and then progress).
        `gpu_error` is None, or why the GPU numbers are missing or old (NVML or nvidia-smi hung: the stream goes
        on without them). Each sample gains `node`, and each GPU process and each progress report
        `job_run_dir`: the controller's run folder of the hsched run it belongs to, None if none.
        Ends after `count` samples; raises NodeUnreachable when no sample came for `stale_after_s`
        (default: 3 intervals, at least 5 s) or the stream broke."""
        ...

    async def remote_path(self, local_path: str) -> str:
        """The node's path for a controller path (a job's checkpoint folder): the same path where the node
        shares the controller's disk, else a folder under the node's hsched root (a pure function of the
        local path, so it holds across restarts)."""
        ...

    async def put(self, local: str | Path, remote: str, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        """Copy a local file or folder to `remote` on the node, replacing what is there as a whole (a reader
        never sees half of it). On a node that shares the controller's disk, nothing to do when `remote` is
        `local` itself (what remote_path gives there). Data only (hsched/node/safefiles.py); `user`: the job's, whose
        files they are (a root controller makes them theirs from the first byte and reads only what they may
        give)."""
        ...

    async def get(self, remote: str, local: str | Path, *, timeout_s: float = 3600.0,
                  user: str | None = None) -> None:
        """Copy a file or folder from the node to `local`, replacing what is there as a whole; TransferError
        if `remote` does not exist. On a node that shares the controller's disk, nothing to do when `remote`
        is `local` itself. `user`: as put's."""
        ...

    async def data(self, op: str, req: Mapping[str, Any], *, timeout_s: float = 120.0) -> dict[str, Any]:
        """A dataset request the node helper answers (hsched/node `data_<op>`): `scan`, `list`, `free`,
        `root`, `read`, `write`, `read_many`, `write_many`, `claim`, `commit`, `drop` or `hash`, with the node's own
        absolute paths; its reply as it came (an older helper answers "unknown request" to the newer ones).
        hsched/controller/datacopy.py builds copies, scans and eviction on it. Within `timeout_s`, else NodeUnreachable;
        HelperError for a request the node refused (no such file, a link on the way, outside a confined
        helper's folder, an unknown op); a node that keeps no datasets of its own (Slurm) refuses them all."""
        ...

    async def close(self) -> None:
        """Let go of connections and helper processes (runs go on). The executor may be used again after.
        Connections and helper processes belong to the event loop that made them: close before it ends."""
        ...
