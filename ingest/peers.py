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
- **Episode summaries need their steps.** A summary only counts once that stream has
  delivered at least as many transitions as the episodes it has reported (plus this one), so
  forged summaries cannot move the episode statistics or stop a `--target-return` run.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from shared.protocol import EpisodeSummary

PENDING_SUMMARIES_PER_STREAM = 8  # summaries waiting for their transitions; older ones are dropped


@dataclass
class StreamSteps:
    """One env stream of one collector: transitions delivered vs episode lengths reported."""

    delivered: int = 0
    reported: int = 0
    waiting: collections.deque[EpisodeSummary] = field(default_factory=collections.deque)


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
    received_seq: int = 0  # newest sequence number read, accepted or rejected
    credited_seq: int = 0  # newest sequence number acknowledged with CREDIT
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
    streams: dict[int, StreamSteps] = field(default_factory=dict)
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
        return self.pending[0][0] - 1 if self.pending else self.received_seq

    # ------------------------------------------------------------------ episodes
    def delivered(self, stream: int, transitions: int) -> list[EpisodeSummary]:
        """Count transitions of `stream`; returns its waiting summaries that are now covered."""
        steps = self.streams.setdefault(stream, StreamSteps())
        steps.delivered += transitions
        return _release(steps)

    def summary(self, s: EpisodeSummary) -> list[EpisodeSummary]:
        """Queue a summary; returns those of its stream whose transitions have all arrived."""
        steps = self.streams.setdefault(s.stream, StreamSteps())
        if len(steps.waiting) >= PENDING_SUMMARIES_PER_STREAM:
            steps.waiting.popleft()
        steps.waiting.append(s)
        return _release(steps)


def _release(steps: StreamSteps) -> list[EpisodeSummary]:
    out = []
    while steps.waiting and steps.reported + steps.waiting[0].length <= steps.delivered:
        s = steps.waiting.popleft()
        steps.reported += s.length
        out.append(s)
    return out


def fair_next(states: list[CollectorState]) -> CollectorState | None:
    """The open collector with parked chunks that was served least recently (ties: lowest id)."""
    best = None
    for s in states:
        if s.pending and not s.closed and (best is None or s.served_at < best.served_at):
            best = s
    return best


def episode_bounds_ok(s: EpisodeSummary, max_abs_reward: float) -> bool:
    """A summary's return cannot exceed what its length allows at the reward bound."""
    return s.length >= 1 and abs(s.episode_return) <= s.length * max_abs_reward
