"""ingest/peers.py without sockets: what one registration may make the head keep, and which episode
summaries count.

A summary counts only when it matches an episode end the head saw in that stream's inserted chunks,
with that many steps since the previous counted one, and (rewards not clipped) the return those steps'
rewards add up to; everything a registration makes the head hold is bounded, and every summary that is
dropped is counted under its reason.
"""

from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np

from ingest.peers import (
    MAX_TRACKED_STREAMS,
    PENDING_SUMMARIES_PER_STREAM,
    PENDING_SUMMARIES_TOTAL,
    CollectorState,
    EpisodeRules,
)
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
from shared.protocol import EpisodeSummary
from tests.hostile.attack import valid_chunk

SCALE = 0.1
RULES = EpisodeRules(reward_scale=SCALE, verify_returns=True)


def state(stream_limit: int = 4, rules: EpisodeRules = RULES) -> CollectorState:
    return CollectorState(1, "inproc://peers", None, b"c1", stream_limit=stream_limit, rules=rules)


def reasons(verdicts) -> Counter[str]:
    return Counter(reason for v in verdicts for reason, _ in v.rejected)


def counted(verdicts) -> list[EpisodeSummary]:
    return [s for v in verdicts for s in v.counted]


def inserted(chunk: TransitionChunk, n_step: int = 3) -> int:
    """What the replay stores of `chunk`: the starts whose n-step window is complete inside it."""
    from shared.chunk import nstep_targets

    return len(nstep_targets(chunk.actions, chunk.rewards, chunk.flags, chunk.first_start, n_step, 0.99).starts)


def test_a_summary_flood_on_distinct_streams_keeps_the_registration_bounded() -> None:
    """One registered collector, 1,000,000 EPISODE_SUMMARY on 1,000,000 stream ids and no transitions grew the
    head by > 1 GB (a StreamSteps per stream id). The registration now holds at most its streams' backlog,
    whatever the count (200,000 here: the bound is absolute)."""
    s = state(stream_limit=4)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for stream in range(200_000):
            s.summary(EpisodeSummary(stream, 500, 475.0))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(s.streams) <= 4, len(s.streams)
    assert grown < 1 << 20, f"{grown:,} bytes kept for summaries without transitions"
    assert s.pending_summaries == 4


def test_summaries_past_the_streams_and_the_caps_are_rejected_and_counted() -> None:
    s = state(stream_limit=MAX_TRACKED_STREAMS)
    verdicts = [s.summary(EpisodeSummary(MAX_TRACKED_STREAMS + i, 10, 1.0)) for i in range(5)]
    assert reasons(verdicts) == {"stream_range": 5} and not s.streams
    verdicts = [s.summary(EpisodeSummary(0, 10, 1.0)) for _ in range(PENDING_SUMMARIES_PER_STREAM + 3)]
    assert reasons(verdicts) == {"summary_backlog": 3} and s.pending_summaries == PENDING_SUMMARIES_PER_STREAM
    sent = 0
    for stream in range(1, MAX_TRACKED_STREAMS):
        for _ in range(PENDING_SUMMARIES_PER_STREAM):
            verdicts.append(s.summary(EpisodeSummary(stream, 10, 1.0)))
            sent += 1
    assert PENDING_SUMMARIES_TOTAL < MAX_TRACKED_STREAMS * PENDING_SUMMARIES_PER_STREAM  # the total cap binds
    assert s.pending_summaries == PENDING_SUMMARIES_TOTAL
    assert reasons(verdicts) == {"summary_backlog": 3 + sent - (PENDING_SUMMARIES_TOTAL - PENDING_SUMMARIES_PER_STREAM)}
    assert not any(v.counted for v in verdicts)


def test_forged_one_step_summaries_after_real_transitions_never_count() -> None:
    """One valid 40-frame chunk (37 transitions, the episode goes on) and 20 summaries of (length 1, return 500)
    made a --target-return 475 run stop as solved. None of them matches an episode end."""
    s = state()
    first = valid_chunk(steps=39, end=False)
    verdicts = [s.delivered(first, inserted(first))]
    assert inserted(first) == 37
    verdicts += [s.summary(EpisodeSummary(0, 1, 500.0)) for _ in range(PENDING_SUMMARIES_PER_STREAM)]
    assert counted(verdicts) == [] and s.pending_summaries == PENDING_SUMMARIES_PER_STREAM
    # the episode ends 3 steps later (the stream's next chunk: the 2 pending starts again, then 3 new steps)
    rest = _continuation(first, extra_steps=3)
    verdicts = [s.delivered(rest, inserted(rest))]
    assert inserted(rest) == 5
    assert counted(verdicts) == [] and reasons(verdicts) == {"episode_mismatch": PENDING_SUMMARIES_PER_STREAM}
    # the genuine summary: 42 steps of reward 0.1 (scaled) = 42 unscaled
    genuine = EpisodeSummary(0, 42, 42.0)
    v = s.summary(genuine)
    assert v.counted == (genuine,) and not v.rejected and s.pending_summaries == 0


def _continuation(first: TransitionChunk, extra_steps: int) -> TransitionChunk:
    """The next chunk of `first`'s stream (stack 1, n 3): its 2 incomplete starts again, `extra_steps` more
    steps, the last one terminating the episode, and the final observation."""
    steps = 2 + extra_steps
    frames = np.vstack([first.frames[-3:-1], np.full((extra_steps + 1, first.frames.shape[1]), 0.01, np.float32)])
    actions = np.concatenate([first.actions[-3:-1], np.ones(extra_steps, np.int32), [NO_ACTION]]).astype(np.int32)
    rewards = np.full(steps + 1, 0.1, np.float32)
    rewards[-1] = 0.0
    flags = np.zeros(steps + 1, np.uint8)
    flags[steps - 1] = FLAG_TERMINATED
    return TransitionChunk(first.stream, 0, frames, actions, rewards, flags, np.ones(steps + 1, np.float32))


def test_a_summary_counts_before_or_after_its_chunk_and_only_with_its_return() -> None:
    s = state()
    chunk = valid_chunk(steps=20, stream=1)  # one whole terminated episode: 20 steps of 0.1
    early = s.summary(EpisodeSummary(1, 20, 20.0))  # the reference sends it before the chunk
    assert early.counted == () and early.rejected == ()
    v = s.delivered(chunk, inserted(chunk))
    assert [e.length for e in v.counted] == [20] and not v.rejected
    # the same data on another stream, the summary after the chunk and with a return the rewards do not give
    chunk = valid_chunk(steps=20, stream=2)
    assert s.delivered(chunk, inserted(chunk)).counted == ()
    v = s.summary(EpisodeSummary(2, 20, 475.0))
    assert v.counted == () and [r for r, _ in v.rejected] == ["episode_mismatch"]
    # clipped rewards: the summary reports the game's score, which the chunks cannot show; the steps still must match
    s = state(rules=EpisodeRules(reward_scale=SCALE, verify_returns=False))
    chunk = valid_chunk(steps=20, stream=3)
    s.delivered(chunk, inserted(chunk))
    v = s.summary(EpisodeSummary(3, 1, 1.0))  # the steps still must match an end
    assert v.counted == () and [r for r, _ in v.rejected] == ["episode_mismatch"]
    assert [e.episode_return for e in s.summary(EpisodeSummary(3, 20, 475.0)).counted] == [475.0]


def test_a_game_of_several_lives_is_one_summary_over_its_ends() -> None:
    """Atari with life_loss_terminal: each lost life is an episode end for learning, the summary covers the game."""
    lives = [valid_chunk(steps=n, stream=0, seed=n) for n in (5, 7, 9)]
    s = state()
    verdicts = [s.delivered(c, inserted(c)) for c in lives]
    verdicts.append(s.summary(EpisodeSummary(0, 21, 21.0)))
    assert [e.length for e in counted(verdicts)] == [21] and not reasons(verdicts)


def test_truncated_episodes_and_ends_beyond_the_kept_window() -> None:
    s = state()
    chunk = valid_chunk(steps=6, stream=0)
    flags = chunk.flags.copy()
    flags[5] = FLAG_TRUNCATED  # a time limit: still an episode end
    chunk = TransitionChunk(0, 0, chunk.frames, chunk.actions, chunk.rewards, flags, chunk.priorities)
    s.delivered(chunk, inserted(chunk))
    assert [e.length for e in s.summary(EpisodeSummary(0, 6, 6.0)).counted] == [6]


def test_streams_past_the_limit_carry_data_but_no_bookkeeping() -> None:
    s = state(stream_limit=2)
    chunk = valid_chunk(steps=8, stream=5)
    assert s.delivered(chunk, inserted(chunk)) == s.delivered(chunk, 0)
    assert not s.streams


def test_a_chunk_of_many_short_episodes_keeps_a_bounded_window_of_ends() -> None:
    """2,048 one-step episodes in one chunk and no summary waiting: the stream keeps only its newest ends. The
    summaries that come later count against the kept episodes of their length and return, each end once: 15
    episodes lie between the 16 kept ends, the next summary waits for an end to come."""
    from ingest.peers import ENDS_KEPT_PER_STREAM

    n = 2048
    frames = np.zeros((2 * n, 4), np.float32)
    actions = np.tile(np.array([0, NO_ACTION], np.int32), n)
    rewards = np.tile(np.array([0.1, 0.0], np.float32), n)
    flags = np.tile(np.array([FLAG_FIRST | FLAG_TERMINATED, 0], np.uint8), n)
    chunk = TransitionChunk(0, 0, frames, actions, rewards, flags, np.ones(2 * n, np.float32))
    s = state()
    s.delivered(chunk, inserted(chunk))
    assert inserted(chunk) == n and len(s.streams[0].ends) == ENDS_KEPT_PER_STREAM
    verdicts = [s.summary(EpisodeSummary(0, 1, 1.0)) for _ in range(ENDS_KEPT_PER_STREAM)]
    assert len(counted(verdicts)) == ENDS_KEPT_PER_STREAM - 1 and not reasons(verdicts)
    assert s.pending_summaries == 1 and s.streams[0].ends == []


def _one_step_episodes(n: int, stream: int = 0) -> TransitionChunk:
    """`n` one-step episodes of reward 0.1 (scaled) in one chunk (stack 1): n transitions, n episode ends."""
    frames = np.zeros((2 * n, 4), np.float32)
    actions = np.tile(np.array([0, NO_ACTION], np.int32), n)
    rewards = np.tile(np.array([0.1, 0.0], np.float32), n)
    flags = np.tile(np.array([FLAG_FIRST | FLAG_TERMINATED, 0], np.uint8), n)
    return TransitionChunk(stream, 0, frames, actions, rewards, flags, np.ones(2 * n, np.float32))


def test_waiting_summaries_see_every_end_of_a_chunk_with_more_ends_than_the_window() -> None:
    """20 one-step episodes in one chunk whose 20 summaries already wait (the reference collector sends a
    summary before the chunk that ends its episode): all 20 count, though the stream keeps 16 ends."""
    from ingest.peers import ENDS_KEPT_PER_STREAM

    s = state()
    chunk = _one_step_episodes(20)
    waiting = [s.summary(EpisodeSummary(0, 1, 1.0)) for _ in range(20)]
    assert counted(waiting) == [] and not reasons(waiting) and ENDS_KEPT_PER_STREAM < 20
    v = s.delivered(chunk, inserted(chunk, n_step=1))
    assert len(v.counted) == 20 and not v.rejected and s.pending_summaries == 0


def test_a_refused_summary_does_not_stop_the_next_honest_ones_from_counting() -> None:
    """A summary that matches no episode (wrong length) is rejected; the stream's later honest summaries
    still count, and so does an honest one after a lost one."""
    s = state()
    for n, steps in enumerate((5, 7, 9)):
        chunk = valid_chunk(steps=steps, stream=0, seed=n)
        s.delivered(chunk, inserted(chunk))
    bad = s.summary(EpisodeSummary(0, 4, 4.0))  # no episode of 4 steps
    assert [r for r, _ in bad.rejected] == ["episode_mismatch"]
    # the 5-step episode's summary is lost; the 7- and 9-step ones count
    verdicts = [s.summary(EpisodeSummary(0, 7, 7.0)), s.summary(EpisodeSummary(0, 9, 9.0))]
    assert [e.length for e in counted(verdicts)] == [7, 9] and not reasons(verdicts)
    # a forged summary still needs an unclaimed episode of its length and return: none is left
    forged = s.summary(EpisodeSummary(0, 5, 5.0))
    assert forged.counted == ()
