"""Request handlers: one JSON object in, one JSON object out (see hsched/protocol.py)."""

from __future__ import annotations

import base64
import os
from dataclasses import replace
from typing import Any

from hsched.config import job_spec_from_table
from hsched.controller import commands
from hsched.controller.core import ACTIVE_STATES, Controller
from hsched.controller.health import check_health
from hsched.errors import UserError
from hsched.model import NodeState
from hsched.serialize import iso, job_to_dict, node_to_dict, run_to_dict
from hsched.store import job_from_row

API_VERSION = 1


class Api:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self._dicts: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    async def handle(self, op: str, args: dict[str, Any], peer_uid: int) -> Any:
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise UserError(f"unknown request {op!r}")
        if op not in ("ping", "stop"):
            await self.ctl.ready.wait()
        return await fn(args, peer_uid)

    async def op_ping(self, args: dict[str, Any], uid: int) -> Any:
        ops = sorted(name.removeprefix("op_") for name in dir(self) if name.startswith("op_"))
        return {"pid": os.getpid(), "api": API_VERSION, "home": str(self.ctl.home.root),
                "started": iso(self.ctl.started_at), "fleet": self.ctl.fleet_cfg.source,
                "policy": self.ctl.settings.policy, "ops": [*ops, "subscribe"]}

    async def op_submit(self, args: dict[str, Any], uid: int) -> Any:
        table = args.get("spec")
        if not isinstance(table, dict):
            raise UserError("submit: no job spec given")
        settings = self.ctl.settings
        spec = job_spec_from_table(table, args.get("source") or "<command line>", settings.qos_names,
                                   settings.default_qos)
        user = str(args.get("user") or uid)
        env = args.get("environ")
        job = await commands.submit(self.ctl, spec, user, env if isinstance(env, dict) else None)
        return job_to_dict(job)

    async def op_queue(self, args: dict[str, Any], uid: int) -> Any:
        rows = await self.ctl.db(self.ctl.store.job_rows, active_only=not args.get("all"))
        return [self.job_dict(r) for r in rows]

    def job_dict(self, row: Any) -> dict[str, Any]:
        """The contract's job object for a store row, reused while the row is unchanged: most of a long
        queue (ended jobs) never changes, and decoding every spec on every `queue --all` is what costs."""
        key = tuple(row)
        hit = self._dicts.get(row["id"])
        if hit is not None and hit[0] == key:
            return hit[1]
        d = job_to_dict(job_from_row(row))
        self._dicts[row["id"]] = (key, d)
        return d

    async def _job(self, args: dict[str, Any]) -> Any:
        try:
            job_id = int(args["id"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"not a job id: {args.get('id')!r}") from None
        job = await self.ctl.db(self.ctl.store.get_job, job_id)
        if job is None:
            raise UserError(f"no job {job_id}; `hsched queue --all` lists the jobs")
        return job

    async def op_show(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        d = job_to_dict(job)
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        events = await self.ctl.db(self.ctl.store.events, job.id)
        d["runs"] = [run_to_dict(r) for r in runs]
        d["events"] = [{"time": iso(e["time"]), "kind": e["kind"], "message": e["message"], "node": e["node"]}
                       for e in events]
        pre = [e["data"] or {} for e in events if e["kind"] == "preempted"]
        lost = [p["lost_gpu_s"] for p in pre if p.get("lost_gpu_s") is not None]
        d["preemptions"] = {
            "count": len(pre),
            "lost_gpu_s": round(sum(lost), 1) if lost else (0.0 if not pre else None),
            "time_to_free_s": [p.get("time_to_free_s") for p in pre],
        }
        d["env"] = dict(job.spec.env)
        d["resources"] = {"gpus": job.spec.resources.gpus, "gpu_types": list(job.spec.resources.gpu_types),
                          "gpu_memory_mib": job.spec.resources.gpu_memory_mib, "cpus": job.spec.resources.cpus,
                          "memory_mib": job.spec.resources.memory_mib, "nodes": job.spec.resources.nodes,
                          "interconnect": job.spec.resources.interconnect.value}
        d["checkpoint_dir"] = str(self.ctl.home.checkpoints / str(job.id))
        return d

    async def op_cancel(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        return job_to_dict(await commands.cancel(self.ctl, job.id))

    async def op_preempt(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        return job_to_dict(await commands.preempt(self.ctl, job.id))

    async def op_checkpoint(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        return job_to_dict(await commands.checkpoint(self.ctl, job.id))

    async def op_hold(self, args: dict[str, Any], uid: int) -> Any:
        """One job (`id`), or several at once (`ids`: released together, in one scheduling round)."""
        if "ids" in args:
            jobs = [await self._job({"id": i}) for i in args["ids"]]
            return [job_to_dict(j) for j in await commands.hold(self.ctl, [j.id for j in jobs],
                                                                 bool(args.get("hold", True)))]
        job = await self._job(args)
        return job_to_dict((await commands.hold(self.ctl, [job.id], bool(args.get("hold", True))))[0])

    async def op_priority(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        try:
            prio = int(args["priority"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"priority: expected an integer, found {args.get('priority')!r}") from None
        return job_to_dict(await commands.set_priority(self.ctl, job.id, prio, args.get("qos")))

    async def op_requeue(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        return job_to_dict(await commands.requeue(self.ctl, job.id))

    async def op_wait(self, args: dict[str, Any], uid: int) -> Any:
        """Block until every listed job is terminal or `timeout` seconds pass."""
        ids = [int(i) for i in args.get("ids", [])]
        timeout = float(args.get("timeout") or 3600)
        deadline = self.ctl.clock.monotonic() + timeout
        version = self.ctl.version
        while True:
            jobs = []
            for i in ids:
                job = await self.ctl.db(self.ctl.store.get_job, i)
                if job is None:
                    raise UserError(f"no job {i}; `hsched queue --all` lists the jobs")
                jobs.append(job)
            if all(j.state.is_terminal() for j in jobs):
                return {"done": True, "jobs": [job_to_dict(j) for j in jobs]}
            left = deadline - self.ctl.clock.monotonic()
            if left <= 0:
                return {"done": False, "jobs": [job_to_dict(j) for j in jobs]}
            version = await self.ctl.wait_changed(version, min(left, 5.0))

    async def op_logs(self, args: dict[str, Any], uid: int) -> Any:
        """A chunk of the latest run's log from `offset`, base64 (logs are bytes, not always UTF-8)."""
        job = await self._job(args)
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        run_no = args.get("run")
        if run_no is not None and not any(r.attempt == int(run_no) for r in runs):
            attempts = ", ".join(str(a) for a in sorted({r.attempt for r in runs})) or "none yet"
            raise UserError(f"--run: job {job.id} has no run {run_no} (its runs: {attempts}); "
                            f"`hsched show {job.id}` lists them")
        if not runs:
            return {"data": "", "offset": 0, "run": None, "ended": job.state.is_terminal(), "state": job.state.value}
        run = runs[-1] if run_no is None else next(r for r in runs if r.attempt == int(run_no))
        rt = self.ctl.nodes.get(run.node)
        offset = int(args.get("offset", 0))
        data = b""
        if rt is not None:
            data = await rt.executor.read_log(run.run_dir, offset, int(args.get("max_bytes", 1 << 20)))
        return {"data": base64.b64encode(data).decode(), "offset": offset + len(data), "run": run.attempt,
                "ended": not run.state.is_live(), "state": job.state.value,
                "runs": len(runs)}

    async def op_nodes(self, args: dict[str, Any], uid: int) -> Any:
        active = await self.ctl.db(self.ctl.store.jobs, states=list(ACTIVE_STATES))
        owners = self.ctl.owners(active)
        return [node_to_dict(n, owners) for n in self.ctl.node_list()]

    async def op_node_admin(self, args: dict[str, Any], uid: int) -> Any:
        name = args.get("name")
        rt = self.ctl.nodes.get(str(name))
        if rt is None:
            raise UserError(f"no node {name!r}; `hsched nodes` lists them")
        state = NodeState.DRAINED if args.get("action") == "drain" else NodeState.UP
        reason = str(args.get("reason") or "")
        await self.ctl.db(self.ctl.store.set_node_admin, rt.name, state, reason, self.ctl.clock.time())
        self.ctl.admin[rt.name] = state
        rt.node = replace(rt.node, message=reason if state is NodeState.DRAINED else "")
        await check_health(self.ctl)
        self.ctl.poke()
        await self.ctl.notify()
        return node_to_dict(rt.node)

    async def op_events(self, args: dict[str, Any], uid: int) -> Any:
        events = await self.ctl.db(self.ctl.store.events, None, after_id=int(args.get("after", 0)),
                                   limit=int(args.get("limit", 200)))
        for e in events:
            e["time"] = iso(e["time"])
        return events

    async def op_stop(self, args: dict[str, Any], uid: int) -> Any:
        self.ctl.stopping.set()
        self.ctl.poke()
        return {"stopping": True, "pid": os.getpid()}

    async def op_snapshot(self, args: dict[str, Any], uid: int) -> Any:
        """Everything a dashboard frame needs, in one answer: active jobs, plus those that ended in the last
        `recent_s` seconds (default 600, so a requeue or a last look at a log is still one key away)."""
        recent_s = float(args.get("recent_s", 600.0))
        since = self.ctl.clock.time() - recent_s
        rows = await self.ctl.db(self.ctl.store.job_rows, active_only=True, ended_since=since)
        jobs = [job_from_row(r) for r in rows]
        owners = self.ctl.owners([j for j in jobs if j.state in ACTIVE_STATES])
        return {"version": self.ctl.version, "time": iso(self.ctl.clock.time()),
                "jobs": [job_to_dict(j) for j in jobs],
                "nodes": [node_to_dict(n, owners) for n in self.ctl.node_list()]}
