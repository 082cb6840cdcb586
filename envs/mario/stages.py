"""Random stages: `SuperMarioBrosRandomStages-vN` plays World 1's four stages, one drawn per episode.

One policy for several levels trains on this id as on any other (`--env SuperMarioBrosRandomStages-v0`),
and the evaluation suite plays it as a level of its own. gym-super-mario-bros' own
SuperMarioBrosRandomStagesEnv takes `stages=[...]` and draws one per reset with
`np.random.RandomState(seed).choice(stages)`; RandomStagesEnv draws the same way but plays each stage
on the project's MarioEnv (the frames, reward and episode rules of the stage ids), so a random-stages
episode is a stage episode of the stage it drew. The draws follow the seed of the first reset, and the
stage an episode plays is in every `info` (`world`, `stage`), so per-stage figures can be read off.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from shared.config import ConfigError, EnvConfig

RANDOM_STAGES_WORLD = 1
RANDOM_STAGES = tuple(f"{RANDOM_STAGES_WORLD}-{s}" for s in range(1, 5))
RANDOM_STAGES_ID = re.compile(r"^SuperMarioBrosRandomStages-v(?P<version>[0-3])$")


def is_random_stages(env_id: str) -> bool:
    return RANDOM_STAGES_ID.match(env_id) is not None


def stage_env_ids(env_id: str) -> tuple[str, ...]:
    """The stage ids an env id plays: itself, or for a random-stages id the stage ids it draws from."""
    m = RANDOM_STAGES_ID.match(env_id)
    if m is None:
        return (env_id,)
    return tuple(f"SuperMarioBros-{s}-v{m['version']}" for s in RANDOM_STAGES)


def stage_configs(env_config: EnvConfig) -> list[EnvConfig]:
    """`env_config` once per stage it plays, only the env id changed."""
    return [replace(env_config, env_id=env_id) for env_id in stage_env_ids(env_config.env_id)]


class RandomStagesEnv(gym.Env):
    """One stage env per config, built by `build` when first drawn (each holds an emulator); each reset
    draws which one plays the episode, as the package does."""

    def __init__(self, configs: Sequence[EnvConfig], build: Callable[[EnvConfig], gym.Env],
                 render_mode: str | None = None) -> None:
        if not configs:
            raise ConfigError("RandomStagesEnv needs at least one stage")
        self._configs = list(configs)
        self._build = build
        self._envs: dict[int, gym.Env] = {}
        self._draws = np.random.RandomState()
        self._current = self._env(0)
        self.action_space = self._current.action_space
        self.observation_space = self._current.observation_space
        self.metadata = dict(self._current.metadata)
        self.render_mode = render_mode

    def _env(self, index: int) -> gym.Env:
        if index not in self._envs:
            self._envs[index] = self._build(self._configs[index])
        return self._envs[index]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._draws.seed(seed)
        index = int(self._draws.choice(len(self._configs)))
        self._current = self._env(index)
        return self._current.reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[Any, Any, bool, bool, dict]:
        return self._current.step(action)

    def render(self) -> Any:
        return self._current.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
