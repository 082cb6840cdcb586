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


def collector(slot: int, epsilon: float, transitions: int = 0, weight_version: int = 0) -> dict:
    return {"slot": slot, "epsilon": epsilon, "weight_version": weight_version, "closed": False, "waiting": False,
            "transitions": transitions}


def test_weight_lag_counts_the_collectors_that_delivered_transitions() -> None:
    """A live registration that never sent a chunk (silent, or summaries only) acts with no weights: it is out of
    the lag, not a version 0 that makes every collector look stale."""
    s = stats({1: collector(0, 0.4, transitions=512, weight_version=900), 2: collector(1, 0.1, transitions=64,
                                                                                      weight_version=950),
               3: collector(2, 0.4)}, {})
    record = ProgressTracker(20).record(s, {}, 1000, 10_000, 1000, 0, {})
    assert record["weight_lag"] == 100 and record["collectors_alive"] == 3
    record = ProgressTracker(20).record(stats({3: collector(2, 0.4)}, {}), {}, 0, 10_000, 1000, 0, {})
    assert math.isnan(record["weight_lag"]) and record["collectors_alive"] == 1


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


def test_stages_count_each_stages_episodes_flags_and_best_x() -> None:
    episodes = [EpisodeSummary(0, 10, 1.0, x_pos=x, flag_get=f, world=1, stage=s)
                for x, f, s in ((3000, True, 1), (500, False, 1), (900, False, 2), (3100, True, 4))]
    tracker = ProgressTracker(20)
    record = tracker.record(stats({1: collector(0, 0.01)}, {0: episodes}), {}, 1000, 10_000, 0, 0, {})
    assert record["stages"] == {"1-1": {"episodes": 2, "flags": 1, "best_x_pos": 3000},
                                "1-2": {"episodes": 1, "flags": 0, "best_x_pos": 900},
                                "1-4": {"episodes": 1, "flags": 1, "best_x_pos": 3100}}
    assert record["flags"] == 2
    assert ProgressTracker.progress_line(record).endswith("stages 1-1 1/2 1-2 0/1 1-4 1/1")


def test_one_stage_or_no_stage_adds_nothing_to_the_line() -> None:
    one = [EpisodeSummary(0, 10, 1.0, x_pos=800, world=1, stage=1)]
    record = ProgressTracker(20).record(stats({1: collector(0, 0.01)}, {0: one}), {}, 1000, 10_000, 0, 0, {})
    assert record["stages"] == {"1-1": {"episodes": 1, "flags": 0, "best_x_pos": 800}}
    assert " stages " not in ProgressTracker.progress_line(record)
    cartpole = [EpisodeSummary(0, 10, 1.0)]
    record = ProgressTracker(20).record(stats({1: collector(0, 0.01)}, {0: cartpole}), {}, 1000, 10_000, 0, 0, {})
    assert record["stages"] == {}
