"""Env construction for collectors: shared.env_factory when present, plain Gymnasium otherwise.

The fallback keeps collectors testable on any registered Gymnasium id (the counting env above
all) while the Mario wrapper lives in shared.env_factory.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import shared.fake_env  # noqa: F401 - registers ApeXCounting-v0
from shared.config import EnvConfig


def make_env(env_cfg: EnvConfig) -> gym.Env:
    try:
        from shared.env_factory import make_env as factory_make_env
    except ImportError:
        return gym.make(env_cfg.env_id, disable_env_checker=True)
    return factory_make_env(env_cfg)


def env_spec(env_cfg: EnvConfig, env: gym.Env | None = None) -> tuple[tuple[int, ...], np.dtype, int, int]:
    """(obs_shape, obs_dtype, num_actions, stack) for one observation of this env."""
    try:
        from shared.env_factory import env_spec_of
    except ImportError:
        env_spec_of = None
    if env_spec_of is not None:
        shape, dtype, actions, stack = env_spec_of(env_cfg)
        return tuple(int(d) for d in shape), np.dtype(dtype), int(actions), int(stack)
    probe = env if env is not None else make_env(env_cfg)
    try:
        shape = tuple(int(d) for d in probe.observation_space.shape)
        dtype = np.dtype(probe.observation_space.dtype)
        actions = int(probe.action_space.n)
    finally:
        if env is None:
            probe.close()
    return shape, dtype, actions, env_cfg.frame_stack if len(shape) == 2 else 1


def episode_info(info: dict[str, Any]) -> tuple[int, bool, int, int]:
    """(x_pos, flag_get, world, stage) from a Mario info dict; zeros for other envs."""

    def num(key: str) -> int:
        try:
            return int(info.get(key, 0) or 0)
        except (TypeError, ValueError):
            return 0

    return num("x_pos"), bool(info.get("flag_get", False)), num("world"), num("stage")
