"""make_env / env_spec: Mario dispatch, Gymnasium passthrough, clear errors (no torch)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from envs.factory import env_spec, make_env, parse_mario_id
from envs.spec import EnvSpec
from envs.testing import COUNTING_ENV_ID, decode_frame
from shared.config import EnvConfig

pytestmark = pytest.mark.envonly

ROOT = Path(__file__).resolve().parents[1]


def test_cartpole_passthrough_with_time_limit() -> None:
    env = make_env(EnvConfig(env_id="CartPole-v1", max_episode_steps=5))
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4,) and obs.dtype == np.float32
        for t in range(1, 6):
            obs, reward, terminated, truncated, _ = env.step(t % 2)
            assert obs.shape == (4,) and obs.dtype == np.float32 and reward == 1.0
            assert not terminated
            assert truncated == (t == 5)
    finally:
        env.close()


def test_counting_env_passthrough_unchanged() -> None:
    env = make_env(EnvConfig(env_id=COUNTING_ENV_ID, max_episode_steps=5))
    try:
        obs, _ = env.reset(seed=7)
        assert obs.shape == (84, 84) and obs.dtype == np.uint8
        assert decode_frame(obs) == (7, 0, 0)
        for t in range(1, 6):
            obs, reward, terminated, truncated, _ = env.step(1)
            assert decode_frame(obs) == (7, 0, t)
            assert reward == float((t - 1) % 7 + 1)
        assert truncated and not terminated  # the 5-step limit, not the env's own 37-step end
    finally:
        env.close()


def test_env_spec_vector_and_frame_envs() -> None:
    assert env_spec(EnvConfig(env_id="CartPole-v1")) == EnvSpec((4,), np.dtype(np.float32), 2, 1, max_abs_reward=1.0,
                                                                max_abs_obs=20.0)
    assert env_spec(EnvConfig(env_id=COUNTING_ENV_ID, frame_stack=3)) == EnvSpec((84, 84), np.dtype(np.uint8), 4, 3)


def test_mario_env_spec_needs_no_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    import envs.mario.emulator as emulator

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("env_spec built an emulator")

    monkeypatch.setattr(emulator.MarioEmulator, "__init__", boom)
    for action_set, n in (("right_only", 5), ("simple", 7), ("complex", 12)):
        spec = env_spec(EnvConfig(action_set=action_set, frame_size=64, frame_stack=4))
        assert spec == EnvSpec((64, 64), np.dtype(np.uint8), n, 4, frame_skip=4, max_abs_reward=20 + 999 + 50)
    assert env_spec(EnvConfig(env_id="SuperMarioBros-v0")).num_actions == 7


def test_make_env_builds_mario_env() -> None:
    env = make_env(EnvConfig(env_id="SuperMarioBros-2-3-v0", action_set="right_only"))
    try:
        obs, info = env.reset(seed=0)
        assert env.action_space.n == 5 and obs.shape == (84, 84) and obs.dtype == np.uint8
        assert (info["world"], info["stage"]) == (2, 3)
    finally:
        env.close()


def test_random_stages_spec_is_a_stages_spec_without_an_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    import envs.mario.emulator as emulator

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("env_spec built an emulator")

    monkeypatch.setattr(emulator.MarioEmulator, "__init__", boom)
    stage = EnvConfig(env_id="SuperMarioBros-1-3-v0", action_set="simple", frame_size=64)
    assert env_spec(replace(stage, env_id="SuperMarioBrosRandomStages-v0")) == env_spec(stage)


def test_make_env_builds_random_stages_that_train_on_the_stage_drawn() -> None:
    env = make_env(EnvConfig(env_id="SuperMarioBrosRandomStages-v0", action_set="right_only"))
    try:
        assert env.action_space.n == 5 and env.observation_space.shape == (84, 84)
        stages = set()
        _, info = env.reset(seed=11)  # the first seeded reset fixes every later draw, as a collector's streams do
        for _ in range(8):
            stages.add((info["world"], info["stage"]))
            obs, _, _, _, step_info = env.step(1)
            assert obs.shape == (84, 84) and (step_info["world"], step_info["stage"]) == (info["world"], info["stage"])
            _, info = env.reset()
        assert len(stages) > 1 and all(world == 1 for world, _ in stages)
    finally:
        env.close()


def test_parse_mario_ids() -> None:
    assert parse_mario_id("SuperMarioBros-v0") == (None, "vanilla")
    assert parse_mario_id("SuperMarioBros-4-2-v1") == ((4, 2), "downsample")
    assert parse_mario_id("SuperMarioBros-8-4-v3") == ((8, 4), "rectangle")


@pytest.mark.parametrize(
    ("env_id", "suggestion"),
    [
        ("CartPole-v9", "CartPole-v1"),
        ("ApeXCountng-v0", COUNTING_ENV_ID),
        ("SuperMarioBros-9-1-v0", "SuperMarioBros-"),
        ("SuperMarioBros-1-1-v7", "SuperMarioBros-1-1-v"),
        ("SuperMarioBros3-v0", "not supported"),
        ("SuperMarioBrosRandomStages-v4", "did you mean SuperMarioBrosRandomStages-v"),
    ],
)
def test_unknown_id_names_id_and_suggests(env_id: str, suggestion: str) -> None:
    with pytest.raises(ValueError) as err:
        make_env(EnvConfig(env_id=env_id))
    assert env_id in str(err.value) and suggestion in str(err.value)
    with pytest.raises(ValueError):
        env_spec(EnvConfig(env_id=env_id))


@pytest.mark.parametrize("env_id", ["SuperMarioBros-1-1-v0", "CartPole-v1"])
def test_bad_action_set_names_allowed_values(env_id: str) -> None:
    for call in (make_env, env_spec):
        with pytest.raises(ValueError) as err:
            call(EnvConfig(env_id=env_id, action_set="everything"))
        message = str(err.value)
        assert "everything" in message and all(n in message for n in ("right_only", "simple", "complex"))


def test_env_modules_do_not_import_torch() -> None:
    """CI runs the envonly tests under Python 3.13 where torch is absent."""
    code = (
        "import sys; import envs.factory, envs.mario.env, envs.mario.emulator, envs.mario.ram; "
        "sys.exit('torch' in sys.modules)"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, check=True, capture_output=True)


def test_env_spec_carries_the_configs_reward_handling_and_its_description() -> None:
    cfg = EnvConfig(env_id="CartPole-v1", reward_scale=0.1, max_abs_reward=50.0, max_abs_obs=1e3, frame_skip=3)
    spec = env_spec(cfg)
    assert (spec.reward_scale, spec.max_abs_reward, spec.max_abs_obs) == (0.1, 50.0, 1e3)
    assert spec.frame_skip == 1  # the passthrough skips nothing whatever env.frame_skip says
    assert not spec.image and spec.frame_bytes == 16 and "vector path: MLP on 1 x (4,) float32" in spec.description
    mario = env_spec(EnvConfig(frame_size=48, frame_stack=2, action_set="right_only"))
    assert mario.image and mario.frame_bytes == 48 * 48 and mario.stack == 2
    assert mario.description == ("Mario wrapper on nes-py (right_only actions, skip 4 + max-pool, 48x48 gray); image path: "
                                 "Nature CNN on 2 x 48x48 uint8, 5 actions")
    counting = EnvConfig(env_id=COUNTING_ENV_ID, frame_stack=3)
    env = make_env(counting)
    try:  # read from an env the caller keeps: the same spec as from one built for the purpose
        assert env_spec(counting, env) == env_spec(counting)
    finally:
        env.close()


def test_config_only_modules_do_not_import_torch_or_gymnasium() -> None:
    """The config checks use EnvSpec where neither is installed (Python 3.13: no torch)."""
    code = ("import sys; import envs.spec, envs.checks, shared.config_checks; "
            "from shared.config import Config; Config().check_valid(available_bytes=512 * 2**30); "
            "sys.exit('torch' in sys.modules or 'gymnasium' in sys.modules)")
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, check=True, capture_output=True)
