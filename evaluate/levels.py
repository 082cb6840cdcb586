"""Levels to evaluate on, by name, and the env each one is from a checkpoint's env config.

A level is named `1-2` (shorthand for SuperMarioBros-1-2-v0), by a stage id `SuperMarioBros-W-S-vN`,
or `SuperMarioBrosRandomStages-vN`: World 1's four stages, one drawn per episode. Only the env id
changes; the action set, frame skip, frame size, reward rules and time limit stay the checkpoint's.

Random stages: gym-super-mario-bros' SuperMarioBrosRandomStagesEnv takes `stages=[...]` and draws
one per reset with `np.random.RandomState(seed).choice(stages)`; RandomStagesEnv draws the same way
but plays each stage on the project's MarioEnv (the same frames, reward and episode rules as the
stage ids), so a random-stages episode is a stage episode of the stage it drew.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

from shared.config import Config, ConfigError, EnvConfig
from shared.env_factory import make_env

RANDOM_STAGES_WORLD = 1
RANDOM_STAGES = tuple(f"{RANDOM_STAGES_WORLD}-{s}" for s in range(1, 5))
_SHORT = re.compile(r"^(?P<world>[1-8])-(?P<stage>[1-4])$")
_STAGE_ID = re.compile(r"^SuperMarioBros-(?P<world>[1-8])-(?P<stage>[1-4])-v(?P<version>[0-3])$")
_RANDOM_ID = re.compile(r"^SuperMarioBrosRandomStages-v(?P<version>[0-3])$")
ALLOWED = ("W-S (W 1-8, S 1-4, e.g. 1-2), SuperMarioBros-W-S-vN or SuperMarioBrosRandomStages-vN "
           f"(World {RANDOM_STAGES_WORLD}'s stages at random), N 0-3")


class LevelError(ValueError):
    """A level name that names no level; the message says which forms are allowed."""


@dataclass(frozen=True)
class Level:
    name: str  # how reports label it: "1-2" (a -v0 stage), "1-2-v1", "random W1" / "random W1-v1"
    env_id: str  # SuperMarioBros-1-2-v0 or SuperMarioBrosRandomStages-v0
    stages: tuple[str, ...] = ()  # the stages a random-stages level draws from; empty for one stage


def parse_level(text: str) -> Level:
    """The Level `text` names; LevelError for anything else."""
    name = text.strip()
    if _SHORT.match(name):
        return Level(name, f"SuperMarioBros-{name}-v0")
    if (m := _STAGE_ID.match(name)) is not None:
        stage = f"{m['world']}-{m['stage']}"
        return Level(stage if m["version"] == "0" else f"{stage}-v{m['version']}", name)
    if (m := _RANDOM_ID.match(name)) is not None:
        label = f"random W{RANDOM_STAGES_WORLD}"
        return Level(label if m["version"] == "0" else f"{label}-v{m['version']}", name, RANDOM_STAGES)
    raise LevelError(f"unknown level {text!r}: allowed {ALLOWED}")


def parse_levels(text: str) -> tuple[Level, ...]:
    """Comma-separated level names, each once; LevelError naming the first bad one."""
    levels = tuple(parse_level(part) for part in text.split(",")) if text.strip() else ()
    if not levels:
        raise LevelError(f"no level given: allowed a comma-separated list of {ALLOWED}")
    seen: dict[str, str] = {}
    for level in levels:
        if level.env_id in seen:
            raise LevelError(f"level {level.env_id} is listed twice ({seen[level.env_id]!r} and {level.name!r})")
        seen[level.env_id] = level.name
    return levels


def level_env_config(env_cfg: EnvConfig, level: Level) -> EnvConfig:
    """`env_cfg` on the level: its env id, everything else unchanged."""
    return replace(env_cfg, env_id=level.env_id)


def stage_env_ids(env_id: str) -> tuple[str, ...]:
    """The stage ids an env id plays: itself, or for a random-stages id the stage ids it draws from."""
    m = _RANDOM_ID.match(env_id)
    if m is None:
        return (env_id,)
    return tuple(f"SuperMarioBros-{s}-v{m['version']}" for s in RANDOM_STAGES)


def check_env_config(env_cfg: EnvConfig) -> None:
    """ConfigError unless `env_cfg` is valid, random-stages ids included (checked as the stages they draw)."""
    for env_id in stage_env_ids(env_cfg.env_id):
        Config(env=replace(env_cfg, env_id=env_id)).check_valid()


def make_level_env(env_cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """`make_env`, plus the random-stages ids (RandomStagesEnv)."""
    stages = stage_env_ids(env_cfg.env_id)
    if len(stages) == 1:
        return make_env(env_cfg, render_mode=render_mode)
    return RandomStagesEnv([replace(env_cfg, env_id=env_id) for env_id in stages], render_mode=render_mode)


class RandomStagesEnv(gym.Env):
    """One stage env per config; each reset draws which one plays the episode, as the package does."""

    def __init__(self, stage_configs: list[EnvConfig], render_mode: str | None = None) -> None:
        if not stage_configs:
            raise ConfigError("RandomStagesEnv needs at least one stage")
        self._configs = list(stage_configs)
        self._render_mode = render_mode
        self._envs: dict[int, gym.Env] = {}  # built when first drawn: each holds an emulator
        self._draws = np.random.RandomState()
        self._current = self._env(0)
        self.action_space = self._current.action_space
        self.observation_space = self._current.observation_space
        self.metadata = dict(self._current.metadata)
        self.render_mode = render_mode
        self.stage_id = self._configs[0].env_id  # the stage of the current episode

    def _env(self, index: int) -> gym.Env:
        if index not in self._envs:
            self._envs[index] = make_env(self._configs[index], render_mode=self._render_mode)
        return self._envs[index]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._draws.seed(seed)
        index = int(self._draws.choice(len(self._configs)))
        self._current = self._env(index)
        self.stage_id = self._configs[index].env_id
        return self._current.reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[Any, Any, bool, bool, dict]:
        return self._current.step(action)

    def render(self) -> Any:
        return self._current.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
