"""The invariants every fault test ends with: from the store (read-only), the nodes' /proc, and the test's record.

State (true of any store at rest, and mostly at any instant):

* S1  `PRAGMA integrity_check` is ok.
* S2  At most one live copy per job: a job's live runs (LAUNCHING, RUNNING, STOPPING) all belong to one attempt,
      its current one (`restarts + 1`), are at most its world size, one per rank, on distinct nodes for a gang of
      one task per node; a job with live runs is active (LAUNCHING, RUNNING, PREEMPTING, COMPLETING), and at rest
      no job is active and no run is live or FENCING.
* S3  Every terminal job has a reason and an end time, and an exit code by this rule: its exit code is NULL
      exactly when no run of its last attempt left an exit record, i.e.
        - the job never ran that attempt (cancelled or failed while pending: no run of attempt `restarts + 1`):
          NULL, or the code its previous attempt ended with (a requeued job keeps that one);
        - every run of its last attempt ended without one (reason `lost` or `node_lost`, or a cancel or time
          limit whose runs were lost with their node): NULL;
        - else: one of the exit codes its last attempt's runs recorded.
      Every ended run has an end time; a COMPLETED run exit code 0, an EXITED run a non-zero one; a LOST, FENCING
      or FENCED run none (it left no exit record: that is what the state means).
* S4  No GPU held by two jobs: live runs of different jobs share no device, and neither do the placements of
      active jobs.
* S5  No process of an ended run is alive on any node (2 s after the run's recorded end: the acceptance of
      issue 12), apart from a FENCING run's stale copy on a node that is away; no process belongs to a run the
      store does not know; a process of an ended run never holds a GPU that a live run of another job was given.

History (the store's events and runs, and what the test did, `Record`):

* H1  Every acknowledged submit is in the store, once; no submitted name (each submit names a unique token)
      appears twice.
* H2  An acknowledged cancel takes effect: the job ends CANCELLED. A cancel answered "already ended" found a job
      that ends in a terminal state it had reached before.
* H3  A terminal state never changes: once observed terminal, a job is observed in that state ever after, and no
      `placed` or `started` event of it is committed after the read that saw it terminal.
* H4  A job never runs twice at once: the runs of different attempts never overlap in time (the store's start
      and end of each attempt), and the processes sampled during the test never show two attempts of a job alive
      at once, except a FENCING run's stale copy (given up past the lease; killed when its node is reached again).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from tests.faults.cluster import ACTIVE, LIVE_RUN, TERMINAL, MarkedProc, Record, Store

if TYPE_CHECKING:
    from tests.faults.cluster import Cluster

LEFTOVER_GRACE_S = 2.0
"""A run's processes are gone this long after its recorded end (issue 12's acceptance)."""


def run_name(run: dict[str, Any]) -> str:
    return str(run["run_dir"]).rstrip("/").rsplit("/", 1)[-1]


def state_violations(st: Store, procs: list[MarkedProc], *, quiescent: bool, now: float | None = None,
                     away: frozenset[str] = frozenset()) -> list[str]:
    """S1-S5. `away`: nodes cut off right now (their FENCING runs' stale copies may still run there)."""
    now = time.time() if now is None else now
    out: list[str] = []
    jobs = {j["id"]: j for j in st.jobs}
    # S1
    if st.integrity != "ok":
        out.append(f"S1 integrity_check: {st.integrity}")
    # S2
    live: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in st.runs:
        if r["state"] in LIVE_RUN:
            live[r["job_id"]].append(r)
    for jid, runs in live.items():
        job = jobs.get(jid)
        if job is None:
            out.append(f"S2 live runs {[r['id'] for r in runs]} of a job {jid} the store does not have")
            continue
        attempts = sorted({r["attempt"] for r in runs})
        if len(attempts) > 1:
            out.append(f"S2 job {jid}: live runs of attempts {attempts} at once")
        if attempts and attempts[-1] != job["restarts"] + 1:
            out.append(f"S2 job {jid}: live run of attempt {attempts[-1]} while its current attempt is "
                       f"{job['restarts'] + 1}")
        world = max(r["world"] for r in runs)
        ranks = [r["rank"] for r in runs]
        if len(runs) > world or len(set(ranks)) != len(ranks):
            out.append(f"S2 job {jid}: {len(runs)} live runs, ranks {ranks}, world {world}")
        tpn = int(job["spec"].get("resources", {}).get("tasks_per_node") or 1)
        nodes = [r["node"] for r in runs]
        if world > 1 and tpn == 1 and len(set(nodes)) != len(nodes):
            out.append(f"S2 job {jid}: gang ranks share a node: {nodes}")
        if job["state"] not in ACTIVE:
            out.append(f"S2 job {jid} is {job['state']} with live runs {[r['id'] for r in runs]}")
    if quiescent:
        busy = [f"{j['id']}:{j['state']}" for j in st.jobs if j["state"] not in TERMINAL]
        if busy:
            out.append(f"S2 at rest, jobs not ended: {busy}")
        stale = [f"run {r['id']} of job {r['job_id']}: {r['state']}" for r in st.runs
                 if r["state"] in LIVE_RUN or r["state"] == "FENCING"]
        if stale:
            out.append(f"S2 at rest, runs still live or awaiting fencing: {stale}")
    # S3
    for job in st.jobs:
        if job["state"] not in TERMINAL:
            continue
        jid = job["id"]
        if not job["reason"]:
            out.append(f"S3 job {jid} is {job['state']} with no reason")
        if job["end_time"] is None:
            out.append(f"S3 job {jid} is {job['state']} with no end time")
        runs = [r for r in st.runs if r["job_id"] == jid]
        last = [r for r in runs if r["attempt"] == job["restarts"] + 1]
        code = job["exit_code"]
        if not last:
            earlier = {r["exit_code"] for r in runs}
            if code is not None and code not in earlier:
                out.append(f"S3 job {jid} never ran its last attempt, yet has exit code {code} "
                           f"(its runs recorded {sorted(c for c in earlier if c is not None)})")
            continue
        codes = {r["exit_code"] for r in last if r["exit_code"] is not None}
        if codes and code not in codes:
            out.append(f"S3 job {jid} ({job['state']}, {job['reason']}) has exit code {code}, but its last "
                       f"attempt's runs recorded {sorted(codes)}")
        if not codes and code is not None:
            out.append(f"S3 job {jid} has exit code {code} though no run of its last attempt left one")
    for r in st.runs:
        if r["state"] in LIVE_RUN:
            continue
        if r["end_time"] is None and r["state"] not in ("FENCING", "FENCED"):
            out.append(f"S3 run {r['id']} of job {r['job_id']} is {r['state']} with no end time")
        if r["state"] == "COMPLETED" and r["exit_code"] != 0:
            out.append(f"S3 run {r['id']} of job {r['job_id']} is COMPLETED with exit code {r['exit_code']}")
        if r["state"] == "EXITED" and r["exit_code"] in (None, 0):
            out.append(f"S3 run {r['id']} of job {r['job_id']} is EXITED with exit code {r['exit_code']}")
        if r["state"] in ("LOST", "FENCING", "FENCED") and r["exit_code"] is not None:
            # a run given up for lost has no exit record by definition: one recorded afterwards came from a stale
            # report (read before the run was given up), and settled its job a second time
            out.append(f"S3 run {r['id']} of job {r['job_id']} is {r['state']} with exit code {r['exit_code']}")
    # S4
    holder: dict[tuple[str, str], int] = {}
    for jid, runs in live.items():
        for r in runs:
            for dev in r["devices"]:
                other = holder.setdefault((r["node"], dev), jid)
                if other != jid:
                    out.append(f"S4 GPU {dev} on {r['node']} held by live runs of jobs {other} and {jid}")
    placed: dict[str, int] = {}
    for job in st.jobs:
        if job["state"] not in ACTIVE:
            continue
        for p in job["placement"]:
            for dev in p.get("devices", []):
                other = placed.setdefault(dev, job["id"])
                if other != job["id"]:
                    out.append(f"S4 GPU {dev} placed for active jobs {other} and {job['id']}")
    # S5
    out.extend(process_violations(st, procs, now=now, away=away))
    return out


def process_violations(st: Store, procs: list[MarkedProc], *, now: float,
                       away: frozenset[str] = frozenset()) -> list[str]:
    out: list[str] = []
    by_name = {run_name(r): r for r in st.runs}
    live_gpus: dict[str, int] = {}
    for r in st.runs:
        if r["state"] in LIVE_RUN:
            for dev in r["devices"]:
                live_gpus[dev] = r["job_id"]
    for p in procs:
        run = by_name.get(p.run_name)
        if run is None:
            # a run folder the store does not know (yet: its row is committed before the launch, so never)
            out.append(f"S5 process {p.pid} ({p.comm}) of run folder {p.run_dir}, which the store does not know")
            continue
        if run["state"] in LIVE_RUN:
            continue
        if run["state"] == "FENCING" and run["node"] in away:
            continue
        ended = run["end_time"]
        if run["state"] != "FENCING" and ended is not None and now - ended < LEFTOVER_GRACE_S:
            continue  # not yet: see assert_invariants
        where = f"run {run['id']} of job {run['job_id']} (attempt {run['attempt']}, {run['state']} on {run['node']})"
        out.append(f"S5 process {p.pid} ({p.comm}) of {where} is alive "
                   + (f"{now - ended:.1f} s after the run's end" if ended is not None else "after the run ended"))
        for dev in (p.cuda or "").split(","):
            other = live_gpus.get(dev)
            if dev and other is not None and other != run["job_id"]:
                out.append(f"S5 GPU {dev} was given to job {other} while process {p.pid} of ended {where} uses it")
    return out


def history_violations(st: Store, record: Record, only: set[int] | None = None) -> list[str]:
    """H1-H4 (H4's process samples are in `record.sampled`); `only`: these jobs' (the store is cut down to them)."""
    out: list[str] = []
    jobs = {j["id"]: j for j in st.jobs}

    def mine(jid: int | None) -> bool:
        return only is None or jid in only

    # H1
    names: dict[str, list[int]] = defaultdict(list)
    for j in st.jobs:
        if j["spec"].get("name"):
            names[j["spec"]["name"]].append(j["id"])
    for a in record.submits():
        if only is not None and a.job not in only and not (a.ok is False and a.detail.get("name") in names):
            continue
        if a.ok and a.job not in jobs:
            out.append(f"H1 acknowledged submit of job {a.job} ({a.detail.get('name')}) is not in the store")
        name = a.detail.get("name")
        if name and len(names.get(name, [])) > 1:
            out.append(f"H1 submit {name!r} is in the store {len(names[name])} times: jobs {names[name]}")
        if name and a.ok and names.get(name) and a.job not in names[name]:
            out.append(f"H1 submit {name!r} was acknowledged as job {a.job} but the store has it as {names[name]}")
    # H2
    for a in record.acts:
        if a.kind != "cancel" or a.ok is None or a.job not in jobs or not mine(a.job):
            continue
        job = jobs[a.job]
        if a.ok and job["state"] in TERMINAL and job["state"] != "CANCELLED":
            out.append(f"H2 job {a.job}: cancel acknowledged at {a.t:.3f}, yet it ended {job['state']} "
                       f"({job['reason']})")
        if a.ok is False:
            seen = record.first_terminal.get(a.job)
            if job["state"] not in TERMINAL:
                out.append(f"H2 job {a.job}: cancel answered 'already ended', yet it is {job['state']}")
            elif seen is not None and seen[0] != job["state"]:
                out.append(f"H2 job {a.job}: had ended {seen[0]} when the cancel came, now {job['state']}")
    # H3
    out.extend(f"H3 {m}" for jid, m in record.changed_after_terminal if mine(jid))
    for jid, (state, at, max_event) in record.first_terminal_events.items():
        if not mine(jid):
            continue
        late = [e for e in st.events
                if e["job_id"] == jid and e["id"] > max_event and e["kind"] in ("placed", "started")]
        if late:
            out.append(f"H3 job {jid} was seen {state} at {at:.3f}, then: "
                       + "; ".join(f"{e['kind']} ({e['message']})" for e in late))
    for j in st.jobs:
        seen = record.first_terminal.get(j["id"])
        if seen is not None and j["state"] != seen[0]:
            out.append(f"H3 job {j['id']} was seen {seen[0]}, is now {j['state']}")
    # H4
    by_job: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in st.runs:
        by_job[r["job_id"]][r["attempt"]].append(r)
    for jid, attempts in by_job.items():
        spans = []
        for attempt, runs in sorted(attempts.items()):
            starts = [r["start_time"] for r in runs if r["start_time"] is not None]
            ends = [r["end_time"] if r["end_time"] is not None else float("inf") for r in runs]
            if starts:
                spans.append((attempt, min(starts), max(ends), sorted({r["node"] for r in runs})))
        for (a1, _s1, e1, n1), (a2, s2, _e2, n2) in itertools.pairwise(spans):
            if s2 < e1:
                out.append(f"H4 job {jid}: attempt {a2} on {n2} started {e1 - s2:.3f} s before attempt {a1} on "
                           f"{n1} ended")
    out.extend(f"H4 {m}" for jid, m in record.sampled if mine(jid))
    return out


def sample_copies(st: Store, procs: list[MarkedProc], record: Record, away: frozenset[str]) -> None:
    """H4 at one instant: the processes alive now belong to at most one attempt per job, apart from a FENCING
    run's stale copy: one the store has given up (its node was away past the lease) and kills when it can reach
    it again, whether that node is still away (`away`) or back and not fenced yet (the heartbeat that says it is
    back comes first)."""
    by_name = {run_name(r): r for r in st.runs}
    attempts: dict[int, set[tuple[int, str]]] = defaultdict(set)
    for p in procs:
        run = by_name.get(p.run_name)
        if run is None or run["state"] == "FENCING":
            continue
        attempts[run["job_id"]].add((run["attempt"], run["node"]))
    for jid, seen in attempts.items():
        if len({a for a, _ in seen}) > 1:
            msg = f"job {jid}: processes of attempts {sorted(seen)} alive at once (at {time.time():.3f})"
            if not any(j == jid for j, _ in record.sampled):
                record.sampled.append((jid, msg))


def check(cluster: Cluster, *, quiescent: bool = True, jobs: set[int] | None = None) -> list[str]:
    """Every invariant, now (`jobs`: of these jobs only, and of the store as a whole: its integrity, its GPUs,
    the processes of its runs). Processes of a run that ended less than LEFTOVER_GRACE_S ago get the rest of it."""
    away = frozenset(h.name for h in cluster.hosts if cluster.hosts.is_cut(h)) if cluster.hosts is not None \
        else frozenset()
    st = cluster.read(integrity=True)
    procs = cluster.processes()
    recent = [r["end_time"] for r in st.runs if r["end_time"] is not None and r["state"] not in LIVE_RUN]
    young = [t for t in recent if time.time() - t < LEFTOVER_GRACE_S]
    if young and procs:
        time.sleep(max(0.0, max(young) + LEFTOVER_GRACE_S - time.time()))
        st = cluster.read(integrity=True)
        procs = cluster.processes()
    if jobs is not None:
        mine = {r["run_dir"].rstrip("/").rsplit("/", 1)[-1] for r in st.runs if r["job_id"] in jobs}
        procs = [p for p in procs if p.run_name in mine]
        st = st.only(jobs)
    return (state_violations(st, procs, quiescent=quiescent, away=away)
            + history_violations(st, cluster.record, jobs))


def assert_invariants(cluster: Cluster, *, quiescent: bool = True) -> None:
    found = check(cluster, quiescent=quiescent)
    assert not found, "invariants violated:\n  " + "\n  ".join(found)
