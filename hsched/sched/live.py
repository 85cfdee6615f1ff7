"""The live controller's scheduling seam, by its old name: `schedule(fleet, queue, now)` and the names other modules
import from here. The round itself is a pipeline of stages over one state:

    hsched.sched.fleet       what a round reads and decides (FleetView, Running, Launch, Wait, Move, Decision)
    hsched.sched.cache       RoundCache: what one round keeps for the next, owned by the caller
    hsched.sched.state       the ledger and index (free, held, taken devices; when they free); `fit`
    hsched.sched.stages      eligibility, caps, sharing, plan (with moves), reservation, backfill, preemption,
                             locality (with `prefetch_targets`), groups (Slurm node groups)
    hsched.sched.pipeline    `schedule`: the stages in order

Pure: no I/O, no state.
"""

from __future__ import annotations

from hsched.sched.cache import RoundCache
from hsched.sched.fleet import (
    Chosen,
    Decision,
    DeviceChooser,
    FleetView,
    Launch,
    Move,
    Running,
    Wait,
    catalog_throughput,
    default_chooser,
    gpu_type_of,
    minute,
    order,
    topology_chooser,
)
from hsched.sched.pipeline import schedule
from hsched.sched.preempt import PreemptRule, Victims
from hsched.sched.stages.eligibility import (
    constraint_of,
    eligible_devices,
    host_memory_per_gpu,
    resolve_gpu_types,
    unsatisfiable,
)
from hsched.sched.stages.locality import PREFETCH_JOBS, PREFETCH_LOOKAHEAD, prefetch_targets
from hsched.sched.stages.plan import LivePlacer
from hsched.sched.view import Preempt

_minute = minute
"""(the old private name, still imported by tests)"""

__all__ = [
    "PREFETCH_JOBS",
    "PREFETCH_LOOKAHEAD",
    "Chosen",
    "Decision",
    "DeviceChooser",
    "FleetView",
    "Launch",
    "LivePlacer",
    "Move",
    "Preempt",
    "PreemptRule",
    "RoundCache",
    "Running",
    "Victims",
    "Wait",
    "catalog_throughput",
    "constraint_of",
    "default_chooser",
    "eligible_devices",
    "gpu_type_of",
    "host_memory_per_gpu",
    "order",
    "prefetch_targets",
    "resolve_gpu_types",
    "schedule",
    "topology_chooser",
    "unsatisfiable",
]
