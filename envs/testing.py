"""A tiny, fast, fully checkable Gymnasium env for tests of the whole system.

`ApeXCounting-v0` emits uint8 frames whose first bytes encode (stream, episode, step), so any
stack the replay returns can be decoded and checked against what the collector saw. Episodes
last `episode_length` steps and end by termination or, every `truncate_every`-th episode,
by truncation. The reward is deterministic: step index mod 7 plus the action.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

COUNTING_ENV_ID = "ApeXCounting-v0"


class CountingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, frame_shape=(84, 84), episode_length: int = 37, truncate_every: int = 3, num_actions: int = 4,
                 render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r}: ApeXCounting-v0 renders nothing; use None")
        self.render_mode = render_mode
        self.frame_shape = tuple(frame_shape)
        self.observation_space = spaces.Box(0, 255, shape=self.frame_shape, dtype=np.uint8)
        self.action_space = spaces.Discrete(num_actions)
        self.episode_length = int(episode_length)
        self.truncate_every = int(truncate_every)
        self._stream = 0
        self._episode = -1
        self._t = 0

    def _frame(self) -> np.ndarray:
        frame = np.full(self.frame_shape, self._t % 251, dtype=np.uint8)
        header = np.array([self._stream, self._episode, self._t], dtype="<u8").view(np.uint8)
        frame.reshape(-1)[: header.size] = header
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._stream = int(seed)
            self._episode = -1
        self._episode += 1
        self._t = 0
        return self._frame(), {"episode": self._episode, "t": self._t}

    def step(self, action):
        reward = float(self._t % 7 + int(action))
        self._t += 1
        ended = self._t >= self.episode_length
        truncated = ended and self.truncate_every > 0 and (self._episode % self.truncate_every) == self.truncate_every - 1
        terminated = ended and not truncated
        return self._frame(), reward, terminated, truncated, {"episode": self._episode, "t": self._t}


def decode_frame(frame: np.ndarray) -> tuple[int, int, int]:
    """(stream, episode, step) written into a CountingEnv frame."""
    stream, episode, t = np.ascontiguousarray(frame).reshape(-1)[:24].view("<u8")
    return int(stream), int(episode), int(t)


def register() -> None:
    if COUNTING_ENV_ID not in gym.registry:
        gym.register(id=COUNTING_ENV_ID, entry_point="envs.testing:CountingEnv")


register()
