"""Image observations of any Gymnasium env onto the image path: (H, W, C) uint8 -> one (S, S) uint8 gray frame.

The Q-network picks its torso from the observation's geometry (shared/network.py: 2-D frames go
to the Nature CNN, everything else to the MLP) and the replay stores one frame per slot, so an
env whose observation is an RGB(A) image must reach the collector as a single 2-D uint8 frame:
grayscale (OpenCV's weights) and resized to frame_size x frame_size with INTER_AREA, as Mario's
and Atari's frames are. Without this an (H, W, 3) image would be flattened into an MLP input.
"""

from __future__ import annotations

from typing import Any

import cv2
import gymnasium as gym
import numpy as np
from gymnasium import spaces

IMAGE_CHANNELS = (1, 3, 4)  # gray, RGB, RGBA
_TO_GRAY = {3: cv2.COLOR_RGB2GRAY, 4: cv2.COLOR_RGBA2GRAY}


def is_image_space(space: gym.Space) -> bool:
    """True for a Box of uint8 (H, W, C) images with C in 1, 3, 4 (the envs this wrapper takes)."""
    return (
        isinstance(space, spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and int(space.shape[2]) in IMAGE_CHANNELS
    )


class GrayResizeObservation(gym.ObservationWrapper):
    """(H, W, C) uint8 images -> (frame_size, frame_size) uint8 grayscale frames."""

    def __init__(self, env: gym.Env, frame_size: int = 84) -> None:
        super().__init__(env)
        if not is_image_space(env.observation_space):
            raise ValueError(f"observation space {env.observation_space} is not an (H, W, C) uint8 image, C in 1, 3, 4")
        self.source_shape = tuple(int(d) for d in env.observation_space.shape)
        self._code = _TO_GRAY.get(self.source_shape[2])
        self._dsize = (int(frame_size), int(frame_size))
        self.observation_space = spaces.Box(0, 255, (int(frame_size), int(frame_size)), np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        image = np.asarray(observation, dtype=np.uint8)
        gray = cv2.cvtColor(image, self._code) if self._code is not None else image[:, :, 0]
        return cv2.resize(gray, self._dsize, interpolation=cv2.INTER_AREA)
