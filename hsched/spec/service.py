"""What a service asks (issue 30): its replicas' job, how many replicas, its latency objective, how a replica is
found ready. Pure: parsed from a table (the CLI's options, or a spec file's `[service]` section) and kept as JSON in
the store's `services` table; the controller's service manager (hsched.controller.services) runs it.

A service's replica is a job: `replica` is the JobSpec each one is submitted as (its command, resources, QoS), to
which the manager adds the service's name, the replica's number and its port (HSCHED_SERVICE, HSCHED_REPLICA,
HSCHED_PORT). The table splits in two: the keys in SERVICE_KEYS are the service's, every other key is the replica's
job table as `hsched submit` takes it (hsched.config.job_spec_from_table checks that part, so a replica's
resources mean exactly what a job's do).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hsched.errors import UserError
from hsched.model import JobSpec
from hsched.serialize import spec_from_dict, spec_to_dict

SERVICE_KEYS = frozenset({"name", "replicas", "slo", "target_concurrency", "ready_path", "port",
                          "gpus_per_replica", "stable_window"})
"""The keys of a `[service]` table that are the service's own; the rest are its replicas' job table."""

MAX_REPLICAS = 1024
DEFAULT_TARGET_CONCURRENCY = 2.0
"""Requests in flight per replica the autoscaler aims at when the service names none (Ray Serve's default
target_ongoing_requests)."""

DEFAULT_STABLE_WINDOW_S = 60.0
"""Knative's stable window: a service that names none averages its concurrency over the last minute."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_SLO = re.compile(r"p99\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s)?", re.IGNORECASE)
_WINDOW = re.compile(r"([0-9]*\.?[0-9]+)\s*(ms|s|m)?", re.IGNORECASE)


class ServiceState(enum.StrEnum):
    ACTIVE = "active"
    """Its replicas are kept between MIN and MAX."""
    STOPPING = "stopping"
    """`serve stop`: its replicas drain, then stop."""
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """A service as the store keeps it."""

    spec: ServiceSpec
    user: str
    """Whose it is: its replicas run as this user; they and a lab's admins may scale or stop it."""
    state: ServiceState
    wanted: int
    """Replicas wanted when last decided (a restarted controller starts from it)."""
    created: float
    updated: float


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    replica: JobSpec
    """What each replica runs and asks (the service's command, resources and QoS)."""
    min_replicas: int
    max_replicas: int
    slo_p99_s: float
    """The latency objective: requests' p99, seconds."""
    target_concurrency: float = DEFAULT_TARGET_CONCURRENCY
    ready_path: str | None = None
    """The HTTP path whose 2xx says a replica is ready; None: its port accepting a connection says so."""
    port: int = 0
    """The port the service's router listens on (its address); 0: one the controller picks."""
    stable_window_s: float = DEFAULT_STABLE_WINDOW_S
    """The autoscaler's stable window (its panic window is a tenth, its scale-down delay a half:
    hsched.sched.autoscale.ScalePolicy.for_window)."""


def parse_replicas(text: str, key: str = "--replicas") -> tuple[int, int]:
    """`2` or `1-4` as (MIN, MAX); a UserError naming `key` otherwise."""
    low, sep, high = str(text).strip().partition("-")
    try:
        lo = int(low)
        hi = int(high) if sep else lo
    except ValueError:
        raise UserError(f"{key} {text!r}: expected MIN-MAX (e.g. 1-4) or a count") from None
    if lo < 0 or hi < 1 or lo > hi or hi > MAX_REPLICAS:
        raise UserError(f"{key} {text!r}: expected 0 <= MIN <= MAX, 1 <= MAX <= {MAX_REPLICAS} (e.g. 1-4)")
    return lo, hi


def parse_slo(text: str, key: str = "--slo") -> float:
    """`p99=300ms` (or `p99=0.3s`, `p99=0.3`: seconds) as seconds."""
    m = _SLO.fullmatch(str(text).strip())
    if m is None:
        raise UserError(f"{key} {text!r}: expected p99=DURATION, e.g. p99=300ms")
    value = float(m.group(1)) / (1000.0 if (m.group(2) or "s").lower() == "ms" else 1.0)
    if not 0.0 < value <= 3600.0:
        raise UserError(f"{key} {text!r}: the p99 target must be above 0 and at most an hour")
    return value


def parse_window(text: str | int | float, key: str = "--stable-window") -> float:
    """`60s`, `6s`, `500ms`, `2m` or a number of seconds, as seconds (1 s to an hour: the autoscaler samples
    every second)."""
    m = _WINDOW.fullmatch(str(text).strip()) if not isinstance(text, bool) else None
    if m is None:
        raise UserError(f"{key} {text!r}: expected a duration such as 60s, 6s or 2m")
    unit = (m.group(2) or "s").lower()
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]
    if not 1.0 <= value <= 3600.0:
        raise UserError(f"{key} {text!r}: the stable window must be from 1 s to an hour")
    return value


def name_problem(name: str) -> str | None:
    if not _NAME.fullmatch(name):
        return (f"{name!r} is not a service name: use letters, digits, '.', '_' and '-' (at most 63, starting with "
                "a letter or digit)")
    return None


def split_table(table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the service's own keys, the replicas' job table) of a `[service]` table."""
    own = {k: v for k, v in table.items() if k in SERVICE_KEYS}
    job = {k: v for k, v in table.items() if k not in SERVICE_KEYS}
    if "gpus_per_replica" in own:
        res = dict(job.get("resources") or {}) if isinstance(job.get("resources"), Mapping) else {}
        res["gpus"] = own["gpus_per_replica"]
        job["resources"] = res
    return own, job


def service_from_table(own: Mapping[str, Any], replica: JobSpec, source: str) -> ServiceSpec:
    """The service of a table's own keys (split_table) and its replicas' checked job spec; a UserError naming the
    source and key otherwise."""
    def bad(key: str, why: str) -> UserError:
        return UserError(f"{source}: {key}: {why}")

    name = own.get("name")
    if not isinstance(name, str) or not name:
        raise bad("name", "required: the service's name (hsched serve start NAME ...)")
    why = name_problem(name)
    if why:
        raise bad("name", why)
    replicas = own.get("replicas", 1)
    if isinstance(replicas, list) and len(replicas) == 2 and all(isinstance(x, int) for x in replicas):
        replicas = f"{replicas[0]}-{replicas[1]}"
    if isinstance(replicas, bool) or not isinstance(replicas, str | int):
        raise bad("replicas", f"expected \"MIN-MAX\" or a count, found {replicas!r}")
    lo, hi = parse_replicas(str(replicas), f"{source}: replicas")
    if "slo" not in own:
        raise bad("slo", "required: the latency objective, e.g. slo = \"p99=300ms\" (--slo p99=300ms)")
    slo = parse_slo(str(own["slo"]), f"{source}: slo")
    target = own.get("target_concurrency", DEFAULT_TARGET_CONCURRENCY)
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 10_000:
        raise bad("target_concurrency", f"expected a number above 0 (requests in flight per replica), found "
                  f"{target!r}")
    path = own.get("ready_path")
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or any(c.isspace() for c in path)):
        raise bad("ready_path", f"expected an HTTP path starting with / (e.g. /health), found {path!r}")
    port = own.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise bad("port", f"expected a port from 1 to 65535 (or 0: any free one), found {port!r}")
    window = (parse_window(own["stable_window"], f"{source}: stable_window") if "stable_window" in own
              else DEFAULT_STABLE_WINDOW_S)
    if replica.array is not None or replica.resources.nodes != 1 or replica.dependency:
        raise bad("replicas", "a replica is one job on one node: no array, --nodes or --dependency")
    return ServiceSpec(name=name, replica=replica, min_replicas=lo, max_replicas=hi, slo_p99_s=slo,
                       target_concurrency=float(target), ready_path=path or None, port=port,
                       stable_window_s=window)


def service_to_dict(s: ServiceSpec) -> dict[str, Any]:
    return {"name": s.name, "replica": spec_to_dict(s.replica), "min_replicas": s.min_replicas,
            "max_replicas": s.max_replicas, "slo_p99_s": s.slo_p99_s, "target_concurrency": s.target_concurrency,
            "ready_path": s.ready_path, "port": s.port, "stable_window_s": s.stable_window_s}


def service_from_dict(d: Mapping[str, Any]) -> ServiceSpec:
    return ServiceSpec(name=d["name"], replica=spec_from_dict(d["replica"]), min_replicas=int(d["min_replicas"]),
                       max_replicas=int(d["max_replicas"]), slo_p99_s=float(d["slo_p99_s"]),
                       target_concurrency=float(d.get("target_concurrency", DEFAULT_TARGET_CONCURRENCY)),
                       ready_path=d.get("ready_path"), port=int(d.get("port") or 0),
                       stable_window_s=float(d.get("stable_window_s") or DEFAULT_STABLE_WINDOW_S))
