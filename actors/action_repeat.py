"""Temporally extended epsilon-greedy (ez-greedy; Dabney, Ostrovski and Barreto, ICLR 2021).

Plain epsilon-greedy explores one step at a time, so a behaviour that needs one action held for many
steps (Mario's highest jump: A held for ~8 agent steps) is almost never tried at random. ez-greedy
keeps epsilon-greedy's decision and changes what an exploratory decision does: it draws an action and
a duration n from a zeta (discrete power-law) distribution, P(n) ~ n ** -mu, and takes that action for
the next n steps of the stream, whatever the network says and without drawing again meanwhile. Most
durations are 1 (60% at the paper's mu = 2), a few are long, so the streams still visit what
one-step exploration visits and now and then commit to a long run of one action.

One object per collector, one state per env stream; the collector's random draws feed it, so a seeded
collector stays reproducible.
"""

from __future__ import annotations

import numpy as np


class ActionRepeat:
    """The held exploratory action of each stream and how many more steps it is held."""

    def __init__(self, streams: int, mu: float, max_steps: int, rng: np.random.Generator) -> None:
        if not mu > 1.0:
            raise ValueError(f"ActionRepeat mu={mu!r}: the zeta distribution needs mu > 1")
        if max_steps < 1:
            raise ValueError(f"ActionRepeat max_steps={max_steps!r}: at least 1")
        self.mu, self.max_steps, self.rng = float(mu), int(max_steps), rng
        self.action = np.zeros(streams, dtype=np.int64)
        self.left = np.zeros(streams, dtype=np.int64)  # steps the held action still takes, this one included

    def actions(self, explore: np.ndarray, random_actions: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        """This step's action per stream: a held one while it lasts; else a new hold where `explore` says so
        (`random_actions` gives its action, a zeta draw capped at max_steps its length); else greedy."""
        start = np.asarray(explore, dtype=bool) & (self.left == 0)
        count = int(start.sum())
        if count:
            self.action[start] = np.asarray(random_actions)[start]
            self.left[start] = np.minimum(self.rng.zipf(self.mu, size=count), self.max_steps)
        held = self.left > 0
        self.left[held] -= 1
        return np.where(held, self.action, np.asarray(greedy))

    def end_episode(self, stream: int) -> None:
        """A new episode (or life) starts on `stream`: nothing is held into it."""
        self.left[stream] = 0
