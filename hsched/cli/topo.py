"""CLI commands for topology: `hsched topo parse FILE [--json]` and `hsched place --topology FILE --gpus K`.

Both work on captured tool output, no controller needed (CONTRACT.md, "Topology and placement").
Heavy imports (networkx, rich tables) happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from hsched.cli import complete
from hsched.cli._common import handle_errors, print_json
from hsched.errors import UserError

# Colour by link class, the way nvidia-smi users read the matrix: fabric green, same switch cyan,
# host bridge yellow, across bridges in a socket magenta, across sockets red.


def _warn(lines: Any) -> None:
    for w in lines:
        sys.stderr.write(f"hsched: warning: {w}\n")


def _render_topology(topo: Any, source: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from hsched.theme import link_color
    from hsched.topo.graph import tree_lines
    from hsched.topo.topology import format_cpulist

    heads = [d.name for d in topo.devices] + [n.name for n in topo.nics]
    # a matrix is only readable unwrapped: widen past the terminal as nvidia-smi does
    needed = 8 * len(heads) + max((len(n.label) for n in topo.nics), default=0) + 50
    console = Console()
    if console.width < needed:
        console = Console(width=needed)
    lmap = topo.link_map()
    table = Table(title=f"{source} ({topo.source_format})", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("")
    for h in heads:
        table.add_column(h, justify="center")
    table.add_column("CPU Affinity")
    table.add_column("NUMA")
    for row in heads:
        cells = []
        for col in heads:
            if row == col:
                cells.append("[dim]X[/]")
                continue
            lk = lmap.get(frozenset((row, col)))
            if lk is None:
                cells.append("[dim]-[/]")
            else:
                cells.append(f"[{link_color(lk.kind)}]{lk.kind}[/]")
        dev = topo.device(row)
        nic = next((n for n in topo.nics if n.name == row), None)
        cpu = format_cpulist(dev.cpu_affinity) if dev else ""
        numa_val = dev.numa_node if dev else nic.numa_node if nic else None
        label = row if not (nic and nic.device and nic.device != row) else f"{row} ({nic.device})"
        table.add_row(label, *cells, cpu or "N/A", "N/A" if numa_val is None else str(numa_val))
    console.print(table)
    console.print("\n".join(tree_lines(topo)), highlight=False)
    if topo.partial:
        _warn([f"{source}: partial result"])
    _warn(topo.warnings)


def _render_other(result: Any, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    data = result.to_json()
    if (
        "gpus" in data
        and data["gpus"]
        and isinstance(data["gpus"][0], dict)
        and "index" in data["gpus"][0]
        and "name" in data["gpus"][0]
    ):
        # a MIG instance as hsched names it (GPU0.1 under GPU0), with its profile where the capture gives one
        cols = ["device", "name", "uuid", "pci_bus_id", "memory_total_mib", "MIG"]
        if any(g.get("affine_cpus") for g in data["gpus"]):
            cols.append("affine_cpus")
        table = Table(title=f"{source} ({data.get('format')})", title_justify="left")
        for c in cols:
            table.add_column(c)
        for g in data["gpus"]:
            mig = g.get("mig_profile") or ("slice" if g.get("mig_parent") is not None else
                                           {True: "on", False: "off"}.get(g.get("mig_current")))
            cells = {**g, "MIG": mig}
            table.add_row(*["N/A" if cells.get(c) in (None, "") else str(cells.get(c)) for c in cols])
        console.print(table)
        if any(g.get("mig_parent") is not None or g.get("mig_current") for g in data["gpus"]):
            # MIG changes what is schedulable: say what hsched would hand out
            names = [d["name"] for d in data.get("devices", [])]
            console.print("hsched devices: " + (", ".join(names) + " (a GPU in MIG mode only as its instances)"
                          if names else "none (the capture names no UUID; `nvidia-smi -L` does)"), highlight=False)
    elif "nodes" in data:
        facts = [f"{k.replace('_', ' ')} {data[k]}" for k in
                 ("sockets", "cores_per_socket", "threads_per_core", "cpus", "model_name") if data.get(k) is not None]
        console.print(f"{source} ({data.get('format')}): " + (", ".join(facts) or "no CPU counts"), highlight=False)
        if data["nodes"]:
            table = Table()
            for c in ("node", "cpus", "memory_mib"):
                table.add_column(c)
            for n in data["nodes"]:
                table.add_row(
                    str(n["id"]), n["cpus"] or "-", "N/A" if n.get("memory_mib") is None else str(n["memory_mib"])
                )
            console.print(table)
    else:
        console.print_json(data=data)
    _warn(data.get("warnings", []))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    topo_app = typer.Typer(
        name="topo",
        help="Read captured topology output (nvidia-smi topo -m, rocm-smi, amd-smi ...).",
        no_args_is_help=True,
    )

    @topo_app.command("parse")
    @handle_errors
    def parse_cmd(
        file: Path = typer.Argument(
            ...,
            help="Captured tool output (nvidia-smi topo -m, -L, -q, the nvidia-smi table, --query-gpu CSV, "
            "topo -c; rocm-smi, amd-smi topology/static/list; numactl -H, lscpu, lscpu -e/-p).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Parse a capture and print its devices, NICs and links (or inventory / NUMA layout); MIG devices as
        hsched names them (GPU0.1)."""
        from hsched.topo.parse import read_capture
        from hsched.topo.topology import Topology

        result = read_capture(file)
        if json_out:
            if isinstance(result, Topology):
                result = result.with_bandwidth()
            print_json(result.to_json())
            if result.partial:
                _warn([f"{file}: partial result", *result.warnings])
            return
        if isinstance(result, Topology):
            _render_topology(result, str(file))
        else:
            _render_other(result, str(file))

    @topo_app.command("show")
    @handle_errors
    def show_cmd(
        node: str | None = typer.Argument(None, help="A node of the fleet (default: every node with GPUs).",
                                          autocompletion=complete.node_names),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document per node, in a list."),
    ) -> None:
        """A fleet node's link matrix and tree, as the controller knows them."""
        from hsched.client import Client
        from hsched.errors import UserError
        from hsched.serialize import node_from_dict
        from hsched.topo.place import topology_of_node

        with Client() as c:
            nodes = c.call("nodes")
        if node is not None:
            nodes = [n for n in nodes if n["name"] == node]
            if not nodes:
                raise UserError(f"no node {node!r}; `hsched nodes` lists them")
        nodes = [n for n in nodes if n["devices"]]
        out = []
        for raw in nodes:
            topo = topology_of_node(node_from_dict(raw))
            if json_out:
                out.append({"node": raw["name"], **topo.with_bandwidth().to_json()})
            else:
                _render_topology(topo, raw["name"])
        if json_out:
            print_json(out)

    app.add_typer(topo_app, name="topo")

    @app.command("place")
    @handle_errors
    def place_cmd(
        topology: Path = typer.Option(..., "--topology", help="Captured `nvidia-smi topo -m` (or AMD) output."),
        gpus: int = typer.Option(..., "--gpus", help="How many devices the job needs."),
        busy: str = typer.Option("", "--busy", help="Devices already in use, comma separated (GPU1,GPU5)."),
        gpu_type: list[str] = typer.Option([], "--gpu-type", help="Model substring (needs models in the input)."),
        interconnect: str = typer.Option("any", "--interconnect", help="nvlink (required) or any."),
        cpus: int | None = typer.Option(None, "--cpus", help="CPU cores to pick near the chosen GPUs."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """The best K free GPUs of a machine, with a one-line explanation."""
        from hsched.topo.parse import read_topology_file
        from hsched.topo.place import Constraints, place

        if interconnect not in ("any", "nvlink"):
            raise UserError(f"--interconnect: expected 'nvlink' or 'any', got {interconnect!r}")
        topo = read_topology_file(topology)
        busy_set = {b.strip() for b in busy.split(",") if b.strip()}
        result = place(
            topo, gpus, busy_set, Constraints(gpu_types=tuple(gpu_type), interconnect=interconnect, cpus=cpus)
        )
        if topo.partial:
            _warn([f"{topology}: partial topology; unknown links rank lowest", *topo.warnings])
        if json_out:
            print_json(result.to_json())
            return
        from rich.console import Console

        console = Console()
        console.print(f"[bold]{', '.join(result.devices)}[/]", highlight=False)
        console.print(result.explanation, highlight=False)
        console.print(
            f"score {result.score:g} GB/s weakest pair" + ("" if result.exact else " (heuristic)"), highlight=False
        )
        if result.cpus:
            from hsched.topo.topology import format_cpulist

            console.print(f"cpus {format_cpulist(result.cpus)}", highlight=False)
