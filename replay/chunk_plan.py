"""One chunk: its validation and its n-step plan, the reference semantics of the replay writer.

`validate_chunk` raises a ValueError naming the first inconsistency of a chunk (shapes, dtypes,
sizes, then values); `plan_segment` turns a valid chunk into the segment the writer stores: the
range of frames it needs and its complete transitions with their n-step targets (via
shared.chunk). replay/batch_plan.py plans a batch of chunks at once and reproduces exactly what
these give one by one (it also uses them for the chunks it does not vectorize).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shared.chunk import (
    FLAG_END,
    FLAG_FIRST,
    FLAG_TERMINATED,
    FLAG_TRUNCATED,
    NO_ACTION,
    TransitionChunk,
    nstep_targets,
    stack_floors,
    stack_indices,
)

MAX_CHUNK_FRAMES = 4096  # the most frames one chunk may carry, whatever the capacity


def max_chunk_frames(capacity: int) -> int:
    """The most frames one chunk may carry into a replay of `capacity` frame slots: half the ring, at
    most MAX_CHUNK_FRAMES, at least 2. The one owner of this number: the replay refuses longer chunks,
    and the head's data sockets derive their MAXMSGSIZE from it (ingest/registration.py)."""
    return max(2, min(MAX_CHUNK_FRAMES, int(capacity) // 2))


_ALL_FLAGS = FLAG_FIRST | FLAG_TERMINATED | FLAG_TRUNCATED
# the flag bits no frame may carry, as uint8: numpy 2 refuses `uint8_array & -8` (a negative Python int)
_UNKNOWN_FLAGS = np.uint8(0xFF & ~_ALL_FLAGS)
# |reward| the replay stores. n-step returns are summed in float64 and stored as float32: any n below
# 3e8 keeps sum_k gamma^k r_k (gamma <= 1) under float32's 3.4e38, so returns, TD errors and priorities
# stay finite. The head's protocol bound (the env's own, at most 1e6 by default) is far tighter; this is the
# replay's own last line for chunks that reach it some other way.
MAX_ABS_REWARD = 1e30


class ChunkArrays(NamedTuple):
    """A chunk's fields as numpy arrays, once its shapes and dtypes are known to be consistent."""

    frames: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    flags: np.ndarray
    priorities: np.ndarray
    first_start: int


def check_structure(chunk: TransitionChunk, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                    max_frames: int) -> ChunkArrays:
    """Raise ValueError naming the first inconsistency of shapes, dtypes, sizes or float frames;
    return the chunk's arrays. No per-frame value of the small arrays is looked at."""
    frames = np.asarray(chunk.frames)
    num = frames.shape[0] if frames.ndim else -1
    if tuple(frames.shape[1:]) != tuple(obs_shape) or num < 1:
        raise ValueError(f"chunk frames have shape {frames.shape}; expected [F>=1, {', '.join(map(str, obs_shape))}]")
    if frames.dtype != obs_dtype:
        raise ValueError(f"chunk frames have dtype {frames.dtype}; the replay stores {obs_dtype}")
    if num > max_frames:
        raise ValueError(f"chunk has {num} frames; the replay accepts at most max_chunk_frames={max_frames}")
    if frames.dtype.kind == "f" and not (np.isfinite(frames.min()) and np.isfinite(frames.max())):
        bad = int(np.flatnonzero(~np.isfinite(frames.reshape(num, -1)).all(axis=1))[0])  # NaN propagates to min/max
        raise ValueError(f"chunk frames[{bad}] has a NaN or infinite value; observations must be finite")
    arrays = []
    for name, arr, kinds in (("actions", chunk.actions, "iu"), ("rewards", chunk.rewards, "fiu"),
                             ("flags", chunk.flags, "iu"), ("priorities", chunk.priorities, "fiu")):
        a = np.asarray(arr)
        if a.shape != (num,):
            raise ValueError(f"chunk {name} has shape {a.shape}; expected ({num},) to match its {num} frames")
        if a.dtype.kind not in kinds:
            raise ValueError(f"chunk {name} has dtype {a.dtype}; expected a {'float' if 'f' in kinds else 'integer'} type")
        arrays.append(a)
    first_start = int(chunk.first_start)
    if not 0 <= first_start <= num:
        raise ValueError(f"chunk first_start={chunk.first_start} outside [0, {num}]")
    return ChunkArrays(frames, *arrays, first_start)


def values_ok(actions: np.ndarray, rewards: np.ndarray, flags: np.ndarray, priorities: np.ndarray,
              boundaries: np.ndarray | None = None) -> bool:
    """Whether every per-frame value is usable: a handful of whole-array reductions (the hot path).

    The arrays may be several chunks concatenated; `boundaries` are then the indices where chunks
    2, 3, ... begin, and the one check on neighbouring frames (a FIRST frame must follow a frame
    without an action) skips the pairs that straddle two chunks."""
    end = flags & FLAG_END
    crossing = ((flags[1:] & FLAG_FIRST) != 0) & (actions[:-1] != NO_ACTION)
    if boundaries is not None and boundaries.size:
        crossing[boundaries - 1] = False
    return bool(
        actions.min() >= NO_ACTION
        and not (flags & _UNKNOWN_FLAGS).any()
        and not (end == FLAG_END).any()
        and not ((end != 0) & (actions == NO_ACTION)).any()
        and not crossing.any()
        and (np.abs(rewards) <= MAX_ABS_REWARD).all()  # NaN compares False: non-finite fails here too
        and np.isfinite(priorities).all()
        and priorities.min() >= 0
    )


def validate_chunk(chunk: TransitionChunk, obs_shape: tuple[int, ...], obs_dtype: np.dtype, stack: int,
                   max_frames: int) -> None:
    """Raise ValueError naming the first inconsistency between the chunk's arrays or a value the
    learner cannot use (non-finite float observations, rewards beyond MAX_ABS_REWARD)."""
    a = check_structure(chunk, obs_shape, obs_dtype, max_frames)
    if not values_ok(a.actions, a.rewards, a.flags, a.priorities):
        explain_bad_values(chunk, a.actions, a.flags)


def explain_bad_values(chunk: TransitionChunk, actions: np.ndarray, flags: np.ndarray) -> None:
    """Raise the precise ValueError for the first bad value (slow path)."""
    bad = np.flatnonzero(actions < NO_ACTION)
    if bad.size:
        raise ValueError(f"chunk actions[{bad[0]}]={actions[bad[0]]} is negative but not NO_ACTION ({NO_ACTION})")
    bad = np.flatnonzero((flags & _UNKNOWN_FLAGS) != 0)
    if bad.size:
        raise ValueError(f"chunk flags[{bad[0]}]={flags[bad[0]]} has bits outside FIRST|TERMINATED|TRUNCATED")
    both = np.flatnonzero((flags & FLAG_END) == FLAG_END)
    if both.size:
        raise ValueError(f"chunk flags[{both[0]}] sets both TERMINATED and TRUNCATED")
    end_no_action = np.flatnonzero(((flags & FLAG_END) != 0) & (actions == NO_ACTION))
    if end_no_action.size:
        i = int(end_no_action[0])
        raise ValueError(f"chunk flags[{i}] ends the episode but actions[{i}] is NO_ACTION (no step was taken)")
    firsts = np.flatnonzero((flags & FLAG_FIRST) != 0)
    firsts = firsts[firsts > 0]
    crossing = firsts[actions[firsts - 1] != NO_ACTION]
    if crossing.size:
        j = int(crossing[0])
        raise ValueError(
            f"chunk frame {j} is FIRST but actions[{j - 1}]={actions[j - 1]}: a step would cross into a new episode"
        )
    for name in ("rewards", "priorities"):
        a = np.asarray(getattr(chunk, name))
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise ValueError(f"chunk {name}[{bad[0]}]={a[bad[0]]} is not finite")
    rewards = np.asarray(chunk.rewards)
    bad = np.flatnonzero(np.abs(rewards) > MAX_ABS_REWARD)
    if bad.size:
        raise ValueError(f"chunk rewards[{bad[0]}]={rewards[bad[0]]:.6g} is invalid: allowed |reward| <= "
                         f"{MAX_ABS_REWARD:g} (keeps n-step returns finite in float32)")
    bad = np.flatnonzero(np.asarray(chunk.priorities) < 0)
    if bad.size:
        raise ValueError(f"chunk priorities[{bad[0]}]={chunk.priorities[bad[0]]} is negative")
    raise ValueError("chunk failed validation")  # unreachable unless the two paths disagree


@dataclass(frozen=True)
class PlannedSegment:
    """A chunk's complete transitions, expressed relative to the stored frame range [lo, hi)."""

    lo: int
    hi: int
    starts: np.ndarray  # int64, relative to lo
    boots: np.ndarray  # int64, relative to lo
    floors: np.ndarray  # int64 per stored frame, relative to lo
    actions: np.ndarray
    returns: np.ndarray
    discounts: np.ndarray
    priorities: np.ndarray  # collector's initial priorities of the transitions


def plan_segment(chunk: TransitionChunk, stack: int, n_step: int, gamma: float) -> PlannedSegment | None:
    """n-step targets via shared.chunk; None when no transition is complete in the chunk."""
    actions = np.asarray(chunk.actions)
    flags = np.asarray(chunk.flags)
    targets = nstep_targets(actions, np.asarray(chunk.rewards), flags, int(chunk.first_start), n_step, gamma)
    if targets.starts.size == 0:
        return None
    floors = stack_floors(flags)
    first = targets.starts[:1]
    missing = (first - (stack - 1) < 0) & (floors[first] == 0) & ((flags[0] & FLAG_FIRST) == 0)
    if missing[0]:
        raise ValueError(
            f"chunk transition at frame {int(first[0])} needs {stack - 1} history frames but the chunk has only "
            f"{int(first[0])} and frame 0 is not FIRST (context must reach back stack-1 frames or to the episode start)"
        )
    lo = int(stack_indices(first, floors[first], stack)[0, 0])
    hi = int(targets.bootstrap.max()) + 1
    return PlannedSegment(
        lo=lo, hi=hi,
        starts=targets.starts - lo, boots=targets.bootstrap - lo,
        floors=np.maximum(floors[lo:hi], lo) - lo,
        actions=actions[targets.starts], returns=targets.returns, discounts=targets.discounts,
        priorities=np.asarray(chunk.priorities)[targets.starts],
    )
