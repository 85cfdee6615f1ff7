"""Heterogeneous jobs (sbatch's hetjobs): one job of several components, each with its own command and resources.

Three ways to write one, all ending in a job table's `component` list (what a spec file's `[[component]]` tables
are), which `hetjob_spec` checks and turns into `JobSpec.components`:

    hsched submit --gpus 1 --gpu-type l40s -- prep.py : --gpus 2 --gpu-type h100 -- train.py : --cpus 4 -- fuse.py
    #SBATCH --gpus 1 ... / #SBATCH hetjob / #SBATCH --gpus 2 ...      (hsched.spec.batch: `:` between the groups)
    [[component]] command = [...]  [component.resources] gpus = 1 ...  (a spec file)

A component has what may differ per component (`COMPONENT_KEYS`: command, resources, env, workdir, constraint);
the job's other keys (qos, name, time, dependency...) apply to every component, as sbatch applies them, and given
inside a component are refused with one line naming the key and where to put it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hsched.errors import ConfigError, UserError
from hsched.model import Component, JobSpec
from hsched.problems import Problems, shown

SEPARATOR = ":"
"""The word between components on the command line, as sbatch's."""

COMPONENT_KEYS = frozenset({"command", "resources", "env", "workdir", "constraint"})
"""A component's own keys in a job table; every other key is the job's."""

COMPONENT_OPTIONS = frozenset({"gpus", "gpus_per_node", "gpu_type", "gpu_memory", "nodes", "cpus", "memory",
                               "tasks_per_node", "constraint", "partition", "nodelist", "exclude", "interconnect",
                               "env", "workdir"})
"""The submit options (hsched.cli.submitting.OPTIONS' names) a component after the first `:` may give."""

REFUSED = ("array", "ntasks")
"""Job keys a heterogeneous job cannot have: Slurm refuses arrays of hetjobs; tasks are per component
(resources.tasks_per_node)."""


def split_argv(args: Sequence[str]) -> list[list[str]]:
    """The words of a command line split at each `:` word (one list per component; [args] without any)."""
    out: list[list[str]] = [[]]
    for w in args:
        if w == SEPARATOR:
            out.append([])
        else:
            out[-1].append(w)
    return out


def check_component_options(i: int, words: Sequence[str], by_option: Mapping[str, str],
                            flags: Collection[str] = ()) -> None:
    """Refuse, in one line, an option a component after the first `:` may not give: unknown, or the job's (it
    applies to every component, so it goes before the first `:`). `by_option`: option -> its name; `flags`: the
    names that take no value."""
    value_next = False
    for w in words:
        if value_next:
            value_next = False
            continue
        if w == "--" or not w.startswith("-"):
            return
        opt = w.partition("=")[0] if w.startswith("--") else w
        value_next = "=" not in w and by_option.get(opt) not in flags
        name = by_option.get(opt)
        if name is None:
            if opt[:2] in by_option and not opt.startswith("--"):
                continue  # -G2: Typer's spelling, read by the caller
            raise UserError(f"component {i}: unknown option {opt}; a component takes "
                            f"{', '.join(sorted('--' + n.replace('_', '-') for n in COMPONENT_OPTIONS))}")
        if name not in COMPONENT_OPTIONS:
            raise UserError(f"component {i}: {opt} applies to the whole job (every component, as sbatch's); give it "
                            f"before the first `{SEPARATOR}`")


def component_table(t: Mapping[str, Any]) -> dict[str, Any]:
    """A job table's component keys: the table of one component."""
    return {k: v for k, v in t.items() if k in COMPONENT_KEYS}


def hetjob_spec(data: Mapping[str, Any], source: str, parse: Callable[[Mapping[str, Any], str], JobSpec],
                job_keys: Collection[str]) -> JobSpec:
    """The spec of a job table with a `component` list (see the module docstring). `parse`: the job table checker
    (hsched.config.job_spec_from_table with the settings' QoS classes), run on each component's table and on the
    job's other keys; `job_keys`: the keys it takes. Raises ConfigError with one line per problem, each naming the
    key."""
    p = Problems(source)
    raw = data["component"]
    if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) for c in raw):
        p.expected("component", "one or more [[component]] tables (command, resources, env, workdir)", raw)
        p.raise_if_any()
    for key in ("command", "resources"):
        if key in data:
            p.add(key, f"given with [[component]] tables: give each component its own {key} in its table")
    for key in REFUSED:
        if key in data:
            p.add(key, "a heterogeneous job cannot have one (sbatch refuses it too); give tasks per component as "
                       "resources.tasks_per_node" if key == "ntasks" else
                       "a heterogeneous job cannot be an array (sbatch refuses it too); submit one job per index")
    comps: list[Component] = []
    for i, c in enumerate(raw):
        where = f"component[{i}]"
        for key in c:
            if key not in COMPONENT_KEYS:
                p.add(f"{where}.{key}", "applies to the whole job (every component, as sbatch's): give it at the "
                      "top of the spec, before the [[component]] tables" if key in job_keys else
                      f"unknown key; a component has {', '.join(sorted(COMPONENT_KEYS))}")
        if not c.get("command"):
            p.add(f"{where}.command", f"missing or empty ({shown(c.get('command'))}): give the component's program "
                                      "and arguments")
            continue
        try:
            s = parse(component_table(c), f"{source}: {where}")
        except ConfigError as e:
            p.lines.extend(e.problems)
            continue
        if s.resources.shared:
            p.add(f"{where}.resources.shared", "a component has whole GPUs; submit a shared job on its own")
            continue
        if s.resources.elastic:
            # (a pipeline is placed, started and ended as one gang: its components keep their size)
            p.add(f"{where}.resources", "a component has one size; give a count, not a range MIN-MAX (an elastic "
                                        "job is submitted on its own)")
            continue
        comps.append(Component(command=s.command, resources=s.resources, env=s.env, workdir=s.workdir))
    p.raise_if_any()
    rest = {k: v for k, v in data.items() if k not in ("component", "command", "resources")}
    base = parse({**rest, "command": list(comps[0].command)}, source)
    if base.resources.constraint:
        # a spec file's top-level `constraint` is every component's that has none of its own
        comps = [c if c.resources.constraint else replace(c, resources=replace(
            c.resources, constraint=base.resources.constraint)) for c in comps]
    if len(comps) == 1:
        # one component is an ordinary job
        c = comps[0]
        return replace(base, resources=c.resources, env=base.env + c.env, workdir=c.workdir or base.workdir)
    return replace(base, command=comps[0].command, resources=comps[0].resources, components=tuple(comps))


def component_env(spec: JobSpec, i: int) -> tuple[tuple[str, str], ...]:
    """Component `i`'s variables over the job's."""
    return spec.env + spec.components[i].env if spec.components else spec.env
