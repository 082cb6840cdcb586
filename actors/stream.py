"""One env stream's recent history and the chunks cut from it (the collector side of shared/chunk.py).

Frames are recorded as the env produces them (the first observation flagged FIRST, each step's
action/reward/end flags on the frame it was taken from, an episode's final observation as its
own frame). A chunk covers from the context of the first unsent transition through the newest
frame; `nstep_targets` (the same function the replay uses) says which transitions are complete,
and the rest stay pending for the next chunk, so every transition is sent exactly once.
"""

from __future__ import annotations

import numpy as np

from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk, nstep_targets


class StreamRecorder:
    """Per-env frame history with the Q rows computed while acting (for initial priorities)."""

    def __init__(self, stream: int, stack: int, n_step: int, gamma: float, chunk_steps: int, num_actions: int) -> None:
        self.stream = stream
        self.stack = stack
        self.n_step = n_step
        self.gamma = gamma
        self.chunk_steps = chunk_steps
        self.num_actions = num_actions
        self.frames: list[np.ndarray] = []
        self.actions: list[int] = []
        self.rewards: list[float] = []
        self.flags: list[int] = []
        self.q: list[np.ndarray | None] = []
        self.base = 0  # global index of frames[0]
        self.next_start = 0  # global index of the first transition not yet sent
        self.pending = 0  # transitions started at or after next_start
        self._zeros = np.zeros(num_actions, dtype=np.float32)

    @property
    def newest(self) -> int:
        return self.base + len(self.frames) - 1

    def begin_episode(self, frame: np.ndarray) -> None:
        """Record the first observation after a reset."""
        self._append(frame, FLAG_FIRST)
        if len(self.frames) == 1:
            self.next_start = self.base

    def set_q(self, q_row: np.ndarray, index: int | None = None) -> None:
        """Q-values of the stack ending at frame `index` (default: the newest frame)."""
        self.q[-1 if index is None else index - self.base] = q_row

    def record_step(self, action: int, reward: float, next_frame: np.ndarray, terminated: bool, truncated: bool) -> int:
        """Attach the step to the newest frame and append the next observation; returns its index."""
        self.actions[-1] = int(action)
        self.rewards[-1] = float(reward)
        self.flags[-1] |= FLAG_TERMINATED if terminated else (FLAG_TRUNCATED if truncated else 0)
        self.pending += 1
        self._append(next_frame, 0)
        return self.newest

    def _append(self, frame: np.ndarray, flags: int) -> None:
        self.frames.append(frame)
        self.actions.append(NO_ACTION)
        self.rewards.append(0.0)
        self.flags.append(flags)
        self.q.append(None)

    def ready(self) -> bool:
        """True once the pending transitions include `chunk_steps` complete n-step windows."""
        return self.pending >= self.chunk_steps + self.n_step - 1

    def build_chunk(self) -> TransitionChunk | None:
        """Cut the next chunk (None if nothing is complete) and forget what no later chunk needs."""
        lo = self._context_start(self.next_start) - self.base
        actions = np.asarray(self.actions[lo:], dtype=np.int32)
        rewards = np.asarray(self.rewards[lo:], dtype=np.float32)
        flags = np.asarray(self.flags[lo:], dtype=np.uint8)
        first_start = self.next_start - self.base - lo
        t = nstep_targets(actions, rewards, flags, first_start, self.n_step, self.gamma)
        if len(t.starts) == 0:
            return None
        q = [row if row is not None else self._zeros for row in self.q[lo:]]
        q_start = np.stack([q[i] for i in t.starts])
        q_boot = np.stack([q[i] for i in t.bootstrap]).max(axis=1)
        q_sa = q_start[np.arange(len(t.starts)), actions[t.starts]]
        priorities = np.zeros(len(actions), dtype=np.float32)
        td = np.abs(t.returns + t.discounts * q_boot - q_sa)
        priorities[t.starts] = np.nan_to_num(td, nan=1.0, posinf=1.0, neginf=1.0)
        chunk = TransitionChunk(self.stream, first_start, np.stack(self.frames[lo:]), actions, rewards, flags, priorities)
        # complete windows form a prefix of the candidates; the first incomplete one starts next time
        candidates = np.flatnonzero((np.arange(len(actions)) >= first_start) & (actions >= 0))
        if len(t.starts) < len(candidates):
            self.next_start = self.base + lo + int(candidates[len(t.starts)])
        else:
            self.next_start = self.newest
        self.pending = sum(1 for a in self.actions[self.next_start - self.base:] if a >= 0)
        self._trim(self._context_start(self.next_start))
        return chunk

    def _context_start(self, start: int) -> int:
        """Oldest frame the stack of `start` needs: stack-1 back, clipped at the episode's FIRST."""
        lo = max(self.base, start - self.stack + 1)
        for g in range(start, lo - 1, -1):
            if self.flags[g - self.base] & FLAG_FIRST:
                return g
        return lo

    def _trim(self, keep_from: int) -> None:
        cut = keep_from - self.base
        if cut > 0:
            del self.frames[:cut], self.actions[:cut], self.rewards[:cut], self.flags[:cut], self.q[:cut]
            self.base = keep_from
