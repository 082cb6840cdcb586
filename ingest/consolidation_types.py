"""The consolidation thread's seams and its counters snapshot.

`Registrations` is what the thread needs of the launcher's registration (the control socket it
polls, data sockets for new collectors), `ReplaySink` what it writes chunks into, `InsertGate`
(replay/rate_limiter.py) what it asks before each write; `ConsolidationStats` is the snapshot
`ConsolidationThread.stats()` hands to the head's progress report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from ingest.peers import CollectorState
from replay.rate_limiter import InsertGate
from shared.chunk import TransitionChunk
from shared.protocol import EpisodeSummary


class _AlwaysOpen:
    def may_insert(self, pending: int = 0) -> bool:
        return True


ALWAYS_OPEN: InsertGate = _AlwaysOpen()  # no insert-side limit (Ape-X: collectors never wait)


class Registrations(Protocol):
    """Registration (ingest/registration.py): the control socket this thread polls, and the data
    sockets it binds for new collectors. Called from this thread only."""

    control: zmq.Socket
    control_endpoint: str
    hostname: str

    def drain(self, open_count: int, reject: Callable[[str, str], None]) -> list[CollectorState]: ...
    def release(self, state: CollectorState) -> None: ...
    def close(self) -> None: ...


class ReplaySink(Protocol):
    def add_chunks(self, chunks: Sequence[TransitionChunk]) -> list[int | ValueError]:
        """Per chunk, in order: the transitions it added, or the ValueError that refused it."""
        ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)

class ConsolidationStats:
    transitions: int
    chunks: int
    rejected: int
    rejected_by_reason: dict[str, int]
    gaps: int
    heartbeats: int
    episodes: int
    registrations: int
    buffer_size: int
    queue: int
    collectors: dict[int, dict[str, Any]]  # open registrations only
    recent_episodes: list[EpisodeSummary]
    transitions_by_slot: dict[int, int]  # accepted transitions per slot over the run (closed ones included)
    reclaimed: int
    parked: int  # chunks read and waiting for the insert gate
    recent_by_slot: dict[int, list[EpisodeSummary]]  # the last episode_window episodes of each exploration slot
    errors: int = 0  # rounds that raised: a bug on the head's side (peers' bad input is `rejected` instead)
    errors_since_accepted: int = 0  # rounds that raised since a chunk was last accepted
    last_error: str = ""
    priorities_capped: int = 0  # chunks stored with their priorities clipped to the cap (ingest/peers.py)
