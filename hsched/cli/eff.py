"""`hsched eff JOB`: how well a job used what it held (seff's role): state, exit code, elapsed time per run,
GPUs and GPU-hours, GPU utilization and memory peak, CPU efficiency and memory peak (from each run's cgroup:
CPU time over cores allocated x elapsed, peak over memory requested or the node's share), from the monitoring
samples the controller folded while it ran (hsched.learn.efficiency), and what kind of work that was (its profile,
hsched.learn.profiles). No progress or time left is shown: an ended job's estimate is history."""

from __future__ import annotations

from typing import Any

import typer

from hsched.cli import complete
from hsched.cli._common import handle_errors, print_json

NO_SAMPLES = "no samples"


def _size(mib: int | None) -> str:
    if mib is None:
        return "?"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


def _pct(ratio: float | None) -> str:
    return "" if ratio is None else f" ({100 * ratio:.0f}%)"


def figure_lines(f: dict[str, Any], indent: str = "") -> list[str]:
    """The figures of a run or of the whole job, one line each; a figure no sample carried says so."""
    util = f.get("gpu_utilization")
    simulated = f.get("simulated") and util is None
    no_gpus = f.get("gpus") == 0  # a CPU job: nothing to read, rather than nothing read
    if util is None:
        u = ("simulated GPUs: made-up readings, not measured" if simulated else "no GPUs held" if no_gpus
             else NO_SAMPLES)
    else:
        u = f"{util['mean']:.1f}% mean"
        busiest, idlest = util.get("busiest"), util.get("idlest")
        if busiest and idlest and busiest["uuid"] != idlest["uuid"]:
            u += f" (busiest GPU {busiest['mean']:.1f}%, idlest {idlest['mean']:.1f}%)"
    mem = f.get("gpu_memory")
    m = ("simulated GPUs" if simulated else "no GPUs held" if no_gpus else NO_SAMPLES) if mem is None else (
        f"{_size(mem['peak_mib'])} of {_size(mem['total_mib'])}{_pct(mem.get('ratio'))}")
    cpu = f.get("cpu")
    if cpu is None:
        c = NO_SAMPLES
    elif cpu.get("efficiency") is not None:
        n = cpu["cpus"]
        of = f"{n:g} CPU{'' if n == 1 else 's'}" + (" asked" if cpu.get("cpus_from") == "asked" else
                                                    ", its share of the node,")
        c = f"{100 * cpu['efficiency']:.1f}% ({cpu['cores_mean']:.2f} of {of} on average)"
    else:
        c = f"{cpu['cores_mean']:.2f} CPUs on average (no --cpus asked: no efficiency)"
    host = f.get("host_memory")
    if host is None:
        h = NO_SAMPLES
    else:
        asked = host.get("requested_mib")
        h = _size(host["peak_mib"]) + (
            f" of {_size(int(asked))} {'asked' if host.get('requested_from') == 'asked' else '(its share of the node)'}"
            f"{_pct(host.get('ratio'))}" if asked else "")
    return [f"{indent}Samples: {f.get('samples', 0)}", f"{indent}GPU utilization: {u}",
            f"{indent}GPU memory peak: {m}", f"{indent}CPU efficiency: {c}", f"{indent}Host memory peak: {h}"]


def render(e: dict[str, Any]) -> list[str]:
    from hsched.cli.listing import _clock
    from hsched.learn.profiles import profile_line

    exit_code = "-" if e.get("exit_code") is None else str(e["exit_code"])
    lines = [f"Job {e.get('display_id') or e['id']} ({e['name']}) of {e['user']}",
             f"State: {e['state']}" + (f" ({e['reason']})" if e.get("reason") else "") + f", exit code {exit_code}",
             f"Elapsed: {_clock(int(e['elapsed_s']))} over {len(e['runs'])} run(s); "
             f"GPU-hours: {e['gpu_hours']:.2f}"]
    for r in e["runs"]:
        code = "-" if r.get("exit_code") is None else str(r["exit_code"])
        lines.append(f"Run {r['attempt']} on {','.join(r['nodes'])}: {r['state']}, exit code {code}, "
                     f"{_clock(int(r['elapsed_s']))}, {r['gpus']} GPU(s), {r['gpu_hours']:.2f} GPU-hours")
        if len(e["runs"]) > 1:
            lines += figure_lines(r, "  ")
            lines.append(f"  Profile: {profile_line(r.get('profile'))}")
    lines += figure_lines(e)
    lines.append(f"Profile: {profile_line(e.get('profile'))}")
    sources = {(f.get(k) or {}).get("source") for f in [e, *e["runs"]] for k in ("cpu", "host_memory")}
    if "gpu processes" in sources:
        lines.append("(CPU and memory: the job's GPU processes only, a floor; no cgroup was read)")
    elif "processes" in sources:
        lines.append("(CPU and memory from the processes' accounting, no cgroup: the memory peak is the largest "
                     "process's, a floor)")
    return lines


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def eff(
        job_id: str = typer.Argument(..., metavar="JOB", autocompletion=complete.job_ids),
        as_json: bool = typer.Option(False, "--json", help="The same fields as JSON."),
    ) -> None:
        """How well a job used what it held (seff's role): GPU utilization and memory, CPU efficiency, host
        memory, per run and in all."""
        from hsched.cli.control import job_ids_of
        from hsched.cli.jobs import _client

        with _client() as c:
            reply = c.call("eff", id=job_ids_of(c, [job_id], whole_arrays=False)[0])
        if as_json:
            print_json(reply)
            return
        print("\n".join(render(reply)))
