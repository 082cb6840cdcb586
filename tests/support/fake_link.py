"""A collector's Link without sockets: records what the collector sends and hands it the weights a test queues."""

from __future__ import annotations

from typing import Any

from shared.chunk import TransitionChunk
from shared.protocol import EpisodeSummary


class FakeLink:
    def __init__(self) -> None:
        self.weight_version = 0
        self.chunks: list[TransitionChunk] = []
        self.episodes: list[EpisodeSummary] = []
        self.weights: list[Any] | None = None

    def poll_head(self) -> None:
        pass

    def take_weights(self):
        w, self.weights = self.weights, None
        return w

    def must_exit(self) -> bool:
        return False

    def head_silent(self) -> bool:
        return False

    def send_chunk(self, chunk: TransitionChunk) -> bool:
        self.chunks.append(chunk)
        return True

    def send_episode(self, summary: EpisodeSummary) -> bool:
        self.episodes.append(summary)
        return True

    def maybe_heartbeat(self) -> None:
        pass
