"""Request handlers: one JSON object in, one JSON object out (see hsched/protocol.py).

Nothing here waits on a node: a request is answered from what the controller knows (a node still probing is
PROBING, one whose probe hung is UNHEALTHY), so a hung nvidia-smi never holds up `hsched queue`.

Every argument is checked before it is used: a missing, mistyped or out-of-range one is a UserError naming
the field (the CLI exits 2 with that one line), never an internal error. Ranges: job ids 1 to 2^63-1,
priority PRIORITY_MIN to PRIORITY_MAX (as in a spec file), `wait` timeouts up to a week, log chunks up to
16 MiB. A job's size is bounded by the settings (max_nodes, max_tasks_per_node, max_tasks, max_gpus, max_cpus,
max_array_tasks, max_dependencies, max_command_bytes; hsched.config.beyond_limits) and a request's jobs or ids by
max_jobs_per_request: past one, one line names the key, the option and the setting. The submitting user is the
connecting process's uid (SO_PEERCRED) mapped to its name, never a name sent in the request.

Lab mode (one controller for every local user): anyone may look (queue, show, nodes, events, as squeue shows
all), but a job is acted on (cancel, hold, release, requeue, priority, preempt, checkpoint, logs) by its owner,
root, the controller's own account and the admins of settings `admins` only; draining nodes and stopping the
controller are admins' only. A refusal changes nothing and says whose the job is.
"""

from __future__ import annotations

import asyncio
import base64
import grp
import json
import os
import pwd
from typing import Any

from hsched import __version__
from hsched.config import PRIORITY_MAX, PRIORITY_MIN, beyond_limits, job_spec_from_table
from hsched.controller import commands, services
from hsched.controller.core import ACTIVE_STATES, Controller, Stopping
from hsched.controller.health import check_health
from hsched.controller.store import job_from_row
from hsched.controller.visible import for_others, for_owner, quotes_log
from hsched.errors import ExecutorError, PermissionDenied, UserError
from hsched.model import JobState, NodeState, Resources
from hsched.protocol import PROTOCOL, Preencoded
from hsched.sched.live import unsatisfiable
from hsched.serialize import (
    components_with_runs,
    gpu_processes_to_list,
    history_to_dict,
    host_load_to_dict,
    iso,
    job_to_dict,
    node_live_to_dict,
    node_to_dict,
    pick_jobs,
    run_to_dict,
)
from hsched.spec.jobkind import kind_of

API_VERSION = 1

"""A job's priority inside its QoS class (higher first); a bound keeps it an integer SQLite can store."""
ID_MAX = 2**63 - 1
WAIT_MAX_S = 7 * 86400.0
LOG_CHUNK_MAX = 16 << 20
LOG_READ_TIMEOUT_S = 30.0
EVENTS_MAX = 10_000
REASON_MAX = 1000
SUBMIT_MANY_MAX = 10_000
"""Jobs in one submit_many request (the request line's limit, 1 MiB, bounds it too)."""


def _shown(value: Any) -> str:
    """A value as an error line shows it: repr'd (control characters escaped) and short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


class Api:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self._dicts: dict[int, tuple[tuple[Any, ...], dict[str, Any], bytes]] = {}
        # a job's object cut to a listing's fields (`queue` with `fields`: the table's) and its text, while its whole
        # object (the `_dicts` entry) is the same
        self._parts: dict[int, tuple[dict[str, Any], tuple[str, ...], dict[str, Any], bytes]] = {}
        self._users: dict[int, str] = {}

    async def handle(self, op: str, args: dict[str, Any], peer_uid: int) -> Any:
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise UserError(f"unknown request {op!r}")
        if not isinstance(args, dict):
            raise UserError(f"args: expected an object, found {_type_name(args)}")
        return await fn(args, peer_uid)

    # ------------------------------------------------------------------------------------- arguments

    @staticmethod
    def integer(args: dict[str, Any], key: str, default: int | None = None, *, low: int | None = None,
                high: int | None = None, required: bool = False) -> int | None:
        """`args[key]` as an integer in [low, high]; `default` when absent or null (unless required)."""
        v = args.get(key)
        if v is None:
            if required:
                raise UserError(f"{key}: required")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{key}: expected an integer, found {_type_name(v)} {_shown(v)}")
        if (low is not None and v < low) or (high is not None and v > high):
            raise UserError(f"{key}: expected an integer from {low} to {high}, found {v}")
        return v

    @staticmethod
    def number(args: dict[str, Any], key: str, default: float, *, low: float, high: float) -> float:
        v = args.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
            raise UserError(f"{key}: expected a number, found {_type_name(v)} {_shown(v)}")
        if not low <= v <= high:
            raise UserError(f"{key}: expected a number from {low:g} to {high:g}, found {v:g}")
        return float(v)

    @staticmethod
    def flag(args: dict[str, Any], key: str, default: bool) -> bool:
        v = args.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise UserError(f"{key}: expected true or false, found {_type_name(v)} {_shown(v)}")
        return v

    @staticmethod
    def text(args: dict[str, Any], key: str, default: str | None = None, *, limit: int = REASON_MAX,
             choices: tuple[str, ...] = ()) -> str | None:
        v = args.get(key)
        if v is None:
            return default
        if not isinstance(v, str):
            raise UserError(f"{key}: expected a string, found {_type_name(v)} {_shown(v)}")
        if len(v) > limit:
            raise UserError(f"{key}: at most {limit} characters, found {len(v)}")
        if "\0" in v:
            raise UserError(f"{key}: a NUL character is not allowed")
        if choices and v not in choices:
            raise UserError(f"{key}: expected one of {', '.join(choices)}, found {_shown(v)}")
        return v

    def job_id(self, args: dict[str, Any], key: str = "id") -> int:
        v = args.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= ID_MAX:
            raise UserError(f"{key}: not a job id: {_shown(v)}")
        return v

    def job_ids(self, args: dict[str, Any], key: str = "ids") -> list[int]:
        v = args.get(key)
        if not isinstance(v, list):
            raise UserError(f"{key}: expected a list of job ids, found {_type_name(v)} {_shown(v)}")
        most = self.ctl.settings.max_jobs_per_request
        if len(v) > most:  # a `wait` reads each of them at every change: a hundred thousand was a busy loop
            raise UserError(f"{key}: {len(v)} job ids is over the limit of {most} (settings max_jobs_per_request)")
        return [self.job_id({key: i}, key) for i in v]

    async def user_name(self, uid: int) -> str:
        """The login name of `uid` (its number where it has none); looked up off the event loop, as the
        user database may be remote (LDAP, sssd)."""
        name = self._users.get(uid)
        if name is None:
            try:
                name = (await asyncio.to_thread(pwd.getpwuid, uid)).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    # ---------------------------------------------------------------------------------------- who may

    async def is_admin(self, uid: int) -> bool:
        """Root, the controller's own account, and (lab mode) the users and groups of settings `admins`;
        in personal mode the one peer there can be is the owner."""
        if not self.ctl.home.lab or uid in (0, os.getuid()):
            return True
        name = await self.user_name(uid)
        admins = self.ctl.settings.admins
        if name in admins:
            return True
        groups = tuple(a[1:] for a in admins if a.startswith("@"))
        # membership is looked up each time (off the loop: the group database may be LDAP): a user removed
        # from the admin group loses the right at once
        return bool(groups) and await asyncio.to_thread(_member_of_any, name, groups)

    async def may_use_qos(self, uid: int, qos: str) -> None:
        """Raise PermissionDenied unless `uid` may put jobs in QoS class `qos` (settings `[qos.NAME] allow`; by
        default everyone, but `prod`, root's and the admins' alone in a lab). Personal mode: the owner may."""
        if await self.is_admin(uid):
            return
        cls = self.ctl.settings.qos.get(qos)
        allow = cls.allow if cls is not None else None
        if allow is None:
            if qos != "prod":
                return
            allow = ()
        name = await self.user_name(uid)
        if "*" in allow or name in allow:
            return
        groups = tuple(a[1:] for a in allow if a.startswith("@"))
        member: bool = bool(groups) and await asyncio.to_thread(_member_of_any, name, groups)
        if member:
            return
        raise PermissionDenied(f"permission denied: {name} may not use QoS {qos} (it preempts others' work): an "
                               f"admin grants it with `allow = [\"{name}\"]` in [qos.{qos}] of settings.toml and "
                               "`hsched daemon reload`")

    async def may_act(self, uid: int, job: Any) -> None:
        """Raise PermissionDenied unless `uid` owns `job` or is an admin (always allowed in personal mode)."""
        if await self.is_admin(uid) or await self.user_name(uid) == job.user:
            return
        raise PermissionDenied(f"permission denied: job {job.id} belongs to {job.user}")

    async def admin_only(self, uid: int, what: str) -> None:
        if not await self.is_admin(uid):
            raise PermissionDenied(f"permission denied: {what} is for root and the lab's admins "
                                   "(settings `admins`)")

    async def _own_job(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        await self.may_act(uid, job)
        return job

    # ---------------------------------------------------------------------------------------- requests

    async def op_ping(self, args: dict[str, Any], uid: int) -> Any:
        ops = sorted(name.removeprefix("op_") for name in dir(self) if name.startswith("op_"))
        ctl = self.ctl
        return {"pid": os.getpid(), "api": API_VERSION, "hsched": __version__, "protocol": PROTOCOL,
                "install": ctl.fingerprint, "home": str(ctl.home.root), "mode": ctl.home.mode,
                "socket": str(ctl.home.socket), "you": await self.user_name(uid),
                "admin": await self.is_admin(uid),
                "started": iso(ctl.started_at), "fleet": ctl.fleet_cfg.source,
                "policy": ctl.settings.policy, "ops": [*ops, "subscribe"], "ready": ctl.ready.is_set(),
                "probing": sorted(rt.name for rt in ctl.nodes.values() if rt.node.state is NodeState.PROBING),
                "unhealthy_nodes": sorted(rt.name for rt in ctl.nodes.values()
                                          if rt.node.state is NodeState.UNHEALTHY),
                **ctl.health_report(), "services": services.summary(ctl)}

    async def op_submit(self, args: dict[str, Any], uid: int) -> Any:
        env = self._environ(args)
        spec = await self._learned_memory(self._spec(args))
        await self._hear_first_probes(spec.resources)
        # who asks is who the kernel says connected (SO_PEERCRED); a `user` in the request is ignored
        await self.may_use_qos(uid, spec.qos)
        user = await self.user_name(uid)
        job = await commands.submit(self.ctl, await self._priority_by(spec, uid), user, env)
        return job_to_dict(job)

    async def op_submit_many(self, args: dict[str, Any], uid: int) -> Any:
        """Several jobs in one request and one transaction: `jobs`, a list of {"spec", "source"} as `submit`
        takes them (at most SUBMIT_MANY_MAX), and one `environ` for all. All are queued, or none when one is
        refused (its lines start `jobs[i]: `). The reply: their job objects, in order (an array's first task)."""
        items = args.get("jobs")
        if not isinstance(items, list):
            raise UserError(f"jobs: expected a list of {{spec, source}} objects, found {_type_name(items)}")
        if not items:
            raise UserError("jobs: expected at least one job")
        if len(items) > SUBMIT_MANY_MAX:
            raise UserError(f"jobs: at most {SUBMIT_MANY_MAX} in one request, found {len(items)}")
        env = self._environ(args)
        specs = []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise UserError(f"expected an object with spec and source, found {_type_name(item)}")
                specs.append(self._spec(item))
            except UserError as e:
                raise UserError(f"jobs[{i}]: {e}", problems=[f"jobs[{i}]: {p}" for p in e.problems]) from None
        # each array is its tasks' jobs: ten thousand arrays of ten thousand in one request were 10^8 jobs
        total = sum(len(s.array.indices) if s.array is not None else 1 for s in specs)
        if total > self.ctl.settings.max_jobs_per_request:
            raise UserError(f"jobs: {total} jobs in one request (arrays' tasks counted) is over the limit of "
                            f"{self.ctl.settings.max_jobs_per_request} (settings max_jobs_per_request); submit "
                            "them in parts")
        for qos in dict.fromkeys(s.qos for s in specs):
            await self.may_use_qos(uid, qos)
        specs = [await self._learned_memory(s) for s in specs]
        for spec in specs:
            await self._hear_first_probes(spec.resources)
        user = await self.user_name(uid)  # the kernel's word, as for `submit`
        specs = [await self._priority_by(s, uid) for s in specs]
        jobs = await commands.submit_many(self.ctl, specs, user, env, numbered=True)
        return [job_to_dict(j) for j in jobs]

    async def _priority_by(self, spec: Any, uid: int) -> Any:
        """A spec whose priority is set records who set it, and whether a lab admin (whose priority orders the job
        across users; a member's orders only their own jobs). The request cannot say: the spec table has no
        such keys."""
        from dataclasses import replace

        if not spec.priority:
            return spec
        return replace(spec, priority_by=await self.user_name(uid), priority_admin=await self._lab_admin(uid))

    async def _lab_admin(self, uid: int) -> bool:
        """An admin of a lab (in personal mode everyone is `is_admin`, but there is nobody else to order across)."""
        return self.ctl.home.lab and await self.is_admin(uid)

    async def _learned_memory(self, spec: Any) -> Any:
        """A GPU job that asks for no GPU memory gets its kind's learned peak plus a margin (issue 15): a GPU too
        small for it is never handed out (nor one it would run out of memory on)."""
        from dataclasses import replace

        from hsched.controller.learning import learned_gpu_memory

        res = spec.resources
        if res.gpus <= 0 or res.gpu_memory_mib is not None:
            return spec
        need = await learned_gpu_memory(self.ctl, kind_of(spec.kind, spec.command))
        return replace(spec, resources=replace(res, gpu_memory_mib=need)) if need else spec

    def _spec(self, args: dict[str, Any]) -> Any:
        """The job spec of a request's `spec` (a table as in a spec file) and `source` (what to name in errors)."""
        table = args.get("spec")
        if not isinstance(table, dict):
            raise UserError(f"spec: expected a job spec object, found {_type_name(table)}")
        source = self.text(args, "source", "<command line>", limit=4096) or "<command line>"
        settings = self.ctl.settings
        spec = job_spec_from_table(table, source, settings.qos_names, settings.default_qos)  # priority range too
        # the request's size, bounded by settings (a million tasks was a million run rows and minutes of no answers)
        over = [f"{source}: {line}" for line in beyond_limits(spec, settings)]
        if over:
            raise UserError(over[0], problems=over)
        if spec.data:
            # a dataset the fleet file does not declare has no place to come from: refused now, not a job that
            # waits for ever
            known = {d.name for d in self.ctl.fleet_cfg.datasets}
            unknown = [n for n in spec.data if n not in known]
            if unknown:
                have = ", ".join(sorted(known)) or "none"
                raise UserError(f"{source}: data: no dataset {unknown[0]!r} in the fleet file "
                                f"{self.ctl.fleet_cfg.source} (datasets: {have}); declare it in a [[dataset]] table")
        return spec

    @staticmethod
    def _environ(args: dict[str, Any]) -> dict[str, str] | None:
        env = args.get("environ")
        if env is not None and not (isinstance(env, dict)
                                    and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise UserError("environ: expected an object of strings")
        return env

    async def _hear_first_probes(self, res: Resources) -> None:
        """When no node known so far could run the job but some are still on their first probe, wait for those
        probes (each ends within its timeout): they decide whether the job is refused as impossible or queued.
        A job that a known node can run is accepted at once, whatever the others' probes do."""
        first = [rt.probe_task for rt in self.ctl.nodes.values()
                 if rt.node.state is NodeState.PROBING and rt.config.simulate is None
                 and rt.probe_task is not None and not rt.probe_task.done()]
        if not first:
            return
        known = [rt.node for rt in self.ctl.nodes.values() if rt.last_ok is not None or rt.config.simulate]
        if unsatisfiable(res, known) is not None:
            await asyncio.wait(first)  # not cancelled with this request: the probes are the controller's

    async def op_queue(self, args: dict[str, Any], uid: int) -> Any:
        users, states, ids = (self.names(args, "users"), self.names(args, "states"), self.names(args, "ids"))
        as_text = self.flag(args, "text", False)
        wanted = self.names(args, "fields")
        fields = tuple(sorted(wanted)) if wanted is not None else None
        rows = await self.ctl.db(self.ctl.store.job_rows, active_only=not self.flag(args, "all", False))

        def listing() -> Any:
            hits = [self._listed(r, as_text and fields is None) for r in rows]
            if users is None and states is None and ids is None:
                picked = hits
            else:
                keep = {id(d) for d in pick_jobs((h[0] for h in hits), users=users, states=states, ids=ids)}
                picked = [h for h in hits if id(h[0]) in keep]
            if fields is not None:
                # (picked by the whole objects, then cut: a table's ~20 fields are ~40 % of a job's text, and
                # decoding them is what a long `hsched queue` costs its reader)
                picked = [self._cut(h[0], fields, as_text) for h in picked]
            if as_text:
                # each job's text kept with its object: a listing is a join, whatever its length (issue 33)
                return Preencoded(b"[" + b", ".join(h[1] for h in picked) + b"]")
            return [h[0] for h in picked]

        if len(rows) > 2000:
            # a long history (`queue --all`): its objects are made in a thread, so that requests are answered
            # meanwhile (100,000 jobs seen for the first time: seconds of decoding)
            return await asyncio.to_thread(listing)
        return listing()

    def names(self, args: dict[str, Any], key: str) -> frozenset[str] | None:
        """`args[key]` as a set of names (a list of strings, bounded); None when absent."""
        v = args.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise UserError(f"{key}: expected a list of strings, found {_type_name(v)}")
        if len(v) > 100_000:
            raise UserError(f"{key}: at most 100000 names, found {len(v)}")
        return frozenset(v)

    def _listed(self, row: Any, as_text: bool = False) -> tuple[dict[str, Any], bytes]:
        """The contract's job object for a store row and (when `as_text`) its JSON text, reused while the row is
        unchanged: most of a long queue (ended jobs) never changes, and decoding every spec on every `queue --all`
        is what costs. The text is made on first asking (a listing's reader that decodes never needs it)."""
        key = tuple(row)
        hit = self._dicts.get(row["id"])
        if hit is None or hit[0] != key:
            hit = (key, job_to_dict(job_from_row(row)), b"")
            self._dicts[row["id"]] = hit
        if as_text and not hit[2]:
            hit = self._dicts[row["id"]] = (key, hit[1], json.dumps(hit[1], default=str).encode())
        return hit[1], hit[2]

    def _cut(self, d: dict[str, Any], fields: tuple[str, ...], as_text: bool) -> tuple[dict[str, Any], bytes]:
        """Job object `d` (`_listed`'s) with only `fields` (a name it has not is left out) and (`as_text`) that
        object's text, kept while `d` is the very object and the fields are the same (one set of fields a job: the
        table's)."""
        part = self._parts.get(d["id"])
        if part is None or part[0] is not d or part[1] != fields:
            part = (d, fields, {k: d[k] for k in fields if k in d}, b"")
        if as_text and not part[3]:
            part = (d, fields, part[2], json.dumps(part[2], default=str).encode())
        self._parts[d["id"]] = part
        return part[2], part[3]

    def job_dict(self, row: Any) -> dict[str, Any]:
        """The contract's job object for a store row (`_listed`'s, kept while the row is unchanged)."""
        return self._listed(row)[0]

    async def _job(self, args: dict[str, Any]) -> Any:
        job_id = self.job_id(args)
        job = await self.ctl.db(self.ctl.store.get_job, job_id)
        if job is None:
            raise UserError(f"no job {job_id}; `hsched queue --all` lists the jobs")
        return job

    async def op_show(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._job(args)
        d = job_to_dict(job)
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        sees_all = await self._sees_all(uid, job)
        # a line quoted from its log is its owner's (and admins'): others see the event without it
        events = [(for_owner if sees_all else for_others)(e)
                  for e in await self.ctl.db(self.ctl.store.events, job.id)]
        d["runs"] = [run_to_dict(r) for r in runs]
        if job.spec.components:
            d["components"] = components_with_runs(job, runs)  # a heterogeneous job: each component's state
        # (an event's figures too, where it has some: a copy's bytes and seconds, a preemption's time to free)
        d["events"] = [{"time": iso(e["time"]), "kind": e["kind"], "message": e["message"], "node": e["node"],
                        **({"data": e["data"]} if e["data"] else {})}
                       for e in events]
        pre = [e["data"] or {} for e in events if e["kind"] == "preempted"]
        lost = [p["lost_gpu_s"] for p in pre if p.get("lost_gpu_s") is not None]
        d["preemptions"] = {
            "count": len(pre),
            "lost_gpu_s": round(sum(lost), 1) if lost else (0.0 if not pre else None),
            "time_to_free_s": [p.get("time_to_free_s") for p in pre],
        }
        # the policy's moves of it to faster GPUs (hsched.controller.moves): from, to, expected gain, cost, why
        d["moves"] = [{"time": iso(e["time"]), "why": e["message"], **(e["data"] or {})}
                      for e in events if e["kind"] == "move"]
        # an elastic job's resizes (hsched.controller.resizing): grow/shrink, sizes, measured speedup, gain, why
        d["resizes"] = [{"time": iso(e["time"]), "kind": e["kind"], "why": e["message"], **(e["data"] or {})}
                        for e in events if e["kind"] in ("grow", "shrink")]
        # a job's environment may hold its owner's secrets: in a lab, only they (and admins) see it
        d["env"] = dict(job.spec.env) if sees_all else {}
        d["resources"] = {"gpus": job.spec.resources.gpus, "gpu_types": list(job.spec.resources.gpu_types),
                          "gpu_memory_mib": job.spec.resources.gpu_memory_mib, "cpus": job.spec.resources.cpus,
                          "memory_mib": job.spec.resources.memory_mib, "nodes": job.spec.resources.nodes,
                          "interconnect": job.spec.resources.interconnect.value,
                          "offload": job.spec.resources.offload, "shared": job.spec.resources.shared,
                          "gpus_max": job.spec.resources.gpus_max, "nodes_max": job.spec.resources.nodes_max}
        d["checkpoint_dir"] = str(self.ctl.checkpoint_dir(job.id))
        # its multifactor priority, factor by factor (sprio's view; hsched.controller.shares), while not ended
        from hsched.controller.shares import job_priority

        d["priority_factors"] = await job_priority(self.ctl, job)
        # what its progress reports said: the running attempt's, else the last one kept
        from hsched.controller.learning import progress_of

        kept = await self.ctl.db(self.ctl.store.run_progress, job.id)
        d["progress"] = progress_of(self.ctl, job.id, job.restarts + 1) or (kept[-1] if kept else None)
        if d["progress"] and job.state is not JobState.RUNNING:
            # an attempt that is not running has no time left: its last report's estimate is history
            d["progress"] = {**d["progress"], "remaining_s": None}
        # what hsched expects of it: how long its kind runs (its user's runs first), when it will end
        from hsched.controller.forecast import predicted_end
        from hsched.controller.learning import expected

        d["expected_duration_s"] = await expected(self.ctl, job)
        end, source = (await predicted_end(self.ctl, job, self.ctl.clock.time())
                       if job.state is JobState.RUNNING else (None, ""))
        d["predicted_end"] = {"time": iso(end), "from": source} if end is not None else None
        # what its GPUs' readings say it is (hsched.learn.profiles): the running attempt's, else the last one's
        from hsched.controller.usage import profile_of

        stored = await self.ctl.db(self.ctl.store.run_usage, job.id)
        attempts = [r.attempt for r in runs]
        d["profile"] = profile_of(self.ctl, job.id, max(attempts), stored,
                                  job.state.is_active()) if attempts else None
        return d

    async def _sees_all(self, uid: int, job: Any) -> bool:
        return await self.is_admin(uid) or await self.user_name(uid) == job.user

    async def op_cancel(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._own_job(args, uid)
        return job_to_dict(await commands.cancel(self.ctl, job.id))

    async def op_preempt(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._own_job(args, uid)
        return job_to_dict(await commands.preempt(self.ctl, job.id))

    async def op_checkpoint(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._own_job(args, uid)
        return job_to_dict(await commands.checkpoint(self.ctl, job.id))

    async def op_hold(self, args: dict[str, Any], uid: int) -> Any:
        """One job (`id`), or several at once (`ids`: released together, in one scheduling round)."""
        held = self.flag(args, "hold", True)
        if "ids" in args:
            jobs = [await self._own_job({"id": i}, uid) for i in self.job_ids(args)]  # all checked, then done
            return [job_to_dict(j) for j in await commands.hold(self.ctl, [j.id for j in jobs], held)]
        job = await self._own_job(args, uid)
        return job_to_dict((await commands.hold(self.ctl, [job.id], held))[0])

    async def op_priority(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._own_job(args, uid)
        prio = self.integer(args, "priority", low=PRIORITY_MIN, high=PRIORITY_MAX, required=True)
        assert prio is not None
        qos = self.text(args, "qos", None, limit=100)
        if qos:
            await self.may_use_qos(uid, qos)
        return job_to_dict(await commands.set_priority(self.ctl, job.id, prio, qos or None,
                                                       by=await self.user_name(uid), admin=await self._lab_admin(uid)))

    async def op_requeue(self, args: dict[str, Any], uid: int) -> Any:
        job = await self._own_job(args, uid)
        return job_to_dict(await commands.requeue(self.ctl, job.id))

    async def op_wait(self, args: dict[str, Any], uid: int) -> Any:
        """Block until every listed job is terminal or `timeout` seconds pass (0: look once)."""
        ids = self.job_ids(args) if args.get("ids") is not None else []
        timeout = self.number(args, "timeout", 3600.0, low=0.0, high=WAIT_MAX_S)
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
            if self.ctl.stopping.is_set():
                raise Stopping("the controller stopped before the jobs ended; `hsched wait` them again")
            version = await self.ctl.wait_changed(version, min(left, 5.0))

    async def op_logs(self, args: dict[str, Any], uid: int) -> Any:
        """A chunk of a run's log from `offset`, base64 (logs are bytes, not always UTF-8): the latest attempt's
        (or `run`'s), rank `rank`'s (default 0: a gang's or an srun-style job's first task; each rank keeps a log of
        its own)."""
        job = await self._own_job(args, uid)
        run_no = self.integer(args, "run", None, low=1, high=ID_MAX)
        rank = self.integer(args, "rank", 0, low=0, high=ID_MAX) or 0
        offset = self.integer(args, "offset", 0, low=0, high=ID_MAX) or 0
        max_bytes = self.integer(args, "max_bytes", 1 << 20, low=1, high=LOG_CHUNK_MAX) or 1
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        if run_no is not None and not any(r.attempt == run_no for r in runs):
            attempts = ", ".join(str(a) for a in sorted({r.attempt for r in runs})) or "none yet"
            raise UserError(f"--run: job {job.id} has no run {run_no} (its runs: {attempts}); "
                            f"`hsched show {job.id}` lists them")
        if not runs:
            return {"data": "", "offset": 0, "run": None, "ended": job.state.is_terminal(), "state": job.state.value}
        attempt = max(r.attempt for r in runs) if run_no is None else run_no
        ranks = sorted({r.rank for r in runs if r.attempt == attempt})
        if rank not in ranks:
            raise UserError(f"--rank: run {attempt} of job {job.id} has no rank {rank} (its ranks: "
                            f"{', '.join(map(str, ranks))})")
        run = next(r for r in runs if r.attempt == attempt and r.rank == rank)
        rt = self.ctl.nodes.get(run.node)
        data = b""
        if rt is not None:
            try:
                async with asyncio.timeout(LOG_READ_TIMEOUT_S):
                    data = await rt.executor.read_log(run.run_dir, offset, max_bytes)
            except (ExecutorError, TimeoutError) as e:
                raise ExecutorError(f"cannot read the log of job {job.id} on {run.node}: "
                                    f"{e or 'no answer within 30 s'}") from None
        return {"data": base64.b64encode(data).decode(), "offset": offset + len(data), "run": run.attempt,
                "ended": not run.state.is_live(), "state": job.state.value,
                "runs": len({r.attempt for r in runs}), "rank": rank, "ranks": len(ranks), "node": run.node}

    async def op_nodes(self, args: dict[str, Any], uid: int) -> Any:
        active = await self.ctl.db(self.ctl.store.jobs, states=list(ACTIVE_STATES))
        owners = self.ctl.owners(active)
        return [node_to_dict(n, owners) for n in self.ctl.node_list()]

    async def op_node_admin(self, args: dict[str, Any], uid: int) -> Any:
        await self.admin_only(uid, "draining and resuming nodes")
        name = self.text(args, "name", None, limit=256)
        rt = self.ctl.nodes.get(name) if name is not None else None
        if rt is None:
            raise UserError(f"no node {name!r}; `hsched nodes` lists them")
        action = self.text(args, "action", None, choices=("drain", "resume"))
        if action is None:
            raise UserError("action: required (drain or resume)")
        state = NodeState.DRAINED if action == "drain" else NodeState.UP
        reason = self.text(args, "reason", "") or ""
        await self.ctl.db(self.ctl.store.set_node_admin, rt.name, state, reason, self.ctl.clock.time())
        self.ctl.admin[rt.name] = state
        if state is NodeState.DRAINED:
            self.ctl.drain_reasons[rt.name] = reason
        else:
            self.ctl.drain_reasons.pop(rt.name, None)
        await check_health(self.ctl)
        self.ctl.poke()
        await self.ctl.notify()
        return node_to_dict(rt.node)

    async def op_events(self, args: dict[str, Any], uid: int) -> Any:
        after = self.integer(args, "after", 0, low=0, high=ID_MAX) or 0
        limit = self.integer(args, "limit", 200, low=1, high=EVENTS_MAX) or 200
        events = await self._visible(uid, await self.ctl.db(self.ctl.store.events, None, after_id=after, limit=limit))
        for e in events:
            e["time"] = iso(e["time"])
        return events

    async def _visible(self, uid: int, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events as `uid` may see them: a line quoted from a job's log only to its owner and admins
        (hsched.controller.visible); the owners of the few events that quote one are looked up once each."""
        admin = await self.is_admin(uid)
        name = None if admin else await self.user_name(uid)
        owners: dict[int, str | None] = {}
        out = []
        for e in events:
            if not quotes_log(e):
                out.append(e)
                continue
            job_id = e["job_id"]
            if not admin and job_id is not None and job_id not in owners:
                job = await self.ctl.db(self.ctl.store.get_job, job_id)
                owners[job_id] = job.user if job is not None else None
            mine = admin or (job_id is not None and owners[job_id] == name)
            out.append(for_owner(e) if mine else for_others(e))
        return out

    async def op_acct(self, args: dict[str, Any], uid: int) -> Any:
        """Accounting: the jobs of a time window with their runs, and GPU-hours by user and by GPU model."""
        from hsched.learn.accounting import usage

        # -1: not given (the window is open on that side)
        since_v = self.number(args, "since", -1.0, low=-1.0, high=1e12)
        until_v = self.number(args, "until", -1.0, low=-1.0, high=1e12)
        since = since_v if since_v >= 0 else None
        until = until_v if until_v >= 0 else None
        jobs = await self.ctl.db(self.ctl.store.window_jobs, since, until)
        runs = await self.ctl.db(self.ctl.store.runs_of, [j.id for j in jobs])
        model_of = {d.uuid: d.model for rt in self.ctl.nodes.values() for d in rt.node.devices}
        use = usage(jobs, runs, model_of, since, until, self.ctl.clock.time())
        out = []
        for j in jobs:
            d = job_to_dict(j)
            d["runs"] = [{**run_to_dict(r), "models": sorted({model_of.get(u, "unknown") for u in r.devices})}
                         for r in runs.get(j.id, [])]
            if j.spec.components:
                d["components"] = components_with_runs(j, runs.get(j.id, []))  # sacct's row per component
            out.append(d)
        return {"jobs": out, "gpu_hours": {"by_user": dict(use.by_user), "by_model": dict(use.by_model),
                                           "total": use.total_gpu_hours,
                                           "by_workload": _by_workload(jobs, runs, since, until,
                                                                       self.ctl.clock.time())}}

    async def op_eff(self, args: dict[str, Any], uid: int) -> Any:
        """seff's figures for job `id` (the job object with hsched.learn.efficiency.report's fields): from the
        monitoring samples folded while it ran (hsched.controller.usage). Everyone may read it (as `show`)."""
        from hsched.controller.usage import flagged_attempts, tallies_of
        from hsched.learn.efficiency import report

        job = await self._job(args)
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        stored = await self.ctl.db(self.ctl.store.run_usage, job.id)
        # each node's cores, memory and GPUs: the share a job that asked no --cpus or --mem held
        nodes = {n: (rt.node.cpus, rt.node.memory_total_mib, len(rt.node.devices)) for n, rt in self.ctl.nodes.items()}
        return {**job_to_dict(job), **report(job, runs, tallies_of(self.ctl, job.id, stored), self.ctl.clock.time(),
                                             self.ctl.settings.idle_after_s, flagged_attempts(self.ctl, job.id),
                                             nodes)}

    async def op_kinds(self, args: dict[str, Any], uid: int) -> Any:
        """What hsched learnt of each job kind: steps per second per GPU type, GPU count and placement class
        (the stored average, and the running jobs' current speeds counted in), and the jobs of each kind now."""
        from hsched.controller.jobcache import job_cache
        from hsched.controller.learning import current_rates, rates
        from hsched.model import workload_of
        from hsched.serialize import job_kind

        stored = await rates(self.ctl)
        jobs = job_cache(self.ctl).last
        now_of: dict[str, int] = {}
        workloads: dict[str, str] = {}  # issue 30: the workload class the kind's jobs say (or are inferred)
        for j in (jobs.all if jobs is not None else ()):
            k = job_kind(j)
            now_of[k] = now_of.get(k, 0) + 1
            workloads[k] = workload_of(j.spec) or workloads.get(k, "")
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for r in sorted(current_rates(self.ctl), key=lambda r: (r.kind, r.gpu_type, r.gpus, r.klass.value)):
            key = (r.kind, r.gpu_type, r.gpus, r.klass.value)
            by_kind.setdefault(r.kind, []).append({
                "gpu_type": r.gpu_type, "gpus": r.gpus, "class": r.klass.value, "steps_per_s": r.steps_per_s,
                "runs": r.runs, "stored_runs": stored[key].runs if key in stored else 0,
                "updated": iso(r.updated) if r.updated else None})
        # each kind's usual profile (hsched.learn.profiles) over its latest jobs' last attempts
        from hsched.controller.usage import kind_profiles, live_snapshot
        from hsched.learn.profiles import most_common

        profiles = await self.ctl.db(kind_profiles, self.ctl.store, live_snapshot(self.ctl),
                                     self.ctl.settings.idle_after_s)
        usual = {k: most_common(ps) for k, ps in profiles.items()}
        # how long each kind runs, and how wrong the predictions made at the jobs' starts were (hsched.learn.predict)
        from hsched.controller.learning import expected_of, history_of

        errors = await self.ctl.db(self.ctl.store.prediction_errors)
        kinds = sorted(set(by_kind) | set(now_of) | set(usual) | set(errors))
        out = []
        for k in kinds:
            done, predicted, err = errors.get(k, (0, 0, None))
            prof = usual[k][0] if k in usual else None
            out.append({"kind": k, "jobs_now": now_of.get(k, 0), "rates": by_kind.get(k, []),
                        "workload": workloads.get(k),
                        "profile": prof.value if prof is not None else None,
                        "profiles": usual[k][1] if k in usual else {}, "completed": done,
                        "expected_duration_s": expected_of(await history_of(self.ctl, k), ""),
                        "prediction": {"jobs": predicted, "mean_abs_error": err}})
        return out

    async def op_starts(self, args: dict[str, Any], uid: int) -> Any:
        """squeue --start: each waiting job's predicted start (hsched.controller.forecast.predicted_starts): its ISO
        time or None; with `detail`, the whole prediction (start, nodes, not before, the round's reason)."""
        from hsched.controller.forecast import predicted_starts

        got = await predicted_starts(self.ctl)
        if args.get("detail"):
            return {str(k): v for k, v in got.items()}
        return {str(k): v["start_time"] for k, v in got.items()}

    async def op_data(self, args: dict[str, Any], uid: int) -> Any:
        """`hsched data`: every dataset of the fleet file, where it is, and the copies under way (their progress)."""
        from hsched.controller import data

        return await data.listing(self.ctl)

    async def op_data_scan(self, args: dict[str, Any], uid: int) -> Any:
        """`hsched data scan`: look at each dataset's declared path on every up node and record what is there."""
        from hsched.controller import data

        return await data.scan(self.ctl)

    async def op_test_only(self, args: dict[str, Any], uid: int) -> Any:
        """sbatch --test-only: when and where a job of `spec` would start if it were submitted now (nothing is
        queued): hsched.controller.forecast.test_only."""
        from hsched.controller.forecast import test_only

        spec = self._spec(args)
        await self._hear_first_probes(spec.resources)
        return await test_only(self.ctl, spec, await self.user_name(uid))

    async def op_partitions(self, args: dict[str, Any], uid: int) -> Any:
        """The partitions `submit --partition` may name: each node label of the fleet file, with its nodes."""
        out: dict[str, list[str]] = {}
        for cfg in self.ctl.fleet_cfg.nodes:
            for label in cfg.labels:
                out.setdefault(label, []).append(cfg.name)
        # and every node's name, for -w/-x (sbatch's "Invalid node name specified" before the job is queued)
        return {"partitions": {k: sorted(v) for k, v in sorted(out.items())},
                "nodes": sorted(cfg.name for cfg in self.ctl.fleet_cfg.nodes)}

    async def op_metrics(self, args: dict[str, Any], uid: int) -> Any:
        """One scrape's OpenMetrics text, as the endpoint (settings `metrics`) serves it."""
        from hsched.controller.metrics import recorder, render, take_snapshot

        snap = await take_snapshot(self.ctl)
        recorder(self.ctl).snapshot = snap
        return {"text": render(self.ctl, snap).decode()}

    async def op_reload(self, args: dict[str, Any], uid: int) -> Any:
        """`hsched daemon reload`: fleet file and settings read again (hsched.controller.reloading); admins only."""
        from hsched.controller.reloading import reload

        await self.admin_only(uid, "reloading the settings")
        async with self.ctl.lock:
            return await reload(self.ctl)

    async def op_stop(self, args: dict[str, Any], uid: int) -> Any:
        await self.admin_only(uid, "stopping the controller")
        self.ctl.stopping.set()
        self.ctl.poke()
        return {"stopping": True, "pid": os.getpid()}

    async def op_snapshot(self, args: dict[str, Any], uid: int) -> Any:
        """Everything a dashboard frame needs, in one answer: active jobs, plus those that ended in the last
        `recent_s` seconds (default 600, so a requeue or a last look at a log is still one key away)."""
        recent_s = self.number(args, "recent_s", 600.0, low=0.0, high=365 * 86400.0)
        since = self.ctl.clock.time() - recent_s
        rows = await self.ctl.db(self.ctl.store.job_rows, active_only=True, ended_since=since)
        jobs = [job_from_row(r) for r in rows]
        owners = self.ctl.owners([j for j in jobs if j.state in ACTIVE_STATES])
        # each node also carries its host CPU and memory and its GPU processes (the dashboard's process list)
        runs_root = str(self.ctl.home.runs)
        return {"version": self.ctl.version, "time": iso(self.ctl.clock.time()),
                "jobs": [job_to_dict(j) for j in jobs],
                "nodes": [node_live_to_dict(rt.node, owners, host_load=host_load_to_dict(rt.host_load, rt.last_sample),
                                            processes=gpu_processes_to_list(rt.gpu_processes, owners, runs_root))
                          for rt in self.ctl.nodes.values()],
                # dataset copies under way (hsched.controller.data): the dashboard shows their progress
                "transfers": _transfers(self.ctl),
                "services": services.summary(self.ctl)}  # issue 30: the dashboard's Services view

    async def op_serve(self, args: dict[str, Any], uid: int) -> Any:
        """`hsched serve start|list|show|scale|stop` (issue 30): hsched.controller.services.request."""
        return await services.request(self, args, uid)

    async def op_share(self, args: dict[str, Any], uid: int) -> Any:
        """Fair share by user, as sshare shows it: account, shares, raw and decayed GPU-hours, the fair-share
        factor. Everyone may read it (as squeue shows every job)."""
        from hsched.controller.shares import share_report

        return await share_report(self.ctl)

    async def op_history(self, args: dict[str, Any], uid: int) -> Any:
        """Each device's utilization and memory history, and each node's host CPU and memory history, as the
        controller keeps them (hsched.controller.fleet.HISTORY samples, one per monitoring sample): the
        samples at or after `since` (epoch seconds; 0, the default, for all), so that a dashboard seeds its
        charts once and then asks for what is new. Everyone may read it (as the snapshot)."""
        since = self.number(args, "since", 0.0, low=0.0, high=1e12)
        devices = {}
        hosts = {}
        for rt in self.ctl.nodes.values():
            for d in rt.node.devices:
                series = rt.history.get(d.uuid)
                if series:
                    devices[d.uuid] = {"node": rt.name, **history_to_dict(series, since,
                                                                          ("utilization_gpu", "memory_used_mib"))}
            if rt.host_history:
                hosts[rt.name] = history_to_dict(rt.host_history, since, ("cpu_percent", "memory_used_mib"))
        return {"time": iso(self.ctl.clock.time()), "now": self.ctl.clock.time(),
                "interval_s": self.ctl.settings.monitor_interval_s, "devices": devices, "hosts": hosts}


def _transfers(ctl: Controller) -> list[dict[str, Any]]:
    from hsched.controller.data import state

    return [{"dataset": t.dataset, "from": t.source, "to": t.node, "done": t.done, "total": t.total,
             "job_id": t.job_id, "why": t.why, "seconds": ctl.clock.monotonic() - t.started}
            for t in state(ctl).transfers.values()]


def _by_workload(jobs: Any, runs: Any, since: float | None, until: float | None, now: float) -> dict[str, float]:
    """GPU-hours in the window by workload class (issue 30; "unknown" for a job that says none)."""
    from hsched.learn.accounting import run_gpu_seconds
    from hsched.model import workload_of

    out: dict[str, float] = {}
    for job in jobs:
        secs = sum(run_gpu_seconds(r, since, until, now) for r in runs.get(job.id, ()))
        if secs > 0:
            key = workload_of(job.spec) or "unknown"
            out[key] = out.get(key, 0.0) + secs / 3600
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _member_of_any(user: str, groups: tuple[str, ...]) -> bool:
    """Whether `user` belongs to one of `groups` (as primary or supplementary group). Blocking."""
    try:
        pw = pwd.getpwnam(user)
        mine = set(os.getgrouplist(user, pw.pw_gid))
    except (KeyError, OSError):
        return False
    for g in groups:
        try:
            if grp.getgrnam(g).gr_gid in mine:
                return True
        except KeyError:
            continue
    return False
