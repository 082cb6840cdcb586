"""What values a restored replay may hold, and the check that refuses anything else.

A checkpoint's sha256 says the files are the ones written, not that their values are ones a run can
produce. A restore therefore checks every value a resumed run would train on against the bounds its
data went in under: the head's wire bounds (env.max_abs_obs for float observations, env.max_abs_reward
per scaled reward, hence |R_n| <= max_abs_reward x sum_{k<n} gamma^k for an n-step return) and the
learner's |TD| cap for priorities. A finite 1e30 frame passes a finiteness check and wrecks training
as surely as a NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.chunk_plan import MAX_ABS_REWARD
from replay.sampler import MAX_PRIORITY_TD

# Returns are float64 sums stored as float32 and priorities float64 powers of float32 values: a value
# produced within a bound may round past it by a few float32 ulps; this much relative slack admits it.
ROUNDING_SLACK = 1e-6


@dataclass(frozen=True)
class ValueBounds:
    """The largest |value| a restore admits; None: finite is enough.

    The default is what a bare ReplayBuffer's add_chunk admits (rewards up to MAX_ABS_REWARD, any finite
    observation or priority); `ReplayBuffer.build` uses the head's bounds (`of_head`)."""

    max_abs_obs: float | None = None  # float frames only; integer frames cannot hold a huge value
    max_abs_reward: float = MAX_ABS_REWARD  # per step, as stored (after env.reward_scale)
    max_priority_td: float | None = None  # the largest |TD| that becomes a priority
    num_actions: int | None = None  # actions 0 .. num_actions - 1 (None: any action >= 0)

    @classmethod
    def of_head(cls, max_abs_obs: float, max_abs_reward: float, num_actions: int | None = None) -> ValueBounds:
        """The head's bounds: the wire's obs_out_of_range / reward_out_of_range / action_range limits (the
        run's EnvSpec, envs/bounds.py) and the learner's |TD| cap (ingest clips collectors'
        priorities below it)."""
        return cls(max_abs_obs=float(max_abs_obs), max_abs_reward=float(max_abs_reward),
                   max_priority_td=MAX_PRIORITY_TD, num_actions=None if num_actions is None else int(num_actions))

    def max_abs_return(self, n_step: int, gamma: float) -> float:
        """The largest |n-step return| rewards within max_abs_reward can sum to: sum_{k<n} gamma^k of it."""
        return self.max_abs_reward * sum(float(gamma) ** k for k in range(int(n_step)))

    def max_leaf(self, prioritized: bool, alpha: float, priority_eps: float) -> float | None:
        """The largest sampling mass a transition can have: (cap + eps) ** alpha, or 1 in uniform mode."""
        if not prioritized:
            return 1.0
        if self.max_priority_td is None:
            return None
        return (self.max_priority_td + float(priority_eps)) ** float(alpha)


def check_values(path: Path, arr: np.ndarray, *, low: float | None = None, high: float | None = None,
                 max_abs: float | None = None, why: str = "", first_slot: int = 0) -> None:
    """ValueError naming `path` and the first slot holding NaN/inf, a value outside [low, high], or one
    with |x| above max_abs (checked with ROUNDING_SLACK; `why` says where max_abs comes from)."""
    rows = arr.reshape(len(arr), -1)
    bad = ~np.isfinite(rows)
    if low is not None:
        bad |= rows < low
    if high is not None:
        bad |= rows > high
    if max_abs is not None:
        bad |= np.abs(rows) > max_abs * (1.0 + ROUNDING_SLACK)
    if bad.any():
        slot = int(np.flatnonzero(bad.any(axis=1))[0])
        value = float(rows[slot][bad[slot]][0])
        allowed = ("finite" + ("" if low is None else f", >= {low}") + ("" if high is None else f", <= {high}")
                   + ("" if max_abs is None else f", |x| <= {max_abs:g}{why}"))
        raise ValueError(f"{path}: slot {first_slot + slot} holds {value:.6g} ({int(bad.sum())} bad values in all); "
                         f"allowed {allowed}; refusing to restore it")


def check_ints(path: Path, arr: np.ndarray, *, low: int, high: int | np.ndarray, allowed: str,
               also: int | None = None) -> None:
    """ValueError naming `path` and the first slot of an integer array whose value lies outside
    [low, high] (`high` may be per slot) and is not `also`; `allowed` says in words what may be there.
    An index a restore admits unchecked is an IndexError (or a wrong gather) on the first batch drawn."""
    bad = (arr < low) | (arr > high)
    if also is not None:
        bad &= arr != also
    if bad.any():
        slot = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: slot {slot} holds {int(arr[slot])} ({int(bad.sum())} bad values in all); "
                         f"allowed {allowed}; refusing to restore it")
