"""TOML configuration: job spec files, the fleet file and controller settings.

Validation collects every problem and reports one line each, naming the file, the key, what was expected
and what was found, with a close-match suggestion for a misspelt key. User input never causes a traceback.
"""

from __future__ import annotations

import difflib
import re
import signal as _signal
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hsched.datasets import Dataset, datasets_from_table, parse_bytes
from hsched.errors import ConfigError as ConfigError  # what the readers here raise (hsched.problems)
from hsched.errors import UserError
from hsched.learn.fairshare import DEFAULT_HALF_LIFE_S, Account, PriorityWeights
from hsched.model import (
    DEFAULT_QOS,
    QOS_CLASSES,
    WORKLOADS,  # issue 30
    CheckpointSignal,
    Dependency,
    Interconnect,
    JobSpec,
    Nic,
    Resources,
)
from hsched.problems import Problems, shown
from hsched.protocol import IDLE_TIMEOUT_S, MAX_CONNECTIONS
from hsched.spec.arrays import MAX_ARRAY_TASKS
from hsched.spec.constraints import label_problem, parse_constraint
from hsched.topo.fabric import Fabric, Switch, layout_problem, nic_kind, parse_topology_conf

# ---------------------------------------------------------------------------------------------- parsing


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; any failure is one clear line naming the file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; check the path") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a TOML file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not valid TOML: the file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_MULT_MIB = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def parse_size_mib(value: str | int) -> int:
    """'16G', '512M', '1.5T', or a plain number of MiB."""
    if isinstance(value, bool):
        raise ValueError("a size such as 16G or 512M")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size >= 0")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError("a size such as 16G or 512M")
    return int(float(m.group(1)) * _SIZE_MULT_MIB[m.group(2).lower()])


_GPU_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_gpu_memory_mib(value: str | int) -> int:
    """GPU memory as GPU vendors write it: `80G` or `80GB` is 80 * 10^9 bytes, what an "80GB" card holds
    (an H100 80GB reports 81,559 MiB: 80G fits, as its owner expects); `80GiB` is 80 * 2^30. A plain number
    is MiB, as nvidia-smi reports. The result is MiB, rounded down."""
    if isinstance(value, bool):
        raise ValueError("a GPU memory size such as 40G (GB, as vendors count) or 40GiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size >= 0")
        return value
    m = _GPU_SIZE_RE.match(str(value))
    if not m:
        raise ValueError("a GPU memory size such as 40G (GB, as vendors count) or 40GiB")
    number, unit, binary = float(m.group(1)), m.group(2).lower(), bool(m.group(3))
    if not unit:
        return int(number)  # MiB
    if binary:
        return int(number * _SIZE_MULT_MIB[unit])
    return int(number * _DECIMAL[unit] / 2**20)


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms]?)")
_DURATION_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}


_DURATION_HELP = ("a time limit as sbatch takes it (90 = 90 minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) "
                  "or with units (90s, 1h30m, 2d)")


def parse_duration_s(value: str | int | float) -> float:
    """Seconds from a time limit written as sbatch's --time takes it, or with units.

    sbatch: a bare number is MINUTES; `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`. hsched's extension:
    a number with units, `90s`, `1h30m`, `2d`. So `90` is 5,400 s and `1-02:30` is 1 day 2 h 30 min."""
    if isinstance(value, bool):
        raise ValueError(_DURATION_HELP)
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("a duration > 0")
        return float(value) * 60.0  # sbatch: minutes
    text = value.strip()
    total: float
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        total = float(text) * 60.0
    elif re.fullmatch(r"[\d:-]+", text):
        days = 0
        if "-" in text:
            d, text = text.split("-", 1)
            if not d.isdigit() or not text:
                raise ValueError(_DURATION_HELP)
            days = int(d)
            parts = text.split(":")
            if not all(p.isdigit() for p in parts) or len(parts) > 3:
                raise ValueError(_DURATION_HELP)
            hms = [int(p) for p in parts] + [0] * (3 - len(parts))  # D-HH, D-HH:MM, D-HH:MM:SS
        else:
            parts = text.split(":")
            if not all(p.isdigit() for p in parts) or len(parts) > 3:
                raise ValueError(_DURATION_HELP)
            nums = [int(p) for p in parts]
            hms = [0, *nums] if len(nums) == 2 else nums  # MM:SS, HH:MM:SS
        total = days * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
    else:
        pos, total = 0, 0.0
        for m in _DURATION_RE.finditer(text.lower()):
            if m.start() != pos or not m.group(2):
                raise ValueError(_DURATION_HELP)
            total += float(m.group(1)) * _DURATION_UNIT[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise ValueError(_DURATION_HELP)
    if total <= 0:
        raise ValueError("a duration > 0")
    return float(total)


def parse_signal_name(name: str) -> str:
    """'USR1', 'SIGUSR1', '10' -> 'USR1' (validated against this platform's signals)."""
    text = name.strip().upper()
    if text.isdigit():
        try:
            return _signal.Signals(int(text)).name.removeprefix("SIG")
        except ValueError:
            raise ValueError("a signal name such as USR1, TERM or INT") from None
    text = text.removeprefix("SIG")
    if f"SIG{text}" not in _signal.Signals.__members__:
        raise ValueError("a signal name such as USR1, TERM or INT")
    return text


_UNCATCHABLE = frozenset({"KILL", "STOP"})


def parse_checkpoint_signal(text: str) -> CheckpointSignal:
    """'USR1@60' (signal and grace seconds), 'USR1' (default grace), '@60', or sbatch's 'B:USR1@60' (only the
    batch shell, the run's main process, gets it; without B: every process of the run does)."""
    text = str(text)
    batch_only = text[:2].upper() == "B:"
    if batch_only:
        text = text[2:]
    sig, _, grace = text.partition("@")
    name = parse_signal_name(sig) if sig.strip() else "TERM"
    if name in _UNCATCHABLE:
        # the job must be able to act on it: SIGKILL and SIGSTOP never reach its handler
        raise ValueError(f"a signal the job can catch, such as USR1@60 (SIG{name} cannot be caught)")
    grace_s = CheckpointSignal().grace_s
    if grace.strip():
        try:
            grace_s = float(grace)
        except ValueError:
            raise ValueError("SIGNAL@SECONDS such as USR1@60") from None
        if grace_s < 0:
            raise ValueError("SIGNAL@SECONDS with SECONDS >= 0")
    return CheckpointSignal(signal=name, grace_s=grace_s, batch_only=batch_only)


# ------------------------------------------------------------------------------------------- validation


def check_keys(p: Problems, table: Mapping[str, Any], allowed: set[str] | frozenset[str], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(allowed))})"
            p.add(f"{prefix}{key}", f"unknown key{hint}")


def _int(p: Problems, key: str, v: Any, *, minimum: int | None = None) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        p.expected(key, "an integer" + (f" >= {minimum}" if minimum is not None else ""), v)
        return None
    if minimum is not None and v < minimum:
        p.expected(key, f"an integer >= {minimum}", v)
        return None
    return v


def _str(p: Problems, key: str, v: Any, *, nonempty: bool = False) -> str | None:
    if not isinstance(v, str) or (nonempty and not v.strip()):
        p.expected(key, "a non-empty string" if nonempty else "a string", v)
        return None
    return v


def _converted(p: Problems, key: str, v: Any, fn: Callable[[Any], Any]) -> Any:
    try:
        return fn(v)
    except (ValueError, TypeError) as e:
        p.expected(key, str(e), v)
        return None


# --------------------------------------------------------------------------------------------- job spec

_JOB_KEYS = frozenset(
    {"name", "command", "workdir", "env", "resources", "qos", "priority", "checkpoint_signal", "time",
     "time_limit", "hold", "signal", "retries", "dependency", "kill_on_invalid_dep", "array", "constraint",
     "kind", "output", "error", "open_mode", "data", "ntasks", "resize_signal"}
)
_JOB_KEYS = _JOB_KEYS | {"workload"}  # issue 30: the workload class (its own line: other branches add keys too)
MAX_NAME_BYTES = 256
OPEN_MODES = ("append", "truncate")
"""sbatch's --open-mode for the -o/-e files."""
PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
"""Priorities a job may have (a spec file, the CLI, the API alike)."""
MAX_RETRIES = 100
_RES_KEYS = frozenset({"gpus", "gpu_types", "gpu_memory", "cpus", "memory", "nodes", "interconnect",
                       "tasks_per_node", "constraint", "offload", "shared", "gpus_max", "nodes_max"})


def job_spec_from_table(data: Mapping[str, Any], source: str, qos_classes: tuple[str, ...] = QOS_CLASSES,
                        default_qos: str = DEFAULT_QOS) -> JobSpec:
    """Validate a job table (from a spec file or from CLI options merged over it)."""
    if "component" in data:
        # a heterogeneous job (hsched.spec.components): each component's table, then the job's keys, checked here
        from hsched.spec.components import hetjob_spec

        return hetjob_spec(data, source, lambda t, s: job_spec_from_table(t, s, qos_classes, default_qos),
                           _JOB_KEYS | {"component"})
    p = Problems(source)
    check_keys(p, data, _JOB_KEYS, "")
    name = _str(p, "name", data.get("name", "")) or ""
    if name:
        why = name_problem(name)
        if why:
            p.add("name", why)
    kind = (_str(p, "kind", data.get("kind", "")) or "").strip()
    if kind:
        why = name_problem(kind)
        if why:
            p.add("kind", why)
    command: tuple[str, ...] = ()
    raw_cmd = data.get("command")
    if raw_cmd is None:
        p.add("command", "missing: give the program and its arguments, e.g. command = [\"python\", \"train.py\"]")
    elif isinstance(raw_cmd, str):
        # a string is a shell command line, as sbatch --wrap takes it
        if raw_cmd.strip():
            command = ("/bin/sh", "-c", raw_cmd)
        else:
            p.expected("command", "a non-empty command", raw_cmd)
    elif isinstance(raw_cmd, list) and raw_cmd and all(isinstance(a, str) for a in raw_cmd):
        command = tuple(raw_cmd)
    else:
        p.expected("command", "a non-empty list of strings (argv)", raw_cmd)
    for i, arg in enumerate(command):
        if "\0" in arg:
            # execve cannot pass it: the launch would fail on the node long after the submit said yes
            p.add(f"command[{i}]", "contains a NUL character, which no program can receive; remove it")
    workdir = data.get("workdir")
    if workdir is not None:
        workdir = _str(p, "workdir", workdir, nonempty=True)
        if workdir is not None and "\0" in workdir:
            p.add("workdir", "contains a NUL character; give a folder path")
            workdir = None
    env: list[tuple[str, str]] = []
    raw_env = data.get("env", {})
    if not isinstance(raw_env, dict):
        p.expected("env", "a table of NAME = \"value\"", raw_env)
    else:
        for k, v in raw_env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                p.add(f"env.{k}", "expected an environment variable name (letters, digits, _)")
            elif not isinstance(v, str | int | float) or isinstance(v, bool):
                p.expected(f"env.{k}", "a string", v)
            elif "\0" in str(v):
                p.add(f"env.{k}", "contains a NUL character, which an environment cannot hold; remove it")
            else:
                env.append((k, str(v)))
    resources = _resources(p, data.get("resources", {}))
    if "constraint" in data:
        # sbatch's --constraint is a job option; the spec takes it at the top or in [resources]
        raw_res = data.get("resources")
        if isinstance(raw_res, dict) and "constraint" in raw_res:
            p.add("constraint", "given twice (also as resources.constraint); keep one")
        else:
            resources = replace(resources, constraint=_constraint(p, "constraint", data["constraint"]))
    qos = data.get("qos", default_qos)
    if not isinstance(qos, str) or qos not in qos_classes:
        p.expected("qos", f"one of {', '.join(qos_classes)}", qos)
        qos = default_qos
    priority = _int(p, "priority", data.get("priority", 0)) or 0
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        p.expected("priority", f"an integer from {PRIORITY_MIN} to {PRIORITY_MAX}", priority)
        priority = 0
    ck = CheckpointSignal()
    if "checkpoint_signal" in data:
        ck = _converted(p, "checkpoint_signal", data["checkpoint_signal"], parse_checkpoint_signal) or ck
    time_limit = None
    for tkey in ("time", "time_limit"):
        if tkey in data:
            time_limit = _converted(p, tkey, data[tkey], parse_duration_s)
    warn = None
    if "signal" in data:
        warn = _converted(p, "signal", data["signal"], parse_checkpoint_signal)
        if warn is not None and time_limit is None:
            p.add("signal", "a warning signal needs a time limit (time = \"1h\")")
    hold = data.get("hold", False)
    if not isinstance(hold, bool):
        p.expected("hold", "true or false", hold)
        hold = False
    retries = None
    if "retries" in data:
        retries = _int(p, "retries", data["retries"], minimum=0)
        if retries is not None and retries > MAX_RETRIES:
            p.expected("retries", f"an integer from 0 to {MAX_RETRIES}", retries)
            retries = None
    deps: tuple[Dependency, ...] = ()
    any_of = False
    if "dependency" in data:
        from hsched.spec.dependencies import parse_dependency

        parsed = _converted(p, "dependency", data["dependency"], lambda v: parse_dependency(str(v)))
        if parsed is not None:
            deps, any_of = parsed
    array = None
    if "array" in data:
        from hsched.spec.arrays import parse_array

        array = _converted(p, "array", data["array"], parse_array)
    kill_invalid = data.get("kill_on_invalid_dep", False)
    if not isinstance(kill_invalid, bool):
        p.expected("kill_on_invalid_dep", "true or false", kill_invalid)
        kill_invalid = False
    files: dict[str, str | None] = {"output": None, "error": None}
    for fkey in files:
        if data.get(fkey) is not None:
            files[fkey] = _output_pattern(p, fkey, data[fkey])
    open_mode = data.get("open_mode", "truncate")
    if open_mode not in OPEN_MODES:
        p.expected("open_mode", "append or truncate (as sbatch's --open-mode)", open_mode)
    datasets = _data_names(p, data.get("data", []))
    ntasks = None
    if "ntasks" in data:
        ntasks = _int(p, "ntasks", data["ntasks"], minimum=1)
        if ntasks is not None and (resources.nodes > 1 or resources.tasks_per_node > 1):
            # srun's tasks of one batch shell run on its node; over several nodes the tasks are hsched's ranks
            p.add("ntasks", "one node only, without resources.tasks_per_node: over several nodes give "
                  "resources.tasks_per_node (each task runs the command, with its rank)")
            ntasks = None
    workload = (_str(p, "workload", data.get("workload", "")) or "").strip()
    if workload and workload not in WORKLOADS:
        p.add("workload", f"expected one of {', '.join(WORKLOADS)}, found {workload!r}")
    resize_signal = None
    if "resize_signal" in data:
        resize_signal = _converted(p, "resize_signal", data["resize_signal"], _resize_signal)
        if resize_signal is not None and not resources.elastic:
            p.add("resize_signal", "only an elastic job resizes: give a range, --gpus MIN-MAX")
            resize_signal = None
    p.raise_if_any()
    return replace(JobSpec(
        command=command, name=name, workdir=workdir, env=tuple(env), resources=resources, qos=qos,
        priority=priority, checkpoint_signal=ck, time_limit_s=time_limit, warn_signal=warn, hold=hold,
        retries=retries, dependency=deps, dependency_any=any_of, kill_on_invalid_dep=kill_invalid, array=array,
        kind=kind, output=files["output"], error=files["error"], output_append=open_mode == "append",
        data=datasets, ntasks=ntasks, resize_signal=resize_signal,
    ), workload=workload)


def _resize_signal(text: str) -> str:
    """`--resize-signal USR2`: a signal name the job can catch (no grace: it goes on running)."""
    ck = parse_checkpoint_signal(str(text))
    if "@" in str(text) or ck.batch_only:
        raise ValueError("a signal name such as USR2 (no grace, no B:)")
    return ck.signal


def beyond_limits(spec: JobSpec, settings: Settings) -> list[str]:
    """What of `spec` is over the settings' request bounds (max_nodes, max_tasks_per_node, ...), one line each naming
    the spec key, the option and the setting; empty when it is within them. The controller refuses such a submit,
    and ends a stored job beyond them (one queued before the bounds) rather than making its runs."""
    out = []
    res = spec.resources

    def over(key: str, option: str, found: int, setting: str, what: str = "") -> None:
        limit = getattr(settings, setting)
        if found > limit:
            out.append(f"{key} ({option}): {found}{what} is over the limit of {limit} (settings {setting}); ask for "
                       "less, or an admin raises it in settings.toml")

    over("resources.nodes", "--nodes", res.nodes, "max_nodes")
    over("resources.tasks_per_node", "--tasks-per-node", res.tasks_per_node, "max_tasks_per_node")
    if res.nodes <= settings.max_nodes and res.tasks_per_node <= settings.max_tasks_per_node:
        over("resources.nodes x resources.tasks_per_node", "--nodes x --tasks-per-node", res.nodes * res.tasks_per_node,
             "max_tasks", " tasks")
    if spec.ntasks is not None:
        over("ntasks", "--ntasks", spec.ntasks, "max_tasks_per_node")
    for i, c in enumerate(spec.components[1:], 1):  # a heterogeneous job: the later components' requests too
        over(f"component[{i}].resources.nodes", "--nodes", c.resources.nodes, "max_nodes")
        over(f"component[{i}].resources.tasks_per_node", "--tasks-per-node", c.resources.tasks_per_node,
             "max_tasks_per_node")
        if c.resources.cpus is not None:
            over(f"component[{i}].resources.cpus", "--cpus", c.resources.cpus, "max_cpus")
    if len(spec.components) > 1:
        over("the components' GPUs", "--gpus", sum(c.resources.gpus * c.resources.nodes for c in spec.components),
             "max_gpus", " GPUs")
    over("resources.gpus x resources.nodes", "--gpus", res.gpus * res.nodes, "max_gpus", " GPUs")
    if res.elastic:
        # an elastic job may grow to its MAX: the bounds hold for that size too
        over("resources.nodes_max", "--nodes MIN-MAX", res.nodes_max or res.nodes, "max_nodes")
        over("resources.gpus_max x resources.nodes_max", "--gpus MIN-MAX",
             (res.gpus_max or res.gpus) * (res.nodes_max or res.nodes), "max_gpus", " GPUs")
    if res.cpus is not None:
        over("resources.cpus", "--cpus", res.cpus, "max_cpus")
    if spec.array is not None:
        over("array", "--array", len(spec.array.indices), "max_array_tasks", " tasks")
    named = sum(len(d.job_ids) + len(d.tasks) for d in spec.dependency)
    over("dependency", "--dependency", max(named, len(spec.dependency)), "max_dependencies", " jobs")
    over("command", "the command", sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in spec.command),
         "max_command_bytes", " bytes")
    return out


def _data_names(p: Problems, raw: Any) -> tuple[str, ...]:
    """`data = ["imagenet", "coco"]` (or "imagenet,coco", as --data takes it): dataset names, checked here for their
    spelling only; whether the fleet file defines them is the controller's to say (it reads the fleet file)."""
    names = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        p.expected("data", 'a list of dataset names such as ["imagenet"] (the fleet file\'s [[dataset]] names)', raw)
        return ()
    out: list[str] = []
    for n in names:
        if not n:
            continue
        if not _NAME_RE.match(n):
            p.expected("data", "dataset names of letters, digits, '.', '_' or '-' (at most 63)", n)
        elif n not in out:
            out.append(n)
    return tuple(out)


def _output_pattern(p: Problems, key: str, value: Any) -> str | None:
    """sbatch's --output/--error file pattern (hsched.spec.outfiles), checked here so that a bad one is refused at
    submit rather than failing the run on its node."""
    from hsched.spec.outfiles import pattern_problem

    text = _str(p, key, value, nonempty=True)
    if text is None:
        return None
    why = pattern_problem(text)
    if why:
        p.add(key, why)
        return None
    return text


def name_problem(name: str) -> str | None:
    """Why a job name cannot be used, or None. Names are printed in tables and terminals: printable characters
    only (no newline, NUL or terminal escape sequences that would rewrite someone's screen), 256 bytes at most."""
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes; shorten it"
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        return f"contains the unprintable character {bad!r}; use printable characters only"
    return None


def _resources(p: Problems, raw: Any) -> Resources:
    if not isinstance(raw, dict):
        p.expected("resources", "a table", raw)
        return Resources()
    check_keys(p, raw, _RES_KEYS, "resources.")
    gpus, gpus_max = _elastic(p, raw, "gpus", 0)
    nodes, nodes_max = _elastic(p, raw, "nodes", 1)
    tasks = _int(p, "resources.tasks_per_node", raw.get("tasks_per_node", 1), minimum=1) or 1
    types_raw = raw.get("gpu_types", [])
    if isinstance(types_raw, str):
        types_raw = [types_raw]
    gpu_types: tuple[str, ...] = ()
    if not isinstance(types_raw, list) or not all(isinstance(t, str) and t.strip() for t in types_raw):
        p.expected("resources.gpu_types", "a list of model names such as [\"a100\", \"h100\"]", types_raw)
    else:
        gpu_types = tuple(t.strip() for t in types_raw)
    gpu_mem = None
    if "gpu_memory" in raw:
        gpu_mem = _converted(p, "resources.gpu_memory", raw["gpu_memory"], parse_gpu_memory_mib)
    cpus = None
    if "cpus" in raw:
        cpus = _int(p, "resources.cpus", raw["cpus"], minimum=1)
    mem = None
    if "memory" in raw:
        mem = _converted(p, "resources.memory", raw["memory"], parse_size_mib)
    inter = raw.get("interconnect", "any")
    try:
        interconnect = Interconnect(str(inter).lower())
    except ValueError:
        p.expected("resources.interconnect", "\"nvlink\" or \"any\"", inter)
        interconnect = Interconnect.ANY
    if interconnect is Interconnect.NVLINK and gpus < 2:
        p.add("resources.interconnect", "\"nvlink\" needs gpus >= 2 (there is no link within one GPU)")
    constraint = _constraint(p, "resources.constraint", raw["constraint"]) if "constraint" in raw else ""
    offload = raw.get("offload", False)
    if not isinstance(offload, bool):
        p.expected("resources.offload", "true or false", offload)
        offload = False
    shared = raw.get("shared", False)
    if not isinstance(shared, bool):
        p.expected("resources.shared", "true or false", shared)
        shared = False
    if shared and (gpus != 1 or nodes != 1):
        p.add("resources.shared", "a shared job takes a fraction of one GPU: gpus = 1 and nodes = 1")
    elif shared and gpu_mem is None and "gpu_memory" not in raw:
        p.add("resources.shared", "a shared job says how much of the GPU it needs: give gpu_memory (--gpu-memory 10G)")
    if shared and (gpus_max or nodes_max):
        p.add("resources.shared", "a shared job is not elastic: drop the gpus/nodes range")
    return Resources(
        gpus=gpus, gpu_types=gpu_types, gpu_memory_mib=gpu_mem, cpus=cpus, memory_mib=mem, nodes=nodes,
        interconnect=interconnect, tasks_per_node=tasks, constraint=constraint, offload=offload, shared=shared,
        gpus_max=gpus_max, nodes_max=nodes_max,
    )


def _elastic(p: Problems, raw: Mapping[str, Any], key: str, least: int) -> tuple[int, int | None]:
    """`gpus = 4`, `gpus = "2-8"` or `gpus = 2` with `gpus_max = 8` (and the same for nodes): (MIN, MAX or None)."""
    from hsched.spec.sizes import size_range

    value = raw.get(key, least)
    if not isinstance(value, str):
        lo = _int(p, f"resources.{key}", value, minimum=least) or least
        return lo, _top(p, raw, key, lo, None)
    try:
        lo, hi = size_range(value, f"resources.{key}", minimum=least)
    except ValueError as e:
        p.add(f"resources.{key}", str(e).removeprefix(f"resources.{key} "))
        return least, None
    return lo, _top(p, raw, key, lo, hi)


def _top(p: Problems, raw: Mapping[str, Any], key: str, lo: int, hi: int | None) -> int | None:
    """`gpus_max`/`nodes_max` beside `gpus`/`nodes`, checked against a range given there."""
    value = raw.get(key)
    if f"{key}_max" in raw:
        top = _int(p, f"resources.{key}_max", raw[f"{key}_max"], minimum=max(1, lo))
        if top is not None and hi is not None and top != hi:
            p.add(f"resources.{key}_max", f"{top} disagrees with {key} = {value!r}; give one of them")
        elif top is not None:
            if lo == 0:
                p.add(f"resources.{key}_max", f"an elastic job asks at least 1 {key}: give {key} >= 1")
            hi = top if top > lo else None
    return hi


def _constraint(p: Problems, key: str, raw: Any) -> str:
    """sbatch's --constraint text, normalised ("nvme & ib" -> "nvme&ib"); "" when absent or bad (reported)."""
    if not isinstance(raw, str):
        p.expected(key, 'node labels such as "nvme&ib" or "a100|h100"', raw)
        return ""
    if not raw.strip():
        return ""
    try:
        return parse_constraint(raw).text
    except ValueError as e:
        p.add(key, f"{raw!r} is not a constraint: expected {e}")
        return ""


def load_job_spec(path: Path, overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """A spec file, with CLI options laid over it (overrides use the file's key names)."""
    data = read_toml(path)
    merged = dict(data)
    for k, v in (overrides or {}).items():
        if k == "resources":
            res = dict(merged.get("resources", {})) if isinstance(merged.get("resources"), dict) else {}
            res.update(v)
            merged["resources"] = res
        else:
            merged[k] = v
    return job_spec_from_table(merged, str(path))


# ------------------------------------------------------------------------------------------------ fleet

_SLURM_KEYS = ("partition", "account", "qos", "cluster", "login", "login_dir")
_LOGIN_DIR_VARS = re.compile(r"\$(?:\{(?:HOME|USER)\}|(?:HOME|USER)(?![A-Za-z0-9_]))")
"""`$HOME`, `$USER` (or `${...}`): what a slurm group's `login_dir` may say, expanded on the login node."""
_NODE_KEYS = frozenset(
    {"name", "executor", "host", "port", "user", "identity_file", "known_hosts", "simulate", "labels",
     "shared_paths", "helper", "data_dir", "data_quota", "discover", *_SLURM_KEYS}
)
_SIM_KEYS = frozenset({"model", "count", "memory_mib", "topology", "numa_nodes", "cpus", "memory", "nics"})
_NIC_KEYS = frozenset({"name", "kind", "rate_gbps", "active", "netdev", "near"})
_SWITCH_KEYS = frozenset({"name", "nodes", "switches", "rate_gbps"})
MAX_SIMULATED_DEVICES = 1024
"""A simulated node's GPUs at most (`simulate.count`)."""
EXECUTORS = ("local", "ssh", "slurm")


@dataclass(frozen=True, slots=True)
class SimulatedDevices:
    model: str
    count: int
    memory_mib: int | None = None
    topology: str | None = None
    """A captured `nvidia-smi topo -m` file (absolute path), or a synthetic kind such as 'nvswitch'."""
    numa_nodes: int = 1
    cpus: int | None = None
    memory_mib_host: int | None = None
    nics: tuple[Nic, ...] = ()
    """The simulated node's network adapters (`[[node.simulate.nics]]`)."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    executor: str = "local"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    simulate: SimulatedDevices | None = None
    shared_paths: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    """What `--constraint` matches (sbatch's node features): ["nvme", "ib"]."""
    partition: str | None = None
    """executor "slurm": the Slurm partition this node group stands for (executors/slurm/executor.py)."""
    account: str | None = None
    """executor "slurm": sbatch's --account."""
    slurm_qos: str | None = None
    """executor "slurm": sbatch's --qos (the fleet file's `qos`: Slurm's QoS, not hsched's class)."""
    cluster: str | None = None
    """executor "slurm": sbatch's --clusters (a multi-cluster Slurm)."""
    login: str | None = None
    """executor "slurm": "user@host" of a login node whose Slurm commands are run over SSH (with the entry's
    port, identity_file, known_hosts as an ssh node's); None: this machine's (executors/slurm/login.py)."""
    login_dir: str | None = None
    """executor "slurm" with `login`: hsched's folder on the login node (run folders, checkpoint copies), on a
    filesystem the cluster's nodes share: absolute, `~/...`, `$HOME` and `$USER` expanded there
    ("/scratch/$USER/hsched"); None: $HSCHED_NODE_ROOT there, else ~/.cache/hsched."""
    helper: str | None = None
    """executor "local"/"ssh": the launcher of a helper installed on the node (root's, confined), run through
    `sudo -n` instead of shipping one: how a lab's controller that runs as a service account reaches its nodes
    (default /usr/local/libexec/hsched/hsched-node-helper in that case)."""
    data_dir: str | None = None
    """Where copies of datasets go on the node (absolute); None: a `data` folder of the node's hsched folder."""
    data_quota_bytes: int | None = None
    """At most this much of the node's disk for dataset copies (least recently used evicted first); None: what the
    disk has free."""
    discover: str | None = None
    """executor "local"/"ssh": the absolute path, on the node, of a discovery plugin whose JSON describes the
    node's accelerators (docs/reference.md#discovery-plugins); the node helper runs it in its probe."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    nodes: tuple[NodeConfig, ...]
    source: str = "<built-in: this machine>"
    datasets: tuple[Dataset, ...] = ()
    """The fleet file's `[[dataset]]`s (hsched.datasets)."""
    fabric: Fabric = field(default_factory=Fabric)
    """The switch layout between nodes: `[[switch]]` tables or `topology = "topology.conf"` (issue 32)."""

    @staticmethod
    def default() -> FleetConfig:
        import socket

        return FleetConfig(nodes=(NodeConfig(name=socket.gethostname().split(".")[0] or "local"),))


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def fleet_from_table(data: Mapping[str, Any], source: str, base_dir: Path) -> FleetConfig:
    p = Problems(source)
    check_keys(p, data, frozenset({"node", "dataset", "switch", "topology"}), "")
    raw_nodes = data.get("node", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        p.add("node", "expected at least one [[node]] table")
        p.raise_if_any()
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        key = f"node[{i}]"
        if not isinstance(raw, dict):
            p.expected(key, "a [[node]] table", raw)
            continue
        check_keys(p, raw, _NODE_KEYS, f"{key}.")
        name = _str(p, f"{key}.name", raw.get("name"), nonempty=True)
        if name is not None:
            if not _NAME_RE.match(name):
                p.expected(f"{key}.name", "letters, digits, '.', '_' or '-' (at most 63)", name)
            elif name in seen:
                p.add(f"{key}.name", f"duplicate node name {name!r}; node names must be unique")
            seen.add(name)
            key = f"node[{i}] ({name})"
        executor = raw.get("executor", "local")
        if executor not in EXECUTORS:
            p.expected(f"{key}.executor", " or ".join(f'"{e}"' for e in EXECUTORS), executor)
        host = raw.get("host")
        if executor == "ssh" and not (isinstance(host, str) and host.strip()):
            p.add(f"{key}.host", "missing: an ssh node needs host = \"name, address or ~/.ssh/config alias\"")
        port = raw.get("port")
        if port is not None:
            port = _int(p, f"{key}.port", port, minimum=1)
        sim = None
        if "simulate" in raw:
            sim = _simulate(p, raw["simulate"], f"{key}.simulate", base_dir)
        shared = raw.get("shared_paths", [])
        if not isinstance(shared, list) or not all(isinstance(s, str) for s in shared):
            p.expected(f"{key}.shared_paths", "a list of paths", shared)
            shared = []
        labels = raw.get("labels", [])
        if not isinstance(labels, list):
            p.expected(f"{key}.labels", 'a list of labels such as ["nvme", "ib"]', labels)
            labels = []
        for lb in labels:
            why = label_problem(lb)
            if why is not None:
                p.expected(f"{key}.labels", why, lb)
        labels = [lb for lb in labels if label_problem(lb) is None]
        slurm = _slurm_keys(p, raw, key, executor)
        helper = raw.get("helper")
        if helper is not None and not (isinstance(helper, str) and helper.startswith("/")):
            p.expected(f"{key}.helper", "the absolute path of the installed helper's launcher "
                       '(`hsched node helper-script` installs "/usr/local/libexec/hsched/hsched-node-helper")', helper)
            helper = None
        elif helper is not None and executor not in ("local", "ssh"):
            p.add(f"{key}.helper", 'only for executor = "local" or "ssh"')
            helper = None
        discover = raw.get("discover")
        if discover is not None and not (isinstance(discover, str) and discover.startswith("/")
                                         and discover.isprintable()):
            p.expected(f"{key}.discover", 'the absolute path on the node of a discovery plugin, such as '
                       '"/opt/lab/discover-n300" (docs/reference.md: discovery plugins)', discover)
            discover = None
        elif discover is not None and (executor not in ("local", "ssh") or sim is not None):
            p.add(f"{key}.discover", 'only for a real node of executor = "local" or "ssh" (not simulated)')
            discover = None
        data_dir = raw.get("data_dir")
        if data_dir is not None and not (isinstance(data_dir, str) and data_dir.startswith("/")):
            p.expected(f"{key}.data_dir", 'an absolute path on the node for dataset copies, such as "/scratch/hsched"',
                       data_dir)
            data_dir = None
        quota = None
        if "data_quota" in raw:
            try:
                quota = parse_bytes(raw["data_quota"])
            except ValueError as e:
                p.expected(f"{key}.data_quota", str(e), raw["data_quota"])
        nodes.append(
            NodeConfig(
                name=name or f"node{i}", executor=str(executor), host=host if isinstance(host, str) else None,
                port=port, user=raw.get("user"), identity_file=raw.get("identity_file"),
                known_hosts=raw.get("known_hosts"), simulate=sim, shared_paths=tuple(shared),
                labels=tuple(dict.fromkeys(labels)), partition=slurm.get("partition"), account=slurm.get("account"),
                slurm_qos=slurm.get("qos"), cluster=slurm.get("cluster"), login=slurm.get("login"),
                login_dir=slurm.get("login_dir"), helper=helper,
                data_dir=data_dir, data_quota_bytes=quota, discover=discover,
            )
        )
    datasets = datasets_from_table(p, data["dataset"], [n.name for n in nodes]) if "dataset" in data else ()
    fabric = _fabric(p, data, base_dir, {n.name for n in nodes})
    p.raise_if_any()
    return FleetConfig(nodes=tuple(nodes), source=source, datasets=datasets, fabric=fabric)


def _fabric(p: Problems, data: Mapping[str, Any], base_dir: Path, names: set[str]) -> Fabric:
    """The switch layout: `[[switch]]` tables (name, nodes, switches, rate_gbps) or `topology` naming a Slurm
    topology.conf (relative to the fleet file); not both."""
    switches: list[Switch] = []
    if "switch" in data and "topology" in data:
        p.add("topology", "give the switch layout once: [[switch]] tables or topology = \"topology.conf\", not both")
        return Fabric()
    if "topology" in data:
        raw = data["topology"]
        if not isinstance(raw, str) or not raw.strip():
            p.expected("topology", 'a Slurm topology.conf file such as "topology.conf"', raw)
            return Fabric()
        path = (base_dir / raw).expanduser()
        try:
            switches = parse_topology_conf(path.read_text())
        except OSError as e:
            p.add("topology", f"cannot read {str(path)!r}: {e.strerror or e}; paths are relative to the fleet file")
            return Fabric()
        except ValueError as e:
            p.add("topology", f"{path}: {e}")
            return Fabric()
        where = "topology"
    elif "switch" in data:
        raws = data["switch"]
        if not isinstance(raws, list):
            p.expected("switch", "[[switch]] tables", raws)
            return Fabric()
        for i, raw in enumerate(raws):
            key = f"switch[{i}]"
            if not isinstance(raw, dict):
                p.expected(key, "a [[switch]] table", raw)
                continue
            check_keys(p, raw, _SWITCH_KEYS, f"{key}.")
            name = _str(p, f"{key}.name", raw.get("name"), nonempty=True)
            lists = {}
            for k in ("nodes", "switches"):
                v = raw.get(k, [])
                if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                    p.expected(f"{key}.{k}", 'a list of names such as ["n1", "n2"]', v)
                    v = []
                lists[k] = tuple(v)
            if not lists["nodes"] and not lists["switches"]:
                p.add(f"{key}", "a switch needs nodes = [...] (a leaf) or switches = [...] (a spine)")
            rate = raw.get("rate_gbps")
            if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
                p.expected(f"{key}.rate_gbps", "a positive number (the uplink's Gb/s, e.g. 400)", rate)
                rate = None
            if name is not None:
                switches.append(Switch(name=name, nodes=lists["nodes"], switches=lists["switches"],
                                       rate_gbps=float(rate) if rate is not None else None))
        where = "switch"
    else:
        return Fabric()
    for s in switches:
        for n in s.nodes:
            if n not in names:
                p.add(where, f"switch {s.name!r} names node {n!r}, which is not a [[node]] of this fleet")
                return Fabric()
    problem = layout_problem(switches)
    if problem is not None:
        p.add(where, problem)
        return Fabric()
    return Fabric(switches=tuple(switches))


def _nics(p: Problems, raw: Any, key: str, count: int | None) -> tuple[Nic, ...]:
    """A simulated node's `nics`: tables of name, kind ("ib", "roce", "ethernet"), rate_gbps, active, netdev, near
    (GPU indices PCIe-near it)."""
    if not isinstance(raw, list):
        p.expected(key, 'a list of tables such as [{name = "mlx5_0", kind = "ib", rate_gbps = 400}]', raw)
        return ()
    out: list[Nic] = []
    for i, t in enumerate(raw):
        k = f"{key}[{i}]"
        if not isinstance(t, dict):
            p.expected(k, "a table", t)
            continue
        check_keys(p, t, _NIC_KEYS, f"{k}.")
        name = _str(p, f"{k}.name", t.get("name"), nonempty=True)
        kind = nic_kind(t["kind"]) if isinstance(t.get("kind"), str) else None
        if kind is None:
            p.expected(f"{k}.kind", '"ib", "roce" or "ethernet"', t.get("kind"))
        rate = t.get("rate_gbps")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            p.expected(f"{k}.rate_gbps", "a positive number of Gb/s (e.g. 400 for NDR InfiniBand)", rate)
            rate = None
        active = t.get("active", True)
        if not isinstance(active, bool):
            p.expected(f"{k}.active", "true or false", active)
            active = True
        near = t.get("near", [])
        if (not isinstance(near, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                   and (count is None or x < count) for x in near)):
            p.expected(f"{k}.near", "a list of this node's GPU indices (0 to count-1) PCIe-near the NIC", near)
            near = []
        netdev = t.get("netdev")
        if netdev is not None and not (isinstance(netdev, str) and netdev):
            p.expected(f"{k}.netdev", 'a network interface name such as "ib0"', netdev)
            netdev = None
        if name is not None and kind is not None and rate is not None:
            out.append(Nic(name=name, kind=kind, rate_gbps=float(rate), active=active, netdev=netdev,
                           near=tuple(near)))
    return tuple(out)


def _slurm_keys(p: Problems, raw: Mapping[str, Any], key: str, executor: Any) -> dict[str, str]:
    """A slurm node group's keys: `partition` (required), `account`, `qos`, `cluster`, `login`, `login_dir`; only
    for that executor. The ssh keys (`port`, `identity_file`, `known_hosts`) and `login_dir` go with `login`."""
    out: dict[str, str] = {}
    if executor != "slurm":
        for k in _SLURM_KEYS:
            if k in raw:
                p.add(f"{key}.{k}", 'only for executor = "slurm" (a Slurm partition as a node group)')
        return out
    if "partition" not in raw:
        p.add(f"{key}.partition", 'missing: a slurm node needs partition = "the Slurm partition its jobs go to"')
    for k in _SLURM_KEYS:
        if k in raw:
            value = _str(p, f"{key}.{k}", raw[k], nonempty=True)
            if value is not None:
                out[k] = value
    login = out.get("login")
    if login is not None and (any(c.isspace() for c in login) or login.count("@") > 1 or login.endswith("@")
                              or login.startswith(("@", "-"))):
        p.expected(f"{key}.login", 'a login node as "user@host" or "host" (an ~/.ssh/config alias works)', login)
        del out["login"]
    login_dir = out.get("login_dir")
    if login_dir is not None and (problem := login_dir_problem(login_dir)) is not None:
        p.add(f"{key}.login_dir", f"expected {problem}, found {shown(login_dir)} (e.g. \"/scratch/$USER/hsched\")")
        del out["login_dir"]
    for k in ("host", "simulate"):
        if k in raw:
            p.add(f"{key}.{k}", "not for a slurm node: it is reached through Slurm's commands (sbatch, squeue; "
                  'over SSH with login = "user@host") and its GPUs are Slurm\'s')
    if "login" not in raw:
        for k in ("port", "identity_file", "known_hosts", "login_dir"):
            if k in raw:
                p.add(f"{key}.{k}", 'only with login = "user@host" (a slurm node reached over SSH)')
    return out


def login_dir_problem(value: str) -> str | None:
    """Why `value` cannot be a slurm group's `login_dir`, or None: it must name an absolute folder once the login
    node expands `~`, `$HOME` and `$USER` (nothing else: no other variable, no control character)."""
    if any(not c.isprintable() for c in value):
        return "a folder name without control characters"
    rest = _LOGIN_DIR_VARS.sub("", value)
    if "$" in rest:
        return "an absolute folder on the login node where only $HOME and $USER (or ~) are expanded"
    if not (value.startswith("/") or value == "~" or value.startswith(("~/", "$HOME", "${HOME}"))):
        return "an absolute folder on the login node (/..., ~/... or $HOME/...)"
    return None


def _simulate(p: Problems, raw: Any, key: str, base_dir: Path) -> SimulatedDevices | None:
    if not isinstance(raw, dict):
        p.expected(key, "a table", raw)
        return None
    check_keys(p, raw, _SIM_KEYS, f"{key}.")
    model = _str(p, f"{key}.model", raw.get("model"), nonempty=True)
    count = _int(p, f"{key}.count", raw.get("count", 1), minimum=1)
    if count is not None and count > MAX_SIMULATED_DEVICES:
        # each simulated GPU is state the controller keeps and samples every second: 100,000,000 of them hung it
        p.expected(f"{key}.count", f"an integer from 1 to {MAX_SIMULATED_DEVICES} (GPUs of one simulated node)", count)
        count = None
    mem = None
    if "memory_mib" in raw:
        mem = _int(p, f"{key}.memory_mib", raw["memory_mib"], minimum=1)
    topo = raw.get("topology")
    if topo is not None:
        if not isinstance(topo, str) or not topo.strip():
            p.expected(f"{key}.topology", "a captured `nvidia-smi topo -m` file or a kind such as \"nvswitch\"", topo)
            topo = None
        elif "/" in topo or topo.endswith(".txt"):
            path = (base_dir / topo).expanduser()
            if not path.is_file():
                p.add(f"{key}.topology", f"no such file {str(path)!r}; paths are relative to the fleet file")
                topo = None
            else:
                topo = str(path.absolute())
    numa = _int(p, f"{key}.numa_nodes", raw.get("numa_nodes", 1), minimum=1) or 1
    cpus = _int(p, f"{key}.cpus", raw["cpus"], minimum=1) if "cpus" in raw else None
    host_mem = _converted(p, f"{key}.memory", raw["memory"], parse_size_mib) if "memory" in raw else None
    nics = _nics(p, raw["nics"], f"{key}.nics", count) if "nics" in raw else ()
    if model is None or count is None:
        return None
    return SimulatedDevices(model=model, count=count, memory_mib=mem, topology=topo, numa_nodes=numa, cpus=cpus,
                            memory_mib_host=host_mem, nics=nics)


def load_fleet(path: Path | None) -> FleetConfig:
    if path is None:
        return FleetConfig.default()
    data = read_toml(path)
    return fleet_from_table(data, str(path), path.parent)


# --------------------------------------------------------------------------------------------- settings

@dataclass(frozen=True, slots=True)
class QosClass:
    """A named priority band: which classes it may preempt, and its GPU limits."""

    name: str
    preempts: tuple[str, ...] = ()
    max_gpus: int | None = None
    """GPUs all jobs of this class may hold at once."""
    max_gpus_per_user: int | None = None
    """GPUs one user's jobs of this class may hold at once."""
    max_jobs_per_user: int | None = None
    """Jobs of this class one user may have holding devices at once (hsched.sched.limits enforces the caps)."""
    allow: tuple[str, ...] | None = None
    """Who may submit to this class in a lab: users, and groups as `@group` (`"*"`: everyone). None: everyone,
    except `prod`, which only root and the lab's admins may use unless settings grant it (Slurm's AllowQos; a
    class that preempts the others must not be everyone's)."""


DEFAULT_QOS_TABLE: dict[str, QosClass] = {
    "prod": QosClass("prod", preempts=("normal", "scavenger")),
    "normal": QosClass("normal", preempts=("scavenger",)),
    "scavenger": QosClass("scavenger"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Controller settings ($HSCHED_HOME/settings.toml); every key is optional."""

    poll_interval_s: float = 0.5
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 15.0
    """A probe that has not answered by then makes its node UNHEALTHY (a hung nvidia-smi); GPU discovery on
    the node is bounded by half of it."""
    checkpoint_exit_code: int = 85
    lease_s: float = 300.0
    heartbeat_timeout_s: float = 15.0
    max_restarts: int = 3
    """Checkpoint exits a job may make on its own before it ends FAILED (reason max_restarts)."""
    retries: int = 0
    """Retries of a failed run (nonzero exit, lost) for jobs whose spec does not say (`--retries`)."""
    fatal_exit_codes: tuple[int, ...] = (126, 127)
    """Exit codes never retried (126: cannot execute, 127: command not found)."""
    retry_backoff_s: float = 10.0
    """The first retry waits this long; each next one twice as long, up to retry_backoff_max_s."""
    retry_backoff_max_s: float = 360.0
    kill_after_s: float = 10.0
    """After a cancel's SIGTERM, how long before SIGKILL."""
    monitor_interval_s: float = 1.0
    """How often each node sends a monitoring sample (utilization, memory, processes)."""
    gpu_models: dict[str, Any] = field(default_factory=dict)
    """The `[gpu_models]` table as written (its `aliases` are read into `gpu_aliases`)."""
    gpu_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """`[gpu_models.aliases]`: a `--gpu-type` name -> the device models it stands for (each matched as a
    case-insensitive substring, as --gpu-type is): a100 = ["A100-SXM4-80GB", "A100-PCIE-40GB"]."""
    fairshare_half_life_s: float = DEFAULT_HALF_LIFE_S
    """Fair share's usage decay (Slurm's PriorityDecayHalfLife): usage this old counts half; 0: no decay."""
    accounts: dict[str, Account] = field(default_factory=dict)
    """`[accounts]`: groups of users sharing a part of the lab (fair share); a user in none is their own."""
    priority: PriorityWeights = field(default_factory=PriorityWeights)
    """`[priority]`: the multifactor priority's weights (Slurm's PriorityWeight*: fair share, age, job size) and
    `max_age_s` (PriorityMaxAge), which order jobs between users inside a QoS class (hsched.sched.policies.hsched)."""
    qos: dict[str, QosClass] = field(default_factory=lambda: dict(DEFAULT_QOS_TABLE))
    default_qos: str = DEFAULT_QOS
    metrics: str | None = None
    """HOST:PORT where the controller serves Prometheus metrics (e.g. "127.0.0.1:9464"); None: off."""
    policy: str | None = "hsched"
    """The scheduling-core policy that orders the queue and picks GPU types; "none" for QoS/priority/FIFO."""
    admins: tuple[str, ...] = ()
    """Lab mode: who may act on any job, drain nodes and stop the controller besides root and the controller's
    own account: user names, and groups as "@group" (["@hsched-admin", "labadmin"])."""
    lab_group: str | None = None
    """Lab mode: only this group's members may use the socket (0660); None lets every local user (0666)."""
    idle_after_s: float = 1800.0
    """A running job whose GPUs have all been idle this long is flagged (event `idle`, profile `idle`;
    hsched.learn.profiles.IDLE_AFTER_S). Nothing is done to it."""
    moves: bool = True
    """The policy may move a running job that proved it checkpoints (it exited with the checkpoint code before)
    to faster free GPUs when the move pays, and time-share such jobs within a QoS class (least attained service
    first); false: running jobs stay where they are, as before (issue 14, hsched.controller.moves)."""
    move_min_run_s: float = 1800.0
    """A job (re)started less than this long ago is neither moved nor time-shared away (the live policy's
    quantum): a move costs a checkpoint and a restart, so they must be rare."""
    history_days: float = 180.0
    """Events, monitoring tallies and progress of jobs that ended longer ago than this are compacted away (jobs and
    runs stay: accounting reads them); 0 keeps everything."""
    move_cost_s: float = 60.0
    """What a checkpoint and restart is taken to cost a job before one was measured (its time from the stop's
    decision to its GPUs free, plus from its restart to its first progress report)."""
    data_link_mbps: float = 1000.0
    """What copying a dataset between two nodes is taken to move per second (Mbit/s) until a copy between them was
    measured: the copy time placement weighs against waiting for a node that holds the data."""
    prefetch: bool = True
    """Copy a waiting job's datasets ahead of time to the node it is predicted to start on (hsched.controller.data)."""
    prefetch_horizon_s: float = 900.0
    """How soon a waiting job must be predicted to start for its data to be copied ahead of time (the copy's own
    modelled time is added: a long copy starts earlier)."""
    data_limit_mbps: float = 0.0
    """At most this many Mbit/s for each dataset copy (0: as fast as the link goes)."""

    # What one lab member may take of the controller (issue 27): the socket's connections, subscriptions and requests
    # being answered are counted per uid (the kernel's, SO_PEERCRED), so one member's flood never locks out the others
    # or the admins; and every request is bounded, so that no single submit makes the controller work for minutes.
    max_connections: int = MAX_CONNECTIONS
    """Connections to the socket at once, everyone's together (a newcomer past it is told so and closed)."""
    max_connections_per_user: int = 32
    """Connections one lab member may hold at once (root, the controller's account and `admins` are not counted
    against it)."""
    admin_reserve: int = 32
    """Of max_connections, how many only root, the controller's account and `admins` may use: the others together
    never hold more than max_connections - admin_reserve, so an admin always gets in."""
    max_subscriptions_per_user: int = 16
    """Streams (`subscribe`: the dashboard) and `wait`s one lab member may have open at once."""
    max_requests_per_user: int = 8
    """Requests of one lab member being answered at once; the next wait their turn (a member cannot keep the
    controller busy with hundreds of `queue --all` at a time)."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    """A connection that sends no whole request for this long is closed; a subscription whose reader takes none of
    what it is sent for this long is closed too."""
    max_nodes: int = 256
    """A job's `--nodes` at most."""
    max_tasks_per_node: int = 512
    """A job's `--tasks-per-node` at most (each task is a run: a row in the store and a process)."""
    max_tasks: int = 4096
    """A job's tasks (`--nodes` x `--tasks-per-node`) at most."""
    max_gpus: int = 1024
    """A job's GPUs (`--gpus`, all its nodes together) at most."""
    max_cpus: int = 8192
    """A job's `--cpus` at most."""
    max_array_tasks: int = 10_000
    """Tasks of one `--array` at most (each is a job)."""
    max_jobs_per_request: int = 10_000
    """Jobs one request may queue at most (a submit_many's jobs, each array's tasks counted)."""
    max_dependencies: int = 1000
    """Jobs one `--dependency` may name at most."""
    max_command_bytes: int = 131_072
    """A job's command line (all its words together) at most, in bytes (Linux takes one word of at most 128 KiB)."""
    policy_round_s: float = 360.0
    """The round length the policy is told (PolicyInput.round_s: the simulator's round, 360 s): a (re)started job is
    not time-shared away before max(`move_min_run_s`, this). Only a time-compressed controller (`hsched replay`, where
    360 s of wall time is weeks of its trace) sets it, to the simulator's round over its speedup."""

    @property
    def qos_names(self) -> tuple[str, ...]:
        return tuple(self.qos)


_SETTINGS_FLOATS = ("poll_interval_s", "probe_interval_s", "probe_timeout_s", "lease_s", "heartbeat_timeout_s",
                    "kill_after_s", "monitor_interval_s", "retry_backoff_s", "retry_backoff_max_s", "idle_after_s",
                    "move_min_run_s", "move_cost_s", "data_link_mbps", "prefetch_horizon_s", "idle_timeout_s",
                    "policy_round_s")
_SETTINGS_BOUNDS = {
    # key: (least, most): a bound beyond the most would let the request it bounds hang the controller again
    "max_connections": (1, 100_000), "max_connections_per_user": (1, 100_000), "admin_reserve": (0, 100_000),
    "max_subscriptions_per_user": (0, 100_000), "max_requests_per_user": (1, 100_000),
    "max_nodes": (1, 100_000), "max_tasks_per_node": (1, 100_000), "max_tasks": (1, 1_000_000),
    "max_gpus": (1, 1_000_000), "max_cpus": (1, 10_000_000), "max_array_tasks": (1, MAX_ARRAY_TASKS),
    "max_dependencies": (1, 100_000), "max_command_bytes": (1, 1 << 20), "max_jobs_per_request": (1, 1_000_000),
}
"""The integer limits of settings (issue 27) and the range each may be set in."""


def load_settings(path: Path) -> Settings:
    if not path.exists():
        return Settings()
    data = read_toml(path)
    p = Problems(str(path))
    allowed = frozenset({*_SETTINGS_FLOATS, "checkpoint_exit_code", "max_restarts", "gpu_models", "qos",
                         "default_qos", "policy", "retries", "fatal_exit_codes", "metrics", "admins", "lab_group",
                         "fairshare_half_life_s", "accounts", "priority", "moves", "history_days", "prefetch",
                         "data_limit_mbps", *_SETTINGS_BOUNDS})
    check_keys(p, data, allowed, "")
    kwargs: dict[str, Any] = {}
    for k in _SETTINGS_FLOATS:
        if k in data:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                p.expected(k, "a number of seconds > 0" if k.endswith("_s") else "Mbit/s > 0, such as 1000", v)
            else:
                kwargs[k] = float(v)
    for k in ("checkpoint_exit_code", "max_restarts", "retries"):
        if k in data:
            v = _int(p, k, data[k], minimum=0)
            if v is not None:
                kwargs[k] = v
    for k, (least, most) in _SETTINGS_BOUNDS.items():
        if k in data:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= most:
                p.expected(k, f"an integer from {least} to {most}", v)
            else:
                kwargs[k] = v
    if kwargs.get("admin_reserve", 0) >= kwargs.get("max_connections", MAX_CONNECTIONS):
        p.add("admin_reserve", f"must be below max_connections ({kwargs.get('max_connections', MAX_CONNECTIONS)}): "
                               "the lab's members need some connections too")
    if "metrics" in data:
        m = data["metrics"]
        _host, sep, port = str(m).rpartition(":")
        if not isinstance(m, str) or not sep or not port.isdigit() or not 0 < int(port) < 65536:
            p.expected("metrics", "HOST:PORT such as \"127.0.0.1:9464\"", m)
        else:
            kwargs["metrics"] = m
    if "admins" in data:
        a = data["admins"]
        if not isinstance(a, list) or not all(isinstance(x, str) and x.strip("@") and " " not in x for x in a):
            p.expected("admins", 'a list of user names and "@group" names such as ["@hsched-admin", "labadmin"]', a)
        else:
            kwargs["admins"] = tuple(a)
    if "lab_group" in data:
        g = data["lab_group"]
        if not isinstance(g, str) or not g or " " in g:
            p.expected("lab_group", 'a group name such as "lab"', g)
        else:
            kwargs["lab_group"] = g
    if "fatal_exit_codes" in data:
        codes = data["fatal_exit_codes"]
        if not isinstance(codes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255
                                                  for c in codes):
            p.expected("fatal_exit_codes", "a list of exit codes from 0 to 255 such as [126, 127]", codes)
        elif 0 in codes or kwargs.get("checkpoint_exit_code", 85) in codes:
            p.add("fatal_exit_codes", "cannot hold 0 or the checkpoint exit code: those are not failures")
        else:
            kwargs["fatal_exit_codes"] = tuple(codes)
    if "gpu_models" in data:
        if isinstance(data["gpu_models"], dict):
            kwargs["gpu_models"] = data["gpu_models"]
            kwargs["gpu_aliases"] = _gpu_aliases(p, data["gpu_models"])
        else:
            p.expected("gpu_models", "a table such as [gpu_models.aliases]", data["gpu_models"])
    if "fairshare_half_life_s" in data:
        v = data["fairshare_half_life_s"]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            p.expected("fairshare_half_life_s", "a number of seconds >= 0 (604800 = 7 days; 0: no decay)", v)
        else:
            kwargs["fairshare_half_life_s"] = float(v)
    if "history_days" in data:
        v = data["history_days"]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            p.expected("history_days", "a number of days >= 0 (180; 0 keeps everything)", v)
        else:
            kwargs["history_days"] = float(v)
    for flag in ("moves", "prefetch"):
        if flag in data:
            if not isinstance(data[flag], bool):
                p.expected(flag, "true or false", data[flag])
            else:
                kwargs[flag] = data[flag]
    if "data_limit_mbps" in data:
        v = data["data_limit_mbps"]
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            p.expected("data_limit_mbps", "Mbit/s >= 0 for each dataset copy (0: no limit)", v)
        else:
            kwargs["data_limit_mbps"] = float(v)
    if "accounts" in data:
        kwargs["accounts"] = _accounts(p, data["accounts"])
    if "priority" in data:
        kwargs["priority"] = _priority_weights(p, data["priority"])
    if "qos" in data:
        kwargs["qos"] = _qos_table(p, data["qos"])
    if "default_qos" in data:
        names = tuple(kwargs.get("qos", DEFAULT_QOS_TABLE))
        if data["default_qos"] not in names:
            p.expected("default_qos", f"one of {', '.join(names)}", data["default_qos"])
        else:
            kwargs["default_qos"] = data["default_qos"]
    if "policy" in data:
        from hsched.sched.registry import make_policy, policy_names

        name = data["policy"]
        live = [n for n in policy_names() if not n.endswith("-oracle")]
        if name == "none":
            kwargs["policy"] = None
        elif not isinstance(name, str) or name not in live:
            p.expected("policy", f"one of {', '.join(live)} or \"none\"", name)
        else:
            make_policy(name)
            kwargs["policy"] = name
    p.raise_if_any()
    return Settings(**kwargs)


_QOS_KEYS = frozenset({"preempts", "max_gpus", "max_gpus_per_user", "max_jobs_per_user", "allow"})


def _gpu_aliases(p: Problems, table: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """[gpu_models.aliases]: NAME = ["MODEL", ...] (or one "MODEL"). Other [gpu_models] keys were never read:
    they are refused rather than silently ignored."""
    check_keys(p, table, frozenset({"aliases"}), "gpu_models.")
    raw = table.get("aliases", {})
    if not isinstance(raw, dict):
        p.expected("gpu_models.aliases", 'a table such as a100 = ["A100-SXM4-80GB", "A100-PCIE-40GB"]', raw)
        return {}
    out: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for name, models in raw.items():
        key = f"gpu_models.aliases.{name}"
        if isinstance(models, str):
            models = [models]
        if not name.strip() or not isinstance(models, list) or not models or not all(
                isinstance(m, str) and m.strip() for m in models):
            p.expected(key, 'a list of GPU model names such as ["A100-SXM4-80GB", "A100-PCIE-40GB"]', models)
            continue
        if name.lower() in seen:
            p.add(key, f"the same alias as {seen[name.lower()]!r} (aliases are case-insensitive); keep one")
            continue
        seen[name.lower()] = name
        out[name] = tuple(m.strip() for m in models)
    return out


_PRIORITY_KEYS = {"weight_fairshare": "fairshare", "weight_age": "age", "weight_size": "size",
                  "max_age_s": "max_age_s"}


def _priority_weights(p: Problems, raw: Any) -> PriorityWeights:
    """[priority]: weight_fairshare, weight_age, weight_size (numbers >= 0, Slurm's PriorityWeight*) and max_age_s
    (seconds >= 0 of waiting for the full age factor, Slurm's PriorityMaxAge; 0: every waiting job has it)."""
    if not isinstance(raw, dict):
        p.expected("priority", "a table such as [priority] with weight_fairshare = 10000", raw)
        return PriorityWeights()
    check_keys(p, raw, frozenset(_PRIORITY_KEYS), "priority.")
    kw: dict[str, float] = {}
    for key, name in _PRIORITY_KEYS.items():
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
                p.expected(f"priority.{key}", "a number of seconds >= 0 (604800 = 7 days)" if key == "max_age_s"
                           else "a weight >= 0 such as 10000 (0 leaves the factor out)", v)
            else:
                kw[name] = float(v)
    return PriorityWeights(**kw)


def _accounts(p: Problems, raw: Any) -> dict[str, Account]:
    """[accounts]: NAME = ["user", ...], or NAME = { users = [...], shares = N } for an account worth N shares."""
    if not isinstance(raw, dict):
        p.expected("accounts", 'a table such as physics = ["lab1", "lab2"]', raw)
        return {}
    out: dict[str, Account] = {}
    member_of: dict[str, str] = {}
    for name, value in raw.items():
        key = f"accounts.{name}"
        shares: int | None = 1
        users = value
        if isinstance(value, dict):
            check_keys(p, value, frozenset({"users", "shares"}), f"{key}.")
            users = value.get("users", [])
            shares = _int(p, f"{key}.shares", value.get("shares", 1), minimum=1)
        if not isinstance(users, list) or not users or not all(isinstance(u, str) and u.strip() for u in users):
            p.expected(f"{key}" + (".users" if isinstance(value, dict) else ""),
                       'a list of user names such as ["lab1", "lab2"]', users)
            continue
        for u in users:
            if u in member_of:
                p.add(key, f"user {u!r} is already in account {member_of[u]!r}; a user belongs to one account")
            member_of.setdefault(u, name)
        out[name] = Account(name, tuple(dict.fromkeys(users)), shares or 1)
    return out


def _qos_table(p: Problems, raw: Any) -> dict[str, QosClass]:
    """[qos.NAME] tables; a class given here replaces the built-in one of that name, others stay."""
    out = dict(DEFAULT_QOS_TABLE)
    if not isinstance(raw, dict):
        p.expected("qos", "tables such as [qos.prod]", raw)
        return out
    for name, t in raw.items():
        key = f"qos.{name}"
        if not isinstance(t, dict):
            p.expected(key, "a table", t)
            continue
        check_keys(p, t, _QOS_KEYS, f"{key}.")
        pre = t.get("preempts", [])
        if not isinstance(pre, list) or not all(isinstance(x, str) for x in pre):
            p.expected(f"{key}.preempts", "a list of QoS class names", pre)
            pre = []
        limits = {k: _int(p, f"{key}.{k}", t[k], minimum=0)
                  for k in ("max_gpus", "max_gpus_per_user", "max_jobs_per_user") if k in t}
        allow = t.get("allow")
        if allow is not None and (not isinstance(allow, list) or not all(isinstance(x, str) and x.strip()
                                                                          for x in allow)):
            p.expected(f"{key}.allow", 'a list of user names, "@group" names or "*"', allow)
            allow = None
        out[name] = QosClass(name, preempts=tuple(pre), allow=tuple(x.strip() for x in allow)
                             if allow is not None else None, **limits)
    for q in out.values():
        for target in q.preempts:
            if target not in out:
                p.add(f"qos.{q.name}.preempts", f"unknown class {target!r}; known: {', '.join(out)}")
            elif target == q.name:
                p.add(f"qos.{q.name}.preempts", "a class cannot preempt itself")
    return out
