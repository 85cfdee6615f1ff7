"""What Slurm's commands print and what they are given: pure parsing and argv building, no I/O.

Written against Slurm 22.05 (Debian 12), and kept to the outputs that have not changed in years: `scontrol
--oneliner` (22.05 has no `scontrol --json`; `sinfo/squeue --json` there ignore every filter and their schema
changed in 23.02), `squeue -o` with a tab between fields, and epoch times (SLURM_TIME_FORMAT=%s, set by the
executor for every command). Captured outputs of a real cluster pin each parser (tests/fixtures/slurm/).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

# ------------------------------------------------------------------------------------------- scontrol -o

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")


def oneliner_pairs(line: str) -> list[tuple[str, str]]:
    """`scontrol -o show node|job|partition` output as (key, value) pairs, in order (a job's `-d` detail
    repeats `Nodes=... GRES=...` per node set, so keys may repeat). A value runs to the next ` Key=`, so
    values with spaces (`OS=Linux 6.1.0 #1 SMP`, `Reason=Not responding [slurm@...]`) come out whole."""
    matches = list(_KEY.finditer(line))
    out = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.append((m.group(1), line[m.end():end].strip()))
    return out


def oneliner(line: str) -> dict[str, str]:
    """The pairs of one `scontrol -o` line as a dict (the first of a repeated key)."""
    out: dict[str, str] = {}
    for k, v in oneliner_pairs(line):
        out.setdefault(k, v)
    return out


def null(value: str | None) -> str | None:
    """Slurm's ways of saying "nothing" as None."""
    return None if value in (None, "", "(null)", "N/A", "None", "n/a", "Unknown") else value


# ------------------------------------------------------------------------------------------- host lists


def expand_hostlist(expr: str) -> list[str]:
    """`n[1-3,7],gpu[01-02]-x` -> ['n1', 'n2', 'n3', 'n7', 'gpu01-x', 'gpu02-x'] (Slurm's hostlist syntax,
    zero padding kept; several bracket groups in one name multiply out)."""
    names: list[str] = []
    for part in _split_top(expr, ","):
        if part:
            names.extend(_expand_one(part))
    return names


def _expand_one(name: str) -> list[str]:
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.find("]", open_at)
    if close_at < 0:
        return [name]
    head, body, tail = name[:open_at], name[open_at + 1:close_at], name[close_at + 1:]
    out: list[str] = []
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        if not hi:
            values = [lo]
        elif lo.isdigit() and hi.isdigit():
            width = len(lo) if lo.startswith("0") else 0
            values = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
        else:
            values = [item]
        for v in values:
            out.extend(head + v + rest for rest in _expand_one(tail))
    return out


def _split_top(text: str, sep: str) -> Iterator[str]:
    """Split at `sep` outside brackets and parentheses."""
    depth = 0
    start = 0
    for i, c in enumerate(text):
        if c in "[(":
            depth += 1
        elif c in "])":
            depth = max(0, depth - 1)
        elif c == sep and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


# ------------------------------------------------------------------------------------------------ gres


@dataclass(frozen=True, slots=True)
class Gres:
    """One entry of a node's `Gres=` (`gpu:a100:2(S:0-1)`)."""

    name: str
    type: str | None
    count: int


def parse_gres(text: str | None) -> list[Gres]:
    """`gpu:a100:2(S:0-1),gpu:v100:1,shard:8` -> [Gres('gpu', 'a100', 2), Gres('gpu', 'v100', 1),
    Gres('shard', None, 8)]; `(null)` -> []."""
    out = []
    for item in _split_top(null(text) or "", ","):
        item = item.split("(", 1)[0].strip()
        if not item:
            continue
        parts = item.split(":")
        count = 1
        if len(parts) > 1 and _count(parts[-1]) is not None:
            count = _count(parts.pop()) or 0
        out.append(Gres(parts[0], ":".join(parts[1:]) or None, count))
    return out


def _count(text: str) -> int | None:
    m = re.fullmatch(r"(\d+)([KMGkmg]?)", text)
    if m is None:
        return None
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]


def parse_indices(text: str) -> list[int]:
    """`0-1,3` -> [0, 1, 3]; `N/A` -> []."""
    out: list[int] = []
    for item in text.split(","):
        lo, _, hi = item.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def gres_indices(text: str | None, name: str = "gpu") -> list[int]:
    """The indices of gres `name` in `GresUsed=gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)` or a job's
    `GRES=gpu:a100:1(IDX:0)`: [0, 1]."""
    out: list[int] = []
    for item in _split_top(null(text) or "", ","):
        if item.split(":", 1)[0] != name:
            continue
        m = re.search(r"\(IDX:([^)]*)\)", item)
        if m is not None:
            out.extend(parse_indices(m.group(1)))
    return sorted(set(out))


# ------------------------------------------------------------------------------------------------ nodes

_UNUSABLE_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "MAINT",
                             "INVALID_REG", "REBOOT_ISSUED", "REBOOT_REQUESTED", "RESERVED", "PLANNED"})
_UNUSABLE_BASES = frozenset({"DOWN", "FUTURE", "UNKNOWN", "ERROR", "DRAINED", "DRAINING", "FAIL", "INVAL"})


def node_usable(state: str) -> bool:
    """Whether Slurm may start a job on a node in `State=` `state` (`IDLE`, `MIXED+DRAIN`, `DOWN*`,
    `IDLE+NOT_RESPONDING`...): not down, drained, failing, in maintenance or unresponsive. A powered-down
    cloud node is usable (Slurm powers it up)."""
    words = [w for w in re.split(r"[+]", state.upper().rstrip("*~#!%$@^-")) if w]
    if not words or state.endswith("*"):
        return False
    return words[0] not in _UNUSABLE_BASES and not any(w in _UNUSABLE_FLAGS for w in words[1:])


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node of the partition, as `scontrol -d -o show node` says."""

    name: str
    state: str
    cpus: int | None
    memory_mib: int | None
    gres: tuple[Gres, ...]
    gpus_used: tuple[int, ...]
    """Indices of its GPUs that jobs hold now (`GresUsed=...(IDX:...)`)."""
    features: tuple[str, ...]
    active_features: tuple[str, ...]
    cpus_allocated: int | None = None
    memory_allocated_mib: int | None = None
    reason: str | None = None

    @property
    def usable(self) -> bool:
        return node_usable(self.state)

    def gpus(self) -> list[tuple[int, str | None]]:
        """(gres index, type) of every GPU, in Slurm's index order (gres.conf's)."""
        out: list[tuple[int, str | None]] = []
        for g in self.gres:
            if g.name == "gpu":
                base = len(out)
                out.extend((base + i, g.type) for i in range(g.count))
        return out


def parse_node(line: str) -> SlurmNode:
    d = oneliner(line)
    return SlurmNode(
        name=d.get("NodeName", ""), state=d.get("State", "UNKNOWN"), cpus=_int(d.get("CPUTot")),
        memory_mib=_int(d.get("RealMemory")), gres=tuple(parse_gres(d.get("Gres"))),
        gpus_used=tuple(gres_indices(d.get("GresUsed"))), features=_words(d.get("AvailableFeatures")),
        active_features=_words(d.get("ActiveFeatures")), cpus_allocated=_int(d.get("CPUAlloc")),
        memory_allocated_mib=_int(d.get("AllocMem")), reason=null(d.get("Reason")),
    )


def _words(text: str | None) -> tuple[str, ...]:
    return tuple(w for w in (null(text) or "").split(",") if w)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------- jobs

SQUEUE_FORMAT = "%i\t%T\t%r\t%N\t%k\t%S\t%e"
"""`squeue -o`: id, state, reason, node list, comment, start and end time (epoch with SLURM_TIME_FORMAT=%s);
tab-separated: the comment is ours and the other fields never hold a tab."""

LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED",
                         "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                         "RESV_DEL_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE", "UPDATE_DB"})
"""Slurm job states in which some of the job may still run, or will: the run is live for hsched."""
STARTED_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"})
"""States in which the batch script has started (signals can reach it)."""
GONE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REVOKED"})
"""Ended without an exit code of the run's own: its node failed, or Slurm took it away."""


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One line of `squeue -o SQUEUE_FORMAT`."""

    job_id: int
    state: str
    reason: str | None
    nodes: str | None
    comment: str | None
    start_time: float | None
    end_time: float | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def started(self) -> bool:
        return self.state in STARTED_STATES


def parse_squeue(text: str) -> dict[int, QueueEntry]:
    out = {}
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) < 7 or not f[0].strip().isdigit():
            continue
        job_id = int(f[0])
        out[job_id] = QueueEntry(job_id, f[1].strip(), null(f[2].strip()), null(f[3].strip()), null(f[4]),
                                 _epoch(f[5]), _epoch(f[6]))
    return out


def _epoch(text: str) -> float | None:
    text = text.strip()
    return float(text) if text.isdigit() and int(text) > 0 else None


@dataclass(frozen=True, slots=True)
class JobDetail:
    """`scontrol -d -o show job ID`: what squeue does not say (the exit code, which GPU indices where)."""

    job_id: int
    state: str
    exit_status: int | None
    exit_signal: int | None
    start_time: float | None
    end_time: float | None
    nodes: str | None
    reason: str | None
    comment: str | None
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Slurm node -> the GPU indices the job holds there."""
    restarts: int = 0


def parse_job(line: str) -> JobDetail:
    pairs = oneliner_pairs(line)
    d: dict[str, str] = {}
    gpus: dict[str, tuple[int, ...]] = {}
    current: list[str] = []
    for k, v in pairs:
        if k == "Nodes":  # a `-d` detail block: Nodes=n[1-2] CPU_IDs=0 Mem=2000 GRES=gpu:a100:1(IDX:0)
            current = expand_hostlist(v)
        elif k == "GRES" and current:
            for n in current:
                gpus[n] = tuple(gres_indices(v))
        d.setdefault(k, v)
    status, sig = None, None
    code = d.get("ExitCode", "")
    if re.fullmatch(r"\d+:\d+", code):
        status, sig = (int(x) for x in code.split(":"))
    return JobDetail(
        job_id=int(d.get("JobId", "0") or 0), state=d.get("JobState", "UNKNOWN"), exit_status=status,
        exit_signal=sig, start_time=_epoch(d.get("StartTime", "")), end_time=_epoch(d.get("EndTime", "")),
        nodes=null(d.get("NodeList")), reason=null(d.get("Reason")), comment=null(d.get("Comment")),
        gpus=gpus, restarts=_int(d.get("Restarts")) or 0,
    )


def exit_code(status: int | None, sig: int | None) -> tuple[int | None, int | None]:
    """Slurm's `ExitCode=N:S` as hsched's (exit code, signal): a run killed by signal S exits 128 + S."""
    if sig:
        return 128 + sig, sig
    return status, None


# --------------------------------------------------------------------------------------------- sbatch


@dataclass(frozen=True, slots=True)
class SbatchRequest:
    """Everything one `sbatch` is given, each field one option (None / empty: left to Slurm's defaults)."""

    script: str
    """Path of the batch script (the run's own argv, written by batch_script)."""
    output: str
    """sbatch's --output: the run folder's log, or the job's own `-o` file (and --error too, without `error`)."""
    workdir: str
    job_name: str
    comment: str
    partition: str
    account: str | None = None
    qos: str | None = None
    cluster: str | None = None
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    """With a type: `--gres=gpu:TYPE:N` (Slurm then picks only nodes with that model); else
    `--gpus-per-node=N`."""
    cpus_per_task: int | None = None
    memory_mib: int | None = None
    time_limit_s: float | None = None
    signal: str | None = None
    """sbatch's `--signal` (`B:USR1@60`), as the job spec says it."""
    constraint: str | None = None
    requeue: bool = False
    """False: `--no-requeue`. hsched requeues a job by its own rules (a new run, a new sbatch); Slurm requeueing
    the same run behind its back would run an attempt twice."""
    error: str | None = None
    """sbatch's --error, the job's own `-e` file; None: stderr goes to `output`."""
    open_mode: str | None = None
    """sbatch's --open-mode (`append`, `truncate`) for the job's own files; None: Slurm's default."""


def sbatch_argv(r: SbatchRequest) -> list[str]:
    """The argv of `sbatch` for `r`: one word per option, never through a shell."""
    argv = ["sbatch", "--parsable", f"--partition={r.partition}", f"--job-name={r.job_name}",
            f"--comment={r.comment}", f"--output={slurm_path(r.output)}",
            f"--error={slurm_path(r.error or r.output)}", f"--chdir={r.workdir}", "--export=NONE",
            f"--nodes={r.nodes}", f"--ntasks-per-node={r.ntasks_per_node}",
            "--requeue" if r.requeue else "--no-requeue"]
    if r.open_mode:
        argv.append(f"--open-mode={r.open_mode}")
    if r.account:
        argv.append(f"--account={r.account}")
    if r.qos:
        argv.append(f"--qos={r.qos}")
    if r.cluster:
        argv.append(f"--clusters={r.cluster}")
    if r.gpus_per_node:
        argv.append(f"--gres=gpu:{r.gpu_type}:{r.gpus_per_node}" if r.gpu_type
                    else f"--gpus-per-node={r.gpus_per_node}")
    if r.cpus_per_task:
        argv.append(f"--cpus-per-task={r.cpus_per_task}")
    if r.memory_mib:
        argv.append(f"--mem={r.memory_mib}M")
    if r.time_limit_s is not None:
        argv.append(f"--time={slurm_minutes(r.time_limit_s)}")
    if r.signal:
        argv.append(f"--signal={r.signal}")
    if r.constraint:
        argv.append(f"--constraint={r.constraint}")
    argv.append(r.script)
    return argv


def slurm_path(path: str) -> str:
    """A file name for `--output`: `%` starts one of Slurm's patterns (`%j`), so a literal one is `%%`."""
    return path.replace("%", "%%")


def slurm_minutes(seconds: float) -> str:
    """A time limit for `--time`: whole minutes, rounded up (Slurm's unit), at least 1."""
    return str(max(1, -(-int(seconds) // 60)))


def job_name(name: str) -> str:
    """What squeue shows as the job's name: hsched's, printable and short (Slurm cuts at 200)."""
    clean = "".join(c if c.isprintable() and c not in "\t\n\r" else "_" for c in name).strip()
    return (clean or "hsched")[:100]


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def batch_script(argv: Sequence[str], env: Mapping[str, str], workdir: str, run_dir: str) -> tuple[str, list[str]]:
    """The batch script that runs `argv` exactly: every word single-quoted (shlex.quote), no expansion of any
    kind, and `exec`, so the command is the batch step's main process itself (what `scancel --batch` signals,
    and whose exit status Slurm records). Returns the script and the environment names it had to leave out
    (a shell can only export names that are identifiers).

    sbatch reads `#SBATCH` lines only up to the first command, and the first command is ours (`:`), so no
    value can smuggle an option in."""
    skipped = [k for k in env if not _ENV_NAME.fullmatch(k)]
    lines = [
        "#!/bin/sh",
        f"# hsched run {_comment_safe(run_dir)}: generated, the command's words are quoted one by one",
        ":",
        # with --export=NONE a job has no PATH unless Slurm loaded the user's login environment (root only)
        '[ -n "${PATH:-}" ] || PATH=/usr/local/bin:/usr/bin:/bin',
        '[ -n "${HOME:-}" ] || HOME=$(getent passwd "$(id -u)" | cut -d: -f6)',
        "export PATH HOME",
        # srun steps inside the job get the script's environment, not sbatch's --export=NONE (sbatch(1))
        "export SLURM_EXPORT_ENV=ALL",
        f"export HSCHED_RUN_DIR={shlex.quote(run_dir)}",
    ]
    for k, v in env.items():
        if k in skipped:
            continue
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append(f"cd -- {shlex.quote(workdir)} || exit 1")
    # a command word that starts with '-' would be read as an option of bash's `exec` (and dash's has no `--`)
    lead = "exec env -- " if argv and argv[0].startswith("-") else "exec "
    lines.append(lead + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n", skipped


_SIGNALS_BY_TEXT = {signal.strsignal(s): int(s) for s in signal.valid_signals() if signal.strsignal(s)}
"""What srun prints for a task killed by a signal is libc's strsignal() of it ("Terminated", "Killed")."""
_TASK_END = re.compile(r"^srun: error: [^:\n]*: tasks? ([\d,\-]+): (.+)$", re.M)


def srun_task_ends(log: str) -> dict[int, tuple[int, int | None]]:
    """The tasks srun says did not exit 0, from its messages in the batch script's output (`srun: error: n1: task
    1: Exited with exit code 3`, `srun: error: n1: tasks 0,2-3: Terminated`): task -> (exit code, signal), a
    task killed by signal S exiting 128 + S as elsewhere in hsched. The first line about a task counts."""
    out: dict[int, tuple[int, int | None]] = {}
    for m in _TASK_END.finditer(log):
        what = m.group(2).strip()
        code = re.fullmatch(r"Exited with exit code (\d+)", what)
        if code is not None:
            end: tuple[int, int | None] = (int(code.group(1)), None)
        elif what in _SIGNALS_BY_TEXT:
            end = (128 + _SIGNALS_BY_TEXT[what], _SIGNALS_BY_TEXT[what])
        else:
            continue
        for task in parse_indices(m.group(1)):
            out.setdefault(task, end)
    return out


def rank_dispatch(ranks: Sequence[tuple[str, str]], errors: Sequence[str | None] = ()) -> str:
    """What srun runs as every task of a gang's Slurm job: task SLURM_PROCID becomes rank SLURM_PROCID, its own
    script (`ranks[r]`: (script, log) of rank r, each rank's batch_script) with its output appended to its log
    (its own folder's, or the job's `-o` file), and its stderr to `errors[r]` where given (the job's `-e` file),
    else to the log too. `exec` all the way: the rank's command is the task's process itself, which srun and
    scancel signal."""
    lines = ["#!/bin/sh", "# hsched: srun runs this as every task of the job; task N is rank N",
             'case "${SLURM_PROCID:-}" in']
    for r, (script, log) in enumerate(ranks):
        err = errors[r] if r < len(errors) else None
        to_err = f"2>> {shlex.quote(err)}" if err else "2>&1"
        lines.append(f"{r}) exec /bin/sh {shlex.quote(script)} >> {shlex.quote(log)} {to_err} ;;")
    lines += ["esac", 'echo "hsched: task ${SLURM_PROCID:-?} is no rank of this job" >&2', "exit 1"]
    return "\n".join(lines) + "\n"


def gang_script(dispatch: str, workdir: str, run_dir: str, nodes: int, tasks_per_node: int) -> str:
    """The batch script of a gang (one Slurm job for every rank of an attempt): srun starts nodes x
    tasks_per_node tasks, each `dispatch` (rank_dispatch); the first rank failing ends the others
    (--kill-on-bad-exit), as hsched does with a gang. MASTER_ADDR is the job's first node (this script runs
    there, and so does rank 0 with srun's block distribution): hsched's own value names the group, not a host."""
    lines = [
        "#!/bin/sh",
        f"# hsched gang {_comment_safe(run_dir)}: generated",
        ":",
        '[ -n "${PATH:-}" ] || PATH=/usr/local/bin:/usr/bin:/bin',
        '[ -n "${HOME:-}" ] || HOME=$(getent passwd "$(id -u)" | cut -d: -f6)',
        "export PATH HOME",
        "export SLURM_EXPORT_ENV=ALL",
        "MASTER_ADDR=$(hostname)",
        "export MASTER_ADDR",
        f"cd -- {shlex.quote(workdir)} || exit 1",
        f"exec srun --kill-on-bad-exit=1 --nodes={nodes} --ntasks={nodes * tasks_per_node} "
        f"--ntasks-per-node={tasks_per_node} /bin/sh {shlex.quote(dispatch)}",
    ]
    return "\n".join(lines) + "\n"


def _comment_safe(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


# --------------------------------------------------------------------------------------- the login node

_LOGIN_VARS = re.compile(r"\$(?:\{(HOME|USER)\}|(HOME|USER)(?![A-Za-z0-9_]))")


def expand_login_dir(login_dir: str, home: str, user: str) -> str:
    """A group's `login_dir` on its login node: `~` and `$HOME` (or `${HOME}`) are the login user's home, `$USER`
    its name; nothing else is expanded (hsched.config.login_dir_problem refuses anything else)."""
    if login_dir == "~" or login_dir.startswith("~/"):
        login_dir = "$HOME" + login_dir[1:]
    expanded = _LOGIN_VARS.sub(lambda m: home if (m.group(1) or m.group(2)) == "HOME" else user, login_dir)
    return posixpath.normpath(expanded)
