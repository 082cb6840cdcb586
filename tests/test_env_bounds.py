"""The head's value bounds derived from the env (envs/bounds.py), and the real envs staying within them.

Why: a bound far above what the env produces admits data no real episode has (one chunk of 1e6
CartPole observations ruins the network; rewards of 1e5 forge a solved run). A bound below what it
produces rejects an honest collector's every chunk: so the real envs are played here against theirs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs import bounds as env_bounds
from envs.factory import env_spec, make_env
from envs.mario.reward import CLOCK_MAX, DEATH_PENALTY, FLAG_BONUS, max_abs_step_reward, max_dx
from shared.config import EnvConfig


def test_derived_reward_bounds() -> None:
    mario = EnvConfig()  # skip 4: 20 px of progress, the clock's whole range, the flag
    assert env_bounds.max_abs_reward(mario) == 20 + CLOCK_MAX + max(-DEATH_PENALTY, FLAG_BONUS)
    assert env_bounds.max_abs_reward(EnvConfig(frame_skip=2, reward_scale=0.01)) == pytest.approx(0.01 * (10 + 1049))
    assert env_bounds.max_abs_reward(EnvConfig(clip_rewards=True, reward_scale=0.5)) == 0.5
    assert env_bounds.max_abs_reward(EnvConfig(env_id="CartPole-v1", reward_scale=0.1)) == pytest.approx(0.1)
    assert env_bounds.max_abs_reward(EnvConfig(env_id="ALE/Pong-v5", clip_rewards=True)) == 1.0
    assert env_bounds.max_abs_reward(EnvConfig(env_id="ALE/Pong-v5")) == env_bounds.UNKNOWN_BOUND  # game scores
    assert env_bounds.max_abs_reward(EnvConfig(env_id="SomeCustomEnv-v0")) == env_bounds.UNKNOWN_BOUND
    # a positive setting replaces the derived bound, as given (already scaled)
    assert env_bounds.max_abs_reward(EnvConfig(env_id="CartPole-v1", reward_scale=0.1, max_abs_reward=7.0)) == 7.0


def test_derived_observation_bounds() -> None:
    assert env_bounds.max_abs_obs(EnvConfig(env_id="CartPole-v1"), [4.8, math.inf]) == 20.0  # its physics
    assert env_bounds.max_abs_obs(EnvConfig(env_id="Custom-v0"), [1.0, 28.3]) == pytest.approx(56.6)  # 2x declared
    assert env_bounds.max_abs_obs(EnvConfig(env_id="Custom-v0"), [1.0, math.inf]) == env_bounds.UNKNOWN_BOUND
    assert env_bounds.max_abs_obs(EnvConfig(env_id="Custom-v0")) == env_bounds.UNKNOWN_BOUND
    assert env_bounds.max_abs_obs(EnvConfig(env_id="Custom-v0"), [0.0, 0.0]) == 1.0  # never below 1
    assert env_bounds.max_abs_obs(EnvConfig(env_id="CartPole-v1", max_abs_obs=3.0), [4.8]) == 3.0


def test_the_specs_of_real_envs_carry_their_bounds() -> None:
    cartpole = env_spec(EnvConfig(env_id="CartPole-v1", reward_scale=0.1))
    assert (cartpole.max_abs_reward, cartpole.max_abs_obs) == (pytest.approx(0.1), 20.0)
    acrobot = env_spec(EnvConfig(env_id="Acrobot-v1"))  # declares |velocities| <= 4 pi and 9 pi
    assert (acrobot.max_abs_reward, acrobot.max_abs_obs) == (1.0, pytest.approx(18 * math.pi, rel=1e-6))
    mario = env_spec(EnvConfig(action_set="right_only"))
    assert mario.max_abs_reward == max_abs_step_reward(4)


def test_cartpole_stays_within_its_bounds_under_any_policy() -> None:
    """Random, constant and sticky policies (the fastest ways off the track) over 200 episodes each: every
    observation within the derived bound, every reward within it."""
    cfg = EnvConfig(env_id="CartPole-v1")
    obs_bound, reward_bound = env_spec(cfg).max_abs_obs, env_bounds.max_abs_reward(cfg)
    env, rng = make_env(cfg), np.random.default_rng(0)
    biggest = 0.0
    try:
        for policy in ("random", "left", "right", "sticky"):
            for episode in range(200):
                obs, _ = env.reset(seed=episode)
                action, done = 0, False
                while not done:
                    biggest = max(biggest, float(np.abs(obs).max()))
                    if policy == "random":
                        action = int(rng.integers(2))
                    elif policy in ("left", "right"):
                        action = int(policy == "right")
                    elif rng.random() < 0.1:
                        action = 1 - action
                    obs, reward, terminated, truncated, _ = env.step(action)
                    assert abs(reward) <= reward_bound
                    done = terminated or truncated
                biggest = max(biggest, float(np.abs(obs).max()))
    finally:
        env.close()
    assert 1.0 < biggest <= obs_bound, biggest


def test_mario_rewards_stay_within_the_bound_through_deaths() -> None:
    """The real emulator, random right_only actions at skip 4, until three episodes ended (each a death or the time
    limit): every reward within the derived bound, and the deaths' -25 among them."""
    cfg = EnvConfig(action_set="right_only", max_episode_steps=400)
    bound = env_bounds.max_abs_reward(cfg)
    env, rng = make_env(cfg), np.random.default_rng(1)
    rewards: list[float] = []
    try:
        for episode in range(3):
            env.reset(seed=episode)
            done = False
            while not done:
                _, reward, terminated, truncated, _ = env.step(int(rng.integers(5)))
                rewards.append(float(reward))
                done = terminated or truncated
    finally:
        env.close()
    assert max(abs(r) for r in rewards) <= bound
    # a death step is -25 plus at most 20 px of progress: the penalty was among the rewards checked
    assert min(rewards) <= DEATH_PENALTY + max_dx(4), "no death among the episodes: the test did not reach its case"
