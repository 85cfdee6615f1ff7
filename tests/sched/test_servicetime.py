"""The inference stand-in's latency model (hsched/sched/servicetime.py): token counts, batching, the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsched.sched.servicetime import (
    ReplicaQueue,
    Request,
    ServiceModel,
    compress,
    load_trace,
    relative_speed,
    service_time_s,
    slowdown,
)

TRACES = Path(__file__).parent.parent / "fixtures" / "traces" / "azure-llm-2023"


def test_service_time_from_tokens_and_speed():
    m = ServiceModel()
    assert service_time_s(1020, 129, m) == pytest.approx(1020 * 0.00004 + 129 * 0.0012)
    assert 0.15 <= service_time_s(1020, 129) <= 0.5  # conv.csv's median request, alone
    assert service_time_s(1020, 129, speed=2.0) == pytest.approx(service_time_s(1020, 129) / 2)
    assert service_time_s(100, 10, m, batch=8) == pytest.approx(service_time_s(100, 10, m) * 1.7)
    assert slowdown(m, 50) == slowdown(m, m.max_batch)


def test_relative_speed_from_the_accelerator_table():
    assert relative_speed("V100") == 1.0
    assert relative_speed("NVIDIA A100-SXM4-80GB") > 1.5
    assert relative_speed("k80") < 0.5
    assert relative_speed("no such gpu") == 1.0
    assert relative_speed(None) == 1.0


def test_load_trace_parses_the_azure_form_and_names_bad_lines():
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
    )
    reqs = load_trace(text)
    assert reqs[0] == Request(0.0, 374, 44)
    assert reqs[1].arrival_s == pytest.approx(4.314579)
    with pytest.raises(ValueError, match=r"t.csv: line 3: .*expected TIMESTAMP"):
        load_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n2,x,3\n", source="t.csv")
    with pytest.raises(ValueError, match="missing column"):
        load_trace("when,ctx\n1,2\n")
    with pytest.raises(ValueError, match="no requests"):
        load_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    conv = load_trace((TRACES / "conv.csv").read_text())
    assert len(conv) == 19366 and 3400 < conv[-1].arrival_s < 3600


def test_compress_speeds_up_and_scales_deterministically():
    reqs = tuple(Request(float(i), 10, 10) for i in range(10))
    assert [r.arrival_s for r in compress(reqs, 10)] == [i / 10 for i in range(10)]
    assert len(compress(reqs, 1, 0.5)) == 5
    assert len(compress(reqs, 1, 2.0)) == 20
    assert len(compress(reqs, 1, 1.5)) == 15


def test_replica_queue_alone_batched_and_fifo():
    m = ServiceModel(prefill_s=0.0, decode_s=0.1, max_batch=2, batch_alpha=0.5)
    q = ReplicaQueue(m)
    assert q.arrive(0.0, 1, 1.0) == []
    assert q.next_finish() == pytest.approx(1.0)  # alone
    q.arrive(0.5, 2, 1.0)  # now 2 in service at rate 1 / 1.5
    q.arrive(0.5, 3, 0.2)  # waits: the batch is full
    assert q.outstanding == 3
    done = q.advance(10.0)
    # a: 0.5 done alone, 0.5 left at rate 2/3 -> finishes at 1.25; b has 0.5 left, c enters; both at 2/3:
    # c (0.2) finishes at 1.25 + 0.3 = 1.55; b (0.3 left) then alone -> 1.55 + 0.3 = 1.85
    assert [k for k, _ in done] == [1, 3, 2]
    assert [t for _, t in done] == pytest.approx([1.25, 1.55, 1.85])
    assert q.outstanding == 0 and q.next_finish() is None
    assert q.busy_s == pytest.approx(1.85)
