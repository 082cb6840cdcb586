"""The config rules that need to know the envs, beside EnvSpec: the env section's (its action sets and Mario's
backends), and the env's spec as far as the config alone tells it (Mario's: `EnvSpec.of_mario`, no emulator), by
which the rules of shared/config_checks.py size the network, the replay and random shifts before any env is built.

`Config.check_valid()` runs `check_config`; a collector runs `check_welcome` on the part of a config a head's
WELCOME carries. Both are shared/config_checks.py's `check_all` and `check_welcome` with these rules handed in
(`ENV_RULES`), so that module imports no env module. Like EnvSpec, this module imports neither torch nor gymnasium.
"""

from __future__ import annotations

from envs.mario.actions import ACTION_LISTS
from envs.mario.backend import check_backend
from envs.spec import EnvSpec
from shared.config import Config, EnvConfig, is_mario
from shared.config_checks import EnvRules, check_all, choice, fail, float_range, int_range
from shared.config_checks import check_welcome as check_welcome_with

ACTION_SETS = tuple(ACTION_LISTS)  # right_only, simple, complex (envs/mario/actions.py)


def check_env(e: EnvConfig) -> None:
    """The env section's rules."""
    if not isinstance(e.env_id, str) or not e.env_id.strip():
        fail("env.env_id", e.env_id, "a registered Gymnasium id such as SuperMarioBros-1-1-v0 or CartPole-v1")
    choice("env.action_set", e.action_set, ACTION_SETS)
    int_range("env.frame_skip", e.frame_skip, 1, 16)
    float_range("env.reward_scale", e.reward_scale, 0.0, 1e6, lo_open=True)
    float_range("env.max_abs_reward", e.max_abs_reward, 0.0, 1e30)  # 0: the env's own; 64 x 1e30 << float32 max
    float_range("env.max_abs_obs", e.max_abs_obs, 0.0, 1e30)
    int_range("env.frame_size", e.frame_size, 16, 256)
    int_range("env.frame_stack", e.frame_stack, 1, 16)
    int_range("env.max_episode_steps", e.max_episode_steps, 1)
    int_range("env.noop_max", e.noop_max, 0, 1000)
    int_range("env.seed", e.seed, 0, 2**31 - 1)
    check_backend(e.backend)


def spec_from_config(cfg: Config) -> EnvSpec | None:
    """Mario's spec needs only the config (EnvSpec.of_mario); other envs' needs the env itself: None."""
    e = cfg.env
    if isinstance(e.env_id, str) and is_mario(e.env_id) and e.action_set in ACTION_SETS:
        return EnvSpec.of_mario(e)
    return None


ENV_RULES = EnvRules(check_env=check_env, spec_from_config=spec_from_config)


def check_config(cfg: Config, available_bytes: int | None = None) -> None:
    """Every rule of `cfg` (what `Config.check_valid` runs): ConfigError for the first bad field."""
    check_all(cfg, available_bytes, ENV_RULES)


def check_welcome(cfg: Config, available_bytes: int | None = None) -> None:
    """The rules of the fields a collector reads, on the config a head's WELCOME carries (shared/config_checks.py
    `check_welcome`), with a collector's memory check of its network copies."""
    check_welcome_with(cfg, available_bytes, ENV_RULES)
