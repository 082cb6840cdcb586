"""The writer side: validate a chunk, place it as one segment, copy it, publish it.

Concurrency protocol (no lock on the hot path). The writer is one thread and
owns the cursor; the reader is one thread and owns the sum-tree. They share:

1. ``claimed_end`` -- absolute frame position (monotonic; ring slot = position % capacity)
   up to which the writer may be writing. It is raised *before* any byte of the new segment
   (frames or metadata) is touched. A reader that gathered a row and then re-reads
   ``claimed_end`` knows the row's segment was untouched during its gather iff
   ``segment_abs_start + capacity >= claimed_end``.
2. ``records`` -- a ``collections.deque`` of `SegmentRecord` appended only *after* the copy
   finished (after a CUDA stream sync on GPU storage). The reader learns of a segment only
   from its record, so it can never sample a half-written segment. ``append``/``popleft``
   are atomic under the GIL, which also orders the writes before the append.

A segment never wraps: if it does not fit before the end of the ring, the cursor jumps to
slot 0 and the tail is retired (the record says so). The absolute position jumps with it to
the next multiple of capacity, keeping ``slot == position % capacity``.

Only the frames actually needed are stored: from the oldest stack frame of the first
complete transition to the last bootstrap frame. Context and lookahead frames beyond that
are re-sent by the collector in its next chunk anyway.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from replay.storage import FrameStorage
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

_ALL_FLAGS = FLAG_FIRST | FLAG_TERMINATED | FLAG_TRUNCATED
# the flag bits no frame may carry, as uint8: numpy 2 refuses `uint8_array & -8` (a negative Python int)
_UNKNOWN_FLAGS = np.uint8(0xFF & ~_ALL_FLAGS)
# |reward| the replay stores. n-step returns are summed in float64 and stored as float32: any n below
# 3e8 keeps sum_k gamma^k r_k (gamma <= 1) under float32's 3.4e38, so returns, TD errors and priorities
# stay finite. The head's protocol bound (env.max_abs_reward, default 1e6) is far tighter; this is the
# replay's own last line for chunks that reach it some other way.
MAX_ABS_REWARD = 1e30


@dataclass(frozen=True)
class SegmentRecord:
    """What the reader applies to its tree once a segment's copy is complete."""

    ring_start: int  # first slot of the new segment
    abs_start: int  # its absolute position (ring_start == abs_start % capacity)
    leaves: np.ndarray  # float64 [length] sampling mass per slot (0 where no transition starts)
    retired_tail: int  # slots [retired_tail, capacity) are retired (the cursor jumped); -1 if not
    stale_end: int  # slots [ring_start + length, stale_end) held the rest of a partly overwritten segment

    @property
    def length(self) -> int:
        return int(len(self.leaves))


def validate_chunk(chunk: TransitionChunk, obs_shape: tuple[int, ...], obs_dtype: np.dtype, stack: int,
                   max_frames: int) -> None:
    """Raise ValueError naming the first inconsistency between the chunk's arrays or a value the
    learner cannot use (non-finite float observations, rewards beyond MAX_ABS_REWARD)."""
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
    for name, arr, kinds in (("actions", chunk.actions, "iu"), ("rewards", chunk.rewards, "fiu"),
                             ("flags", chunk.flags, "iu"), ("priorities", chunk.priorities, "fiu")):
        a = np.asarray(arr)
        if a.shape != (num,):
            raise ValueError(f"chunk {name} has shape {a.shape}; expected ({num},) to match its {num} frames")
        if a.dtype.kind not in kinds:
            raise ValueError(f"chunk {name} has dtype {a.dtype}; expected a {'float' if 'f' in kinds else 'integer'} type")
    if not 0 <= int(chunk.first_start) <= num:
        raise ValueError(f"chunk first_start={chunk.first_start} outside [0, {num}]")
    actions = np.asarray(chunk.actions)
    flags = np.asarray(chunk.flags)
    # fast path (the writer's hot loop): a handful of whole-array reductions; details only on failure
    end = flags & FLAG_END
    rewards, prio = np.asarray(chunk.rewards), np.asarray(chunk.priorities)
    if (
        actions.min() >= NO_ACTION
        and not (flags & _UNKNOWN_FLAGS).any()
        and not (end == FLAG_END).any()
        and not ((end != 0) & (actions == NO_ACTION)).any()
        and not (((flags[1:] & FLAG_FIRST) != 0) & (actions[:-1] != NO_ACTION)).any()
        and (np.abs(rewards) <= MAX_ABS_REWARD).all()  # NaN compares False: non-finite fails here too
        and np.isfinite(prio).all()
        and prio.min() >= 0
    ):
        return
    _explain_bad_values(chunk, actions, flags)


def _explain_bad_values(chunk: TransitionChunk, actions: np.ndarray, flags: np.ndarray) -> None:
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


class SegmentWriter:
    """Owns the write cursor; call `write` from exactly one thread."""

    def __init__(self, storage: FrameStorage, stack: int, n_step: int, gamma: float, prioritized: bool,
                 alpha: float, priority_eps: float, max_chunk_frames: int) -> None:
        self.storage = storage
        self.stack, self.n_step, self.gamma = int(stack), int(n_step), float(gamma)
        self.prioritized, self.alpha, self.priority_eps = bool(prioritized), float(alpha), float(priority_eps)
        self.max_chunk_frames = int(min(max_chunk_frames, storage.capacity))
        self.records: collections.deque[SegmentRecord] = collections.deque()
        self.cursor = 0  # ring slot of the next segment
        self.abs_cursor = 0  # its absolute position
        self.claimed_end = 0  # published before each copy (read by the reader)
        self.transitions_added = 0
        self.frames_stored = 0
        # writer-only mirror of "slot starts a live transition": lets len() be answered from any
        # thread without draining (the reader's tree says the same once it has drained)
        self.live_starts = np.zeros(storage.capacity, dtype=bool)
        self.live_transitions = 0

    def write(self, chunk: TransitionChunk) -> int:
        st = self.storage
        validate_chunk(chunk, st.obs_shape, st.obs_dtype, self.stack, self.max_chunk_frames)
        plan = plan_segment(chunk, self.stack, self.n_step, self.gamma)
        if plan is None:
            return 0
        cap, length = st.capacity, plan.hi - plan.lo
        retired_tail = -1
        if self.cursor + length > cap:
            retired_tail = self.cursor
            self.abs_cursor += cap - self.cursor
            self.cursor = 0
        r0, a0 = self.cursor, self.abs_cursor
        r1 = r0 + length
        self.claimed_end = a0 + length  # publish the claim BEFORE touching the range

        # writer-side bookkeeping of live slots (which old segment the new one cuts into)
        seg_end = st.seg_end
        live = self.live_starts
        if retired_tail >= 0:
            self.frames_stored -= int(np.count_nonzero(seg_end[retired_tail:] >= 0))
            self.live_transitions -= int(np.count_nonzero(live[retired_tail:]))
            seg_end[retired_tail:] = -1
            live[retired_tail:] = False
        stale_end = int(seg_end[r1 - 1])  # end of the old segment under our last slot (-1: none)
        stale_end = stale_end if stale_end > r1 else r1
        self.frames_stored -= int(np.count_nonzero(seg_end[r0:stale_end] >= 0))
        self.live_transitions -= int(np.count_nonzero(live[r0:stale_end]))
        seg_end[r1:stale_end] = -1
        seg_end[r0:r1] = r1
        live[r0:stale_end] = False
        self.frames_stored += length

        try:
            st.write_frames(r0, np.asarray(chunk.frames)[plan.lo : plan.hi])
            starts = plan.starts + r0
            st.action[r0:r1] = NO_ACTION
            st.action[starts] = plan.actions
            st.ret[starts] = plan.returns
            st.disc[starts] = plan.discounts
            st.boot[starts] = plan.boots + r0
            st.floor[r0:r1] = plan.floors + r0
            leaves = np.zeros(length, dtype=np.float64)
            if self.prioritized:
                leaves[plan.starts] = (plan.priorities.astype(np.float64) + self.priority_eps) ** self.alpha
            else:
                leaves[plan.starts] = 1.0
        except BaseException:
            # the range is claimed and partly written: publish it as dead so nothing is sampled
            # from it, and move on (claimed_end stays monotonic, the cursor matches it)
            st.action[r0:r1] = NO_ACTION
            seg_end[r0:r1] = -1
            self.frames_stored -= length
            self.records.append(SegmentRecord(r0, a0, np.zeros(length), retired_tail, stale_end))
            self.cursor, self.abs_cursor = r1, a0 + length
            raise
        self.records.append(SegmentRecord(r0, a0, leaves, retired_tail, stale_end))  # publication
        self.cursor, self.abs_cursor = r1, a0 + length
        added = int(plan.starts.size)
        live[plan.starts + r0] = True
        self.live_transitions += added
        self.transitions_added += added
        return added
