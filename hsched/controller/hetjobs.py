"""A heterogeneous job's runs (sbatch's hetjobs, hsched.spec.components): which component each run is, what it is
told about the others, and how an end names it.

The round places the components in order (hsched.sched.stages.hetjob); each component has nodes x tasks_per_node
runs, numbered after the earlier components' (`hsched.model.component_ranks`). Each run gets its component's
command, resources and working folder, and an environment (`component_env`) saying which component it is and where
every component runs:

    HSCHED_COMPONENT=i  HSCHED_COMPONENTS=n  HSCHED_COMPONENT_<k>_HOSTS=addr,...  HSCHED_COMPONENT_<k>_PORT=p
    SLURM_HET_SIZE=n  SLURM_HET_JOB_ID=id  SLURM_HET_JOB_OFFSET=i  SLURM_JOB_NODELIST_HET_GROUP_<k>=node,...
    SLURM_JOB_NUM_NODES_HET_GROUP_<k>  SLURM_JOB_ID_HET_GROUP_<k>=id

and its own gang's (within the component) ranks: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, SLURM_PROCID/NTASKS.
A component's port is the controller's choice for this attempt (`component_port`): a number in 40000-59999 that
differs between jobs, attempts and components, where component k's own first host listens for the others.
"""

from __future__ import annotations

import zlib

from hsched.controller.core import Controller
from hsched.model import Component, Job, JobSpec, Placement, Resources, Run, component_placements, component_ranks
from hsched.spec.components import component_env as spec_env


def share_resources(spec: JobSpec, k: int) -> Resources:
    """The resources of the job's `k`th placement (one node's share): its component's."""
    at = 0
    for c in spec.components:
        at += c.resources.nodes
        if k < at:
            return c.resources
    return spec.resources


def component_of(spec: JobSpec, rank: int) -> Component | None:
    """The component run `rank` of a heterogeneous job belongs to; None for an ordinary job."""
    if not spec.components:
        return None
    ranks = component_ranks(spec)
    return spec.components[ranks[rank][0]] if rank < len(ranks) else None


def index_of(spec: JobSpec, rank: int) -> int:
    """The number of the component run `rank` belongs to (0 for an ordinary job)."""
    ranks = component_ranks(spec)
    return ranks[rank][0] if rank < len(ranks) else 0


def placement_of(job: Job, run: Run) -> Placement | None:
    """The run's own placement (two components may share a node: its node alone does not say which)."""
    i, local, _n = component_ranks(job.spec)[run.rank]
    ps = component_placements(job.spec, job.placement)[i]
    tpn = job.spec.components[i].resources.tasks_per_node
    return ps[local // tpn] if local // tpn < len(ps) else None


def run_ranks(ctl: Controller, job: Job, placements: tuple[Placement, ...], now: float) -> list[tuple[Placement, str]]:
    """The runs to make for a heterogeneous job's launch, in rank order: (placement, run folder)."""
    attempt = job.restarts + 1
    out: list[tuple[Placement, str]] = []
    for c, ps in zip(job.spec.components, component_placements(job.spec, placements), strict=True):
        for p in ps:
            for _ in range(c.resources.tasks_per_node):
                rank = len(out)
                out.append((p, str(ctl.run_folder(job, p.node) / f"{job.id}-{attempt}-r{rank}-{int(now * 1000)}")))
    return out


def component_port(job_id: int, attempt: int, i: int) -> int:
    """Component `i`'s port for this attempt: differs between jobs, attempts and components (a requeued job's
    components rebind cleanly), outside the range of the gangs' MASTER_PORT (20000-39999)."""
    return 40000 + zlib.crc32(f"{job_id}/{attempt}/{i}".encode()) % 20000


def address(ctl: Controller, node: str) -> str:
    """Where other machines reach `node`: its fleet file's host, else this machine (local nodes)."""
    rt = ctl.nodes.get(node)
    return rt.config.host if rt is not None and rt.config.host else "127.0.0.1"


def component_env(ctl: Controller, job: Job, run: Run, placements: tuple[Placement, ...]) -> dict[str, str]:
    """What run `run` of heterogeneous job `job` is told (the module docstring): over job_env's, which are the
    whole job's."""
    spec = job.spec
    n = len(spec.components)
    i, local, world = component_ranks(spec)[run.rank]
    mine = component_placements(spec, placements)
    tpn = spec.components[i].resources.tasks_per_node
    env = dict(spec_env(spec, i))  # the job's variables, then the component's own
    env.update({
        "HSCHED_COMPONENT": str(i), "HSCHED_COMPONENTS": str(n),
        "SLURM_HET_SIZE": str(n), "SLURM_HET_JOB_ID": str(job.id), "SLURM_HET_JOB_OFFSET": str(i),
        "CUDA_VISIBLE_DEVICES": ",".join(run.devices), "SLURM_GPUS_ON_NODE": str(len(run.devices)),
    })
    for k, ps in enumerate(mine):
        env[f"HSCHED_COMPONENT_{k}_HOSTS"] = ",".join(address(ctl, p.node) for p in ps)
        env[f"HSCHED_COMPONENT_{k}_NODES"] = ",".join(p.node for p in ps)
        env[f"HSCHED_COMPONENT_{k}_PORT"] = str(component_port(job.id, run.attempt, k))
        env[f"SLURM_JOB_NODELIST_HET_GROUP_{k}"] = ",".join(p.node for p in ps)
        env[f"SLURM_JOB_NUM_NODES_HET_GROUP_{k}"] = str(len(ps))
        env[f"SLURM_JOB_ID_HET_GROUP_{k}"] = str(job.id)
    own = mine[i]
    nodes = ",".join(p.node for p in own)
    env.update({
        # its own gang: the component's ranks, as an ordinary job of its resources would have them
        "SLURM_PROCID": str(local), "SLURM_NTASKS": str(world), "SLURM_LOCALID": str(local % tpn),
        "SLURM_NODEID": str(local // tpn), "SLURM_JOB_NUM_NODES": str(len(own)), "SLURM_NNODES": str(len(own)),
        "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes,
        "RANK": str(local), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local % tpn), "LOCAL_WORLD_SIZE": str(tpn),
        "NODE_RANK": str(local // tpn), "GROUP_RANK": str(local // tpn), "HSCHED_GANG_NODES": nodes,
        "MASTER_ADDR": address(ctl, own[0].node) if own else "127.0.0.1",
        "MASTER_PORT": env[f"HSCHED_COMPONENT_{i}_PORT"],
    })
    return env


def name(spec: JobSpec, rank: int) -> str:
    """'component 1 (train.py)': how events name the component of run `rank`."""
    i = index_of(spec, rank)
    return f"component {i} ({spec.components[i].label})"
