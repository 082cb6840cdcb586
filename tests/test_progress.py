"""The progress record: the learning curve follows the least-exploring collector slot."""

from __future__ import annotations

import math

from ingest.consolidation_types import ConsolidationStats
from launcher.progress import ProgressTracker
from shared.protocol import EpisodeSummary


def stats(collectors: dict, by_slot: dict) -> ConsolidationStats:
    episodes = [e for eps in by_slot.values() for e in eps]
    return ConsolidationStats(
        transitions=1000, chunks=10, rejected=0, rejected_by_reason={}, gaps=0, heartbeats=0,
        episodes=len(episodes), registrations=len(collectors), buffer_size=1000, queue=0, collectors=collectors,
        recent_episodes=episodes, transitions_by_slot={}, reclaimed=0, parked=0, recent_by_slot=by_slot,
    )


def collector(slot: int, epsilon: float, transitions: int = 0) -> dict:
    return {"slot": slot, "epsilon": epsilon, "weight_version": 0, "closed": False, "waiting": False,
            "transitions": transitions}


def test_greedy_curve_is_the_lowest_epsilon_slot() -> None:
    explorer = [EpisodeSummary(0, 10, 100.0, x_pos=300) for _ in range(3)]
    greedy = [EpisodeSummary(0, 10, 900.0, x_pos=x, flag_get=x == 3000) for x in (1000, 2000, 3000)]
    s = stats({1: collector(0, 0.4, transitions=512), 2: collector(1, 0.0007)}, {0: explorer, 1: greedy})
    record = ProgressTracker(20).record(s, {}, 1000, 10_000, 0, 0, {})
    assert record["mean_x_pos_20_greedy"] == 2000 and record["greedy_epsilon"] == 0.0007
    assert record["collectors_alive"] == 2 and record["collectors_delivered"] == 1  # slot 1 has sent nothing yet
    assert record["mean_x_pos_20"] == (3 * 300 + 6000) / 6  # every slot
    assert record["flag_rate_20_greedy"] == 1 / 3
    assert "(greedy slot 2,000, flags 33%)" in ProgressTracker.progress_line(record)


def test_no_episodes_yet_is_not_a_number() -> None:
    record = ProgressTracker(20).record(stats({1: collector(0, 0.4)}, {}), {}, 0, 10_000, 0, 0, {})
    assert math.isnan(record["mean_x_pos_20_greedy"])
    assert "(greedy slot -, flags -)" in ProgressTracker.progress_line(record)
