"""The insert gate (learner.max_insert_lead) with a real head, real collector processes and a learner
far slower than the collectors: over many gate cycles no collector is killed as stalled, every
collector gets a fair share of the inserts, and the weight lag stays bounded.

The counting env steps in microseconds while the learner's CNN update takes tens of milliseconds on
one CPU thread, so the gate is shut most of the time and opens for a chunk or two at a time: the
situation in which a collector used to be starved and killed every two minutes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

import envs.testing  # noqa: F401  (registers ApeXCounting-v0)
from launcher.head import Head, StopAt
from shared.config import (
    CollectorConfig,
    Config,
    EnvConfig,
    LearnerConfig,
    LoggingConfig,
    ReplayConfig,
    TransportConfig,
)

# alone: a collector starved of CPU for over transport.head_timeout_s takes its registration for reclaimed
pytestmark = [pytest.mark.slow, pytest.mark.alone]

# Run until the learner has made this many updates (many gate cycles), counted rather than timed: a loaded
# machine gets there later, not differently. DEADLINE_S only bounds a run that makes no progress.
MIN_UPDATES = 150
MIN_GATED_ROUNDS = 100
DEADLINE_S = 400.0
STALL_TIMEOUT_S = 3.0  # ten times shorter than the default: a starved collector would be killed within it


def gated_config(credits: int) -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="ApeXCounting-v0", frame_stack=4),
        collectors=CollectorConfig(count=2, envs_per_collector=2, chunk_steps=8, heartbeat_s=0.2),
        replay=ReplayConfig(capacity=20_000, n_step=3),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, batch_size=32, warmup_transitions=500,
                              samples_per_insert=4.0, max_insert_lead=200, weight_broadcast_every=10,
                              prefetch=False, checkpoint_every_s=3600.0),
        transport=TransportConfig(port=0, max_chunks_in_flight=credits, stall_timeout_s=STALL_TIMEOUT_S,
                                  head_timeout_s=10.0),
        logging=LoggingConfig(interval_s=5.0),
    )


@pytest.mark.parametrize("credits", [0, 2], ids=["hwm-only", "credits-2"])
def test_gate_serves_collectors_fairly_and_never_kills_them(tmp_path, credits: int) -> None:
    head = Head(gated_config(credits), tmp_path / "run")
    lags: list[int] = []
    waiting_seen = 0
    at_first_gate: dict[int, int] | None = None  # transitions by slot when the gate first held a chunk back
    summary: dict = {}
    stop = threading.Event()

    def run() -> None:
        summary.update(head.run(StopAt(seconds=DEADLINE_S), stop))

    runner = threading.Thread(target=run)
    try:
        runner.start()
        while runner.is_alive():
            time.sleep(0.5)
            stats = head.consolidation.stats()
            live = list(stats.collectors.values())
            if at_first_gate is None and head.consolidation.gated_rounds > 0:
                at_first_gate = dict(stats.transitions_by_slot)
            waiting_seen += sum(bool(c["waiting"]) for c in live)
            if head.learner.updates > 50 and len(live) == 2:
                lags.append(head.learner.updates - min(c["weight_version"] for c in live))
            if head.learner.updates >= MIN_UPDATES and head.consolidation.gated_rounds > MIN_GATED_ROUNDS \
                    and waiting_seen > 0:
                stop.set()
        runner.join()
        stats = head.consolidation.stats()
    finally:
        head.close()
    print(f"credits={credits}: {summary}; by slot {stats.transitions_by_slot} ({at_first_gate} when the gate first "
          f"shut); gated rounds {head.consolidation.gated_rounds}; lag max {max(lags, default=-1)}; waiting samples "
          f"{waiting_seen}")
    assert summary["reason"] == "signal", summary  # the counts below were reached before the deadline
    assert summary["updates"] >= MIN_UPDATES, summary  # the learner ran, and throttled the collectors for most of the run
    assert head.consolidation.gated_rounds > MIN_GATED_ROUNDS and waiting_seen > 0
    assert summary["restarts"] == 0 and head.supervisor.stall_kills == 0, "flow control was taken for a stall"
    assert stats.registrations == 2 and stats.reclaimed == 0
    # fairness is the gate's over the gated part of the run: the ungated warm-up before it goes to whichever
    # collector got more CPU, which on a loaded machine is most of a short run's imbalance
    assert at_first_gate is not None
    by_slot = [stats.transitions_by_slot.get(slot, 0) - at_first_gate.get(slot, 0) for slot in (0, 1)]
    # a fair gate on a loaded 2-core machine still meets collectors that got unequal CPU (up to ~2x measured);
    # a gate that favours one collector starves the other far beyond 3x
    assert min(by_slot) > 0 and max(by_slot) <= 3 * min(by_slot), f"unfair service since the gate shut: {by_slot}"
    # lag: what sits in flight when the gate is shut, in updates. Credits bound it to a few chunks per collector;
    # without them the high-water marks (16 + 64 messages of 8-transition chunks) hold more
    bound = 150 if credits else 600
    assert lags and max(lags) <= bound, f"weight lag up to {max(lags)} updates (bound {bound})"
