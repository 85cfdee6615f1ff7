"""A job's kind: what it says (`--kind NAME`, spec `kind`) or what its command looks like.

The script (or module) a command runs and the arguments that name a model, a batch size or a dataset, so
`python train.py --model resnet50 --batch-size 64` and the same line next week are one kind ("train.py
model=resnet50 batch-size=64"), whatever else differs (seeds, output folders, learning rates).

Part of what a job asks, below everything that reads it: the round (hsched.sched), the JSON forms
(hsched.serialize) and what the controller learns per kind (hsched.learn.kinds) all take it from here.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Sequence

_LAUNCHERS = {"python", "python3", "pypy3", "torchrun", "deepspeed", "accelerate", "launch", "srun", "mpirun",
              "uv", "run", "poetry", "conda", "env", "nohup", "exec", "time", "stdbuf", "nice", "bash", "sh",
              "zsh", "horovodrun"}
_WANTED = re.compile(r"(model|arch|network|net|batch|bs|dataset|data|task|config|size|depth|width|layers|seq)",
                     re.IGNORECASE)
_PY = re.compile(r"^python(\d+(\.\d+)?)?$")
MAX_KIND = 120


_SCRIPT = re.compile(r"\.(py|sh|bash|pl|rb|jl|r|lua|js)$", re.IGNORECASE)
_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "2>", "2>&1", "&"}


_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
# words that start a shell's simple command without naming the program a job runs: a pipeline of them
# (`for i in 1 2; do echo $i; done`, `id; hostname`) has no kind worth learning from
_KEYWORDS = {"then", "else", "elif", "do", "!", "{", "(", "time", "exec", "nohup", "command", "builtin"}
"""Shell words that may stand before the program of a simple command."""
_NOT_PROGRAMS = {"for", "while", "until", "if", "fi", "done", "case", "esac", "in", "function", "select", "}", ")",
                 "[", "[[", "]]", "echo", "printf", "cd", "pushd", "popd", "export", "set", "unset", "source", ".",
                 "true", "false", "test", "read", "wait", "trap", "local", "shift", "exit", "return", "eval",
                 "ulimit", "umask", "alias", "id", "hostname", "date", "pwd", "cat", "ls", "mkdir", "rm", "cp", "mv",
                 "touch", "tee", "head", "tail", "grep", "sed", "awk", "env", "whoami", "uname", "nvidia-smi",
                 "module", "ml", "conda", "activate", "deactivate", "ln", "chmod", "wc", "sort", "uniq", "xargs",
                 "basename", "dirname", "seq", ":", "srun"}
"""Shell words and everyday commands: a simple command that runs one of them names no program of the job's own
(`for i in 1 2; do echo $i; done`, `id; hostname`), so a line made only of them has no kind worth learning from.
(`srun` inside a batch script starts its ranks: the script, named by its file, is the kind.)"""
_SEPARATORS = {"&&", "||", ";", ";;", "|", "&", "(", ")", "|&", "\n"}


def derive_kind(command: Sequence[str]) -> str:
    """The kind a command looks like: its script (a word ending in .py, .sh...) or `-m` module, else its
    first word that is not a launcher, an option or a number; then the arguments after it that name a model,
    a batch size or a dataset (`name=value`, in the command's order). "" for an empty command, and for a
    shell line that runs no program of its own (only shell words and commands like `echo`, `id`, `cd`):
    such jobs have no kind and teach nothing.

    A batch script (`sh -c TEXT PATH ARGS`, how hsched.spec.batch runs one) is named after its file, as sbatch
    names a job; a shell line (`sh -c TEXT`) after the first program it runs that is not a shell word."""
    words = list(command)
    if len(words) >= 3 and os.path.basename(words[0]) in _SHELLS and words[1] == "-c":
        if len(words) >= 4 and words[3].startswith("/"):
            return _named(os.path.basename(words[3]), words[4:])
        return _from_shell_line(words[2])
    return _from_words(words)


def _from_shell_line(text: str) -> str:
    """The kind of the first simple command of a shell line that runs a program of its own; "" if none does."""
    for line in text.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError:
            tokens = line.split()
        simple: list[str] = []
        for t in [*tokens, ";"]:
            if t not in _SEPARATORS and not set(t) <= set(";&|()"):
                simple.append(t)
                continue
            kind = _simple_kind(simple)
            if kind:
                return kind
            simple = []
    return ""


def _simple_kind(words: list[str]) -> str:
    # assignments (FOO=1 python x.py) and keywords (do, then, exec, time) may stand before the program
    i = 0
    while i < len(words) and (words[i] in _KEYWORDS or ("=" in words[i] and not words[i].startswith("-"))):
        i += 1
    if i == len(words) or os.path.basename(words[i]) in _NOT_PROGRAMS:
        return ""
    return _from_words(words[i:])


def _from_words(words: list[str]) -> str:
    at = next((i for i, w in enumerate(words) if (w == "-m" and i + 1 < len(words)) or _SCRIPT.search(w)), None)
    if at is not None:
        script = words[at + 1] if words[at] == "-m" else os.path.basename(words[at])
        rest = words[at + 2:] if words[at] == "-m" else words[at + 1:]
    else:
        at = next((i for i, w in enumerate(words)
                   if not (w.startswith("-") or "=" in w or w.replace(".", "").isdigit() or w in _OPERATORS
                           or os.path.basename(w) in _LAUNCHERS or _PY.match(os.path.basename(w)))), None)
        if at is None:
            return ""
        script, rest = os.path.basename(words[at]), words[at + 1:]
    cut = next((i for i, w in enumerate(rest) if w in _OPERATORS), len(rest))
    return _named(script, rest[:cut])


def _named(script: str, rest: Sequence[str]) -> str:
    parts = [script]
    j = 0
    while j < len(rest):
        w = rest[j]
        if w.startswith("-"):
            name, eq, value = w.lstrip("-").partition("=")
            if not eq and j + 1 < len(rest) and not rest[j + 1].startswith("-"):
                value = rest[j + 1]
                j += 1
            if _WANTED.search(name) and value:
                parts.append(f"{name}={os.path.basename(value.rstrip('/'))}")
        j += 1
    return " ".join(parts)[:MAX_KIND]


def kind_of(spec_kind: str | None, command: Sequence[str]) -> str:
    """A job's kind: the one it names, else the one its command looks like."""
    return (spec_kind or "").strip() or _derived(tuple(command))


@functools.lru_cache(maxsize=8192)
def _derived(command: tuple[str, ...]) -> str:
    # a lab submits the same commands again and again, and every listing and round asks each job's kind:
    # deriving it (shlex, regular expressions) cost ~40 us a job, 4 s over a 100,000-job `queue --all`
    return derive_kind(command)
