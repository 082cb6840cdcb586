"""The terms of the Mario reward (envs/mario/env.py) and the largest |reward| one agent step can give.

Kept apart from the env so that the head's value bounds (envs/bounds.py) can be computed on
interpreters without the emulator, OpenCV or Gymnasium.
"""

from __future__ import annotations

DEATH_PENALTY = -25.0  # once per life lost
FLAG_BONUS = 50.0  # once per flag reached
MAX_DX_PER_FRAME = 5  # a larger |x_t - x_{t-1}| per emulator frame is a respawn, pipe or new stage: progress 0
CLOCK_MAX = 999  # the in-game clock is three decimal digits in RAM


def max_dx(frame_skip: int) -> int:
    """The largest |x progress| one agent step of `frame_skip` emulator frames counts."""
    return MAX_DX_PER_FRAME * int(frame_skip)


def max_abs_step_reward(frame_skip: int) -> float:
    """The largest |reward| of one agent step, unclipped and before env.reward_scale: progress, plus the clock
    falling by at most its whole range, plus a death or a flag."""
    return float(max_dx(frame_skip) + CLOCK_MAX + max(-DEATH_PENALTY, FLAG_BONUS))
