"""Levels to evaluate on, by name, and the env each one is from a checkpoint's env config.

A level is named `1-2` (shorthand for SuperMarioBros-1-2-v0), by a stage id `SuperMarioBros-W-S-vN`,
or `SuperMarioBrosRandomStages-vN`: World 1's four stages, one drawn per episode (envs/mario/stages.py,
which training uses too). Only the env id changes; the action set, frame skip, frame size, reward
rules and time limit stay the checkpoint's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from envs.mario.stages import RANDOM_STAGES, RANDOM_STAGES_ID, RANDOM_STAGES_WORLD
from shared.config import Config, EnvConfig

_SHORT = re.compile(r"^(?P<world>[1-8])-(?P<stage>[1-4])$")
_STAGE_ID = re.compile(r"^SuperMarioBros-(?P<world>[1-8])-(?P<stage>[1-4])-v(?P<version>[0-3])$")
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
    if (m := RANDOM_STAGES_ID.match(name)) is not None:
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


def check_env_config(env_cfg: EnvConfig) -> None:
    """ConfigError unless `env_cfg` is valid (a random-stages id is checked as any Mario id: its stages share it)."""
    Config(env=env_cfg).check_valid()
