"""Fault runners: the kill loop, and the randomized fault history with its replayable reports.

    python -m tests.faults.history --seeds 200               # 200 random histories against 3 sshd hosts
    python -m tests.faults.history --replay FILE             # replay a failing seed's report
    python -m tests.faults.history --kills 1000              # the kill loop
    python -m tests.faults.history --kills 50 --admin-query  # ... with an admin's sqlite3 query between kills

Kill loop: a controller is started, a submitter sends submits as fast as it can while the controller is killed
(SIGKILL) at a random instant: before it listens, while it probes, in the middle of a submit, while runs
launch or end. Every submit names a unique token; an acknowledged submit must be in the store, once, and every
job must run exactly once (its command notes its token's start; the count is read after the loop).

Randomized history: a seeded generator draws a list of actions (submits, cancels, preemptions by a `prod` job
arriving over `scavenger` ones, controller kills and restarts, partitions of a host shorter or longer than the
lease, host reboots with a new boot id, pauses); the runner plays them against 3 sshd hosts, sampling the
processes of every run after each action (two attempts of a job alive at once is a violation); then it brings
the lab to rest and checks every invariant. A failing seed writes a report (seed, actions, violations, the
events table) that `--replay` plays again: the same actions in the same order.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import SAFETY_S
from tests.faults.cluster import Cluster, FaultHosts, wait_for
from tests.faults.invariants import check, sample_copies

# ------------------------------------------------------------------------------------------------ kill loop

KILL_LOOP_FLEET = """
[[node]]
name = "kl"
[node.simulate]
model = "NVIDIA A100-SXM4-80GB"
count = 8
"""


@dataclasses.dataclass
class KillLoopFigures:
    kills: int
    acknowledged: int
    unacknowledged: int
    """Submits whose reply never came (the controller died first); each may or may not be in the store."""
    in_store_unacknowledged: int
    lost: int
    duplicates: int
    ran_twice: int
    never_ran: int
    violations: list[str]
    seconds: float

    def line(self) -> str:
        return (f"kill loop: {self.kills} SIGKILLs, {self.acknowledged} acknowledged submits "
                f"({self.unacknowledged} unanswered, {self.in_store_unacknowledged} of them stored), "
                f"{self.lost} lost, {self.duplicates} duplicated, {self.ran_twice} ran twice, "
                f"{self.never_ran} never ran, {len(self.violations)} invariant violations, {self.seconds:.1f} s")


ADMIN_QUERY = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)  # read-write, as the sqlite3 shell opens it
db.execute("SELECT count(*) FROM jobs").fetchone()
db.close()
"""


def admin_query(db: Path) -> None:
    """An admin's look into the store from another process: a read-write connection, one query, closed. The last
    connection to close a WAL database checkpoints it and deletes its log, so this is what finds out whether the
    controller still holds SQLite's locks (issue 27: it had dropped them, and lost the commits since)."""
    import subprocess

    subprocess.run([sys.executable, "-c", ADMIN_QUERY, str(db)], check=True, capture_output=True, timeout=SAFETY_S)


def kill_loop(lab: Cluster, kills: int, seed: int = 0, *, max_delay_s: float = 0.25,
              admin: bool = False) -> KillLoopFigures:
    """`kills` controller SIGKILLs interleaved with submits; `lab` has a fleet of simulated GPUs.

    A submitter sends submits one after the other for the whole loop, as a user's scripts would, while the
    controller is started and killed at a random instant, again and again; a submit caught by a kill either
    fails (not acknowledged) or is sent again by the client to the next controller (when the kernel says the
    dead one never read it). `admin`: an admin's read-write query of the store (another process) at a random
    instant of every controller's life, between its start and its kill."""
    from hsched.errors import ControllerError

    rng = random.Random(seed)
    sub_rng = random.Random(seed + 1)
    tokens = itertools.count()
    t0 = time.monotonic()
    unanswered: list[str] = []
    stop = threading.Event()

    def submitter() -> None:
        while not stop.is_set():
            tok = f"t{seed}-{next(tokens)}"
            command = ["sh", "-c", f"echo $HSCHED_JOB_ID >> {lab.marks}/{tok}"]
            try:
                lab.submit(command, gpus=sub_rng.choice([0, 1, 1, 2]), name=tok)
            except ControllerError as e:
                if "no controller runs" in str(e):  # nobody listens: nothing was sent
                    time.sleep(0.005)
                    continue
                unanswered.append(tok)
                lab.record.add("submit", None, False, name=tok, error=str(e))
            time.sleep(sub_rng.uniform(0.0, 0.08))

    thread = threading.Thread(target=submitter, daemon=True)
    thread.start()
    try:
        for _ in range(kills):
            lab.spawn()
            wait_for(lambda: lab.pid() is not None, "the controller to take its lock", every_s=0.002)
            delay = rng.uniform(0.0, max_delay_s)  # the instant of the fault
            if admin and lab.db.exists():
                split = rng.uniform(0.0, delay)
                time.sleep(split)
                admin_query(lab.db)
                time.sleep(delay - split)
            else:
                time.sleep(delay)
            lab.kill()
    finally:
        stop.set()
        lab.start()  # a submit waiting for a controller to come back gets one
        thread.join(SAFETY_S)
    assert not thread.is_alive(), "a submit hung"
    lab.quiesce()
    st = lab.read()
    names = {j["spec"]["name"]: j for j in st.jobs}
    acked = [a for a in lab.record.submits() if a.ok]
    lost = [a for a in acked if a.job not in {j["id"] for j in st.jobs}]
    counts: dict[str, int] = {}
    for j in st.jobs:
        counts[j["spec"]["name"]] = counts.get(j["spec"]["name"], 0) + 1
    runs_of = {tok: len((lab.marks / tok).read_text().splitlines()) if (lab.marks / tok).exists() else 0
               for tok in names}
    violations = check(lab)
    return KillLoopFigures(
        kills=kills, acknowledged=len(acked), unacknowledged=len(unanswered),
        in_store_unacknowledged=sum(1 for t in unanswered if t in names), lost=len(lost),
        duplicates=sum(c - 1 for c in counts.values() if c > 1),
        ran_twice=sum(1 for n in runs_of.values() if n > 1),
        never_ran=sum(1 for tok, n in runs_of.items() if n == 0 and names[tok]["state"] != "CANCELLED"),
        violations=violations, seconds=time.monotonic() - t0)


# ------------------------------------------------------------------------------------------ the history


@dataclasses.dataclass
class Action:
    """One step of a history. `job` names a job by its index among the history's submits."""

    kind: str
    """submit, cancel, preempt (a prod job over the scavengers), kill, start, cut, restore, reboot, pause"""
    job: int | None = None
    host: int | None = None
    """The host's index; for cut and reboot None means the one with the most live runs when it is played (and
    its restore: the host that was cut by the action before it that had None)."""
    seconds: float = 0.0
    qos: str = "normal"
    gpus: int = 1
    nodes: int = 1
    """> 1: a gang, one rank per node."""
    duration: float = 2.0
    """How long the job runs (its command: sleep)."""


HISTORY_SETTINGS = {"lease_s": 4, "heartbeat_timeout_s": 2, "kill_after_s": 1, "poll_interval_s": 0.2,
                    "retry_backoff_s": 0.5, "retry_backoff_max_s": 2}
LEASE_S = 4.0


def generate(seed: int, length: int = 6, hosts: int = 3, can_reboot: bool = True) -> list[Action]:
    """A history: 2 or 3 submits, then `length` actions (more with the pauses, restores and restarts they imply),
    the same for a seed."""
    rng = random.Random(seed)
    acts: list[Action] = []
    submitted = 0
    cut: set[int] = set()
    down = False
    # a few jobs first, so that the faults find work running (scavengers, for a prod job to preempt)
    for _ in range(3):
        acts.append(Action("submit", job=submitted, qos="scavenger" if rng.random() < 0.6 else "normal",
                           gpus=2 if rng.random() < 0.6 else 1, duration=round(rng.uniform(2.0, 5.0), 2)))
        submitted += 1
    length += len(acts)
    kinds = ["submit"] * 4 + ["cancel"] * 2 + ["gang", "preempt", "kill", "kill", "cut", "cut", "pause"] \
        + (["reboot"] if can_reboot else [])
    while len(acts) < length:
        kind = rng.choice(kinds)
        if kind == "submit":
            acts.append(Action("submit", job=submitted, qos=rng.choice(["normal", "scavenger", "scavenger"]),
                               gpus=rng.choice([1, 1, 2]), duration=round(rng.uniform(0.3, 2.5), 2)))
            submitted += 1
        elif kind == "gang":
            acts.append(Action("submit", job=submitted, qos=rng.choice(["normal", "scavenger"]), gpus=1, nodes=2,
                               duration=round(rng.uniform(0.5, 2.0), 2)))
            submitted += 1
        elif kind == "cancel" and submitted:
            acts.append(Action("cancel", job=rng.randrange(submitted)))
        elif kind == "preempt":
            # a prod job that needs a whole host: it preempts scavengers where it cannot just start
            acts.append(Action("submit", job=submitted, qos="prod", gpus=2, duration=round(rng.uniform(0.3, 1.5), 2)))
            submitted += 1
        elif kind == "kill" and not down:
            acts.append(Action("kill"))
            down = True
            if rng.random() < 0.7:
                acts.append(Action("pause", seconds=round(rng.uniform(0.0, 1.5), 2)))
                acts.append(Action("start"))
                down = False
        elif kind in ("cut", "reboot") and len(cut) < hosts - 1:
            # mostly the host with the most work at that moment (chosen when played: None), else a given one
            h = None if rng.random() < 0.7 else rng.choice([i for i in range(hosts) if i not in cut])
            # away shorter or longer than heartbeat timeout + lease (6 s): reattach, or requeue and fence
            acts.append(Action(kind, host=h))
            cut.add(-1 if h is None else h)
            away = rng.uniform(0.3, 2.0) if rng.random() < 0.5 else rng.uniform(LEASE_S + 2.0, LEASE_S + 3.0)
            acts.append(Action("pause", seconds=round(away, 2)))
            acts.append(Action("restore", host=h))
            cut.discard(-1 if h is None else h)
        elif kind == "pause":
            acts.append(Action("pause", seconds=round(rng.uniform(0.1, 1.0), 2)))
        if down and rng.random() < 0.5:
            acts.append(Action("start"))
            down = False
    if down:
        acts.append(Action("start"))
    return acts


def play(lab: Cluster, hosts: FaultHosts, actions: list[Action], ids: dict[int, int]) -> None:
    """Play a history, noting the job id of each submit index in `ids`. A request the controller fails (it
    was killed meanwhile) is recorded unacknowledged: part of the history, not an error."""
    from hsched.errors import ControllerError

    chosen = hosts[0]
    for i, a in enumerate(actions):
        lab.record.add("action", None, None, index=i, action=dataclasses.asdict(a))
        try:
            if a.kind in ("submit", "cancel") and lab.pid() is None:
                lab.start()  # as the CLI does: a request while no controller runs starts one
            if a.kind == "submit":
                ids[a.job or 0] = lab.submit(["sleep", str(a.duration)], gpus=a.gpus, qos=a.qos,
                                             name=f"h{len(lab.record.acts)}-{a.job}",
                                             checkpoint_signal="TERM@1", resources={"nodes": a.nodes})
            elif a.kind == "cancel" and a.job in ids:
                lab.cancel(ids[a.job])
            elif a.kind == "kill":
                lab.kill()
            elif a.kind == "start":
                lab.start()
            elif a.kind in ("cut", "reboot"):
                h = hosts[a.host] if a.host is not None else busiest(lab, hosts)
                if a.host is None:
                    chosen = h
                if a.kind == "cut":
                    h.cut()
                else:
                    hosts.crash(h)
                lab.record.add(a.kind, host=h.name)
            elif a.kind == "restore":
                h = hosts[a.host] if a.host is not None else chosen
                if hosts.is_cut(h):
                    h.restore()
                lab.record.add("restore", host=h.name)
            elif a.kind == "pause":
                sample_for(lab, hosts, a.seconds)
        except ControllerError as e:
            lab.record.add(f"{a.kind}-failed", None, False, error=str(e))
        sample(lab, hosts)


def busiest(lab: Cluster, hosts: FaultHosts) -> Any:
    """The host (not cut off) with the most live runs now; the first one on a tie."""
    live = [r["node"] for r in lab.read().runs if r["state"] in ("LAUNCHING", "RUNNING", "STOPPING")]
    up = [h for h in hosts if not hosts.is_cut(h)]
    return max(up, key=lambda h: (live.count(h.name), -up.index(h)))


def sample(lab: Cluster, hosts: FaultHosts) -> None:
    away = frozenset(h.name for h in hosts if hosts.is_cut(h))
    sample_copies(lab.read(), lab.processes(), lab.record, away)


def sample_for(lab: Cluster, hosts: FaultHosts, seconds: float) -> None:
    end = time.monotonic() + seconds
    while True:
        sample(lab, hosts)
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.25, left))


EFFECTS = ("preempted", "node_lost", "fenced", "lost", "retry", "requeued", "cancel", "cancelled")
"""Event kinds that show a fault's effect, counted per history."""


@dataclasses.dataclass
class SeedResult:
    seed: int
    actions: list[Action]
    violations: list[str]
    seconds: float
    jobs: int
    states: dict[str, int]
    happened: dict[str, int] = dataclasses.field(default_factory=dict)
    """Actions by kind, and the events that show the faults' effects (preempted, node_lost, fenced, lost...)."""
    report: Path | None = None


def run_history(lab: Cluster, hosts: FaultHosts, seed: int, actions: list[Action] | None = None,
                report_dir: Path | None = None) -> SeedResult:
    """Play one history (the seed's, or `actions`), bring the lab to rest, check every invariant; a failing
    history writes its report to `report_dir`."""
    t0 = time.monotonic()
    actions = actions if actions is not None else generate(seed, can_reboot=hosts.can_reboot)
    first_event = lab.read().events[-1]["id"] if lab.db.exists() and lab.read().events else 0
    violations: list[str] = []
    lab.record.sampled.clear()
    ids: dict[int, int] = {}
    try:
        play(lab, hosts, actions, ids)
        lab.quiesce()
        violations = check(lab, jobs=set(ids.values()))
    except AssertionError as e:  # a wait that never came is a violation of its own (a hang)
        violations = [f"hang: {e}"]
    st = lab.read()
    mine = [j for j in st.jobs if j["id"] in ids.values()]
    states: dict[str, int] = {}
    for j in mine:
        states[j["state"]] = states.get(j["state"], 0) + 1
    happened: dict[str, int] = {}
    for a in actions:
        happened[a.kind] = happened.get(a.kind, 0) + 1
    for e in st.events:
        if e["id"] > first_event and e["kind"] in EFFECTS:
            happened["ev:" + e["kind"]] = happened.get("ev:" + e["kind"], 0) + 1
    res = SeedResult(seed, actions, violations, time.monotonic() - t0, len(mine), states, happened)
    if violations and report_dir is not None:
        res.report = write_report(report_dir, res, [e for e in st.events if e["id"] > first_event], lab)
    return res


def write_report(report_dir: Path, res: SeedResult, events: list[dict[str, Any]], lab: Cluster) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"history-seed-{res.seed}.json"
    path.write_text(json.dumps({
        "seed": res.seed,
        "actions": [dataclasses.asdict(a) for a in res.actions],
        "violations": res.violations,
        "settings": lab.settings,
        "record": lab.record.to_json(),
        "events": events,
    }, indent=1, default=str))
    return path


def load_report(path: Path) -> tuple[int, list[Action]]:
    data = json.loads(Path(path).read_text())
    return int(data["seed"]), [Action(**a) for a in data["actions"]]


@contextlib.contextmanager
def history_lab(base: Path) -> Any:
    """3 sshd hosts and one controller for many histories."""
    with FaultHosts(base / "hosts", 3) as hosts:
        lab = Cluster(base / "lab", hosts=hosts, gpus=2, settings=HISTORY_SETTINGS)
        try:
            lab.start()
            yield lab, hosts
        finally:
            lab.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.history", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=0, help="play this many random histories (seeds from --first)")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--replay", type=Path, help="play the history of a failing seed's report again")
    ap.add_argument("--kills", type=int, default=0, help="run the kill loop with this many SIGKILLs")
    ap.add_argument("--admin-query", action="store_true",
                    help="kill loop: an admin's read-write sqlite3 query of the store during every controller's life")
    ap.add_argument("--seed", type=int, default=0, help="kill loop: the seed of its random instants")
    ap.add_argument("--reports", type=Path, default=Path("fault-reports"), help="where failing seeds' reports go")
    args = ap.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="hsched-faults-") as tmp:
        base = Path(tmp)
        if args.kills:
            with Cluster(base / "killloop", fleet_text=KILL_LOOP_FLEET) as lab:
                figures = kill_loop(lab, args.kills, args.seed, admin=args.admin_query)
            print(figures.line())
            for v in figures.violations:
                print("  ", v)
            failed += bool(figures.violations or figures.lost or figures.duplicates or figures.ran_twice)
        if args.seeds or args.replay:
            with history_lab(base) as (lab, hosts):
                todo: list[tuple[int, list[Action] | None]]
                if args.replay:
                    seed, actions = load_report(args.replay)
                    todo = [(seed, actions)]
                else:
                    todo = [(s, None) for s in range(args.first, args.first + args.seeds)]
                for seed, actions in todo:
                    res = run_history(lab, hosts, seed, actions, args.reports)
                    print(f"seed {seed}: {len(res.actions)} actions, {res.jobs} jobs {res.states}, {res.happened}, "
                          f"{len(res.violations)} violations, {res.seconds:.1f} s"
                          + (f", report {res.report}" if res.report else ""), flush=True)
                    for v in res.violations:
                        print("  ", v)
                    failed += bool(res.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
