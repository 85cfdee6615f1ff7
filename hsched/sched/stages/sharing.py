"""Shared GPUs (`--shared`, issue 15): a shared job takes `gpu_memory_mib` of one GPU, packed with other shared jobs
of the same user (CUDA MPS serves one user's clients at a time on a GPU) while their memory fits. They are placed
before the policy plans (the policy plans whole GPUs), and a GPU that holds shared jobs is busy for exclusive ones.
Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable

from hsched.model import Job, Node, Placement
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import Decision, DeviceChooser, FleetView, Launch, Wait, gpu_size
from hsched.sched.stages.locality import Local


class Sharing(Local):
    """The round with shared GPUs: what each shared device has promised (`shared_use`), and who shares it."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        self.shared_use = dict(fleet.shared_use)
        """Device UUID -> GPU memory (MiB) promised to the shared jobs on it, this round's included."""

    def sharing(self) -> dict[str, frozenset[int]]:
        """Device UUID -> the running shared jobs on it (a shared GPU is free only when all of them stop)."""
        got: dict[str, set[int]] = {}
        for r in self.fleet.running:
            if r.job.spec.resources.shared:
                for u in r.devices:
                    got.setdefault(u, set()).add(r.id)
        return {u: frozenset(ids) for u, ids in got.items()}

    def place_shared(self, jobs: Iterable[Job]) -> list[Decision]:
        """Shared jobs (`--shared`: `gpu_memory_mib` of one GPU each), in order: each goes to the GPU already shared
        whose promised memory it fills best (packing: a GPU's last room first), else to a free GPU on the node with
        the fewest free (whole GPUs stay together for exclusive jobs), else it waits. A GPU holding shared jobs is
        busy for exclusive ones."""
        out: list[Decision] = []
        use = self.shared_use
        # one user per shared GPU: CUDA MPS serves one user's clients at a time on a GPU (a second user's would
        # wait behind the first's, whatever memory is left)
        owner = {u: r.job.user for r in self.fleet.running if r.job.spec.resources.shared for u in r.devices}
        for job in jobs:
            res = job.spec.resources
            need = res.gpu_memory_mib or 0
            capped = self.tally.blocked(job)
            if capped is not None:
                out.append(Wait(job.id, capped))
                continue
            best: tuple[tuple[int, int, str, str], Node, str, int] | None = None
            for node in self.nodes_for(job):
                if res.cpus and node.cpus is not None and self.cpus_used.get(node.name, 0) + res.cpus > node.cpus:
                    continue
                if (res.memory_mib and node.memory_total_mib is not None
                        and self.memory_used.get(node.name, 0) + res.memory_mib > node.memory_total_mib):
                    continue
                free_here = self.free.get(node.name, 0)
                for d in node.devices:
                    if d.uuid not in self.eligible(node, res) or d.memory_total_mib is None:
                        continue
                    used = use.get(d.uuid)
                    if used is not None:
                        if (used + need > d.memory_total_mib or d.uuid in self.releasing
                                or owner.get(d.uuid, job.user) != job.user):
                            continue
                        key = (0, -(used + need), node.name, d.uuid)  # the fullest that still fits
                    elif d.uuid not in self.busy:
                        key = (1, free_here, node.name, d.uuid)
                    else:
                        continue
                    if best is None or key < best[0]:
                        best = (key, node, d.uuid, d.memory_total_mib)
            if best is None:
                out.append(self.wait(job.id, self.why(job, None)))
                continue
            _key, node, uuid, total = best
            now_used = use.get(uuid, 0) + need
            idx = next((d.index for d in node.devices if d.uuid == uuid), 0)
            placement = Placement(node.name, (uuid,), f"GPU{idx} shared: {gpu_size(now_used)} of "
                                                      f"{gpu_size(total)} promised to shared jobs")
            if uuid not in use:
                self.hold((uuid,))
            use[uuid] = now_used
            owner[uuid] = job.user
            if res.cpus:
                self.cpus_used[node.name] = self.cpus_used.get(node.name, 0) + res.cpus
            if res.memory_mib:
                self.memory_used[node.name] = self.memory_used.get(node.name, 0) + res.memory_mib
            self.tally.add(job)
            out.append(Launch(job.id, (placement,)))
        return out

