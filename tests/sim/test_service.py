"""`hsched sim --service`: an autoscaled inference service beside a training trace (hsched/sim/service.py)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hsched.cli import app
from hsched.sched.autoscale import ScalePolicy
from hsched.sched.registry import make_policy
from hsched.sched.servicetime import Request, compress, load_trace
from hsched.sched.throughput import ThroughputModel
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, Simulator
from hsched.sim.service import ServiceConfig, ServiceSim
from hsched.sim.trace import Trace, TraceJob

AZURE = Path(__file__).parent.parent / "fixtures" / "traces" / "azure-llm-2023"


@cache
def requests(name: str) -> tuple[Request, ...]:
    return load_trace((AZURE / f"{name}.csv").read_text(), f"{name}.csv")


def conv_slice() -> tuple[Request, ...]:
    """conv.csv's minutes 24-58 (its rise to the peak minute, 507 requests, and its fall to 225), at 10x: 204 s,
    11,846 requests."""
    reqs = [
        Request(r.arrival_s - 1440.0, r.context_tokens, r.generated_tokens)
        for r in requests("conv")
        if 1440.0 <= r.arrival_s < 3480.0
    ]
    return compress(reqs, 10.0)


def training(n: int = 8, work: float = 600.0, gpus: int = 1, qos: str = "normal") -> Trace:
    """n checkpointable one-GPU training jobs at t=0, `work` seconds each on a V100: they fill an 8-GPU fleet."""
    model = ThroughputModel({"v100": {("train", 1): 1.0, ("train", 2): 2.0}})
    jobs = tuple(TraceJob(id=i, job_type="train", gpus=gpus, arrival_s=0.0, work=work, qos=qos) for i in range(n))
    return Trace(jobs, model, "handmade")


def run(service: ServiceSim, trace: Trace | None = None, checkpoint_s: float = 30.0) -> dict:
    sim = Simulator(
        trace or training(),
        parse_cluster("v100:8", gpus_per_node=8),
        make_policy("hsched"),
        SimConfig(costs=SimCosts(checkpoint_s=checkpoint_s)),
        service=service,
    )
    result = sim.run()
    summary = dict(result.summary)
    summary["records"] = result.records
    return summary


POLICY = ScalePolicy(min_replicas=2, max_replicas=8, target_concurrency=8.0, slo_p99_s=1.5)


def conv_service(static: int | None = None, reqs: tuple[Request, ...] | None = None) -> ServiceSim:
    return ServiceSim(
        ServiceConfig(
            conv_slice() if reqs is None else reqs,
            POLICY,
            name="conv",
            cold_start_s=2.0,
            static=static,
            speedup=10.0,
            initial=5,
        )
    )


@cache
def autoscaled() -> dict:
    return run(conv_service())


def test_autoscaled_meets_the_slo_with_fewer_gpu_hours_than_static_peak():
    s = autoscaled()["service"]
    assert s["requests_failed"] == 0 and s["requests_finished"] == s["requests"] > 5000
    assert s["slo_attainment"] >= 0.99, s
    peak = run(conv_service(static=s["static_peak_replicas"]))["service"]
    assert peak["slo_attainment"] >= 0.99
    assert s["service_gpu_hours"] < peak["service_gpu_hours"]
    assert s["scale_ups"] >= 1 and s["scale_downs"] >= 1
    assert s["replica_timeline"][0][1] >= 1


def test_static_median_provisioning_misses_the_slo():
    # the whole of conv.csv at 10x, on the replicas its median minute needs (4 at 8 in flight each)
    svc = conv_service(reqs=compress(requests("conv"), 10.0))
    peak, median = svc.provisioning()
    assert (peak, median) == (5, 4)
    # each minute provisioned for itself by the same rule: 4 replicas in 56 of the 58 full minutes, 5 in two;
    # against the peak's 5 that is 81%, the floor of any autoscaler's GPU-hours at this load per replica
    assert svc.per_minute_floor() == pytest.approx(234 / 58)
    s = run(conv_service(static=median, reqs=compress(requests("conv"), 10.0)))["service"]
    assert s["requests_failed"] == 0
    assert s["slo_attainment"] < 0.99, s  # below the bar the autoscaled service meets
    assert s["latency_p99_s"] > 1.5


def test_code_idles_to_min_and_wakes_without_a_failed_request():
    # code.csv's first 4 minutes at 1x: 63 requests, two minutes of none, then a burst of 531
    reqs = tuple(r for r in requests("code") if r.arrival_s < 240.0)
    pol = ScalePolicy(
        min_replicas=0,
        max_replicas=8,
        target_concurrency=6.0,
        slo_p99_s=1.5,
        stable_window_s=30.0,
        panic_window_s=3.0,
        scale_down_delay_s=15.0,
    )
    svc = ServiceSim(ServiceConfig(reqs, pol, name="code", cold_start_s=5.0))
    s = run(svc)["service"]
    wanted = [w for _, w, _ in s["replica_timeline"]]
    first_zero = wanted.index(0)
    assert 0 < first_zero < len(wanted) - 1, wanted
    assert max(wanted[first_zero:]) >= 1  # woken by the burst
    assert s["replica_timeline"][-1][1] == 0  # and gone at the end
    assert s["requests_failed"] == 0 and s["requests_finished"] == len(reqs)
    assert any("wake 1 replica" in r for _, r in s["scale_reasons"])
    assert any(r.startswith("idle: no request over 30 s -> 0 replicas") for _, r in s["scale_reasons"])


def test_training_preempted_by_the_service_resumes_and_loses_no_work():
    # one replica at first (7 of the 8 training jobs start), then the load's rise scales up: prod preempts
    pol = ScalePolicy(min_replicas=1, max_replicas=6, target_concurrency=8.0, slo_p99_s=1.5)
    base = run(
        ServiceSim(ServiceConfig(conv_slice()[:3000], pol, cold_start_s=2.0)),
        trace=training(work=600.0),
        checkpoint_s=30.0,
    )
    recs = base["records"]
    assert len(recs) == 8 and base["unfinished_jobs"] == 0
    assert base["service"]["scale_ups"] >= 1 and base["service"]["requests_failed"] == 0
    stopped = [r for r in recs if r.restarts]
    assert stopped, "the replicas the service added on a full fleet preempt training"
    assert base["preemptions"] >= len(stopped)
    # the fleet stayed full while the service ran: what the service did not hold, training did
    svc = base["service"]
    full = 8 * svc["service_span_s"] / 3600.0
    assert svc["training_gpu_hours_during_service"] + svc["service_gpu_hours"] == pytest.approx(full, rel=0.02)
    for r in recs:
        # every job ran its whole work once (600 s at rate 1) plus one checkpoint restore per restart
        assert r.run_s == pytest.approx(600.0 + 30.0 * r.restarts, abs=1e-6)
    assert base["gpu_hours_lost"] == pytest.approx(sum(30.0 * r.restarts for r in recs) / 3600.0)
    assert base["service"]["replica_preemptions"] == 0
    assert base["service"]["training_gpu_hours"] == pytest.approx(sum(r.run_s for r in recs) / 3600.0, rel=1e-6)


def test_replicas_preempted_by_a_higher_class_give_their_requests_back():
    # a normal-class service on a fleet that prod training takes whole at 10 s (for 20 s): its requests wait
    # (none lost) and its replicas start again when the training ends
    model = ThroughputModel({"v100": {("train", 1): 1.0}})
    jobs = tuple(TraceJob(id=i, job_type="train", gpus=1, arrival_s=10.0, work=20.0, qos="prod") for i in range(8))
    reqs = tuple(r for r in conv_slice() if r.arrival_s < 40.0)
    svc = ServiceSim(ServiceConfig(reqs, POLICY, cold_start_s=2.0, static=2, qos="normal"))
    s = run(svc, trace=Trace(jobs, model, "prod-burst"))
    out = s["service"]
    assert out["replica_preemptions"] == 2
    assert out["requests_failed"] == 0 and out["requests_finished"] == len(reqs)
    assert out["requests_requeued"] >= 1
    assert out["latency_max_s"] > 15.0  # waited out the training
    assert all(r.restarts == 0 for r in s["records"])


def test_a_normal_class_service_waits_for_free_gpus():
    svc = ServiceSim(ServiceConfig(conv_slice()[:50], POLICY, cold_start_s=2.0, static=1, qos="normal"))
    s = run(svc, trace=training(work=100.0), checkpoint_s=30.0)
    assert all(r.restarts == 0 for r in s["records"])
    assert s["service"]["requests_failed"] == 0
    # it waited for the training to end (100 s) before its replica could even start
    assert s["service"]["latency_max_s"] > 90.0


def test_cli_service_json_and_text(tmp_path):
    path = tmp_path / "slice.csv"
    lines = (AZURE / "code.csv").read_text().splitlines()[:400]
    path.write_text("\n".join(lines) + "\n")
    args = [
        "sim",
        "--synthetic",
        "4",
        "--cluster",
        "v100:8",
        "--gpus-per-node",
        "8",
        "--service",
        str(path),
        "--service-speedup",
        "10",
        "--service-replicas",
        "1-4",
        "--service-slo",
        "p99=2s",
        "--service-cold-start",
        "1s",
        "--service-stable-window",
        "10s",
    ]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["service"]
    assert s["requests"] == 399 and s["requests_failed"] == 0
    for k in (
        "slo_attainment",
        "latency_p50_s",
        "latency_p99_s",
        "latency_max_s",
        "service_gpu_hours",
        "scale_ups",
        "scale_downs",
        "replica_timeline",
        "training_gpu_hours",
        "static_peak_replicas",
    ):
        assert k in s
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "service slice (autoscale, replicas 1-4 x 1 GPU, qos prod, 10x" in text.stdout
    assert "SLO p99 2 s attained by" in text.stdout


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        (["--service-replicas", "5-2"], "--service-replicas"),
        (["--service-slo", "p50=1s"], "--service-slo"),
        (["--service-cold-start", "soon"], "--service-cold-start"),
        (["--service-qos", "gold"], "--service-qos"),
        (["--service-static", "0"], "--service-static"),
        (["--round-mode", "gavel"], "--service runs with --round-mode event"),
    ],
)
def test_cli_bad_service_options_exit_2_with_one_line(extra, word):
    r = CliRunner().invoke(
        app, ["sim", "--synthetic", "2", "--cluster", "v100:4", "--service", str(AZURE / "code.csv"), *extra]
    )
    assert r.exit_code == 2, r.output
    assert word in r.output and "Traceback" not in r.output


def test_cli_bad_service_file_exits_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12,x\n")
    r = CliRunner().invoke(app, ["sim", "--synthetic", "2", "--cluster", "v100:4", "--service", str(bad)])
    assert r.exit_code == 2
    assert "bad.csv: line 2" in r.output
    r = CliRunner().invoke(
        app, ["sim", "--synthetic", "2", "--cluster", "v100:4", "--service", str(tmp_path / "none.csv")]
    )
    assert r.exit_code == 2 and "none.csv" in r.output
