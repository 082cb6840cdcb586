"""What the fused emulator envs (envs/mario/env.py MarioEnv, envs/atari.py AtariEnv) share: the render mode, one
open emulator until `close`, and the frame pipeline -- the frame skip max-pooling the last two gray screens into the
first, resized (INTER_AREA) to a square uint8 observation of `frame_size`. Each env keeps its own stepping and resets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cv2
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class EmulatorEnv(gym.Env[np.ndarray, int]):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 60}

    def __init__(self, render_mode: str | None) -> None:
        """Checks `render_mode` first (before anything is built); `_attach` then takes the emulator."""
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is invalid: allowed None or 'rgb_array'")
        self.render_mode = render_mode
        self._emu: Any = None

    def _attach(self, emulator: Any, screen_shape: Sequence[int], frame_skip: int, frame_size: int) -> None:
        """The env's emulator (rgb() and close() for render and close), its agent-step rate, the observation space
        and the two gray screens of `screen_shape` the skip pools in (`_gray`)."""
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": 60 / frame_skip}
        self.observation_space = spaces.Box(0, 255, (frame_size, frame_size), np.uint8)
        self._emu = emulator
        self._gray = np.empty((2, *screen_shape), np.uint8)
        self._dsize = (frame_size, frame_size)

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._open().rgb()
        return None

    def close(self) -> None:
        if self._emu is not None:
            self._emu.close()
            self._emu = None

    def _open(self) -> Any:
        """The emulator; RuntimeError once the env is closed."""
        if self._emu is None:
            raise RuntimeError(f"{type(self).__name__} is closed")
        return self._emu

    def _skip_pooled(self, skip: int, frame: Callable[[], bool]) -> bool:
        """One agent step of `skip` emulator frames: `frame()` runs one and says whether the episode ended (the
        skip then stops early); `_gray[0]` becomes the max of the last two frames' screens (the last one alone when
        the skip stopped before it had two). Returns whether it stopped early."""
        emu, gray = self._emu, self._gray
        ended, have_prev = False, False
        for i in range(skip):
            if frame():
                ended = True
                break
            if i == skip - 2:
                emu.gray_into(gray[1])
                have_prev = True
        emu.gray_into(gray[0])
        if have_prev:
            np.maximum(gray[0], gray[1], out=gray[0])
        return ended

    def _resize(self) -> np.ndarray:
        """The observation: the pooled screen `_gray[0]`, resized."""
        return cv2.resize(self._gray[0], self._dsize, interpolation=cv2.INTER_AREA)
