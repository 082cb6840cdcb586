"""The transport benchmarks measure what was delivered: every chunk the sender sent, decoded, counted once
(no timing asserts: shared machines)."""

from __future__ import annotations

import pytest

from bench.transport import (
    CHUNK_TRANSITIONS,
    MIN_MESSAGES,
    collector_overhead,
    mpqueue_transport_tps,
    synthetic_chunk,
    transport_tps,
)
from shared.chunk import nstep_targets


def test_synthetic_chunk_has_128_complete_transitions() -> None:
    c = synthetic_chunk()
    assert len(nstep_targets(c.actions, c.rewards, c.flags, c.first_start, 3, 0.99).starts) == 128


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_transport_tps_counts_every_chunk_sent_once(transport: str) -> None:
    res = transport_tps(transport, seconds=0.3)
    assert res["transport"] == transport and res["chunks"] >= MIN_MESSAGES  # the receiver checked: none lost
    # timed from the first chunk, so its transitions are not in the rate
    assert res["transitions"] == (res["chunks"] - 1) * CHUNK_TRANSITIONS


def test_mpqueue_baseline_counts_every_tuple_put() -> None:
    res = mpqueue_transport_tps(seconds=0.3)
    assert res["tuples"] >= MIN_MESSAGES and res["transitions"] == res["tuples"] - 1


def test_collector_overhead_reports_on_counting_env() -> None:
    res = collector_overhead("ApeXCounting-v0", k=2, steps=10, warmup=2)
    assert res["steps"] == 10 and res["env_ms_per_step"] > 0 and res["other_ms_per_step"] > 0
    assert res["overhead_frac"] > 0
