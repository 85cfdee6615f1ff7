"""The controller's view of the fleet: one executor per node, probes turned into Node values."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from hsched.clock import Clock
from hsched.config import FleetConfig, NodeConfig
from hsched.errors import ExecutorError, HelperError, NodeUnreachable, UserError
from hsched.executors.base import Executor
from hsched.model import Device, Link, Nic, Node, NodeState
from hsched.serialize import nic_from_dict
from hsched.simulated import simulated_devices
from hsched.topo.inventory import MIG_INDEX, profile_memory_mib
from hsched.topo.parse_net import nics_near
from hsched.topo.parse_nvidia import parse_topo_matrix

log = logging.getLogger("hsched.fleet")

HISTORY = 300
"""Samples kept per device (5 minutes at 1 Hz) for sparklines."""

T = TypeVar("T")

@dataclass
class NodeRuntime:
    config: NodeConfig
    executor: Executor
    node: Node
    last_ok: float | None = None
    """When a probe last came back whole (GPUs included), on the monotonic clock; None before the first."""
    probe_error: ExecutorError | None = None
    """Why the last probe failed (typed: NodeRefused needs a person), None once one succeeded."""
    probe_problem: str | None = None
    """Why the node is unhealthy: its last probe timed out ("probe timed out after 15 s") or the node
    answered it with an error (a helper error, a GPU tool that failed); None once a probe came back whole."""
    probe_task: asyncio.Task[None] | None = None
    """The probe in flight, if any: one at a time per node, never awaited by a request."""
    probed_at: float | None = None
    """When the last probe ended, whatever its outcome (monotonic clock)."""
    back_since: float | None = None
    """When a node that was away was first seen answering again (it gets work after a probe since then;
    monotonic clock)."""
    boot_id: str | None = None
    raw_probe: dict[str, Any] = field(default_factory=dict)
    last_sample: float | None = None
    """When the last monitoring sample arrived (wall time: shown with the host's load)."""
    sample_seen: float | None = None
    """The same on the monotonic clock: the heartbeat's."""
    unreachable_since: float | None = None
    """When the node was last heard from before it went away (monotonic clock): its lease counts from then."""
    history: dict[str, Any] = field(default_factory=dict)
    """Device UUID -> deque of (time, utilization %, memory used MiB)."""
    foreign: dict[str, Any] = field(default_factory=dict)
    """Device UUID -> a GPU process there that no hsched run owns."""
    gpu_processes: dict[str, list[dict[str, Any]]] | None = None
    """Device UUID -> every process on it, from the last monitoring sample; None until a sample listed the
    node's GPU processes (a node without NVML or nvidia-smi never does). Dirty GPUs are cleared from it."""
    host_load: dict[str, Any] = field(default_factory=dict)
    """The last monitoring sample's {"cpu": {"util", "count", "loadavg"}, "memory": {"total_mib", ...}}."""
    host_history: Any = None
    """A deque of (time, host CPU %, host memory used MiB), as `history` keeps the devices'; None before the
    first sample."""
    rebooted: bool = False
    users: dict[str, bool | None] = field(default_factory=dict)
    """Lab mode: user name -> whether that account exists on the node (None: being asked); a job of a user the
    node lacks never lands there. Empty in personal mode, where every job is the owner's."""
    users_asked: dict[str, float] = field(default_factory=dict)
    """When each user's presence was last asked (an absent user is asked again later: accounts get created)."""
    users_task: asyncio.Task[None] | None = None

    @property
    def absent_users(self) -> frozenset[str]:
        """The users not known to exist here (absent, or not yet asked): the node is not eligible for them."""
        return frozenset(u for u, present in self.users.items() if not present)

    @property
    def name(self) -> str:
        return self.config.name

    def heartbeat(self, now: float) -> float | None:
        """The node's last contact of any kind (probe, sample, any exchange); `now` for this machine's own
        nodes, alive while the controller is. All on the monotonic clock (`now` too: the controller's
        `clock.monotonic()`, which the executors' `last_contact` reads): a step of the wall clock makes no node
        that answers look silent, nor a silent one look alive."""
        if self.config.executor == "local":
            return now
        seen = [t for t in (self.last_ok, self.sample_seen, self.executor.last_contact) if t is not None]
        return max(seen) if seen else None


LAB_NODE_ROOT = "/var/lib/hsched-node"
"""A lab controller's folder on its SSH nodes (not root's ~/.cache: users' jobs reach their folders under it)."""


def service_account(lab: bool) -> bool:
    """A lab controller that is not root runs as a service account: it reaches every node, this machine
    included, through the helper installed there and the sudo rule that lets it run exactly that helper."""
    return lab and os.geteuid() != 0


def make_executor(cfg: NodeConfig, *, lab: bool = False) -> Executor:
    helper = cfg.helper
    if helper is None and service_account(lab):
        from hsched.executors._confined import SERVICE_HELPER  # (tarfile and all: only a service lab needs it)

        helper = SERVICE_HELPER
    if cfg.executor == "local":
        from hsched.executors.local import LocalExecutor

        return LocalExecutor(node=cfg.name, simulate=cfg.simulate, helper=helper, discover=cfg.discover)
    if cfg.executor == "ssh":
        # imported here: asyncssh costs a fleet of local nodes (and the CLI) nothing
        from hsched.executors.ssh import SSHExecutor

        return SSHExecutor(cfg, node_root=LAB_NODE_ROOT if lab else None, helper=helper)
    if cfg.executor == "slurm" and cfg.partition:
        from hsched.executors.slurm.executor import SlurmExecutor

        # (through its `login` node over SSH where the entry names one)
        return SlurmExecutor.from_config(cfg)
    raise UserError(f"node {cfg.name}: unknown executor {cfg.executor!r}")


def build_fleet(cfg: FleetConfig, transports: Mapping[str, Executor] | None = None, *,
                lab: bool = False) -> dict[str, NodeRuntime]:
    """The fleet's runtime records, each with its executor (`transports` by node name, for tests; else the one
    its config names)."""
    given = transports or {}
    out: dict[str, NodeRuntime] = {}
    for nc in cfg.nodes:
        devices: tuple[Device, ...] = ()
        links: tuple[Link, ...] = ()
        if nc.simulate is not None:
            devices, links = simulated_devices(nc.name, nc.simulate)
        # PROBING until its first probe answers: known by name only, nothing is placed there
        node = Node(name=nc.name, executor=nc.executor, state=NodeState.PROBING, devices=devices, links=links,
                    host=nc.host, cpus=nc.simulate.cpus if nc.simulate else None,
                    memory_total_mib=nc.simulate.memory_mib_host if nc.simulate else None,
                    message="first probe under way", nics=nc.simulate.nics if nc.simulate else ())
        executor = given.get(nc.name) or make_executor(nc, lab=lab)
        out[nc.name] = NodeRuntime(config=nc, executor=executor, node=node)
    return out


def node_from_probe(rt: NodeRuntime, probe: dict[str, Any]) -> Node:
    sim = rt.config.simulate
    n = rt.node
    numa = probe.get("numa") or []
    if sim is not None:
        devices, links = n.devices, n.links
    else:
        devices, links = _real_devices(probe)
        # a GPU's local cores: NVML's affinity where it gave one, else its NUMA node's CPUs
        cores = {n.get("id"): tuple(n.get("cpus") or ()) for n in numa}
        devices = tuple(d if d.cpu_affinity or d.numa_node not in cores else replace(d, cpu_affinity=cores[d.numa_node])
                        for d in devices)
    return replace(
        n,
        cpus=(sim.cpus if sim and sim.cpus else probe.get("cpus")),
        memory_total_mib=(sim.memory_mib_host if sim and sim.memory_mib_host else probe.get("memory_total_mib")),
        numa_nodes=(sim.numa_nodes if sim else (len(numa) or None)),
        devices=devices,
        links=links,
        message="",
        # its NICs: the simulated ones, else what the probe read of sysfs (an old helper reports none)
        nics=n.nics if sim is not None else probe_nics(probe),
    )


def probe_nics(probe: dict[str, Any]) -> tuple[Nic, ...]:
    """The probe's `nics` (hsched.node.probe.nics) as the model's, skipping what an older or odd helper sent."""
    out = []
    for d in probe.get("nics") or []:
        try:
            out.append(nic_from_dict(d))
        except (KeyError, TypeError, ValueError):
            continue
    matrix = (probe.get("gpus") or {}).get("topo_matrix")
    if out and isinstance(matrix, str) and not any(x.near for x in out):
        # sysfs gave no PCIe paths (a VM, a container without /sys/bus/pci): nvidia-smi topo -m's NIC columns
        try:
            near = nics_near(parse_topo_matrix(matrix))
        except UserError:
            near = {}
        out = [replace(x, near=near.get(x.name, ())) for x in out]
    return tuple(out)




def mig_devices(parent: Device, instances: list[dict[str, Any]]) -> list[Device]:
    """The MIG instances of a GPU in MIG mode (nvml_probe's `mig_devices`) as devices of their own: the
    parent's model with " MIG <profile>", their own memory, the parent's place (NUMA node, CPUs, PCI bus)."""
    from hsched.topo.nvml_probe import mig_profile

    out = []
    for k, m in enumerate(instances):
        uuid_ = m.get("uuid")
        if not uuid_:
            continue
        total = m.get("memory_total")
        profile = m.get("profile") or mig_profile(m.get("name"), total) or f"mig{k}"
        if total is None and (named := profile_memory_mib(profile)) is not None:
            # nvidia-smi -L (the fallback without NVML) gives no memory: the profile names it, in vendor's GB
            total = named << 20
        out.append(replace(parent, uuid=str(uuid_), index=(parent.index + 1) * MIG_INDEX + k,
                           model=f"{parent.model} MIG {profile}",
                           memory_total_mib=int(total) // (1 << 20) if total is not None else None,
                           memory_used_mib=None, utilization_gpu=None, mig_parent=parent.uuid, mig_profile=profile))
    return out


def _real_devices(probe: dict[str, Any]) -> tuple[tuple[Device, ...], tuple[Link, ...]]:
    gpus = probe.get("gpus") or {}
    devices = []
    for i, d in enumerate(gpus.get("devices") or []):
        uuid_ = d.get("uuid")
        if not uuid_:
            continue
        mem_total = d.get("memory_total_mib")
        if mem_total is None and d.get("memory_total") is not None:
            mem_total = int(d["memory_total"]) // (1 << 20)
        mem_used = d.get("memory_used_mib")
        if mem_used is None and d.get("memory_used") is not None:
            mem_used = int(d["memory_used"]) // (1 << 20)
        whole = Device(
            uuid=uuid_, index=d.get("index", i) if d.get("index") is not None else i,
            model=d.get("name") or d.get("model") or "unknown", memory_total_mib=mem_total, memory_used_mib=mem_used,
            utilization_gpu=d.get("utilization_gpu"), numa_node=d.get("numa_node"), pci_bus_id=d.get("pci_bus_id"),
            compute_capability=d.get("compute_capability"), temperature_c=d.get("temperature_c"),
            power_w=d.get("power_w"), cpu_affinity=tuple(d.get("cpu_affinity") or ()),
            host=d.get("slurm_node"),  # a Slurm group's device: the Slurm node it is on
        )
        if d.get("mig_mode_current"):
            # a GPU in MIG mode is its instances: each one schedulable (CUDA_VISIBLE_DEVICES takes MIG UUIDs), the
            # GPU itself never handed out whole, not even while it has no instance (then it offers nothing)
            devices.extend(mig_devices(whole, d.get("mig_devices") or []))
        else:
            devices.append(whole)
    links: tuple[Link, ...] = ()
    topo_text = gpus.get("topo_matrix")
    try:
        from hsched.topo.synthetic import topology_to_links

        if gpus.get("source") == "nvml":
            from hsched.topo.nvml import topology_from_nvml  # type: ignore[import-not-found,unused-ignore]

            links = topology_to_links(topology_from_nvml(gpus), [d.uuid for d in devices])
        elif gpus.get("vendor") == "plugin":
            links = tuple(Link(a=str(lk["a"]), b=str(lk["b"]), kind=str(lk["kind"]),
                               bandwidth_gbps=lk.get("bandwidth_gbps")) for lk in gpus.get("links") or [])
        elif gpus.get("vendor") == "amd":
            links = amd_links(gpus, devices)
        elif topo_text:
            from hsched.topo.parse_nvidia import parse_topo_matrix

            links = topology_to_links(parse_topo_matrix(topo_text, source="nvidia-smi topo -m"),
                                      [d.uuid for d in devices])
    except Exception as e:  # a topology we cannot read leaves the node usable, just not topology-aware
        log.warning("cannot read topology: %s", e)
    return tuple(devices), links


def amd_links(gpus: dict[str, Any], devices: list[Device]) -> tuple[Link, ...]:
    """An AMD node's links (XGMI, PCIe) from the topology text its amd-smi/rocm-smi printed (hsched/node/amd.py
    sends it as printed), read by hsched/topo/parse_amd.py as captures are. The tables name devices by PCI address
    (amd-smi) or by the tool's index (rocm-smi): joined on the address where both have it, else on the index."""
    from hsched.topo import parse_amd
    from hsched.topo.synthetic import topology_to_links
    from hsched.topo.topology import Topology, normalize_bus_id

    text, fmt = gpus.get("topo_text"), gpus.get("topo_format")
    if not isinstance(text, str) or not text.strip():
        return ()
    parsers = {"amd-smi topology --json": parse_amd.parse_amd_smi_topology_json,
               "amd-smi topology": parse_amd.parse_amd_smi_topology, "amd-smi xgmi": parse_amd.parse_amd_smi_xgmi,
               "rocm-smi --json": parse_amd.parse_rocm_json, "rocm-smi --showtopo": parse_amd.parse_rocm_showtopo,
               "rocm-smi --showtoponuma": parse_amd.parse_rocm_showtopo}
    parse = parsers.get(str(fmt))
    if parse is None:
        return ()
    topo = parse(text, source=str(fmt))
    if not isinstance(topo, Topology):
        return ()  # rocm-smi --json without its topology keys: an inventory, no links
    by_bus = {normalize_bus_id(d.pci_bus_id): d.uuid for d in devices if d.pci_bus_id}
    by_index = {d.index: d.uuid for d in devices}
    tdevs = sorted(topo.devices, key=lambda d: d.index)
    if tdevs and all(d.pci_bus_id and normalize_bus_id(d.pci_bus_id) in by_bus for d in tdevs):
        uuids = [by_bus[normalize_bus_id(d.pci_bus_id or "")] for d in tdevs]
    else:
        uuids = [by_index[d.index] for d in tdevs if d.index in by_index]
    return topology_to_links(topo, uuids)


async def within(clock: Clock, seconds: float, aw: Awaitable[T]) -> T:
    """`aw`'s result, or TimeoutError once `seconds` pass on `clock` (then `aw` is cancelled). On the
    controller's clock rather than asyncio's, so that a test's fake clock decides when a probe has hung."""
    task = asyncio.ensure_future(aw)
    timer = asyncio.ensure_future(clock.wait(asyncio.Event(), seconds))
    try:
        await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        # give the cancelled call its chance to clean up, but never wait on it: it is what hung
        task.add_done_callback(_consume)
        raise TimeoutError
    return task.result()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned call's late failure is not "never retrieved" noise


async def probe_node(rt: NodeRuntime, clock: Clock, timeout_s: float, *, gpu_timeout_s: float | None = None) -> None:
    """Probe one node, for at most `timeout_s` on `clock`; its outcome becomes the node's facts and its
    problem (see NodeRuntime.probe_problem), never an exception for the caller. `gpu_timeout_s`: how long the
    node gives its GPU tools (NVML, nvidia-smi) before it kills them and says so (executors/base.py)."""
    ask = rt.executor.probe() if gpu_timeout_s is None else rt.executor.probe(gpu_timeout_s=gpu_timeout_s)
    try:
        probe = await within(clock, timeout_s, ask)
    except TimeoutError:
        # the node (or the way to it) hangs: unhealthy if it answers otherwise, unreachable if not (health.py)
        rt.probe_problem = f"probe timed out after {timeout_s:g} s"
        rt.node = replace(rt.node, message=rt.probe_problem)
        return
    except HelperError as e:
        rt.probe_problem = f"probe failed: {e}"
        rt.node = replace(rt.node, message=rt.probe_problem)
        return
    except (ExecutorError, OSError) as e:
        rt.probe_error = e if isinstance(e, ExecutorError) else NodeUnreachable(str(e) or type(e).__name__)
        rt.probe_problem = None
        rt.node = replace(rt.node, message=str(rt.probe_error) or type(e).__name__)
        return
    finally:
        rt.probed_at = clock.monotonic()
    read_plugin(probe)
    rt.raw_probe = probe
    if rt.boot_id is not None and probe.get("boot_id") not in (None, rt.boot_id):
        rt.rebooted = True
    rt.boot_id = probe.get("boot_id")
    rt.probe_error = None
    rt.probe_problem = gpu_problem(rt, probe)
    node = node_from_probe(rt, probe)
    if rt.probe_problem is None:
        rt.last_ok = clock.monotonic()
    else:
        # its GPUs are unknown now, not gone (runs may hold them): what was known of them stays, and the node
        # is not "probed" for what a submit can count on until its GPU tools answer again
        node = replace(node, devices=rt.node.devices, links=rt.node.links)
    # the state is the health check's to decide (hsched.controller.health); a probe only brings facts
    rt.node = replace(node, state=rt.node.state, message=rt.probe_problem or "")


def read_plugin(probe: dict[str, Any]) -> None:
    """A discovery plugin's output (hsched/node/plugin.py sends it as printed) checked and turned into the probe's
    device list, in place; output that does not follow the schema (hsched/topo/plugin.py) is the node's GPU probe
    error: one line, the node UNHEALTHY (gpu_problem), nothing of it read."""
    from hsched.topo.plugin import PluginError, parse_plugin_output

    gpus = probe.get("gpus")
    if not isinstance(gpus, dict) or gpus.get("source") != "plugin":
        return
    path = gpus.get("plugin")
    try:
        report = parse_plugin_output(str(gpus.get("output") or ""))
    except PluginError as e:
        probe["gpus"] = {"source": None, "devices": [], "plugin": path, "error": f"discovery plugin {path}: {e}"}
        return
    probe["gpus"] = {
        "source": "plugin", "vendor": "plugin", "plugin": path, "select_env": report.select_env,
        "select_by": report.select_by, "utilization": report.utilization,
        "devices": [{"uuid": d.id, "index": d.index, "name": d.type, "memory_total_mib": d.memory_mib,
                     "numa_node": d.numa_node, "pci_bus_id": d.pci_bus_id, "utilization_gpu": d.utilization}
                    for d in report.devices],
        "links": [{"a": lk.a, "b": lk.b, "kind": lk.kind, "bandwidth_gbps": lk.bandwidth_gbps} for lk in report.links],
    }


def gpu_problem(rt: NodeRuntime, probe: dict[str, Any]) -> str | None:
    """The GPU tools' failure on a node with real GPUs (a hung or broken nvidia-smi answers with an error and
    no devices): such a node is unhealthy, not a node with 0 GPUs. Simulated nodes' devices are not probed."""
    gpus = probe.get("gpus") or {}
    error = gpus.get("error") if isinstance(gpus, dict) else None
    if rt.config.simulate is not None or not error or gpus.get("devices"):
        return None
    line = str(error).splitlines()[0][:300]
    return line if line.startswith(("GPU probe", "AMD GPU probe", "discovery plugin")) else f"GPU probe failed: {line}"
