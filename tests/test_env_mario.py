"""Real-emulator tests of the fused Mario env (no torch: runs under Python 3.11 and 3.13)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.factory import make_env
from envs.mario.actions import ACTION_LISTS, action_buttons
from envs.mario.emulator import FLAG, package_generation
from envs.mario.env import MarioEnv
from shared.config import EnvConfig

pytestmark = pytest.mark.envonly

FIXTURE = Path(__file__).parent / "data" / "mario_golden.json"
RIGHT = 1  # 'right' in every action set
INFO_KEYS = {"x_pos", "flag_get", "world", "stage", "score", "life", "time"}


def _hash(obs: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(obs).tobytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def stage_env() -> Iterator[MarioEnv]:
    """One default 1-1 env shared by the module (building one skips the start screen, ~0.5 s)."""
    env = make_env(EnvConfig())
    yield env
    env.close()


def _walk_until_end(env: MarioEnv, action: int, limit: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
    for t in range(1, limit + 1):
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return t, float(reward), terminated, truncated, info
    raise AssertionError(f"episode did not end within {limit} steps")


def test_action_sets_are_the_packages_lists() -> None:
    from gym_super_mario_bros import actions

    package = {"right_only": actions.RIGHT_ONLY, "simple": actions.SIMPLE_MOVEMENT, "complex": actions.COMPLEX_MOVEMENT}
    for name, combos in ACTION_LISTS.items():
        assert [list(c) for c in combos] == package[name]
    assert action_buttons("simple") == (0, 0x80, 0x81, 0x82, 0x83, 0x01, 0x40)
    assert len(action_buttons("right_only")) == 5 and len(action_buttons("complex")) == 12


def _golden_scenarios() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text())["scenarios"]


@pytest.mark.parametrize("scenario", _golden_scenarios(), ids=lambda s: s["name"])
def test_matches_golden_fixture(scenario: dict[str, Any]) -> None:
    """Same rewards, infos, terminations and frames as recorded (on the other emulator generation too)."""
    cfg = EnvConfig(**scenario["env_config"])
    env = make_env(cfg)
    try:
        needs_reset, resets, frame_hashes = True, [], []
        for t, action in enumerate(scenario["actions"]):
            if needs_reset:
                obs, _ = env.reset(seed=cfg.seed)
                resets.append((t, _hash(obs)))
            obs, reward, terminated, truncated, info = env.step(action)
            expected = (scenario["reward"][t], scenario["terminated"][t], scenario["truncated"][t], scenario["info"][t])
            assert (reward, terminated, truncated, info) == expected, f"{scenario['name']} step {t}"
            frame_hashes.append(_hash(obs))
            needs_reset = terminated or truncated
    finally:
        env.close()
    assert resets == list(zip(scenario["reset_at"], scenario["reset_hash"], strict=True))
    assert frame_hashes == scenario["hash"]
    if cfg.clip_rewards:
        assert all(-1.0 <= r <= 1.0 for r in scenario["reward"])


def test_fixture_covers_deaths_resets_and_truncation() -> None:
    scenarios = {s["name"]: s for s in _golden_scenarios()}
    stage = scenarios["stage_simple"]
    assert any(stage["terminated"]) and len(stage["reset_at"]) > 1 and min(stage["reward"]) <= -13
    lives = scenarios["full_game_lives"]
    assert [i["life"] for i in lives["info"]].count(255) > 0  # played through to game over
    assert any(scenarios["truncate_clip"]["truncated"])


def test_same_seed_same_actions_identical_frames(stage_env: MarioEnv) -> None:
    actions = np.random.RandomState(5).randint(0, 7, size=40).tolist()

    def play() -> list[np.ndarray]:
        obs, _ = stage_env.reset(seed=11)
        frames = [obs]
        for a in actions:
            obs, _, terminated, truncated, _ = stage_env.step(a)
            frames.append(obs)
            if terminated or truncated:
                break
        return frames

    first, second = play(), play()
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_spaces_shapes_and_info(stage_env: MarioEnv) -> None:
    obs, info = stage_env.reset(seed=0)
    assert obs.shape == (84, 84) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    assert stage_env.observation_space.contains(obs)
    assert stage_env.action_space.n == 7
    assert set(info) == INFO_KEYS and info["world"] == 1 and info["stage"] == 1 and info["life"] == 2
    obs, reward, terminated, truncated, info = stage_env.step(RIGHT)
    assert obs.shape == (84, 84) and obs.dtype == np.uint8 and isinstance(reward, float)
    assert set(info) == INFO_KEYS and all(type(info[k]) is int for k in INFO_KEYS - {"flag_get"})
    assert stage_env.ram.shape == (2048,) and stage_env.generation == package_generation()


def test_check_env(stage_env: MarioEnv) -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(stage_env, skip_render_check=True)


def test_truncation_is_not_termination() -> None:
    env = make_env(EnvConfig(max_episode_steps=10, frame_skip=1))
    try:
        env.reset(seed=0)
        for _ in range(9):
            _, _, terminated, truncated, _ = env.step(0)
            assert not terminated and not truncated
        _, _, terminated, truncated, _ = env.step(0)
        assert truncated and not terminated
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
        obs, _ = env.reset()
        assert obs.shape == (84, 84)
    finally:
        env.close()


def test_stage_episode_ends_on_death(stage_env: MarioEnv) -> None:
    """Walking right on 1-1 runs into the first goomba: terminated, with the death penalty."""
    stage_env.reset(seed=0)
    t, reward, terminated, truncated, info = _walk_until_end(stage_env, RIGHT, 80)
    assert terminated and not truncated and t > 20
    assert reward <= -13  # -25 death plus at most 3 px/frame of progress
    assert info["life"] == 2  # the life counter drops only after the (skipped) death animation
    with pytest.raises(RuntimeError):
        stage_env.step(RIGHT)


@pytest.fixture(scope="module")
def full_game_env() -> Iterator[MarioEnv]:
    env = make_env(EnvConfig(env_id="SuperMarioBros-v0", action_set="right_only", life_loss_terminal=True))
    yield env
    env.close()


def test_full_game_life_loss_terminal(full_game_env: MarioEnv) -> None:
    full_game_env.reset(seed=0)
    t, reward, terminated, _, info = _walk_until_end(full_game_env, RIGHT, 80)
    assert terminated and reward <= -13 and info["life"] == 2
    # resetting restarts from 1-1 with all lives
    _, info = full_game_env.reset()
    assert (info["world"], info["stage"], info["life"], info["x_pos"]) == (1, 1, 2, 40)


def test_full_game_without_life_loss_terminal_matches_package_step() -> None:
    """Our frame driver == the package's own `step` called per frame: RAM and screen, frame for frame."""
    from gym_super_mario_bros import SuperMarioBrosEnv

    env = make_env(EnvConfig(env_id="SuperMarioBros-v0", action_set="right_only", life_loss_terminal=False))
    raw = SuperMarioBrosEnv(target=None)
    try:
        env.reset(seed=0)
        raw.reset()
        buttons = action_buttons("right_only")
        lives = []
        for t in range(200):
            _, _, terminated, truncated, info = env.step(RIGHT)
            raw_done = False
            for _ in range(4):
                out = raw.step(buttons[RIGHT])
                raw_done = bool(out[2] or (len(out) == 5 and out[3]))
                if raw_done:
                    break
            np.testing.assert_array_equal(env.ram, raw.ram, err_msg=f"RAM differs after step {t}")
            assert terminated == raw_done, f"step {t}"
            lives.append(info["life"])
            if t % 25 == 0 or terminated:
                np.testing.assert_array_equal(env._emu.rgb(), np.ascontiguousarray(raw.screen))
            if terminated:
                break
        assert terminated and not truncated and lives[-1] == 255
        assert lives.index(1) > 0 and lives.index(0) > lives.index(1)  # Mario respawned twice
    finally:
        env.close()
        raw.close()


def test_flag_bonus_paid_once_per_flag(stage_env: MarioEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """The +50 is paid on the step flag_get turns true, not on every step it stays true."""
    emu = stage_env._emu
    real_frame = emu.frame
    flag_steps = {3, 4}
    step = {"t": 0}

    def frame(buttons: int, stop: bool) -> int:
        return real_frame(buttons, stop) | (FLAG if step["t"] in flag_steps else 0)

    monkeypatch.setattr(emu, "frame", frame)
    stage_env.reset(seed=0)
    rewards, flags = [], []
    for t in range(6):
        step["t"] = t
        _, reward, _, _, info = stage_env.step(0)  # NOOP: no progress, no death
        rewards.append(reward)
        flags.append(info["flag_get"])
    assert flags == [False, False, False, True, True, False]
    assert [r >= 49 for r in rewards] == [False, False, False, True, False, False]


def test_invalid_action_and_render_and_close() -> None:
    env = make_env(EnvConfig(action_set="right_only", frame_skip=1, frame_size=64), render_mode="rgb_array")
    env.reset(seed=0)
    for bad in (5, -1, 1.5, "a"):
        with pytest.raises(ValueError, match="action"):
            env.step(bad)
    obs, *_ = env.step(np.int64(4))
    assert obs.shape == (64, 64) and obs.dtype == np.uint8
    frame = env.render()
    assert frame.shape == (240, 256, 3) and frame.dtype == np.uint8 and frame.flags.c_contiguous
    env.close()
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


@pytest.mark.skipif(package_generation() != "gymnasium", reason="gym-super-mario-bros 7.4 has the v1-v3 ROMs")
def test_non_vanilla_roms_rejected_on_native_generation() -> None:
    with pytest.raises(ValueError, match="v0"):
        make_env(EnvConfig(env_id="SuperMarioBros-1-1-v1"))
