"""A batch of chunks validated and planned at once, exactly as replay/chunk_plan.py would one by one.

`validate_chunk` and `plan_segment` (replay/chunk_plan.py) handle one chunk with the general
code of shared/chunk.py; they define the semantics. `plan_batch` plans a whole batch with one
set of numpy calls per *batch* for the common chunk (no episode end among its transitions and
every step acted: the chunks shared.chunk's fast path takes). The small per-frame arrays of the
batch are concatenated once; the value checks are five whole-array reductions plus a walk, in
Python, over the few frames that carry a flag or no action; the n-step returns, starts and
bootstraps of all common chunks come from a few whole-batch operations. Per chunk there remain
the structural checks (attribute reads) and some integer arithmetic. The other chunks (episode
ends, missing actions, no complete transition, dtypes other than the batch's) go through
`plan_segment` one by one; a batch whose value checks fail is re-checked chunk by chunk, so
every culprit gets exactly the error it would get alone.

Chunk boundaries inside the concatenation: the one check on neighbouring frames (a FIRST frame
must follow a frame without an action) skips the first frame of each chunk, and every per-chunk
quantity (transition range, latest FIRST frame) is looked up inside its own chunk.

The plan lays the planned chunks end to end on a *tape* (positions 0, 1, ... over their stored
frames, in batch order). The writer maps a run of consecutively placed chunks onto the ring by
adding one offset, so writing a run is a handful of vectorized stores whatever its chunk count.

Cost model: a batch is followed by megabytes of frame copies, which evict the caches (and TLB),
so the next batch's planning starts cold. Each numpy call and each fresh temporary then costs
several times its warm price; hence few calls, and temporaries written in place.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

from replay.chunk_plan import (
    MAX_ABS_REWARD,
    ChunkArrays,
    PlannedSegment,
    check_structure,
    explain_bad_values,
    plan_segment,
    values_ok,
)
from shared.chunk import (
    FLAG_END,
    FLAG_FIRST,
    FLAG_TERMINATED,
    FLAG_TRUNCATED,
    NO_ACTION,
    TransitionChunk,
    window_returns,
)


def _structure(chunk: TransitionChunk, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
               max_frames: int) -> ChunkArrays:
    """`check_structure` with a fast path for the usual chunk (numpy arrays of consistent shapes and
    dtypes, integer frames): one expression of attribute reads. Anything else, valid or not, goes
    through `check_structure` itself, which names the problem."""
    frames, actions, rewards, flags, prio = chunk.frames, chunk.actions, chunk.rewards, chunk.flags, chunk.priorities
    first_start = chunk.first_start
    if (type(frames) is np.ndarray and type(actions) is np.ndarray and type(rewards) is np.ndarray
            and type(flags) is np.ndarray and type(prio) is np.ndarray and type(first_start) is int
            and frames.dtype == obs_dtype and obs_dtype.kind != "f" and frames.shape[1:] == obs_shape):
        num = frames.shape[0]
        shape = (num,)
        if (0 < num <= max_frames and 0 <= first_start <= num and actions.shape == shape and rewards.shape == shape
                and flags.shape == shape and prio.shape == shape and actions.dtype.kind in "iu"
                and flags.dtype.kind in "iu" and rewards.dtype.kind in "fiu" and prio.dtype.kind in "fiu"):
            return ChunkArrays(frames, actions, rewards, flags, prio, first_start)
    return check_structure(chunk, obs_shape, obs_dtype, max_frames)


@dataclass(frozen=True)
class BatchPlan:
    """The chunks of a batch that add transitions, end to end on a tape, in batch order.

    Planned chunk k stores its frames at tape positions [tape[k], tape[k+1]) and owns rows
    [rows[k], rows[k+1]) of the transition tables. Tape positions become ring slots by adding
    the offset of the run the writer places the chunk in.
    """

    index: list[int]  # batch position of each planned chunk
    frames: list[np.ndarray]  # its stored frames: chunk.frames[lo:hi] (the array itself if that is all of it)
    tape: list[int]  # len(index) + 1 cumulative stored-frame counts
    rows: list[int]  # len(index) + 1 cumulative transition counts
    starts: np.ndarray  # int64 [rows] tape position of each transition's state (its newest frame)
    boots: np.ndarray | None  # int64 [rows] tape position of its bootstrap frame; None: n after the start
    actions: np.ndarray  # integer [rows] (int64 when rare chunks are mixed in; the ring casts to int32)
    returns: np.ndarray  # float64 [rows], rounded to float32 when stored (as plan_segment rounds them)
    discounts: np.ndarray | np.float32  # float32 [rows], or one float32 that every row has
    priorities: np.ndarray  # float64 [rows] the collector's initial priorities
    floors: np.ndarray  # int32 [tape] tape position of each stored frame's stack floor
    seg_ends: np.ndarray  # int32 [tape] tape end of the chunk holding each position


def plan_batch(chunks: list[TransitionChunk], obs_shape: tuple[int, ...], obs_dtype: np.dtype, max_frames: int,
               stack: int, n_step: int, gamma: float) -> tuple[BatchPlan, list[ValueError | None]]:
    """Validate and plan every chunk as `validate_chunk` + `plan_segment` would, one by one.

    Returns the plan of the chunks that add transitions and, per chunk, the ValueError those two
    would have raised (None if the chunk is fine). Bit-identical to the per-chunk functions,
    including the float64 summation order of the n-step returns."""
    errors: list[ValueError | None] = [None] * len(chunks)
    arrays: list[ChunkArrays | None] = [None] * len(chunks)
    for i, chunk in enumerate(chunks):
        try:
            arrays[i] = _structure(chunk, obs_shape, obs_dtype, max_frames)
        except ValueError as exc:
            errors[i] = exc.with_traceback(None)
    batch, events, rare = _checked(chunks, arrays, errors)
    common = _common_chunks(batch, events, stack, n_step)
    slow: dict[int, PlannedSegment] = {}
    for i in sorted([i for i in batch.group if i not in common] + rare):
        try:
            plan = plan_segment(chunks[i], stack, n_step, gamma)
        except ValueError as exc:
            errors[i] = exc.with_traceback(None)
            continue
        if plan is not None:
            slow[i] = plan
    return _assemble(batch, arrays, common, slow, n_step, gamma), errors


def _checked(chunks: list[TransitionChunk], arrays: list[ChunkArrays | None],
             errors: list[ValueError | None]) -> tuple[_Concat, _Events, list[int]]:
    """Value checks of the structurally valid chunks: the concatenation of those checked together
    (and its events), and the valid chunks left to plan one by one. Bad chunks get their error."""
    group, rare = _dtype_group(arrays)
    rare = _valid_only(chunks, rare, arrays, errors)
    batch = _Concat(arrays, group)
    events = _scan(batch)
    if events is None:  # some chunk may be bad: check each alone, then scan the good ones again
        batch = _Concat(arrays, _valid_only(chunks, group, arrays, errors))
        events = _scan(batch)
        if events is None:  # valid chunks the (stricter) batch scan refuses: plan them one by one
            rare, batch, events = rare + batch.group, _Concat(arrays, []), _Events([], [], [])
    return batch, events, rare


def _dtype_group(arrays: list[ChunkArrays | None]) -> tuple[list[int], list[int]]:
    """The valid chunks whose small arrays have the first valid chunk's dtypes (concatenating them
    keeps every value exactly), and the other valid chunks (checked and planned one by one)."""
    key, group, others = None, [], []
    for i, a in enumerate(arrays):
        if a is None:
            continue
        k = (a.actions.dtype, a.rewards.dtype, a.flags.dtype, a.priorities.dtype)
        if key is None:
            key = k
        (group if k == key else others).append(i)
    return group, others


def _valid_only(chunks: list[TransitionChunk], indices: list[int], arrays: list[ChunkArrays | None],
                errors: list[ValueError | None]) -> list[int]:
    """The chunks among `indices` whose values pass `validate_chunk`'s checks; the others get its
    precise error."""
    good = []
    for i in indices:
        a = arrays[i]
        if values_ok(a.actions, a.rewards, a.flags, a.priorities):
            good.append(i)
            continue
        try:
            explain_bad_values(chunks[i], a.actions, a.flags)
        except ValueError as exc:
            errors[i] = exc.with_traceback(None)
    return good


class _Concat:
    """The small per-frame arrays of the chunks `group` (batch positions) end to end: chunk j of
    the group occupies [offsets[j], offsets[j] + nums[j])."""

    def __init__(self, arrays: list[ChunkArrays | None], group: list[int]) -> None:
        self.group = group
        self.nums: list[int] = []
        self.offsets: list[int] = []
        self.first_starts: list[int] = []
        if not group:
            self.actions = self.rewards = self.flags = self.priorities = np.zeros(0, dtype=np.int64)
            return
        _, actions, rewards, flags, priorities, first_starts = zip(*[arrays[i] for i in group], strict=True)
        self.first_starts = list(first_starts)
        self.nums = [a.size for a in actions]
        self.offsets = [0, *itertools.accumulate(self.nums)][:-1]
        if len(group) == 1:  # only read: the chunk's own arrays serve
            self.actions, self.rewards, self.flags, self.priorities = actions[0], rewards[0], flags[0], priorities[0]
        else:
            self.actions, self.rewards = np.concatenate(actions), np.concatenate(rewards)
            self.flags, self.priorities = np.concatenate(flags), np.concatenate(priorities)


@dataclass(frozen=True)
class _Events:
    """The few frames of a concatenation that matter for planning (sorted concatenation indices)."""

    idle: list[int]  # frames without an action
    ends: list[int]  # frames flagged TERMINATED or TRUNCATED
    firsts: list[int]  # frames flagged FIRST


# every flags value in [1, TERMINATED|TRUNCATED) has no unknown bit and at most one end bit
_FLAGS_LIMIT = FLAG_TERMINATED | FLAG_TRUNCATED


def _scan(batch: _Concat) -> _Events | None:
    """The value checks of the whole batch, or None when a chunk may be bad.

    A handful of whole-array reductions, then a walk over the few frames that carry a flag. The
    checks are at least as strict as `values_ok` on each chunk alone (never looser), so a batch
    that passes holds only valid chunks; one that fails is re-checked chunk by chunk. The one check
    on neighbouring frames (a FIRST frame must follow a frame without an action) is skipped at the
    first frame of each chunk: the frame before it belongs to another chunk."""
    if not batch.group:
        return _Events([], [], [])
    actions, flags, rewards, prio = batch.actions, batch.flags, batch.rewards, batch.priorities
    low, high = np.minimum.reduce, np.maximum.reduce  # arr.min() without its Python wrapper
    if not (
        low(actions) >= NO_ACTION
        and low(rewards) >= -MAX_ABS_REWARD  # NaN propagates through minimum/maximum and fails
        and high(rewards) <= MAX_ABS_REWARD
        and low(prio) >= 0
        and high(prio) < np.inf
    ):
        return None
    idle = (actions < 0).nonzero()[0].tolist()
    flagged = flags.astype(bool).nonzero()[0]
    if not flagged.size:
        return _Events(idle, [], [])
    idle_set, chunk_starts = set(idle), set(batch.offsets)
    ends, firsts = [], []
    for g, f in zip(flagged.tolist(), flags[flagged].tolist(), strict=True):
        if not 0 < f < _FLAGS_LIMIT:
            return None  # unknown bits, or both end bits
        if f & FLAG_END:
            if g in idle_set:
                return None  # the episode ends but no step was taken
            ends.append(g)
        if f & FLAG_FIRST:
            if g not in chunk_starts and g - 1 not in idle_set:
                return None  # a step would cross into a new episode
            firsts.append(g)
    return _Events(idle, ends, firsts)


def _common_chunks(batch: _Concat, events: _Events, stack: int, n: int) -> dict[int, tuple[int, int]]:
    """{batch position: (position in the concatenation, lo)} of the common chunks, in batch order.

    A common chunk has at least one transition, no episode end from first_start on and an action
    on every frame from first_start to the one before its newest: exactly the chunks
    shared.chunk's fast path takes. Its transitions start at first_start .. F-1-n, every window is
    full, and it stores frames [lo, F), lo being the oldest frame of the first transition's stack
    (plan_segment's lo). A chunk that lacks history frames is not common: plan_segment raises."""
    common = {}
    idle, ends, firsts = events.idle, events.ends, events.firsts
    for j, (i, o, num, fs) in enumerate(zip(batch.group, batch.offsets, batch.nums, batch.first_starts, strict=True)):
        start, newest = o + fs, o + num - 1
        if (num - n <= fs or bisect_left(idle, start) != bisect_left(idle, newest)
                or bisect_left(ends, start) != bisect_right(ends, newest)):
            continue
        k = bisect_right(firsts, start)  # the latest FIRST frame at or before the first start ...
        floor = firsts[k - 1] - o if k and firsts[k - 1] >= o else -1  # ... if it is in this chunk
        if floor < 0 and fs < stack - 1:
            continue  # history frames missing
        common[i] = (j, max(fs - (stack - 1), floor))
    return common


def _assemble(batch: _Concat, arrays: list[ChunkArrays | None], common: dict[int, tuple[int, int]],
              slow: dict[int, PlannedSegment], n: int, gamma: float) -> BatchPlan:
    """Lay the planned chunks on the tape in batch order and build the tables."""
    index = sorted([*common, *slow]) if slow else list(common)
    tape, frames, lengths, picked = [0], [], [], []
    for i in index:
        if i in common:
            j, lo = common[i]
            hi = batch.nums[j]
            # (first start in the concatenation, transitions, shift from concatenation to tape)
            picked.append((batch.offsets[j] + batch.first_starts[j], hi - n - batch.first_starts[j],
                           tape[-1] - lo - batch.offsets[j]))
        else:
            lo, hi = slow[i].lo, slow[i].hi
        whole = arrays[i].frames
        frames.append(whole if lo == 0 and hi == len(whole) else whole[lo:hi])
        lengths.append(hi - lo)
        tape.append(tape[-1] + hi - lo)
    seg_ends = np.array(tape[1:], dtype=np.int32).repeat(lengths)
    floors = np.array(tape[:-1], dtype=np.int32).repeat(lengths)  # a common chunk's floors: its first frame
    rows = _common_rows(batch, picked, n, gamma)
    if not slow:
        starts, actions, returns, discounts, priorities = rows
        counts = [count for _, count, _ in picked]
        return BatchPlan(index, frames, tape, [0, *itertools.accumulate(counts)], starts, None, actions,
                         returns, discounts, priorities, floors, seg_ends)
    row_bounds, table = _merge_rows(index, tape, common, slow, rows, [c for _, c, _ in picked], n, floors)
    return BatchPlan(index, frames, tape, row_bounds, *table, floors, seg_ends)


_Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.float32, np.ndarray]


def _common_rows(batch: _Concat, picked: list[tuple[int, int, int]], n: int, gamma: float) -> _Rows:
    """Transition rows of the common chunks, given per chunk (index of its first start in the
    concatenation, transition count, shift from concatenation to tape index): (tape starts,
    actions, float64 returns, their one float32 discount, float64 priorities).

    The returns are shared.chunk.window_returns over the whole concatenation (the float64 sums
    shared.chunk's per-chunk fast path takes, in its order), gathered at the transitions; windows
    that straddle two chunks are never gathered. They stay float64 here: storing them in the
    float32 ring rounds them exactly as that fast path's astype does.
    Every common chunk has gamma^n as its discount, multiplied in that same order.

    Temporaries are few and written in place: after the previous batch's frame copies every
    freshly touched cache line costs a memory access."""
    discount = 1.0
    for _ in range(n):
        discount = discount * gamma
    if not picked:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0), np.float32(discount), np.zeros(0)
    counts = [count for _, count, _ in picked]
    before = [0, *itertools.accumulate(counts)]
    # concatenation index of each transition's first frame: a ramp, restarted at each chunk's first start
    at = np.arange(before[-1], dtype=np.int64)
    at += np.array([first - b for (first, _, _), b in zip(picked, before, strict=False)]).repeat(counts)
    shifts = [shift for _, _, shift in picked]
    if min(shifts) != max(shifts):
        starts = at + np.array(shifts).repeat(counts)
    else:  # usually all 0: every chunk is common and stores all its frames, so the tape is the concatenation
        starts = at + shifts[0] if shifts[0] else at
    sums = window_returns(batch.rewards, n, gamma)  # every window [t, t + n) of the concatenation
    return starts, batch.actions[at], sums[at], np.float32(discount), batch.priorities[at].astype(np.float64)


def _merge_rows(index: list[int], tape: list[int], common: dict[int, tuple[int, int]],
                slow: dict[int, PlannedSegment], rows: _Rows, counts: list[int], n: int,
                floors: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """Interleave the common chunks' rows with the other chunks' plans in batch order (and write
    those chunks' stack floors into `floors`). Columns are cast to one dtype each first, as chunks of
    other dtypes may be among the others."""
    starts, actions, returns, discounts, priorities = rows
    pieces, bounds, row, c = [], [0], 0, 0
    for k, i in enumerate(index):
        t = tape[k]
        if i in common:
            s = slice(row, row + counts[c])
            pieces.append((starts[s], starts[s] + n, actions[s].astype(np.int64), returns[s],
                           np.full(counts[c], discounts, dtype=np.float32), priorities[s]))
            row, c = row + counts[c], c + 1
        else:
            p = slow[i]
            floors[t : tape[k + 1]] = p.floors + t
            pieces.append((p.starts + t, p.boots + t, p.actions.astype(np.int64), p.returns, p.discounts,
                           p.priorities.astype(np.float64)))
        bounds.append(bounds[-1] + len(pieces[-1][0]))
    return bounds, [np.concatenate(column) for column in zip(*pieces, strict=True)]
