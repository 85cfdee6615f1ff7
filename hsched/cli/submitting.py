"""`hsched submit` without Typer: the job table from the options, one request to the controller, the answer.

Both ways in end here: the Typer command (hsched/cli/jobs.py, which first reads a spec file or a batch script's
#SBATCH lines) and `quick_submit`, which hsched/cli/__init__.py tries first. `quick_submit` parses the plain
case, `[OPTIONS] -- COMMAND ARGS` (or a COMMAND that is not a file), with the options as Typer declares them
(`OPTIONS` below; a test holds the two to the same names and meanings) and declines, returning None, whatever
it is not sure of: a spec file or a script, --help, an unknown or repeated option, a value Typer would check or
convert (a number out of range, `-G4`, a value that starts with `-`). Typer then answers exactly as it always
did, its usage errors included. So the quick path changes how fast, never what.

The spec is checked here only when no controller runs yet (so that bad input fails before one is started);
a running controller checks it anyway, with the same function and settings file, and its UserError comes
back as the same lines and exit code 2. Saves importing hsched.config and reading settings on every submit.
"""

from __future__ import annotations

import os
import sys

from hsched.cli import quick
from hsched.cli._common import print_json
from hsched.cli.quick import FLAG, INT, MANY, TEXT
from hsched.errors import UserError

TYPE_CHECKING = False  # typing is left to the type checker (a few ms of every quick submit)
if TYPE_CHECKING:
    from typing import Any

OPTIONS: dict[str, tuple[tuple[str, ...], str, int | None, int | None]] = {
    # parameter name: (option names, kind, min, max), as hsched/cli/jobs.py's submit declares them
    "gpus": (("--gpus", "-G"), TEXT, None, None),
    "gpus_per_node": (("--gpus-per-node",), INT, 0, None),
    "gpu_type": (("--gpu-type",), MANY, None, None),
    "constraint": (("--constraint", "-C"), TEXT, None, None),
    "partition": (("--partition", "-p"), TEXT, None, None),
    "nodelist": (("--nodelist", "-w"), TEXT, None, None),
    "exclude": (("--exclude", "-x"), TEXT, None, None),
    "ntasks": (("--ntasks", "-n"), INT, 1, None),
    "gpu_memory": (("--gpu-memory",), TEXT, None, None),
    "nodes": (("--nodes", "-N"), TEXT, None, None),
    "name": (("--name", "-J", "--job-name"), TEXT, None, None),
    "qos": (("--qos",), TEXT, None, None),
    "tasks_per_node": (("--tasks-per-node",), INT, 1, None),
    "priority": (("--priority",), INT, None, None),
    "interconnect": (("--interconnect",), TEXT, None, None),
    "offload": (("--offload",), FLAG, None, None),
    "shared": (("--shared", "--gpu-share"), FLAG, None, None),
    "cpus": (("--cpus", "-c"), INT, 1, None),
    "memory": (("--memory", "--mem"), TEXT, None, None),
    "checkpoint_signal": (("--checkpoint-signal",), TEXT, None, None),
    "resize_signal": (("--resize-signal",), TEXT, None, None),
    "time_limit": (("--time", "-t"), TEXT, None, None),
    "warn_signal": (("--signal",), TEXT, None, None),
    "retries": (("--retries",), INT, 0, 100),
    "array": (("--array", "-a"), TEXT, None, None),
    "dependency": (("--dependency", "-d"), TEXT, None, None),
    "kill_on_invalid_dep": (("--kill-on-invalid-dep",), FLAG, None, None),
    "workdir": (("--workdir", "-D", "--chdir"), TEXT, None, None),
    "output": (("--output", "-o"), TEXT, None, None),
    "error": (("--error", "-e"), TEXT, None, None),
    "open_mode": (("--open-mode",), TEXT, None, None),
    "env": (("--env",), MANY, None, None),
    "hold": (("--hold",), FLAG, None, None),
    "kind": (("--kind",), TEXT, None, None),
    "data": (("--data",), TEXT, None, None),
    "test_only": (("--test-only",), FLAG, None, None),
    "as_json": (("--json",), FLAG, None, None),
    "parsable": (("--parsable",), FLAG, None, None),
}
OPTIONS["workload"] = (("--workload",), TEXT, None, None)  # issue 30 (its own line: other branches add options)


def _client() -> Any:
    from hsched.client import Client

    return Client()


def _user() -> str:
    """getpass.getuser() without importing getpass (termios and more, for a name the controller only logs: it
    takes the user from the kernel)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        user = os.environ.get(name)
        if user:
            return user
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]] | None:
    """(parameters as Typer would pass them, the command) for a plain `submit` argv; None when in doubt."""
    parsed = quick.parse(argv, OPTIONS)
    if parsed is None:
        return None
    params, args = parsed
    if args and (args[0].lower().endswith(".toml") or os.path.isfile(args[0])):
        return None  # a spec file or a batch script (after `--` too, as jobs.py reads it): Typer's
    return params, args


def quick_submit(argv: list[str]) -> int | None:
    """Submit a plain `hsched submit ...` (argv after `submit`) and return the exit code; None: not handled,
    Typer's turn (nothing was done)."""
    parsed = parse(argv)
    if parsed is None:
        return None
    params, args = parsed
    return quick.run(submit, params, args, {}, "<command line>")


def job_table(o: dict[str, Any], args: list[str], table: dict[str, Any]) -> dict[str, Any]:
    """The job table the controller gets: `table` (a spec file's, or empty) with the command `args` and the
    options `o` over it."""
    if ":" in args:
        return hetjob_table(o, args, table)
    if args[:1] == ["--"]:
        args = args[1:]
    if args:
        table["command"] = args
    res = dict(table.get("resources", {})) if isinstance(table.get("resources"), dict) else {}
    _elastic_sizes(o, res)
    hosts = _hosts(o, res)
    if o.get("gpus") is not None:
        # sbatch's -G/--gpus is the job's total; hsched's request is per node
        n = o.get("nodes") or (res.get("nodes") if isinstance(res.get("nodes"), int) else None) or 1
        if o["gpus"] % n:
            raise UserError(f"--gpus {o['gpus']}: not a multiple of --nodes {n}; give --gpus-per-node instead")
        o["gpus_per_node"] = o["gpus_per_node"] if o.get("gpus_per_node") is not None else o["gpus"] // n
        if o.get("gpus_max") is not None:
            from hsched.spec.sizes import per_node

            try:
                _lo, res["gpus_max"] = per_node(o["gpus"], o["gpus_max"], n, "--gpus")
            except ValueError as e:
                raise UserError(str(e)) from None
    for key, opt in (("gpus", "gpus_per_node"), ("gpu_memory", "gpu_memory"), ("nodes", "nodes"),
                     ("cpus", "cpus"),
                     ("memory", "memory"), ("interconnect", "interconnect"),
                     ("tasks_per_node", "tasks_per_node"), ("constraint", "constraint")):
        if o.get(opt) is not None:
            res[key] = o[opt]
    if o.get("offload"):
        res["offload"] = True
    if o.get("shared"):
        res["shared"] = True
    if o.get("gpu_type"):
        res["gpu_types"] = list(o["gpu_type"])
    if o.get("constraint") is not None:
        table.pop("constraint", None)  # the command line's wins over a spec file's, wherever that put it
    if o.get("partition") is not None:
        # a partition is a node label (hsched.spec.constraints): -p a,b is a node labelled a or b, and with a
        # constraint (the command line's or the spec file's) a node of the partition that also satisfies it
        from hsched.spec.constraints import with_partition

        given = res.get("constraint") or table.pop("constraint", None)
        try:
            res["constraint"] = with_partition(o["partition"], given if isinstance(given, str) else None)
        except ValueError as e:
            raise UserError(f"--partition {o['partition']!r}: expected {e}") from None
    if hosts:
        # -w/-x: the nodes' own names in the job's constraint (hsched.spec.constraints), over its labels
        from hsched.spec.constraints import with_nodes

        given = res.get("constraint") or table.pop("constraint", None)
        try:
            res["constraint"] = with_nodes(given if isinstance(given, str) else None, hosts.get("nodelist", ()),
                                           hosts.get("exclude", ()))
        except ValueError as e:
            raise UserError(f"--constraint {given!r}: expected {e}") from None
    if o.get("ntasks") is not None:
        _tasks(o["ntasks"], res, table)
    if res or "resources" in table:
        table["resources"] = res
    for key, opt in (("name", "name"), ("qos", "qos"), ("priority", "priority"),
                     ("checkpoint_signal", "checkpoint_signal"), ("time", "time_limit"), ("workdir", "workdir"),
                     ("signal", "warn_signal"), ("retries", "retries"), ("dependency", "dependency"),
                     ("array", "array"), ("kind", "kind"), ("data", "data"), ("resize_signal", "resize_signal")):
        if o.get(opt) is not None:
            table[key] = o[opt]
    for key in ("output", "error"):
        if o.get(key) is not None:
            table[key] = _file_pattern(key, o[key])
    if o.get("open_mode") is not None:
        if o["open_mode"] not in ("append", "truncate"):
            raise UserError(f"--open-mode {o['open_mode']!r}: expected append or truncate")
        table["open_mode"] = o["open_mode"]
    if o.get("workload") is not None:
        table["workload"] = o["workload"]
    if o.get("hold"):
        table["hold"] = True
    if o.get("kill_on_invalid_dep"):
        table["kill_on_invalid_dep"] = True
    if o.get("env"):
        merged = dict(table.get("env", {})) if isinstance(table.get("env"), dict) else {}
        for item in o["env"]:
            k, sep, v = item.partition("=")
            if not sep:
                raise UserError(f"--env {item!r}: expected NAME=VALUE")
            merged[k] = v
        table["env"] = merged
    if "command" not in table and "component" not in table:  # (a spec file's [[component]] tables have theirs)
        raise UserError("nothing to run: give a command after -- (hsched submit -- python train.py) "
                        "or a spec file with command = [...]")
    return table


def _elastic_sizes(o: dict[str, Any], res: dict[str, Any]) -> None:
    """`--gpus MIN-MAX` and `--nodes MIN-MAX` (hsched.spec.sizes): the MIN stays in `gpus`/`nodes` as a rigid
    job's count, the MAX goes to `gpus_max`/`nodes_max` (resources). One clear line for a bad range."""
    from hsched.spec.sizes import size_range

    for key, least in (("gpus", 0), ("nodes", 1)):
        if o.get(key) is None:
            continue
        try:
            o[key], hi = size_range(o[key], f"--{key}", minimum=least)
        except ValueError as e:
            raise UserError(str(e)) from None
        o[f"{key}_max"] = hi
        if hi is not None and key == "nodes":
            res["nodes_max"] = hi


def _hosts(o: dict[str, Any], res: dict[str, Any]) -> dict[str, list[str]]:
    """-w/--nodelist and -x/--exclude as node names (Slurm's host lists expanded), checked against each other and
    --nodes as sbatch checks them; without --nodes the job gets every listed node, as sbatch's."""
    from hsched.spec import hostlist

    out: dict[str, list[str]] = {}
    for key in ("nodelist", "exclude"):
        if o.get(key) is not None:
            try:
                out[key] = hostlist.expand(o[key])
            except ValueError as e:
                raise UserError(f"--{key} {o[key]!r}: expected {e}") from None
    both = sorted(set(out.get("nodelist", ())) & set(out.get("exclude", ())))
    if both:
        raise UserError(f"--nodelist and --exclude both name {both[0]}; drop it from one of them")
    wanted = out.get("nodelist")
    if wanted:
        nodes = o.get("nodes") or (res.get("nodes") if isinstance(res.get("nodes"), int) else None)
        if nodes is None:
            o["nodes"] = len(wanted)  # sbatch: the job contains every listed node
        elif nodes != len(wanted):
            # sbatch refuses fewer nodes than listed; hsched runs only on listed nodes, so not more either
            raise UserError(f"--nodelist {o['nodelist']!r} names {len(wanted)} node(s) and --nodes is {nodes}: the "
                            f"job runs on exactly the listed nodes; list {nodes} node(s) or drop --nodes")
    return out


def _tasks(ntasks: int, res: dict[str, Any], table: dict[str, Any]) -> None:
    """sbatch's --ntasks: on one node the command runs once with N tasks for `srun` in it (table `ntasks`); over
    several nodes the tasks are hsched's ranks, N / nodes on each (`resources.tasks_per_node`)."""
    nodes: int = res["nodes"] if isinstance(res.get("nodes"), int) and res["nodes"] > 0 else 1
    if ntasks % nodes:
        raise UserError(f"--ntasks {ntasks}: not a multiple of --nodes {nodes}")
    tpn = res.get("tasks_per_node")
    if tpn is not None and tpn != ntasks // nodes:
        raise UserError(f"--ntasks {ntasks} and --tasks-per-node {tpn} disagree on {nodes} node(s); give one")
    if nodes > 1:
        res["tasks_per_node"] = ntasks // nodes
    else:
        res.pop("tasks_per_node", None)
        table["ntasks"] = ntasks


def check_nodes(c: Any, hosts: dict[str, list[str]]) -> None:
    """Refuse -w/-x naming a node the controller's fleet does not have (sbatch's "Invalid node name specified"),
    before the job is queued."""
    known = c.call("partitions").get("nodes")
    if known is None:
        return  # a controller from before node names were listed: its round still refuses a job no node can run
    for key in ("nodelist", "exclude"):
        unknown = [n for n in hosts.get(key, ()) if n not in known]
        if unknown:
            raise UserError(f"--{key}: invalid node name {unknown[0]!r}: no such node in the fleet (nodes: "
                            f"{', '.join(sorted(known)) or 'none'})")
    if hosts.get("exclude") and not set(known) - set(hosts["exclude"]):
        # sbatch: "Requested node configuration is not available"
        raise UserError(f"--exclude: requested node configuration is not available: it leaves no node of the fleet "
                        f"(nodes: {', '.join(sorted(known))})")


def _file_pattern(key: str, value: str) -> str:
    """--output/--error's pattern, refused here naming the option (a spec file's is checked by the controller,
    naming its key)."""
    from hsched.spec.outfiles import env_like, pattern_problem

    if key == "error" and env_like(value):
        # `-e NAME=VALUE` was hsched's --env before -e became sbatch's: never make a file of someone's variable
        raise UserError(f"--error {value!r}: -e is sbatch's --error FILE; give --env {value} for an environment "
                        f"variable (or --error ./{value} for a file of that name)")
    why = pattern_problem(value)
    if why:
        raise UserError(f"--{key} {value!r}: {why}")
    return value


def check(table: dict[str, Any], source: str) -> None:
    """What the controller would refuse, said here: for bad input while no controller runs yet."""
    from hsched.config import job_spec_from_table, load_settings
    from hsched.paths import Home

    settings = load_settings(Home.from_env().settings)
    job_spec_from_table(table, source, settings.qos_names, settings.default_qos)


def check_partitions(c: Any, text: str) -> None:
    """Refuse a partition no node of the controller's fleet carries, naming the ones there are (sbatch's
    "invalid partition name specified"), before the job is queued."""
    from hsched.spec.constraints import partition_names

    known = c.call("partitions")["partitions"]
    unknown = [p for p in partition_names(text) if p not in known]
    if unknown:
        have = ", ".join(sorted(known)) or "none: no node of the fleet file has labels"
        raise UserError(f"--partition {unknown[0]!r}: no such partition (partitions are the fleet file's "
                        f"[[node]] labels; known: {have})")


def test_only_line(g: dict[str, Any]) -> str:
    """sbatch --test-only's line: `hsched: the job would start now on a` / `... at 2026-... (in 1h12m) on a: ...` /
    `hsched: not before 2026-...` (hsched.controller.forecast: the controller's round, stepped forward)."""
    where = ", ".join(g.get("nodes") or []) or "no node"
    if g.get("now"):
        text = f"hsched: the job would start now on {where}"
    elif g.get("start_time"):
        left = int(g["start_in_s"])
        text = (f"hsched: the job would start at {g['start_time']} (in {left // 3600}h{left % 3600 // 60:02d}m) "
                f"on {where}: {g['reason']}")
    else:
        text = f"hsched: {g['reason']}"
    if g.get("expected_duration_s") is not None:
        text += f"; jobs of its kind run about {int(g['expected_duration_s'])} s"
    return text


def missing_script(word: str) -> str | None:
    """The one line refusing `hsched submit WORD ...` when WORD reads as a script's name (a path, or a name with an
    extension) that is neither a file nor a program on PATH: sbatch refuses a script it cannot open, where hsched
    queued it as a command that then failed with 127. (A bare name may be a program only the nodes have: `--`
    before a command always runs it as given.)"""
    import shutil

    looks_like_file = "/" in word or "." in os.path.basename(word).strip(".")
    if not looks_like_file or os.path.exists(word) or shutil.which(word) is not None:
        return None
    return (f"hsched submit: {word}: no such file (a batch script's path, or a program on PATH); check the name, or "
            f"put `--` before a command to run it as given")


def _after_dashes(word: str) -> bool:
    """Whether the command line put `--` right before `word`: that runs it as given, never refused as a missing
    script. Both parsers (Typer's and the quick one) drop the `--`, so the command line itself says."""
    argv = sys.argv
    return any(argv[i] == "--" and argv[i + 1] == word for i in range(len(argv) - 1))


def submit(o: dict[str, Any], args: list[str], table: dict[str, Any], source: str) -> None:
    """Queue the job `o` and `args` make of `table` (see job_table) and print what the options ask for."""
    if (source == "<command line>" and args and args[0] != "--" and not _after_dashes(args[0])
            and (why := missing_script(args[0])) is not None):
        raise UserError(why)
    table = job_table(o, args, table)
    environ = dict(os.environ)
    environ["PWD"] = os.getcwd()
    with _client() as c:
        if not c.reachable():
            check(table, source)  # fail fast, before a controller is started for it
        if o.get("partition"):
            check_partitions(c, o["partition"])
        if o.get("nodelist") or o.get("exclude"):
            from hsched.spec import hostlist

            check_nodes(c, {k: hostlist.expand(o[k]) for k in ("nodelist", "exclude") if o.get(k)})
        if o.get("test_only"):
            # sbatch --test-only: when and where it would start; nothing is queued
            guess = c.call("test_only", spec=table, source=source)
            print_json(guess) if o.get("as_json") else print(test_only_line(guess))
            return
        job = c.call("submit", spec=table, source=source, user=_user(), environ=environ)
    if o.get("parsable"):
        print(job["id"])
    elif o.get("as_json"):
        print_json(job)
    else:
        # sbatch's very line (an array's too), which scripts parse (`awk '{print $4}'`, `${out##* }`)
        print(f"Submitted batch job {job['id']}")


def hetjob_table(o: dict[str, Any], args: list[str], table: dict[str, Any]) -> dict[str, Any]:
    """`hsched submit [OPTIONS] -- CMD : [OPTIONS] -- CMD ...` (sbatch's heterogeneous job, hsched.spec.components):
    the job table with a `component` list. The options before the first `:` are the job's and component 0's
    resources (its --env and --workdir the job's, every component's); each later component gives only its own
    (resources, --env, --workdir)."""
    from hsched.spec.components import check_component_options, split_argv

    parts = split_argv(args[1:] if args[:1] == ["--"] else args)
    for i, words in enumerate(parts):
        if not [w for w in words if w != "--"]:
            raise UserError(f"component {i} is empty: give each component a command, as in hsched submit --gpus 1 "
                            f"-- prep.py : --gpus 2 -- train.py")
    first = job_table(o, parts[0], table)
    comps = [{"command": first.pop("command"), **({"resources": first.pop("resources")} if "resources" in first
                                                 else {})}]
    if "constraint" in first:
        comps[0]["constraint"] = first.pop("constraint")
    by_option = {opt: name for name, (opts, *_rest) in OPTIONS.items() for opt in opts}
    for i, words in enumerate(parts[1:], 1):
        check_component_options(i, words, by_option, {n for n, (_o, kind, *_r) in OPTIONS.items() if kind == FLAG})
        parsed = quick.parse(words, OPTIONS)
        if parsed is None:
            raise UserError(f"component {i}: cannot read its options ({' '.join(words)}): give them as --gpus 2 "
                            f"--gpu-type h100 -- CMD")
        oi, rest = parsed
        if not rest:
            raise UserError(f"component {i} has no command: give it after its options and `--`")
        t = job_table(oi, rest, {})
        comps.append({k: v for k, v in t.items() if k in ("command", "resources", "env", "workdir")})
    first["component"] = comps
    return first
