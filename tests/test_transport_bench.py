"""The transport benchmarks run and report their figures (no timing asserts: shared machines)."""

from __future__ import annotations

import pytest

from bench.transport import collector_overhead, mpqueue_transport_tps, synthetic_chunk, transport_tps
from shared.chunk import nstep_targets


def test_synthetic_chunk_has_128_complete_transitions() -> None:
    c = synthetic_chunk()
    assert len(nstep_targets(c.actions, c.rewards, c.flags, c.first_start, 3, 0.99).starts) == 128


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_transport_tps_reports(transport: str) -> None:
    res = transport_tps(transport, seconds=0.3)
    assert res["transport"] == transport and res["transitions"] > 0 and res["transitions_per_s"] > 0


def test_mpqueue_baseline_reports() -> None:
    res = mpqueue_transport_tps(seconds=0.3)
    assert res["transitions"] > 0 and res["transitions_per_s"] > 0


def test_collector_overhead_reports_on_counting_env() -> None:
    res = collector_overhead("ApeXCounting-v0", k=2, steps=10, warmup=2)
    assert res["steps"] == 10 and res["env_ms_per_step"] > 0 and res["other_ms_per_step"] > 0
    assert res["overhead_frac"] > 0
