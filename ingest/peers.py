"""What the head knows about each registered collector, and the rules it applies to them.

Pure bookkeeping (no sockets are read here), so every rule is testable without ZeroMQ:

- **Parking and fair service.** Chunks read from a collector wait in its bounded `pending`
  queue until the insert gate (learner.max_insert_lead) admits them; `fair_next` always serves
  the collector that was served least recently, so a gate that opens for one chunk at a time
  still shares the replay's inserts equally between collectors.
- **Waiting vs stalled.** A collector is *waiting for the head* while the head holds its
  chunks (parked, not yet credited) or while its newest HEARTBEAT says it is blocked on
  credit or a full socket; its stall clock does not run then. Only a collector the head is
  ready to read from, and that still sends nothing, ages towards `stall_timeout_s`.
- **Episode summaries match episodes the head saw.** Per env stream the head counts the steps
  inserted from that stream's chunks and marks every episode end (TERMINATED/TRUNCATED) among
  them. A summary counts only when its length reaches exactly such an end from the previous
  counted one, and (rewards not clipped) its return is what those steps' rewards add up to;
  one that cannot is rejected (`episode_mismatch`). So forged summaries cannot move the
  episode statistics or stop a `--target-return` run, whatever lengths and returns they claim.
- **Priorities capped.** A chunk's priorities above `rules.max_priority` are clipped to it
  (`max_priority`: the learner's own |TD| cap, or the largest |TD| the reward bound allows when
  that is smaller), so no collector can claim more than a transition can be worth.
- **Bounded state.** A registration keeps episode bookkeeping for at most `stream_limit`
  streams, at most PENDING_SUMMARIES_PER_STREAM summaries waiting per stream and
  PENDING_SUMMARIES_TOTAL in all, and ENDS_KEPT_PER_STREAM unclaimed ends per stream; summaries
  past those are rejected (`stream_range`, `summary_backlog`).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from replay.sampler import MAX_PRIORITY_TD
from shared.chunk import FLAG_END, TransitionChunk
from shared.protocol import EpisodeSummary

MAX_TRACKED_STREAMS = 256  # streams with episode bookkeeping per registration (data of others is still stored)
PENDING_SUMMARIES_PER_STREAM = 32  # summaries waiting for their episode's end to be inserted, per stream
PENDING_SUMMARIES_TOTAL = 256  # ... and per registration
ENDS_KEPT_PER_STREAM = 16  # inserted episode ends no summary has claimed yet (Atari: the lives of one game)
RETURN_RTOL = 1e-5  # float32 rewards (rounding 6e-8 each) against the collector's float64 sum of the same rewards
RETURN_ATOL = 1e-6


def max_priority(max_abs_reward: float, gamma: float) -> float:
    """The largest priority a collector may give a transition: the learner's |TD| cap (MAX_PRIORITY_TD), or
    2 x max_abs_reward / (1 - gamma) when smaller. With every reward within max_abs_reward (the head rejects
    others) and Q-values within the discounted range they can reach, |target - Q| stays below the latter."""
    if gamma >= 1.0:
        return MAX_PRIORITY_TD
    return min(MAX_PRIORITY_TD, 2.0 * float(max_abs_reward) / (1.0 - float(gamma)))


@dataclass(frozen=True)
class EpisodeRules:
    """What the head enforces on a collector's data beyond the wire checks (from the run's config)."""

    reward_scale: float = 1.0  # chunks carry env reward x scale, summaries the unscaled sum
    # False with env.clip_rewards: chunks carry clipped rewards while a summary reports the game's score, so
    # only the steps are matched (the return keeps the episode_out_of_range bound)
    verify_returns: bool = True
    max_priority: float = MAX_PRIORITY_TD  # chunk priorities above it are clipped (max_priority())


@dataclass(frozen=True)
class Verdict:
    """What one message did to the episode statistics: summaries that now count, and those rejected."""

    counted: tuple[EpisodeSummary, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()  # (reason, detail)


NOTHING = Verdict()


@dataclass(slots=True)
class StreamSteps:
    """One env stream of one collector: cumulative (steps, reward, |reward|) of its inserted transitions."""

    steps: int = 0
    reward: float = 0.0  # sum of the scaled rewards of those steps
    magnitude: float = 0.0  # sum of their absolute values (the tolerance of a return comparison)
    claimed: tuple[int, float, float] = (0, 0.0, 0.0)  # the totals at the end the last counted summary matched
    ends: list[tuple[int, float, float]] = field(default_factory=list)  # totals at unclaimed ends, oldest first
    waiting: list[EpisodeSummary] = field(default_factory=list)  # summaries whose end is not inserted yet


@dataclass
class CollectorState:
    collector_id: int
    endpoint: str
    sock: Any  # the head's ROUTER for this collector (zmq.Socket)
    token: bytes  # the ZeroMQ routing id the collector must connect with (sent in WELCOME only)
    host: str = ""
    pid: int = 0
    slot: int = -1
    epsilon: float = 0.0
    nonce: str = ""
    last_seq: int = 0  # newest accepted sequence number
    received_seq: int = 0  # newest sequence number read, accepted or rejected, in the socket's sequence
    tentative_seq: int = 0  # an accepted jump past the sequence that no message has continued yet (0: none)
    credited_seq: int = 0  # newest sequence number acknowledged with CREDIT
    credit_due: float = 0.0  # when the next CREDIT goes out even if nothing new was handled (keep-alive)
    registered_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)  # newest accepted message
    stall_clock: float = field(default_factory=time.monotonic)  # last time it was heard from or held
    heard: bool = False  # any accepted message yet
    says_waiting: bool = False  # its newest HEARTBEAT said it is blocked on credit / a full socket
    weight_version: int = 0
    chunks: int = 0
    transitions: int = 0
    served_at: int = 0  # insert-scheduler tick when a chunk of it was last inserted
    pending: collections.deque[tuple[int, Any]] = field(default_factory=collections.deque)  # (seq, chunk)
    stream_limit: int = MAX_TRACKED_STREAMS  # streams 0 .. stream_limit - 1 get episode bookkeeping
    rules: EpisodeRules = EpisodeRules()  # how its summaries are checked against its chunks
    streams: dict[int, StreamSteps] = field(default_factory=dict)
    pending_summaries: int = 0  # summaries waiting in all its streams
    polled: bool = False  # registered with the consolidation's poller (not while its park is full)
    closed: bool = False

    # ------------------------------------------------------------------ flow control
    def held_by_head(self) -> bool:
        """True while chunks of it sit parked behind the insert gate (it waits for us, not we for it)."""
        return bool(self.pending)

    def waiting_for_head(self) -> bool:
        return self.held_by_head() or self.says_waiting

    def credit_seq(self) -> int:
        """Everything up to this seq is handled: read and rejected, or inserted (parked chunks are not)."""
        if not self.pending:
            return self.received_seq
        # a parked jump nothing has continued yet is past the sequence: it acknowledges nothing beyond it
        return min(self.received_seq, min(seq for seq, _ in self.pending) - 1)  # park_limit bounds the scan

    # ------------------------------------------------------------------ data
    def capped(self, chunk: TransitionChunk) -> TransitionChunk | None:
        """`chunk` with its priorities clipped to rules.max_priority; None when none was above it."""
        cap = self.rules.max_priority
        if not float(chunk.priorities.max()) > cap:
            return None
        return replace(chunk, priorities=np.minimum(chunk.priorities, np.float32(cap)))

    # ------------------------------------------------------------------ episodes
    def delivered(self, chunk: TransitionChunk, added: int) -> Verdict:
        """`added` transitions of `chunk` were inserted: count them and mark the episode ends among them;
        returns the waiting summaries of its stream this settles."""
        stream = int(chunk.stream)
        if added <= 0 or not 0 <= stream < self.stream_limit:
            return NOTHING
        steps = self.streams.get(stream)
        if steps is None:
            steps = self.streams[stream] = StreamSteps()
        # the inserted transitions start at the first `added` frames with an action from first_start on (a
        # collector's chunk holds its stream's next steps in order; incomplete ones trail and are sent again)
        first = int(chunk.first_start)
        starts = np.flatnonzero(np.asarray(chunk.actions[first:]) >= 0)[:added] + first
        rewards = np.asarray(chunk.rewards)[starts].astype(np.float64)
        sizes = np.abs(rewards)
        ended = np.flatnonzero(np.asarray(chunk.flags)[starts] & FLAG_END)
        if ended.size:
            totals, magnitudes = np.cumsum(rewards)[ended], np.cumsum(sizes)[ended]
            steps.ends.extend((steps.steps + i + 1, steps.reward + r, steps.magnitude + m)
                              for i, r, m in zip(ended.tolist(), totals.tolist(), magnitudes.tolist(), strict=True))
        steps.steps += len(starts)
        steps.reward += float(rewards.sum())
        steps.magnitude += float(sizes.sum())
        verdict = self._settle(steps) if steps.waiting else NOTHING
        # the waiting summaries saw every end of this chunk (at most one chunk's worth); then a bounded window
        del steps.ends[:-ENDS_KEPT_PER_STREAM]
        return verdict

    def summary(self, s: EpisodeSummary) -> Verdict:
        """A summary arrived: it counts at once if its episode's end was inserted, waits for it (bounded), or
        is rejected."""
        if not 0 <= s.stream < self.stream_limit:
            return Verdict(rejected=(("stream_range", f"summary stream {s.stream} >= {self.stream_limit}"),))
        steps = self.streams.get(s.stream)
        if steps is not None and len(steps.waiting) >= PENDING_SUMMARIES_PER_STREAM:
            return Verdict(rejected=(("summary_backlog", f"{PENDING_SUMMARIES_PER_STREAM} waiting on stream "
                                                         f"{s.stream}"),))
        if self.pending_summaries >= PENDING_SUMMARIES_TOTAL:
            return Verdict(rejected=(("summary_backlog", f"{PENDING_SUMMARIES_TOTAL} waiting"),))
        if steps is None:
            steps = self.streams[s.stream] = StreamSteps()
        steps.waiting.append(s)
        self.pending_summaries += 1
        return self._settle(steps)

    def _settle(self, steps: StreamSteps) -> Verdict:
        """Match waiting summaries, oldest first, against the stream's unclaimed episode ends."""
        counted: list[EpisodeSummary] = []
        rejected: list[tuple[str, str]] = []
        while steps.waiting:
            s = steps.waiting[0]
            target = steps.claimed[0] + s.length
            if not steps.ends or steps.ends[-1][0] < target:
                break  # its episode's end is not inserted yet
            del steps.waiting[0]
            self.pending_summaries -= 1
            start = steps.claimed
            end = next((e for e in steps.ends if e[0] == target), None)
            if end is None:  # summaries of the episodes since the last counted one were lost or refused: resync
                start, end = _episode_of_length(steps.ends, s.length)
            if end is None:
                rejected.append(("episode_mismatch", f"stream {s.stream}: no episode of {s.length} steps ends "
                                                     f"among the unclaimed ones"))
                continue
            del steps.ends[:steps.ends.index(end) + 1]  # with the ends inside it: lives of one game (Atari)
            reward, magnitude = end[1] - start[1], end[2] - start[2]
            steps.claimed = end
            rules = self.rules
            expected = reward / rules.reward_scale
            if rules.verify_returns and abs(s.episode_return - expected) > \
                    RETURN_RTOL * magnitude / rules.reward_scale + RETURN_ATOL:
                rejected.append(("episode_mismatch", f"stream {s.stream}: return {s.episode_return:.6g}, its "
                                                     f"{s.length} steps' rewards add up to {expected:.6g}"))
                continue
            counted.append(s)
        return Verdict(tuple(counted), tuple(rejected)) if counted or rejected else NOTHING


def _episode_of_length(ends: list[tuple[int, float, float]], length: int) -> tuple[Any, Any]:
    """The earliest pair (start, end) of unclaimed ends with `end` exactly `length` steps after `start`:
    the episode a summary describes when the summaries of episodes before it never counted. (None, None)
    when there is none. At most ENDS_KEPT_PER_STREAM + one chunk's ends, so the quadratic search is cheap."""
    steps_at = {e[0]: e for e in ends}
    for end in ends:
        start = steps_at.get(end[0] - length)
        if start is not None:
            return start, end
    return None, None


def fair_next(states: list[CollectorState]) -> CollectorState | None:
    """The open collector with parked chunks that was served least recently (ties: lowest id)."""
    best = None
    for s in states:
        if s.pending and not s.closed and (best is None or s.served_at < best.served_at):
            best = s
    return best


def episode_bounds_ok(s: EpisodeSummary, max_abs_reward: float, max_episode_steps: int | None = None) -> bool:
    """A summary's length is within the env's time limit (env.max_episode_steps truncates every episode) and its
    return cannot exceed what its length allows at the (unscaled) per-step reward bound."""
    if not 1 <= s.length <= (s.length if max_episode_steps is None else max_episode_steps):
        return False
    return abs(s.episode_return) <= s.length * max_abs_reward
