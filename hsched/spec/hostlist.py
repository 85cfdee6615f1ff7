"""Slurm's host lists, as `sbatch -w/--nodelist` and `-x/--exclude` take them, as pure functions.

    n1,gpu5          two nodes
    n[1-3]           n1, n2, n3
    n[01-03]         n01, n02, n03 (the width of the first number is kept, as Slurm)
    n[1,3-4],gpu5    n1, n3, n4, gpu5
    r[1-2]-n[1-2]    r1-n1, r1-n2, r2-n1, r2-n2 (several brackets multiply)

Commas inside brackets separate ranges, outside them hosts. A list is expanded to at most MAX_HOSTS names, so
that `n[0-999999999]` is one line, never a billion strings.
"""

from __future__ import annotations

import re

MAX_HOSTS = 100_000
"""Names one host list may expand to (a lab's fleet is far smaller)."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
HELP = "node names or Slurm host lists, comma-separated, such as n1,gpu5 or n[1-3],gpu5"


def expand(text: str) -> list[str]:
    """The node names of the host list `text`, in order, each once. ValueError saying what is expected."""
    out: dict[str, None] = {}
    for word in _split(str(text).strip()):
        for name in _expand_word(word):
            out[name] = None
            if len(out) > MAX_HOSTS:
                raise ValueError(f"{HELP}; it names more than {MAX_HOSTS} nodes")
    if not out:
        raise ValueError(HELP)
    return list(out)


def _split(text: str) -> list[str]:
    """The comma-separated words of `text`, commas inside brackets kept."""
    words, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"{HELP}; brackets do not nest")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{HELP}; a ']' without its '['")
        if ch == "," and depth == 0:
            words.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"{HELP}; a '[' is not closed")
    words.append(cur.strip())
    if any(not w for w in words):
        raise ValueError(f"{HELP}; an empty name between commas")
    return words


def _expand_word(word: str) -> list[str]:
    names = _pieces(word)
    for n in names:
        if not _NAME_RE.fullmatch(n):
            raise ValueError(f"{HELP}; {n!r} is not a node name")
    return names


def _pieces(word: str) -> list[str]:
    """`word`'s names, its brackets expanded left to right (checked as names by the caller)."""
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", word)
    if m is None:
        return [word]
    prefix, ranges, rest = m.groups()
    tails = _pieces(rest) if rest else [""]
    names = []
    for part in ranges.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or len(lo) > 9 or len(hi) > 9:
            raise ValueError(f"{HELP}; [{ranges}] is not a list of numbers and ranges such as [1-3,5]")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise ValueError(f"{HELP}; the range {part.strip()} runs backwards")
        if (b - a + 1) * len(tails) > MAX_HOSTS:
            raise ValueError(f"{HELP}; it names more than {MAX_HOSTS} nodes")
        width = len(lo) if lo.startswith("0") else 0
        names += [f"{prefix}{n:0{width}d}{t}" for n in range(a, b + 1) for t in tails]
    return names
