"""The largest |reward| and |observation| the head accepts from collectors, derived from the env.

Why: every chunk is checked against two bounds (shared/protocol.py: reward_out_of_range,
obs_out_of_range) and a restored replay against the same (replay/value_bounds.py). A bound far
above anything the env produces lets a broken or hostile collector put values into the replay that
no real episode has: one chunk of CartPole observations at 1e6 ruins the run's network, and
rewards of 1e5 per step make a forged episode "solve" any --target-return. So by default
(`env.max_abs_reward = 0`, `env.max_abs_obs = 0`) the bounds are the env's own:

* rewards, per agent step and before env.reward_scale:
  - Mario: progress (at most 5 px per emulator frame), the clock falling by at most its
    three-digit range, a death or a flag (envs/mario/reward.py); 1 with env.clip_rewards;
  - Atari with env.clip_rewards: 1; CartPole, Acrobot, MountainCar: 1;
  - any other env: 1e6 (nothing is known of its rewards);
* float observations (integer frames cannot hold a huge value and stay unchecked):
  - CartPole: 20 (cart and pole velocities are unbounded in its declared space, but a force of
    10 N on a 4.8 m track keeps them below ~10 before the episode ends);
  - an env whose Box declares finite bounds: twice the largest of them (some envs step a little
    past their declared space before terminating);
  - anything else: 1e6.

A positive `env.max_abs_reward` or `env.max_abs_obs` replaces the derived bound (scaled rewards,
as chunks carry them). This module needs neither Gymnasium nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from envs.mario.reward import max_abs_step_reward
from shared.config import EnvConfig, is_atari, is_mario

UNKNOWN_BOUND = 1e6  # what is accepted of an env nothing is known of (the bound before it was derived)
DECLARED_MARGIN = 2.0  # x the largest finite bound an observation space declares

# |reward| per step of envs whose rewards are known (before env.reward_scale)
KNOWN_REWARD_BOUNDS: dict[str, float] = {
    "CartPole-v0": 1.0,  # +1 per step
    "CartPole-v1": 1.0,
    "Acrobot-v1": 1.0,  # -1 per step until the swing-up, then 0
    "MountainCar-v0": 1.0,  # -1 per step
}

# |observation| of envs whose declared space has infinite bounds but whose physics does not
KNOWN_OBS_BOUNDS: dict[str, float] = {
    "CartPole-v0": 20.0,
    "CartPole-v1": 20.0,
}


def raw_reward_bound(env: EnvConfig) -> float | None:
    """The env's own largest |reward| per agent step, before env.reward_scale; None when unknown."""
    mario, atari = is_mario(env.env_id), is_atari(env.env_id)
    if env.clip_rewards and (mario or atari):  # the only wrappers that clip, both to [-1, 1]
        return 1.0
    if mario:
        return max_abs_step_reward(env.frame_skip)
    if atari:
        return None  # game scores
    return KNOWN_REWARD_BOUNDS.get(env.env_id)


def max_abs_reward(env: EnvConfig) -> float:
    """The largest |scaled reward| the head accepts: env.max_abs_reward when positive, else the env's own bound
    x env.reward_scale (UNKNOWN_BOUND when the env's is unknown)."""
    if env.max_abs_reward > 0:
        return float(env.max_abs_reward)
    raw = raw_reward_bound(env)
    return UNKNOWN_BOUND if raw is None else raw * float(env.reward_scale)


def max_abs_obs(env: EnvConfig, declared: Sequence[float] | None = None) -> float:
    """The largest |float observation| the head accepts: env.max_abs_obs when positive, else the env's known
    bound, else DECLARED_MARGIN x the largest |bound| its observation space declares (`declared`: the Box's low
    and high values, or any reduction of them that keeps the largest |value|) when all are finite, else
    UNKNOWN_BOUND."""
    if env.max_abs_obs > 0:
        return float(env.max_abs_obs)
    if env.env_id in KNOWN_OBS_BOUNDS:
        return KNOWN_OBS_BOUNDS[env.env_id]
    values = [abs(float(v)) for v in declared] if declared is not None else []
    if values and all(math.isfinite(v) for v in values):
        return min(UNKNOWN_BOUND, max(1.0, DECLARED_MARGIN * max(values)))
    return UNKNOWN_BOUND
