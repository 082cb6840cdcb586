"""Vectorized numpy sum-tree for prioritized replay (owned by the reader thread only).

Why this shape: a complete binary tree over `size = next_pow2(capacity)` leaves in one flat
float64 array (node k has children 2k and 2k+1, leaves at [size, 2*size)). Every operation is
vectorized over the batch and loops only over the tree depth (~17 levels for 100k slots):

- internal nodes are *recomputed* from their children (never updated by deltas), so sums
  never drift and `check()` can demand exact equality;
- contiguous leaf ranges (a whole replay segment) update their ancestors level by level with
  strided slices, scattered updates (priority feedback) with `np.unique` of the parents;
- the descent never ends on a zero leaf: it goes right only when the right subtree is
  positive, so floating-point rounding near the total cannot select a retired slot.
"""

from __future__ import annotations

import numpy as np

from shared.sizes import next_pow2


class ReplayInvariantError(Exception):
    """A replay invariant is broken; the message names the slot(s) and the values involved."""




class SumTree:
    """Leaves hold sampling masses (0 = never sampled); the root holds their total."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = next_pow2(capacity)
        self.depth = self.size.bit_length() - 1
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)

    # ------------------------------------------------------------------ queries
    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def leaves(self, slots: np.ndarray | slice | None = None) -> np.ndarray:
        """A view (slice) or copy (index array) of leaf masses; all `capacity` leaves by default."""
        leaf = self.nodes[self.size : self.size + self.capacity]
        return leaf if slots is None else leaf[slots]

    def nbytes(self) -> int:
        return int(self.nodes.nbytes)

    # ------------------------------------------------------------------ updates
    def set_range(self, start: int, values: np.ndarray | float, stop: int | None = None) -> None:
        """Set leaves [start, stop) (stop defaults to start + len(values)) and fix ancestors."""
        if stop is None:
            stop = start + len(values)  # type: ignore[arg-type]
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"leaf range [{start}, {stop}) outside [0, {self.capacity})")
        if start == stop:
            return
        nodes = self.nodes
        lo, hi = start + self.size, stop + self.size
        nodes[lo:hi] = values
        for _ in range(self.depth):
            lo, hi = lo // 2, (hi - 1) // 2 + 1
            nodes[lo:hi] = nodes[2 * lo : 2 * hi : 2] + nodes[2 * lo + 1 : 2 * hi : 2]

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set scattered leaves (duplicates: the last value wins) and fix their ancestors."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        nodes = self.nodes
        idx = slots + self.size
        nodes[idx] = values
        for _ in range(self.depth):
            idx = np.unique(idx >> 1)
            nodes[idx] = nodes[2 * idx] + nodes[2 * idx + 1]

    # ------------------------------------------------------------------ sampling
    def find(self, masses: np.ndarray) -> np.ndarray:
        """Leaf slot whose cumulative interval holds each mass (all masses in [0, total]).

        A lean descent (6 array ops per level) first; the rare rows that rounding steered
        into an empty subtree are redone with the guarded descent, which never ends on 0.
        """
        nodes = self.nodes
        idx = np.ones(len(masses), dtype=np.int64)
        u = np.array(masses, dtype=np.float64, copy=True)
        for _ in range(self.depth):
            idx <<= 1
            left_mass = nodes.take(idx)
            go_right = u >= left_mass
            u -= left_mass * go_right
            idx += go_right
        idx -= self.size
        empty = nodes.take(idx + self.size) <= 0.0
        if empty.any():
            idx[empty] = self._find_guarded(np.asarray(masses, dtype=np.float64)[empty])
        return idx

    def _find_guarded(self, masses: np.ndarray) -> np.ndarray:
        nodes = self.nodes
        idx = np.ones(len(masses), dtype=np.int64)
        u = masses.copy()
        for _ in range(self.depth):
            left = 2 * idx
            left_mass = nodes[left]
            go_right = (u >= left_mass) & (nodes[left + 1] > 0.0)
            u = np.where(go_right, u - left_mass, u)
            idx = left + go_right
        return idx - self.size

    def sample_stratified(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` slots, one per equal stratum of the total mass (lower variance than iid)."""
        total = self.nodes[1]
        if not total > 0.0:
            raise ValueError("cannot sample from a sum-tree whose total mass is 0")
        masses = (np.arange(count, dtype=np.float64) + rng.random(count)) * (total / count)
        np.minimum(masses, total, out=masses)
        return self.find(masses)

    # ------------------------------------------------------------------ validation
    def check(self) -> None:
        """Raise ReplayInvariantError unless every internal node equals the sum of its children."""
        nodes = self.nodes
        leaves = nodes[self.size :]
        if not np.all(np.isfinite(leaves)) or np.any(leaves < 0.0):
            bad = int(np.flatnonzero(~np.isfinite(leaves) | (leaves < 0.0))[0])
            raise ReplayInvariantError(f"sum-tree leaf {bad} has invalid mass {leaves[bad]!r}")
        if np.any(leaves[self.capacity :] != 0.0):
            bad = int(np.flatnonzero(leaves[self.capacity :])[0]) + self.capacity
            raise ReplayInvariantError(f"sum-tree padding leaf {bad} (>= capacity {self.capacity}) is non-zero")
        internal = np.arange(1, self.size)
        sums = nodes[2 * internal] + nodes[2 * internal + 1]
        wrong = np.flatnonzero(nodes[1 : self.size] != sums)
        if wrong.size:
            k = int(internal[wrong[0]])
            raise ReplayInvariantError(
                f"sum-tree node {k} holds {nodes[k]!r} but its children sum to {sums[wrong[0]]!r}"
            )
