"""The unit of experience: a chunk of one env stream's consecutive frames.

Collectors send, and the replay writer stores, *segments* of one env's frame stream. Each
frame travels once per chunk and is stored once per chunk; a chunk repeats only the few
context frames its first transitions need (at most `stack - 1` history frames and the
`n`-step lookahead of transitions that were not complete when the previous chunk left).
That keeps every message self-contained: a lost, rejected or duplicated message can never
make a stack mix two streams or two episodes, and the consolidation thread holds no
per-stream state.

Per-frame arrays, all of length F (one entry per frame of the chunk):

- ``frames[i]``      observation i of the stream (one frame, e.g. uint8 84x84).
- ``actions[i]``     action taken at frame i, or ``NO_ACTION`` (-1) if none was taken inside
                     this chunk (an episode's final observation, or the newest frame).
- ``rewards[i]``     reward received for the action at frame i (0 when no action).
- ``flags[i]``       FIRST: frame i is the first observation of an episode (after reset).
                     TERMINATED: the step from frame i ended the episode; frame i+1 is its
                     final observation (no bootstrap). TRUNCATED: a time limit cut the
                     episode after the step from frame i; frame i+1 is the final observation
                     and targets bootstrap from it.
- ``priorities[i]``  initial priority the collector computed for the transition starting at
                     frame i (ignored for frames that start no transition here).

``first_start`` says where new transitions begin: frames before it are context only.

Stacks (the padding convention, shared by collector and replay): the stack for frame i is
``frames[max(i - S + 1 + k, floor(i))]`` for k = 0..S-1, where ``floor(i)`` is the index of the
latest FIRST frame at or before i (0 if there is none in the chunk). Early frames of an
episode are thus padded with copies of the episode's first frame, exactly what the collector's
rolling stack holds after a reset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLAG_FIRST = 1
FLAG_TERMINATED = 2
FLAG_TRUNCATED = 4
FLAG_END = FLAG_TERMINATED | FLAG_TRUNCATED
NO_ACTION = -1


@dataclass(frozen=True)
class TransitionChunk:
    """One env stream's segment, as sent by a collector and consumed by the replay writer."""

    stream: int  # env index inside its collector
    first_start: int  # transitions start at frames >= first_start; earlier frames are context
    frames: np.ndarray  # [F, *obs_shape]
    actions: np.ndarray  # int32 [F]
    rewards: np.ndarray  # float32 [F]
    flags: np.ndarray  # uint8 [F]
    priorities: np.ndarray  # float32 [F]

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


def stack_floors(flags: np.ndarray) -> np.ndarray:
    """Index of the latest FIRST frame at or before each frame (0 where there is none)."""
    idx = np.arange(len(flags), dtype=np.int64)
    marks = np.where((flags & FLAG_FIRST) != 0, idx, 0)
    return np.maximum.accumulate(marks) if len(flags) else marks


def stack_indices(positions: np.ndarray, floors: np.ndarray, stack: int) -> np.ndarray:
    """[len(positions), stack] frame indices forming each position's stack (oldest first)."""
    offsets = np.arange(-(stack - 1), 1, dtype=np.int64)
    raw = positions[:, None] + offsets[None, :]
    return np.maximum(raw, floors[:, None])


@dataclass(frozen=True)
class NStepTargets:
    """n-step quantities for the transitions of one chunk (all arrays of equal length)."""

    starts: np.ndarray  # int64 frame index where each transition starts (its state's newest frame)
    bootstrap: np.ndarray  # int64 frame index of the state the target bootstraps from
    returns: np.ndarray  # float32 sum_k gamma^k r_{t+k} over the window
    discounts: np.ndarray  # float32 gamma^m for bootstrapping, 0.0 after a termination
    steps: np.ndarray  # int64 m, the number of rewards summed (1..n)


def nstep_targets(
    actions: np.ndarray,
    rewards: np.ndarray,
    flags: np.ndarray,
    first_start: int,
    n: int,
    gamma: float,
) -> NStepTargets:
    """Transitions of a chunk whose n-step window is complete inside it, with their targets.

    A transition starts at frame i >= first_start with an action. Its window walks k = 0..n-1
    over steps i+k: it ends early after a step flagged TERMINATED (discount 0) or TRUNCATED
    (bootstrap from the final observation), and is complete only if the frame it bootstraps
    from is inside the chunk and every step in it has an action. Incomplete windows are left
    for the collector's next chunk. Vectorized over transitions; loops only over k < n.
    """
    num = len(actions)
    fast = _nstep_no_episode_end(actions, rewards, flags, first_start, n, gamma)
    if fast is not None:
        return fast
    idx = np.arange(num, dtype=np.int64)
    candidates = idx[(idx >= first_start) & (actions >= 0)]
    m = len(candidates)
    returns = np.zeros(m, dtype=np.float64)
    discount = np.ones(m, dtype=np.float64)
    steps = np.zeros(m, dtype=np.int64)
    open_ = np.ones(m, dtype=bool)  # window still accumulating
    complete = np.zeros(m, dtype=bool)
    terminated = np.zeros(m, dtype=bool)
    for k in range(n):
        pos = candidates + k
        inside = pos < num
        safe = np.minimum(pos, num - 1)
        has_action = inside & (actions[safe] >= 0)
        # a window that needs step pos but has no action there cannot complete in this chunk
        open_ &= has_action | ~open_
        stepping = open_ & has_action
        returns = np.where(stepping, returns + discount * rewards[safe], returns)
        discount = np.where(stepping, discount * gamma, discount)
        steps = np.where(stepping, steps + 1, steps)
        ended = stepping & ((flags[safe] & FLAG_END) != 0)
        terminated |= ended & ((flags[safe] & FLAG_TERMINATED) != 0)
        complete |= ended
        open_ &= ~ended
        if not open_.any():
            break
    # windows that ran all n steps without an end are complete when the bootstrap frame is here
    bootstrap = candidates + steps
    complete |= open_ & (steps == n)
    complete &= bootstrap < num
    discount = np.where(terminated, 0.0, discount)
    keep = complete
    return NStepTargets(
        starts=candidates[keep],
        bootstrap=bootstrap[keep],
        returns=returns[keep].astype(np.float32),
        discounts=discount[keep].astype(np.float32),
        steps=steps[keep],
    )


def window_returns(rewards: np.ndarray, n: int, gamma: float) -> np.ndarray:
    """float64 sum_k gamma^k r[t+k] over every full window [t, t+n) of `rewards` (len(rewards)-n+1 of them).

    The order of operations is the general path's (0 + r_t, then + gamma r_{t+1}, + gamma^2 r_{t+2},
    ...; rewards cast to float64 first, gamma^k by repeated multiplication), so the sums are
    bit-identical to it; the replay's batched planner sums windows across a concatenation of chunks
    with it too. Temporaries are written in place (the planner runs with cold caches)."""
    span = rewards.size - n + 1
    sums = np.add(rewards[:span], 0.0, dtype=np.float64)  # 0.0 + 1.0 * r: a -0.0 reward gives +0.0
    term = np.empty(span, dtype=np.float64)
    weight = gamma
    for k in range(1, n):
        np.multiply(rewards[k : k + span], weight, out=term, dtype=np.float64)
        np.add(sums, term, out=sums)
        weight = weight * gamma
    return sums


def _nstep_no_episode_end(
    actions: np.ndarray, rewards: np.ndarray, flags: np.ndarray, first_start: int, n: int, gamma: float
) -> NStepTargets | None:
    """The common chunk (no episode end, every step acted) in a few slices: starts are
    first_start .. F-1-n, all windows full. Same float64 operations in the same order as the
    general path, so results are bit-identical; None when the chunk needs the general path."""
    num = len(actions)
    stop = num - n  # exclusive end of complete starts
    if stop <= first_start or (flags[first_start:] & FLAG_END).any() or (actions[first_start:num - 1] < 0).any():
        return None
    count = stop - first_start
    returns = window_returns(rewards[first_start:], n, gamma)[:count]
    discount = 1.0
    for _ in range(n):
        discount = discount * gamma
    starts = np.arange(first_start, stop, dtype=np.int64)
    return NStepTargets(
        starts=starts,
        bootstrap=starts + n,
        returns=returns.astype(np.float32),
        discounts=np.full(count, discount, dtype=np.float32),
        steps=np.full(count, n, dtype=np.int64),
    )
