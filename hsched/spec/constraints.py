"""Node labels in requests: sbatch's `--constraint` (`-C`) syntax, as pure functions.

    --constraint nvme            a node labelled nvme
    --constraint "nvme&ib"       labelled nvme and ib
    --constraint "a100|h100"     labelled a100 or h100
    --constraint "(nvme|ssd)&ib" parentheses group; `&` binds tighter than `|` without them
    @n1, !@n3                    the node named n1; any node but n3: sbatch's -w/--nodelist and -x/--exclude,
                                 kept in the constraint (hsched.spec.hostlist reads Slurm's host lists)

Labels are the fleet file's `[[node]] labels = ["nvme", "ib"]`. Every node of a gang must satisfy the
constraint (sbatch's meaning of `&` and `|` is per node too). sbatch's matching OR (`[a|b]`: all nodes the same
one) and counts (`a*2`) mean something only for gangs over mixed nodes; they are refused with one line rather
than read differently from what a Slurm user expects.

A constraint is kept as its normalised text in the job spec (what the user asked) and parsed where it is
matched; parsing is cached, so a round parses each distinct constraint once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*")
"""A label: what sbatch accepts as a feature name, without its operators."""

_TOKEN_RE = re.compile(r"\s*(?:(?P<label>!?@[A-Za-z0-9][A-Za-z0-9_.:+-]*|[A-Za-z0-9][A-Za-z0-9_.:+-]*)"
                       r"|(?P<op>[&|()])|(?P<bad>\S))")

NODE = "@"
"""A node's own name as a label, `@n1`: what a label of the fleet file can never be (a label starts with a letter or
digit), so `-w`/`-x` never match a label by chance."""

HELP = "labels joined by & (and) and | (or), with parentheses, such as \"nvme&ib\" or \"a100|h100\""


@dataclass(frozen=True, slots=True)
class Constraint:
    """A constraint in disjunctive normal form: a node satisfies it when its labels hold every label of at
    least one clause. Small by nature (a few labels), so the normal form is never large."""

    clauses: tuple[frozenset[str], ...]
    text: str
    """The normalised expression (no spaces), as stored in the job spec."""
    excluded: tuple[frozenset[str], ...] = ()
    """Beside each clause, the labels a node must not carry (`!@n3`, from -x/--exclude); empty: none anywhere."""

    def satisfied_by(self, labels: Iterable[str]) -> bool:
        have = labels if isinstance(labels, frozenset | set) else frozenset(labels)
        if not self.excluded:
            return any(c <= have for c in self.clauses)
        return any(c <= have and not (x & have) for c, x in zip(self.clauses, self.excluded, strict=True))

    @property
    def labels(self) -> frozenset[str]:
        """Every label the constraint names."""
        return frozenset().union(*self.clauses)

    def __str__(self) -> str:
        return self.text


def parse_constraint(text: str) -> Constraint:
    """The constraint of sbatch's `--constraint` text; ValueError (saying what is accepted) when it is not one."""
    return _parse(str(text).strip())


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Constraint:
    if not text:
        raise ValueError(HELP)
    if "[" in text or "]" in text:
        raise ValueError(f"{HELP}; sbatch's matching OR [a|b] is not supported (write a|b)")
    if "*" in text:
        raise ValueError(f"{HELP}; sbatch's counts (a*2) are not supported")
    if re.search(r"!(?!@)", text):
        raise ValueError(f"{HELP}; negation (!) is not supported")
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # only trailing space is left
            break
        if m.group("bad"):
            raise ValueError(f"{HELP}; {m.group('bad')!r} is not allowed in a label")
        tokens.append(m.group("label") or m.group("op"))
        pos = m.end()
    parser = _Parser(tokens)
    clauses = parser.expr()
    if parser.i != len(tokens):
        raise ValueError(f"{HELP}; unexpected {tokens[parser.i]!r}")
    kept = _minimal(clauses)
    excluded = tuple(frozenset(x[1:] for x in c if x.startswith("!")) for c in kept)
    if not any(excluded):
        return Constraint(kept, "".join(tokens))
    return Constraint(tuple(frozenset(x for x in c if not x.startswith("!")) for c in kept), "".join(tokens), excluded)


class _Parser:
    """Recursive descent: expr := term ('|' term)*; term := atom ('&' atom)*; atom := LABEL | '(' expr ')'.
    Each rule returns its DNF clauses."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def expr(self) -> list[frozenset[str]]:
        out = self.term()
        while self.peek() == "|":
            self.i += 1
            out = out + self.term()
        return out

    def term(self) -> list[frozenset[str]]:
        out = self.atom()
        while self.peek() == "&":
            self.i += 1
            right = self.atom()
            out = [a | b for a in out for b in right]
        return out

    def atom(self) -> list[frozenset[str]]:
        tok = self.peek()
        if tok is None:
            raise ValueError(f"{HELP}; it ends where a label was expected")
        if tok == "(":
            self.i += 1
            inner = self.expr()
            if self.peek() != ")":
                raise ValueError(f"{HELP}; a '(' is not closed")
            self.i += 1
            return inner
        if tok in "&|)":
            raise ValueError(f"{HELP}; {tok!r} where a label was expected")
        self.i += 1
        return [frozenset({tok})]


def _minimal(clauses: list[frozenset[str]]) -> tuple[frozenset[str], ...]:
    """Drop clauses that a smaller one already implies (a | a&b is a), keeping the first-seen order."""
    out: list[frozenset[str]] = []
    for c in sorted(set(clauses), key=lambda c: (len(c), sorted(c))):
        if not any(o <= c for o in out):
            out.append(c)
    return tuple(out)


def label_problem(label: object) -> str | None:
    """Why a fleet file's label cannot be used, or None."""
    if not isinstance(label, str) or not LABEL_RE.fullmatch(label):
        return "a label of letters, digits, '_', '.', ':', '+' or '-' (starting with a letter or digit)"
    return None


def partition_constraint(text: str) -> str:
    """sbatch's `-p/--partition a,b` (any of them) as a constraint's text, `a|b`: in hsched a partition is the set
    of nodes carrying that label. ValueError (saying what is accepted) for anything but a comma list of labels."""
    names = [n.strip() for n in str(text).split(",")]
    for n in names:
        if not LABEL_RE.fullmatch(n):
            raise ValueError("a partition name (a node label of the fleet file) or a comma list of them, such as "
                             "gpu or gpu,debug")
    return "|".join(dict.fromkeys(names))


def partition_names(text: str) -> tuple[str, ...]:
    """The partitions of a `--partition` text (checked by partition_constraint first)."""
    return tuple(dict.fromkeys(n.strip() for n in text.split(",")))


def with_partition(partition: str, constraint: str | None) -> str:
    """The constraint a job with `--partition` and `--constraint` gets: a node of one of the partitions that
    also satisfies the constraint (each parenthesised: `|` binds looser than `&`)."""
    part = partition_constraint(partition)
    if not constraint:
        return part
    p = f"({part})" if "|" in part else part
    return f"{p}&({constraint})"


def node_labels(name: str, labels: Iterable[str], constraint: str | None = None) -> frozenset[str]:
    """The labels a node is matched on: the fleet file's, and its own name as `@NAME` (for -w/-x). `constraint`: the
    one request they are for: its name only when that names nodes, so that a refusal listing the fleet's labels
    lists the fleet file's."""
    if constraint is not None and NODE not in constraint:
        return frozenset(labels)
    return frozenset(labels) | {NODE + name}


def with_nodes(constraint: str | None, nodelist: Iterable[str] = (), exclude: Iterable[str] = ()) -> str:
    """The constraint a job with sbatch's -w/--nodelist (one of these nodes) and -x/--exclude (none of these) gets,
    over its other constraint (`(a100)&(@n1|@n2)&!@n3`)."""
    parts = [f"({constraint})"] if constraint else []
    wanted = [NODE + n for n in nodelist]
    if wanted:
        parts.append(f"({'|'.join(wanted)})" if len(wanted) > 1 else wanted[0])
    parts += [f"!{NODE}{n}" for n in exclude]
    return parse_constraint("&".join(parts)).text if parts else ""


def named_nodes(text: str) -> frozenset[str]:
    """The node names a constraint's text names (`@n1`, `!@n3`): those -w/-x gave."""
    return frozenset(re.findall(r"@([A-Za-z0-9][A-Za-z0-9_.:+-]*)", text or ""))
