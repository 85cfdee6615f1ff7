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
                          "--gres", "--ntasks-per-node", "-n", "--ntasks", "-c", "--cpus-per-task"})


@dataclass(frozen=True, slots=True)
class BatchScript:
    options: list[str]
    """The option words of its #SBATCH/#HSCHED lines, translated to hsched's (sbatch's --gres, -n)."""
    command: list[str]
    warnings: list[str]


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
    options, warnings = _translate(words, path)
    absolute = str(path.resolve())
    interp = shlex.split(shebang) if shebang else ["/bin/sh"]
    name = Path(interp[-1] if Path(interp[0]).name == "env" and len(interp) > 1 else interp[0]).name
    if name in _SHELLS:
        command = [*interp, "-c", text, absolute]  # the script's text as of now; $0 is its path
    else:
        command = [*interp, absolute]
    return BatchScript(options, command, warnings)


def _translate(words: list[str], path: Path) -> tuple[list[str], list[str]]:
    out: list[str] = []
    warnings: list[str] = []
    ntasks: int | None = None
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
            out += ["--tasks-per-node", value]
        elif key in ("-n", "--ntasks"):
            if not value.isdigit():
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
    if ntasks is not None:
        nodes = _nodes(out)
        if ntasks % nodes:
            raise UserError(f"{path}: #SBATCH --ntasks {ntasks}: not a multiple of the {nodes} nodes")
        out += ["--tasks-per-node", str(ntasks // nodes)]
    if per_task is not None:
        out += ["--cpus", str(per_task * _tasks_per_node(out))]
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
    for n, w in enumerate(options):
        if w in ("-N", "--nodes") and n + 1 < len(options) and options[n + 1].isdigit():
            return int(options[n + 1])
        if w.startswith("--nodes=") and w[8:].isdigit():
            return int(w[8:])
    return 1
