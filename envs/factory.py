"""Build the training env from an EnvConfig: Mario and Atari get their fused envs, images a gray frame, the rest passes through.

Why one factory: collectors, the evaluator and tests must build bit-identical envs from the
same config, and the learner/replay must size buffers from the same config without stepping
(`env_spec`, an EnvSpec: envs/spec.py).

Mario ids (SMB1 only; the reward reads SMB1 RAM):
    SuperMarioBros-vN        full game (N = 0 vanilla; 1/2/3 = downsample/pixel/rectangle ROMs,
                              only on gym-super-mario-bros 7.4)
    SuperMarioBros-W-S-vN    one stage, W in 1..8, S in 1..4
    SuperMarioBrosRandomStages-vN  World 1's four stages, one drawn per episode (envs/mario/stages.py)
Atari ids (ale-py, ROMs in its wheel): ALE/<Game>-v5 -> envs/atari.py, the standard DQN
preprocessing (no-op starts, skip + max-pool, 84x84 gray, life loss terminal, FIRE reset, clipping).
Any other registered Gymnasium id (CartPole-v1, ApeXCounting-v0, ...): `gymnasium.make(id)` with
a TimeLimit of max_episode_steps; an (H, W, C) uint8 image observation becomes one gray
frame_size x frame_size frame (envs/image_obs.py), anything else is left as it is (vector
observations stay vectors, 2-D uint8 frames stay frames).

Image path vs vector path: the network takes the Nature CNN for 2-D observations and the MLP
otherwise (envs/spec.py is_image_obs); `EnvSpec.description` says which one an env got.
"""

from __future__ import annotations

import difflib
import re

import gymnasium as gym
import numpy as np

from envs.atari import EPISODE_CONTINUES  # no emulator: ale-py is imported when an Atari env is built
from envs.image_obs import GrayResizeObservation, is_image_space
from envs.mario.actions import check_action_set
from envs.mario.stages import RandomStagesEnv, is_random_stages, stage_configs, stage_env_ids
from envs.spec import EnvSpec
from shared.config import ConfigError, EnvConfig, is_atari, is_mario

_MARIO_ID = re.compile(r"^SuperMarioBros-(?:(?P<world>[1-8])-(?P<stage>[1-4])-)?v(?P<version>[0-3])$")
_ROM_MODES = ("vanilla", "downsample", "pixel", "rectangle")


def _mario_ids() -> list[str]:
    ids = [f"SuperMarioBros-v{v}" for v in range(4)]
    ids += [f"SuperMarioBros-{w}-{s}-v{v}" for v in range(4) for w in range(1, 9) for s in range(1, 5)]
    ids += [f"SuperMarioBrosRandomStages-v{v}" for v in range(4)]
    return ids


def parse_mario_id(env_id: str) -> tuple[tuple[int, int] | None, str]:
    """(target (world, stage) or None for the full game, rom_mode) of a full-game or stage id; ConfigError (a
    ValueError) for unsupported ids (a random-stages id is its stages': `stage_env_ids`)."""
    match = _MARIO_ID.match(env_id)
    if match is None:
        close = difflib.get_close_matches(env_id, _mario_ids(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown Mario env id {env_id!r}: supported are SuperMarioBros-vN (full game), "
            f"SuperMarioBros-W-S-vN (W 1-8, S 1-4) and SuperMarioBrosRandomStages-vN (World 1's stages at random), "
            f"N 0-3; Lost Levels and SMB2/SMB3 are not supported{hint}"
        )
    target = None
    if match["world"] is not None:
        target = (int(match["world"]), int(match["stage"]))
    return target, _ROM_MODES[int(match["version"])]


def _ensure_registered(env_id: str) -> None:
    """Register the project's own envs (and ale-py's for ALE/ ids), then fail with suggestions if the id is still unknown."""
    import envs.testing  # noqa: F401  (registers ApeXCounting-v0 on import)

    if is_atari(env_id):
        from envs.atari import register_ale

        try:
            register_ale()
        except ImportError as exc:
            raise ConfigError(f"env {env_id!r} cannot be built: {' '.join(str(exc).split())}") from exc
        if env_id not in gym.registry:
            games = [key for key in gym.registry if is_atari(key)]
            close = difflib.get_close_matches(env_id, games, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(games[:3])}"
            raise ConfigError(f"unknown Atari env id {env_id!r}: ale-py has {len(games)} ALE/<Game>-v5 ids; {hint}")
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown env id {env_id!r}: not a registered Gymnasium id nor a SuperMarioBros id{hint}")


def check_env_id(env_id: object) -> None:
    """Raise ConfigError (a ValueError) naming `env_id` unless it is a supported Mario id or a registered Gymnasium id.

    Needs no emulator and builds nothing; the action and observation spaces are checked by `env_spec`.
    """
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError(f"env_id={env_id!r} is invalid: allowed a registered Gymnasium id or a SuperMarioBros id")
    if is_mario(env_id):
        for stage_id in stage_env_ids(env_id):
            parse_mario_id(stage_id)
    else:
        _ensure_registered(env_id)


def make_env(env_config: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """Build the env `env_config` describes (not yet reset: call reset(seed=...)); see the module docstring."""
    check_action_set(env_config.action_set)
    env_id = env_config.env_id
    check_env_id(env_id)
    if is_random_stages(env_id):
        return RandomStagesEnv(stage_configs(env_config), lambda stage: make_env(stage, render_mode), render_mode)
    if is_mario(env_id):
        target, rom_mode = parse_mario_id(env_id)
        from envs.mario.env import MarioEnv  # imported lazily: it loads the emulator packages

        return MarioEnv(
            target,
            action_set=env_config.action_set,
            frame_skip=env_config.frame_skip,
            frame_size=env_config.frame_size,
            clip_rewards=env_config.clip_rewards,
            life_loss_terminal=env_config.life_loss_terminal,
            max_episode_steps=env_config.max_episode_steps,
            rom_mode=rom_mode,
            render_mode=render_mode,
            backend=env_config.backend,
        )
    if is_atari(env_id):
        from envs.atari import make_atari_env  # imported lazily: it loads the emulator

        return make_atari_env(
            env_id,
            frame_skip=env_config.frame_skip,
            frame_size=env_config.frame_size,
            noop_max=env_config.noop_max,
            clip_rewards=env_config.clip_rewards,
            life_loss_terminal=env_config.life_loss_terminal,
            max_episode_steps=env_config.max_episode_steps,
            render_mode=render_mode,
        )
    kwargs = {} if render_mode is None else {"render_mode": render_mode}  # not every env takes one
    env = gym.make(
        env_id,
        max_episode_steps=env_config.max_episode_steps,
        disable_env_checker=True,  # the passive checker costs per step; tests run check_env instead
        **kwargs,
    )
    if is_image_space(env.observation_space):  # the image path: one gray frame per step, as Mario's
        return GrayResizeObservation(env, env_config.frame_size)
    return env


def env_spec(env_config: EnvConfig, env: gym.Env | None = None) -> EnvSpec:
    """The run's EnvSpec (envs/spec.py) without stepping.

    Mario specs come from the config alone (building the emulator skips the start screen, ~0.5 s).
    Other envs are read from `env` when given (an instance `make_env(env_config)` built, which the
    caller keeps), else from one env built, read and closed here: one construction either way.
    Every unusable env (unknown id, missing dependency, non-Discrete actions, non-Box observations)
    is a one-line ConfigError (a ValueError).
    """
    check_action_set(env_config.action_set)
    env_id = env_config.env_id
    check_env_id(env_id)
    if is_mario(env_id):
        _, rom_mode = parse_mario_id(stage_env_ids(env_id)[0])
        if rom_mode != "vanilla":
            from envs.mario.emulator import package_generation

            if package_generation() == "gymnasium":
                raise ConfigError(f"{env_id!r}: non-vanilla ROMs (-v1/-v2/-v3) need gym-super-mario-bros 7.4")
        return EnvSpec.of_mario(env_config)
    if env is not None:
        return _read_spec(env_config, env)
    try:
        built = make_env(env_config)
    except (gym.error.Error, ImportError) as exc:  # e.g. DependencyNotInstalled (box2d, ale-py, mujoco)
        detail = " ".join(str(exc).split())
        raise ConfigError(f"env {env_id!r} cannot be built: {type(exc).__name__}: {detail}") from exc
    try:
        return _read_spec(env_config, built)
    finally:
        built.close()


def _read_spec(env_config: EnvConfig, env: gym.Env) -> EnvSpec:
    """Check a built env's spaces and read its spec (see `env_spec`); describes its preprocessing too."""
    e, env_id = env_config, env_config.env_id
    obs_space, act_space = env.observation_space, env.action_space
    if isinstance(act_space, gym.spaces.Box):
        raise ConfigError(f"env {env_id!r} has a continuous action space ({act_space}); DQN needs Discrete")
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ConfigError(f"env {env_id!r} has action space {act_space}; DQN needs Discrete")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"env {env_id!r} has observation space {obs_space}; expected a Box")
    frame_skip, names = 1, ()
    if is_atari(env_id):
        frame_skip, names = e.frame_skip, tuple(env.unwrapped.action_meanings)
        source = (f"Atari preprocessing (no-op starts <= {e.noop_max}, skip {e.frame_skip} + max-pool, "
                  f"{e.frame_size}x{e.frame_size} gray, life loss terminal {'on' if e.life_loss_terminal else 'off'}, "
                  f"FIRE reset {'on' if env.unwrapped.needs_fire else 'off (no FIRE action)'}, "
                  f"reward clipping {'on' if e.clip_rewards else 'off'}, sticky actions "
                  f"{env.unwrapped.repeat_action_probability:g})")
    elif isinstance(env, GrayResizeObservation):
        source = f"image observation {env.source_shape} uint8 -> gray {e.frame_size}x{e.frame_size}"
    else:
        source = "observation as the env gives it"
    declared = None  # integer frames are not bounds-checked: only float spaces' bounds matter
    if np.issubdtype(obs_space.dtype, np.floating):
        declared = [float(np.max(np.abs(np.asarray(b, dtype=np.float64)))) for b in (obs_space.low, obs_space.high)]
    return EnvSpec.of_config(e, obs_space.shape, obs_space.dtype, int(act_space.n), frame_skip=frame_skip,
                             preprocessing=source, action_names=names, declared_obs_bounds=declared)


def describe_env(env_config: EnvConfig) -> str:
    """What the env became, for the head's first log line: preprocessing, the image or vector path, actions.

    `env_spec(env_config).description`: builds the env (not Mario's) once; errors as `env_spec`.
    """
    return env_spec(env_config).description


def episode_continues(info: dict) -> bool:
    """True when a terminated step ended a life, not the game: terminal for learning, the episode goes on
    (the next `reset()` resumes the game). Set by Atari with life_loss_terminal; False for every other env."""
    return bool(info.get(EPISODE_CONTINUES, False))


def episode_info(info: dict) -> tuple[int, bool, int, int]:
    """(x_pos, flag_get, world, stage) from an episode's last info dict; zeros for non-Mario envs."""

    def num(key: str) -> int:
        try:
            return int(info.get(key, 0) or 0)
        except (TypeError, ValueError):
            return 0

    return num("x_pos"), bool(info.get("flag_get", False)), num("world"), num("stage")
