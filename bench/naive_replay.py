"""The tutorial baseline the bench compares against: a deque of (s, a, r, s', done) tuples.

Every transition keeps its own 4-frame state and next-state stacks as separate arrays
(8 frames per transition), sampling is `random.sample` + `np.stack`. Uniform, 1-step.
"""

from __future__ import annotations

import collections
import random
import sys

import numpy as np


class NaiveReplay:
    def __init__(self, capacity: int, seed: int | None = None) -> None:
        self.buffer: collections.deque = collections.deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.buffer)

    def add(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray, done: bool) -> None:
        self.buffer.append((state, action, reward, next_state, done))

    def sample(self, batch_size: int):
        batch = self.rng.sample(self.buffer, batch_size)
        states, actions, rewards, next_states, dones = zip(*batch, strict=True)
        return (np.stack(states), np.array(actions), np.array(rewards, dtype=np.float32),
                np.stack(next_states), np.array(dones, dtype=np.float32))

    def bytes_per_transition(self) -> float:
        """Arrays plus the Python objects holding them (tuple, ndarray headers, scalars)."""
        if not self.buffer:
            return 0.0
        s, a, r, ns, d = self.buffer[0]
        per = (s.nbytes + ns.nbytes + sys.getsizeof(s) - s.nbytes * (s.base is None)
               + sys.getsizeof(ns) - ns.nbytes * (ns.base is None)
               + sys.getsizeof((s, a, r, ns, d)) + sys.getsizeof(a) + sys.getsizeof(r) + 8)  # +8: deque slot
        return float(per)
