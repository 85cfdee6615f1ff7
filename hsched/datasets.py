"""Datasets: what the fleet file declares of them, where each lives, and what a job is told of it.

    [[dataset]]
    name = "imagenet"
    path = "/data/imagenet"        # where it is on the nodes that hold it
    nodes = ["ws1"]                # the nodes holding it there (hsched data scan finds the others)
    size = "140G"                  # optional: what placement models until a scan measured it
    source = "ws1"                 # optional: where copies come from (default: any holder)
    paths = { ws2 = "/scratch/imagenet" }   # optional: a holder keeping it elsewhere
    # shared = true                # a mount every node sees at `path`: never copied, no locality

A job names its datasets (`--data imagenet`, spec `data = ["imagenet"]`); placement weighs the modelled copy
(`size` over the measured link speed, hsched.sched.locality) against waiting for a holder, the controller copies
what a node lacks before the run starts (or ahead of time: prefetch, hsched.controller.data), and the run finds
each dataset at `$HSCHED_DATA_<NAME>`. Copies live under the node's `data_dir` (default: a `data` folder of the
node's hsched folder) and are evicted least recently used first under the node's `data_quota`.

Pure: no I/O here, so the scheduling core, the CLI and the controller read the same declarations.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hsched.problems import Problems

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_KEYS = frozenset({"name", "path", "nodes", "size", "source", "paths", "shared"})
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_bytes(value: str | int) -> int:
    """A size as people write it: `140G` and `140GiB` are binary (as `--mem`), `140GB` decimal (as a disk's
    label), a bare number is bytes. ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a size such as 140G, 140GiB or 150GB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size >= 0")
        return value
    m = _BYTES_RE.match(str(value))
    if not m:
        raise ValueError("a size such as 140G, 140GiB or 150GB")
    number, unit, i, b = m.groups()
    decimal = bool(b) and not i and bool(unit)
    base = 1000 if decimal else 1024
    return int(float(number) * base ** _POWER[unit.lower()])


def show_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB'; None -> '?'."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def env_name(name: str) -> str:
    """The variable a run finds a dataset's path in: imagenet-1k -> HSCHED_DATA_IMAGENET_1K."""
    return "HSCHED_DATA_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    path: str | None = None
    """Where it is on the nodes that hold it (and, shared, on every node)."""
    nodes: tuple[str, ...] = ()
    """The nodes the fleet file says hold it at `path` (or at their `paths` entry)."""
    paths: Mapping[str, str] = field(default_factory=dict)
    """Node -> where that node keeps it, when not at `path` (the node holds it)."""
    size_bytes: int | None = None
    """The declared size, what placement models until a scan or a copy measured it."""
    source: str | None = None
    """The node copies come from first (default: whichever holder answers)."""
    shared: bool = False
    """A mount every node sees at `path`: never copied, placement ignores it."""

    @property
    def holders(self) -> tuple[str, ...]:
        """The nodes declared to hold it, in the fleet file's order."""
        return tuple(dict.fromkeys((*self.nodes, *self.paths)))

    def declared_path(self, node: str) -> str | None:
        """Where the fleet file says `node` keeps it (None: it does not say)."""
        if self.shared:
            return self.path
        if node in self.paths:
            return self.paths[node]
        return self.path if node in self.nodes else None


class PlaceOrigin(Enum):
    SCAN = "scan"
    """`hsched data scan` found it at its declared path."""
    COPY = "copy"
    """hsched copied it there (under the node's data_dir): evictable."""


class PlaceState(Enum):
    READY = "ready"
    COPYING = "copying"
    """A copy is under way (or was, when the controller stopped: it resumes)."""
    FAILED = "failed"
    ABSENT = "absent"
    """A scan looked at the declared path and found nothing there."""


@dataclass(frozen=True, slots=True)
class DataPlace:
    """What the store knows of one dataset on one node, beyond the fleet file's declaration."""

    dataset: str
    node: str
    path: str
    origin: PlaceOrigin
    state: PlaceState
    bytes: int | None
    """Its size there (a scan's, or the copy's total)."""
    done_bytes: int
    """A copy's bytes so far."""
    source: str | None
    """The node a copy came from."""
    updated: float
    last_used: float | None
    """When a run last started with it there (a copy's eviction order: least recently used first)."""
    message: str = ""


def copy_path(data_dir: str, name: str) -> str:
    """Where a copy of dataset `name` lives on a node whose copies go to `data_dir`."""
    return f"{data_dir.rstrip('/')}/{name}"


def datasets_from_table(p: Problems, raw: Any, node_names: Collection[str]) -> tuple[Dataset, ...]:
    """The fleet file's `[[dataset]]` tables, each key checked (one line per problem, naming the key)."""
    if not isinstance(raw, list):
        p.expected("dataset", "[[dataset]] tables", raw)
        return ()
    out: list[Dataset] = []
    seen: set[str] = set()
    known = ", ".join(node_names)
    for i, t in enumerate(raw):
        key = f"dataset[{i}]"
        if not isinstance(t, dict):
            p.expected(key, "a [[dataset]] table", t)
            continue
        bad = sorted(set(t) - _KEYS)
        for k in bad:
            p.add(f"{key}.{k}", f"unknown key; a dataset takes {', '.join(sorted(_KEYS))}")
        name = t.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            p.expected(f"{key}.name", "letters, digits, '.', '_' or '-' (at most 63), such as \"imagenet\"", name)
            continue
        if name in seen:
            p.add(f"{key}.name", f"duplicate dataset {name!r}; dataset names must be unique")
            continue
        seen.add(name)
        key = f"dataset[{i}] ({name})"
        path = t.get("path")
        if path is not None and not (isinstance(path, str) and path.startswith("/")):
            p.expected(f"{key}.path", "an absolute path on the nodes, such as \"/data/imagenet\"", path)
            path = None
        nodes = t.get("nodes", [])
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            p.expected(f"{key}.nodes", 'a list of node names such as ["ws1"]', nodes)
            nodes = []
        for n in nodes:
            if n not in node_names:
                p.add(f"{key}.nodes", f"no node {n!r} in the fleet file (nodes: {known})")
        paths = t.get("paths", {})
        if not isinstance(paths, dict) or not all(isinstance(v, str) and v.startswith("/") for v in paths.values()):
            p.expected(f"{key}.paths", 'a table of node = "/absolute/path", such as { ws2 = "/scratch/imagenet" }',
                       paths)
            paths = {}
        for n in paths:
            if n not in node_names:
                p.add(f"{key}.paths", f"no node {n!r} in the fleet file (nodes: {known})")
        size = None
        if "size" in t:
            try:
                size = parse_bytes(t["size"])
            except ValueError as e:
                p.expected(f"{key}.size", str(e), t["size"])
        shared = t.get("shared", False)
        if not isinstance(shared, bool):
            p.expected(f"{key}.shared", "true or false", shared)
            shared = False
        source = t.get("source")
        if source is not None and source not in node_names:
            p.add(f"{key}.source", f"no node {source!r} in the fleet file (nodes: {known})")
            source = None
        if shared and path is None:
            p.add(f"{key}.path", "missing: a shared dataset needs path = \"where every node mounts it\"")
        elif nodes and path is None:
            p.add(f"{key}.path", "missing: the nodes listed keep it at path = \"/absolute/path\" (or give paths)")
        elif not shared and path is None and not paths:
            p.add(f"{key}.path", "missing: give path = \"/where/it/is\" with the nodes that hold it (nodes = [...]), "
                  "or paths = { node = \"/where\" }")
        out.append(Dataset(name=name, path=path, nodes=tuple(n for n in nodes if n in node_names),
                           paths={n: v for n, v in paths.items() if n in node_names}, size_bytes=size,
                           source=source, shared=shared))
    return tuple(out)
