"""Batch scripts as sbatch reads them: `#SBATCH` (and `#HSCHED`) lines before the first command are options.

    #!/bin/bash
    #SBATCH -J train -t 10 --gpus-per-node=2
    #SBATCH --gres=gpu:a100:2          # translated: --gpus-per-node 2 --gpu-type a100
    #SBATCH --constraint="nvme&ib"     # node labels (the fleet file's [[node]] labels), as sbatch's features
    #SBATCH --partition=gpu            # the nodes labelled gpu (a partition is a label here)
    #SBATCH -o logs/%x-%j.out          # output files as sbatch's (-e for stderr), relative to the working folder
    #SBATCH --mail-type=END            # known to sbatch, meaningless here: ignored with a warning
    python train.py

The script is run from a snapshot taken at submit (as sbatch copies it): a shell script's text is passed to
its shell with `-c`, so editing or deleting the file after submitting changes nothing; a script for another
interpreter (`#!/usr/bin/env python3`) is run by path, so the node must see the file.

`srun` inside a shell script works as in a Slurm allocation: hsched defines it as a shell function (SRUN below, on
the script's first line, so that line numbers do not move; exported to child bash shells) that runs its command
once per task of the job (`#SBATCH --ntasks N`: N copies at once, each with SLURM_PROCID, SLURM_LOCALID and the
step's SLURM_NTASKS; `srun -n K` fewer), waits for all and returns the highest exit status, as srun does. Where the
job's tasks are hsched's ranks (several nodes), each rank already is one task: `srun CMD` runs CMD once. srun's
other options are accepted and ignored.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hsched.errors import UserError

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})

# sbatch options that mean nothing on a lab's workstations (yet): accepted from a script and said so
_IGNORED = {
    "-A": "accounts", "--account": "accounts",
    "--mail-type": "mail", "--mail-user": "mail", "--exclusive": "exclusive nodes (jobs share nodes by GPU)",
    "--requeue": "--requeue (hsched requeues on preemption)",
    "--no-requeue": "--no-requeue", "--mem-per-cpu": "--mem-per-cpu (give --mem)",
    "--nice": "--nice (give --priority)",
}
# sbatch options that take a value when written as separate words
_TAKES_VALUE = frozenset({"-p", "-A", "-o", "-e", "-C", "--partition", "--account", "--mail-type", "--mail-user",
                          "--output", "--error", "--open-mode", "--export", "--mem-per-cpu", "--constraint", "--nice",
                          "--gres", "--ntasks-per-node", "-n", "--ntasks", "-c", "--cpus-per-task", "-w",
                          "--nodelist", "-x", "--exclude"})


# one line of POSIX sh (see the module's text); `_hs_` names stay out of the script's way
SRUN = (
    "srun() { _hs_n=; "
    "while [ $# -gt 0 ]; do case $1 in "
    "--) shift; break;; "
    "-n|--ntasks) [ $# -ge 2 ] || { echo \"srun: error: $1 needs a value\" >&2; return 1; }; _hs_n=$2; shift 2;; "
    "--ntasks=*) _hs_n=${1#--ntasks=}; shift;; "
    "-n*) _hs_n=${1#-n}; shift;; "
    "-[NcJoeiptwxGmDdCAsrS]|--nodes|--cpus-per-task|--job-name|--output|--error|--input|--partition|--time|"
    "--nodelist|--exclude|--gpus|--gres|--mem|--mem-per-cpu|--distribution|--chdir|--export|--cpu-bind|--mpi|"
    "--ntasks-per-node|--gpus-per-task|--gpus-per-node|--constraint|--account|--qos|--signal|--dependency) "
    "[ $# -ge 2 ] || { echo \"srun: error: $1 needs a value\" >&2; return 1; }; shift 2;; "
    "-*) shift;; "
    "*) break;; esac; done; "
    "[ $# -gt 0 ] || { echo 'srun: error: no command to run' >&2; return 1; }; "
    # a rank of hsched's (HSCHED_SRUN_TASKS unset) is one task already: the command runs once, as that task
    "if [ -z \"${HSCHED_SRUN_TASKS:-}\" ]; then \"$@\"; return $?; fi; "
    "_hs_n=${_hs_n:-$HSCHED_SRUN_TASKS}; "
    "case $_hs_n in ''|*[!0-9]*|0) echo \"srun: error: --ntasks $_hs_n: expected a number of tasks\" >&2; "
    "return 1;; esac; "
    "if [ \"$_hs_n\" -gt \"$HSCHED_SRUN_TASKS\" ]; then echo \"srun: error: Unable to create step: $_hs_n tasks "
    "requested, the job has $HSCHED_SRUN_TASKS (--ntasks)\" >&2; return 1; fi; "
    "_hs_step=$(( ${_hs_step:--1} + 1 )); _hs_i=0; _hs_pids=; "
    "while [ $_hs_i -lt $_hs_n ]; do "
    "( SLURM_PROCID=$_hs_i; SLURM_LOCALID=$_hs_i; SLURM_NTASKS=$_hs_n; SLURM_NPROCS=$_hs_n; SLURM_STEP_ID=$_hs_step; "
    "SLURM_STEPID=$_hs_step; SLURM_STEP_NUM_TASKS=$_hs_n; export SLURM_PROCID SLURM_LOCALID SLURM_NTASKS "
    "SLURM_NPROCS SLURM_STEP_ID SLURM_STEPID SLURM_STEP_NUM_TASKS; exec \"$@\" ) & "
    "_hs_pids=\"$_hs_pids $!\"; _hs_i=$((_hs_i + 1)); done; "
    "_hs_rc=0; _hs_i=0; for _hs_p in $_hs_pids; do wait \"$_hs_p\" && _hs_c=0 || _hs_c=$?; "
    "[ \"$_hs_c\" -eq 0 ] || echo \"srun: error: ${HSCHED_NODE:-}: task $_hs_i: Exited with exit code $_hs_c\" >&2; "
    "[ \"$_hs_c\" -le \"$_hs_rc\" ] || _hs_rc=$_hs_c; _hs_i=$((_hs_i + 1)); done; return $_hs_rc; }; "
    "[ -z \"${BASH_VERSION:-}\" ] || export -f srun; "
)
"""The srun function a batch shell script gets, ending in `; ` so that the script's first line (its `#!` line, an
#SBATCH line or a command) follows it on the same line."""


@dataclass(frozen=True, slots=True)
class BatchScript:
    options: list[str]
    """The option words of its #SBATCH/#HSCHED lines, translated to hsched's (sbatch's --gres, -n)."""
    command: list[str]
    warnings: list[str]
    components: tuple[list[str], ...] = ()
    """A heterogeneous job's later components (`#SBATCH hetjob` lines between them): each one's option words, as
    `options` holds component 0's (and the job's). Every component runs the script; `$HSCHED_COMPONENT` (Slurm's
    `$SLURM_HET_JOB_OFFSET`) says which it is (hsched.spec.components)."""


def read_batch_script(path: Path) -> BatchScript | None:
    """The batch script at `path`, or None when it is not one (no such file, binary, neither a #! line nor an
    #SBATCH/#HSCHED line: then it is a program to run as given)."""
    try:
        if not path.is_file():
            return None
        raw = path.read_bytes()
    except OSError:
        return None
    if b"\0" in raw[:4096]:
        return None
    text = raw.decode("utf-8", "replace")
    lines = text.splitlines()
    shebang = lines[0][2:].strip() if lines and lines[0].startswith("#!") else ""
    words: list[str] = []
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if n == 1 and shebang:
            continue
        if not s or (s.startswith("#") and not s.startswith(("#SBATCH", "#HSCHED"))):
            continue
        if not s.startswith(("#SBATCH", "#HSCHED")):
            break  # sbatch stops at the first command
        body = s[len("#SBATCH"):].split(" #", 1)[0] if s.startswith("#SBATCH") else s[len("#HSCHED"):]
        try:
            words.extend(shlex.split(body, comments=False))
        except ValueError as e:
            raise UserError(f"{path}:{n}: cannot read the option line: {e}") from None
    if not shebang and not words:
        return None
    groups = _hetjob_groups(words, path)
    words = groups[0]
    later = [_translate(g, path) for g in groups[1:]]
    options, warnings = _translate(words, path)
    warnings += [w for _o, ws in later for w in ws]
    if not any(w in ("-J", "--job-name", "--name") or w.startswith(("--job-name=", "--name=")) for w in options):
        options = ["--job-name", path.name, *options]  # sbatch names the job after its script
    absolute = str(path.resolve())
    interp = shlex.split(shebang) if shebang else ["/bin/sh"]
    name = Path(interp[-1] if Path(interp[0]).name == "env" and len(interp) > 1 else interp[0]).name
    if name in _SHELLS:
        # the script's text as of now, srun defined first; $0 is its path
        command = [*interp, "-c", SRUN + text, absolute]
    else:
        command = [*interp, absolute]
    return BatchScript(options, command, warnings, tuple(o for o, _w in later))


HETJOB_WORDS = frozenset({"hetjob", "packjob"})
"""sbatch's separator line between a heterogeneous job's components (`packjob`: its name before Slurm 20.02)."""


def _hetjob_groups(words: list[str], path: Path) -> list[list[str]]:
    """The option words split at each `hetjob` word: component 0's (and the job's), then each later one's."""
    groups: list[list[str]] = [[]]
    for w in words:
        if w in HETJOB_WORDS:
            if not groups[-1]:
                raise UserError(f"{path}: #SBATCH {w}: component {len(groups) - 1} has no options before it; give "
                                f"each component its resources (#SBATCH --gpus 1 ...) before the {w} line")
            groups.append([])
        else:
            groups[-1].append(w)
    if len(groups) > 1 and not groups[-1]:
        raise UserError(f"{path}: #SBATCH hetjob: component {len(groups) - 1} has no options after it; give its "
                        "resources (#SBATCH --gpus 2 --gpu-type h100) after the hetjob line, or drop the line")
    return groups


def _translate(words: list[str], path: Path) -> tuple[list[str], list[str]]:
    out: list[str] = []
    warnings: list[str] = []
    ntasks: int | None = None
    per_node: int | None = None
    per_task: int | None = None
    i = 0
    while i < len(words):
        w = words[i]
        key, eq, value = w.partition("=") if w.startswith("--") else (w, "", "")
        if not eq and key in _TAKES_VALUE and i + 1 < len(words):
            value = words[i + 1]
            i += 1
        i += 1
        if key in _IGNORED:
            warnings.append(f"{path}: #SBATCH {key} ignored: hsched has no {_IGNORED[key]}")
        elif key == "--gres":
            # gpu:2 or gpu:a100:2 (per node, as sbatch's --gres)
            parts = value.split(":")
            if parts[0] != "gpu" or not parts[-1].isdigit() or len(parts) > 3:
                raise UserError(f"{path}: #SBATCH --gres={value}: expected gpu:N or gpu:TYPE:N")
            out += ["--gpus-per-node", parts[-1]] + (["--gpu-type", parts[1]] if len(parts) == 3 else [])
        elif key == "--ntasks-per-node":
            if not value.isdigit() or int(value) < 1:
                raise UserError(f"{path}: #SBATCH {key} {value}: expected a number of tasks per node")
            per_node = int(value)
        elif key in ("-n", "--ntasks"):
            if not value.isdigit() or int(value) < 1:
                raise UserError(f"{path}: #SBATCH {key} {value}: expected a number of tasks")
            ntasks = int(value)
        elif key in ("-c", "--cpus-per-task"):
            # sbatch's CPUs are per task, hsched's --cpus per node: multiplied by the tasks per node below
            if not value.isdigit() or int(value) < 1:
                raise UserError(f"{path}: #SBATCH {key} {value}: expected a number of CPUs per task")
            per_task = int(value)
        elif key == "--export":
            # ALL (what hsched always does: the submitter's environment) plus NAME=VALUE pairs, as sbatch sets them
            for item in value.split(","):
                if "=" in item:
                    out += ["--env", item]
                elif item.upper() not in ("ALL", ""):
                    warnings.append(f"{path}: #SBATCH --export={value}: only ALL and NAME=VALUE are honoured "
                                    "(hsched always passes the submitter's environment)")
                    break
        else:
            out += [w] if (eq or not value) else [key, value]
    nodes = _nodes(out)
    if per_node is not None:
        if ntasks is not None and ntasks != per_node * nodes:
            raise UserError(f"{path}: #SBATCH --ntasks {ntasks} and --ntasks-per-node {per_node} disagree on "
                            f"{nodes} node(s); give one")
        ntasks = per_node * nodes
    if ntasks is not None:
        # --ntasks as sbatch: the script once, `srun` in it starting the tasks (hsched.cli.submitting decides
        # how over several nodes)
        if ntasks % nodes:
            raise UserError(f"{path}: #SBATCH --ntasks {ntasks}: not a multiple of the {nodes} nodes")
        out += ["--ntasks", str(ntasks)]
    if per_task is not None:
        tasks_here = ntasks // nodes if ntasks is not None else _tasks_per_node(out)
        out += ["--cpus", str(per_task * tasks_here)]
    return out, warnings


def _tasks_per_node(options: list[str]) -> int:
    tasks = 1
    for n, w in enumerate(options):
        if w == "--tasks-per-node" and n + 1 < len(options) and options[n + 1].isdigit():
            tasks = int(options[n + 1])
        elif w.startswith("--tasks-per-node=") and w[17:].isdigit():
            tasks = int(w[17:])
    return tasks


def _nodes(options: list[str]) -> int:
    """The job's nodes; of an elastic gang (`--nodes=2-4`, sbatch's MIN-MAX) its least."""
    for n, w in enumerate(options):
        value = options[n + 1] if w in ("-N", "--nodes") and n + 1 < len(options) else (
            w[8:] if w.startswith("--nodes=") else "")
        least = value.partition("-")[0]
        if least.isdigit():
            return int(least)
    return 1
