"""ReplayBuffer.add_chunks (SegmentWriter.write_batch): exactly add_chunk, one chunk after the other.

Three buffers see the same chunk sequence: one through the writer's per-chunk algorithm as it
was before batching (`reference_write`: validate_chunk, plan_segment, one segment), one through
add_chunk, one through add_chunks in random batch sizes. After every step they must agree on
everything: the per-chunk results (transition counts, or the very same error messages), every
storage array bit for bit, the frames, the writer's counters and cursors, the published records,
and after draining the reader's tree leaves, count and segment starts. Chunks come from the
collector simulator (episodes ending mid-chunk by TERMINATED and TRUNCATED, FIRST frames,
NO_ACTION frames) plus bad chunks of every kind validate_chunk rejects, into small rings where
wraps and partial overwrites happen all the time.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.batch_plan import plan_batch
from replay.buffer import ReplayBuffer
from replay.chunk_plan import plan_segment, validate_chunk
from replay.writer import SegmentRecord, SegmentWriter
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
from tests.support.replay_streams import interleaved_chunks, make_streams, verify_row

SHAPE = (3, 8)


# ---------------------------------------------------------------------- the reference
def reference_write(w: SegmentWriter, chunk: TransitionChunk) -> int:
    """The per-chunk write as it was before batching: the semantics add_chunks must reproduce."""
    st = w.storage
    validate_chunk(chunk, st.obs_shape, st.obs_dtype, w.stack, w.max_chunk_frames)
    plan = plan_segment(chunk, w.stack, w.n_step, w.gamma)
    if plan is None:
        return 0
    cap, length = st.capacity, plan.hi - plan.lo
    retired_tail = -1
    if w.cursor + length > cap:
        retired_tail = w.cursor
        w.abs_cursor += cap - w.cursor
        w.cursor = 0
    r0, a0 = w.cursor, w.abs_cursor
    r1 = r0 + length
    w.claimed_end = a0 + length
    seg_end, live = st.seg_end, w.live_starts
    if retired_tail >= 0:
        w.frames_stored -= int(np.count_nonzero(seg_end[retired_tail:] >= 0))
        w.live_transitions -= int(np.count_nonzero(live[retired_tail:]))
        seg_end[retired_tail:] = -1
        live[retired_tail:] = False
    stale_end = max(int(seg_end[r1 - 1]), r1)
    w.frames_stored -= int(np.count_nonzero(seg_end[r0:stale_end] >= 0))
    w.live_transitions -= int(np.count_nonzero(live[r0:stale_end]))
    seg_end[r1:stale_end] = -1
    seg_end[r0:r1] = r1
    live[r0:stale_end] = False
    w.frames_stored += length
    st.write_frames(r0, np.asarray(chunk.frames)[plan.lo : plan.hi])
    starts = plan.starts + r0
    st.action[r0:r1] = NO_ACTION
    st.action[starts] = plan.actions
    st.ret[starts] = plan.returns
    st.disc[starts] = plan.discounts
    st.boot[starts] = plan.boots + r0
    st.floor[r0:r1] = plan.floors + r0
    leaves = np.zeros(length, dtype=np.float64)
    if w.prioritized:
        leaves[plan.starts] = (plan.priorities.astype(np.float64) + w.priority_eps) ** w.alpha
    else:
        leaves[plan.starts] = 1.0
    w.records.append(SegmentRecord(r0, a0, leaves, retired_tail, stale_end))
    w.cursor, w.abs_cursor = r1, a0 + length
    live[starts] = True
    w.live_transitions += int(starts.size)
    w.transitions_added += int(starts.size)
    return int(starts.size)


def outcome(call) -> int | str:
    try:
        return call()
    except ValueError as exc:
        return f"ValueError: {exc}"


def as_outcome(result: int | ValueError) -> int | str:
    return f"ValueError: {result}" if isinstance(result, ValueError) else result


def assert_same(ref: ReplayBuffer, *others: ReplayBuffer) -> None:
    """Storage, frames, writer state and pending records bit for bit; then the drained trees."""
    for b in others:
        for name, x in ref.storage.metadata_arrays().items():
            y = b.storage.metadata_arrays()[name]
            assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8)), name
        assert torch.equal(ref.storage.frames, b.storage.frames)
        wa, wb = ref._writer, b._writer
        for name in ("cursor", "abs_cursor", "claimed_end", "transitions_added", "frames_stored", "live_transitions"):
            assert getattr(wa, name) == getattr(wb, name), name
        assert np.array_equal(wa.live_starts, wb.live_starts)
        assert len(wa.records) == len(wb.records)
        for ra, rb in zip(wa.records, wb.records, strict=True):
            assert (ra.ring_start, ra.abs_start, ra.retired_tail, ra.stale_end) == (
                rb.ring_start, rb.abs_start, rb.retired_tail, rb.stale_end)
            assert ra.leaves.dtype == rb.leaves.dtype and np.array_equal(ra.leaves, rb.leaves)
    for buf in (ref, *others):
        buf._reader.drain()
    for b in others:
        assert np.array_equal(ref._reader.tree.leaves(), b._reader.tree.leaves())
        assert np.array_equal(ref._reader.tree.nodes, b._reader.tree.nodes)
        assert ref._reader.count == b._reader.count == len(ref) == len(b)
        assert np.array_equal(ref._reader.seg_abs, b._reader.seg_abs)


def make_buffer(capacity: int, stack: int, n: int, prioritized: bool, max_frames: int, reference: bool = False,
                shape: tuple[int, ...] = SHAPE, dtype=np.uint8) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, shape, dtype, stack, n, 0.9, prioritized=prioritized, alpha=0.7,
                       priority_eps=1e-3, max_chunk_frames=max_frames, seed=0)
    if reference:
        buf.add_chunk = lambda chunk: reference_write(buf._writer, chunk)
    return buf


# ---------------------------------------------------------------------- bad chunks
def _with(chunk: TransitionChunk, **changes) -> TransitionChunk:
    return dataclasses.replace(chunk, **changes)


def _set(arr: np.ndarray, index: int, value) -> np.ndarray:
    out = arr.copy()
    out[index] = value
    return out


def _tiled(chunk: TransitionChunk, times: int) -> TransitionChunk:
    return TransitionChunk(chunk.stream, chunk.first_start, np.concatenate([chunk.frames] * times),
                           *(np.tile(getattr(chunk, f), times) for f in ("actions", "rewards", "flags", "priorities")))


def _acting_frame(chunk: TransitionChunk) -> int:
    """A frame > 0 whose predecessor acted (for a FIRST flag that would cross episodes), else -1."""
    acted = np.flatnonzero(chunk.actions[:-1] != NO_ACTION) + 1
    return int(acted[0]) if acted.size else -1


# (name, mutation, expected message) -- every ValueError validate_chunk and plan_segment raise
BAD = [
    ("frames shape", lambda c: _with(c, frames=c.frames[:, :2]), "frames have shape"),
    ("no frames", lambda c: TransitionChunk(0, 0, c.frames[:0], *(getattr(c, f)[:0] for f in
                                            ("actions", "rewards", "flags", "priorities"))), "frames have shape"),
    ("frames dtype", lambda c: _with(c, frames=c.frames.astype(np.int16)), "frames have dtype"),
    ("too many frames", lambda c: _tiled(c, 40), "max_chunk_frames"),
    ("actions shape", lambda c: _with(c, actions=c.actions[:-1]), "actions has shape"),
    ("actions dtype", lambda c: _with(c, actions=c.actions.astype(np.float32)), "actions has dtype"),
    ("rewards dtype", lambda c: _with(c, rewards=c.rewards > 0), "rewards has dtype"),
    ("flags shape", lambda c: _with(c, flags=c.flags[:, None]), "flags has shape"),
    ("priorities shape", lambda c: _with(c, priorities=c.priorities[1:]), "priorities has shape"),
    ("first_start", lambda c: _with(c, first_start=c.num_frames + 1), "first_start"),
    ("negative action", lambda c: _with(c, actions=_set(c.actions, 0, -3)), "is negative but not NO_ACTION"),
    ("unknown flag", lambda c: _with(c, flags=_set(c.flags, 0, c.flags[0] | 8)), "bits outside"),
    ("both ends", lambda c: _with(c, flags=_set(c.flags, 0, FLAG_TERMINATED | FLAG_TRUNCATED),
                                  actions=_set(c.actions, 0, 1)), "both TERMINATED and TRUNCATED"),
    ("end without action", lambda c: _with(c, flags=_set(c.flags, -1, FLAG_TERMINATED)), "no step was taken"),
    ("FIRST after a step", lambda c: _with(c, flags=_set(c.flags, _acting_frame(c), FLAG_FIRST)),
     "cross into a new episode"),
    ("NaN reward", lambda c: _with(c, rewards=_set(c.rewards, 0, np.nan)), r"rewards\[0\]=nan is not finite"),
    ("inf reward", lambda c: _with(c, rewards=_set(c.rewards, -1, np.inf)), "is not finite"),
    ("huge reward", lambda c: _with(c, rewards=_set(c.rewards, 0, -1e31)), "is invalid: allowed"),
    ("NaN priority", lambda c: _with(c, priorities=_set(c.priorities, 0, np.nan)), r"priorities\[0\]=nan"),
    ("inf priority", lambda c: _with(c, priorities=_set(c.priorities, 0, np.inf)), "is not finite"),
    ("negative priority", lambda c: _with(c, priorities=_set(c.priorities, -1, -0.5)), "is negative"),
    ("missing history", lambda c: _with(c, first_start=0, flags=np.zeros_like(c.flags),
                                        actions=np.maximum(c.actions, 0)), "history frames"),
]


def random_chunk(rng: np.random.Generator, stream: int = 0, max_frames: int = 14) -> TransitionChunk:
    """Any valid chunk, not only what the simulated collector cuts: context reaching back into an
    earlier episode, frames without an action and no episode end, an episode end on the newest
    frame, FIRST frames anywhere, any first_start."""
    num = int(rng.integers(1, max_frames + 1))
    actions = rng.integers(0, 4, num).astype(np.int32)
    actions[rng.random(num) < 0.1] = NO_ACTION
    flags = np.zeros(num, np.uint8)
    ends = (rng.random(num) < 0.1) & (actions != NO_ACTION)
    flags[ends] = np.where(rng.random(num) < 0.5, FLAG_TERMINATED, FLAG_TRUNCATED)[ends]
    for j in np.flatnonzero(rng.random(num) < 0.15):
        if j > 0:  # a new episode: the frame before it takes no step (so it cannot end one either)
            actions[j - 1] = NO_ACTION
            flags[j - 1] = flags[j - 1] & FLAG_FIRST
        flags[j] |= FLAG_FIRST
    frames = rng.integers(0, 256, size=(num, *SHAPE), dtype=np.uint8)
    return TransitionChunk(stream, int(rng.integers(0, num + 1)), frames, actions,
                           rng.normal(size=num).astype(np.float32), flags, rng.random(num).astype(np.float32))


def common_chunk(rng: np.random.Generator, stack: int, n: int, first: bool) -> TransitionChunk:
    """The usual chunk of a long episode: stack-1 context frames, new frames, no episode end."""
    num = stack - 1 + int(rng.integers(1, 10)) + n
    actions = rng.integers(0, 4, num).astype(np.int32)
    actions[-1] = NO_ACTION
    flags = np.zeros(num, np.uint8)
    flags[0] = FLAG_FIRST if first else 0
    frames = rng.integers(0, 256, size=(num, *SHAPE), dtype=np.uint8)
    rewards = rng.normal(size=num).astype(np.float32)
    rewards[rng.random(num) < 0.3] = -0.0  # a return of -0.0 + ... must keep the reference's sign bits
    return TransitionChunk(0, stack - 1, frames, actions, rewards, flags, rng.random(num).astype(np.float32))


def good_chunks(seed: int, stack: int, n: int, max_new: int = 8) -> list[TransitionChunk]:
    rng = np.random.default_rng(seed)
    streams = make_streams(3, SHAPE, rng, episodes=4, max_len=12)
    return [c for c, _ in interleaved_chunks(streams, stack, n, rng, max_new=max_new)]


# ---------------------------------------------------------------------- equivalence
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    streams=st.integers(1, 4),
    stack=st.integers(1, 4),
    n=st.integers(1, 4),
    capacity=st.sampled_from([24, 40, 64, 100, 5000]),
    max_new=st.integers(1, 16),
    max_frames=st.sampled_from([12, 32]),
    prioritized=st.booleans(),
    bad_rate=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
)
def test_batches_match_one_by_one_and_the_reference(seed, streams, stack, n, capacity, max_new, max_frames,
                                                    prioritized, bad_rate) -> None:
    rng = np.random.default_rng(seed)
    sims = make_streams(streams, SHAPE, rng, episodes=4, max_len=10)
    chunks = [c for c, _ in interleaved_chunks(sims, stack, n, rng, max_new=max_new)]
    for i in np.flatnonzero(rng.random(len(chunks)) < bad_rate):
        _, mutate, _ = BAD[int(rng.integers(len(BAD)))]
        chunks[i] = mutate(chunks[i])
    ref = make_buffer(capacity, stack, n, prioritized, max_frames, reference=True)
    one = make_buffer(capacity, stack, n, prioritized, max_frames)
    many = make_buffer(capacity, stack, n, prioritized, max_frames)
    pos = 0
    while pos < len(chunks):
        batch = chunks[pos : pos + int(rng.integers(1, 12))]
        pos += len(batch)
        want = [outcome(lambda c=c: ref.add_chunk(c)) for c in batch]
        assert [outcome(lambda c=c: one.add_chunk(c)) for c in batch] == want
        assert [as_outcome(r) for r in many.add_chunks(batch)] == want
        assert_same(ref, one, many)
    many.check_valid()
    if len(many):
        b = many.sample(16, beta=0.5)
        assert torch.isfinite(b.weights).all() and float(b.weights.max()) == 1.0
    if len(many) and bad_rate == 0:  # a bad chunk may also be mutated into a valid one the simulator did not send
        by_id = {s.stream: s for s in sims}
        for r in range(16):
            verify_row(by_id, b.obs[r].numpy(), b.next_obs[r].numpy(), int(b.actions[r]), float(b.returns[r]),
                       float(b.discounts[r]), stack, n, 0.9)


@pytest.mark.parametrize("prioritized", [True, False])
def test_long_random_sequence_with_wraps_and_partial_overwrites(prioritized: bool) -> None:
    rng = np.random.default_rng(17)
    sims = make_streams(4, SHAPE, rng, episodes=30, max_len=25)
    chunks = [c for c, _ in interleaved_chunks(sims, 4, 3, rng, max_new=14)]
    ref = make_buffer(90, 4, 3, prioritized, 32, reference=True)
    many = make_buffer(90, 4, 3, prioritized, 32)
    pos, jumps = 0, 0
    while pos < len(chunks):
        batch = chunks[pos : pos + int(rng.integers(1, 20))]
        pos += len(batch)
        want = [outcome(lambda c=c: ref.add_chunk(c)) for c in batch]
        assert [as_outcome(r) for r in many.add_chunks(batch)] == want
        jumps += sum(rec.retired_tail >= 0 for rec in many._writer.records)
        assert_same(ref, many)
        indices, td = many.sample(8).indices, rng.random(8) * 3
        many.update_priorities(indices, td)
        ref.update_priorities(indices, td)  # the same state, so the same rows are current in both
    many.check_valid()
    assert jumps > 5 and many._writer.abs_cursor > 20 * 90


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), stack=st.integers(1, 4), n=st.integers(1, 4),
       capacity=st.sampled_from([16, 30, 64, 1000]), prioritized=st.booleans())
def test_arbitrary_valid_chunks_match_one_by_one(seed, stack, n, capacity, prioritized) -> None:
    rng = np.random.default_rng(seed)
    chunks = [random_chunk(rng, stream=k % 3) if rng.random() < 0.6 else common_chunk(rng, stack, n, rng.random() < 0.3)
              for k in range(40)]
    plan, errors = plan_batch(chunks, SHAPE, np.dtype(np.uint8), 14, stack, n, 0.9)
    def check_alone(c: TransitionChunk) -> int:
        validate_chunk(c, SHAPE, np.dtype(np.uint8), stack, 14)
        plan_segment(c, stack, n, 0.9)
        return 0

    for i, c in enumerate(chunks):  # the plan's errors are the per-chunk ones
        assert (f"ValueError: {errors[i]}" if errors[i] is not None else 0) == outcome(lambda c=c: check_alone(c))
    ref = make_buffer(capacity, stack, n, prioritized, 14, reference=True)
    many = make_buffer(capacity, stack, n, prioritized, 14)
    pos = 0
    while pos < len(chunks):
        batch = chunks[pos : pos + int(rng.integers(1, 10))]
        pos += len(batch)
        assert [as_outcome(r) for r in many.add_chunks(batch)] == [outcome(lambda c=c: ref.add_chunk(c))
                                                                    for c in batch]
        assert_same(ref, many)
    many.check_valid()


def test_common_chunks_take_the_vectorized_path(monkeypatch) -> None:
    """Chunks without an episode end in their transitions never reach the per-chunk planner, also when
    one chunk ends acting and the next begins an episode (no step crosses between two chunks)."""
    import replay.batch_plan as batch_plan

    rng = np.random.default_rng(2)
    chunks = [common_chunk(rng, 4, 3, first=k % 5 == 0) for k in range(30)]
    for k in range(1, 29, 4):  # newest frame acting, next chunk FIRST
        chunks[k] = _with(chunks[k], actions=_set(chunks[k].actions, -1, 2))
        chunks[k + 1] = _with(chunks[k + 1], flags=_set(chunks[k + 1].flags, 0, FLAG_FIRST))
    ref = make_buffer(200, 4, 3, True, 32, reference=True)
    want = [ref.add_chunk(c) for c in chunks]
    monkeypatch.setattr(batch_plan, "plan_segment", lambda *a: pytest.fail("common chunk planned alone"))
    monkeypatch.setattr(batch_plan, "values_ok", lambda *a: pytest.fail("batch re-checked chunk by chunk"))
    many = make_buffer(200, 4, 3, True, 32)
    assert many.add_chunks(chunks[:16]) + many.add_chunks(chunks[16:]) == want
    assert_same(ref, many)


def test_every_bad_chunk_in_a_batch_gets_the_message_add_chunk_gives() -> None:
    chunks = [c for c in good_chunks(3, 3, 2) if c.num_frames >= 4][:30]
    for k, (name, mutate, match) in enumerate(BAD):
        batch = list(chunks)
        bad_at = [2 + k % 5, 9, len(batch) - 1]
        for i in bad_at:
            batch[i] = mutate(batch[i])
        ref = make_buffer(64, 3, 2, True, 32, reference=True)
        one = make_buffer(64, 3, 2, True, 32)
        many = make_buffer(64, 3, 2, True, 32)
        want = [outcome(lambda c=c, b=ref: b.add_chunk(c)) for c in batch]
        assert [outcome(lambda c=c, b=one: b.add_chunk(c)) for c in batch] == want, name
        got = many.add_chunks(batch)
        assert [as_outcome(r) for r in got] == want, name
        for i in bad_at:
            assert isinstance(got[i], ValueError), (name, i)
            assert pytest.raises(ValueError, many.add_chunk, batch[i]).match(match)
        assert sum(isinstance(r, ValueError) for r in got) == len(bad_at), name
        assert_same(ref, one, many)


def test_chunks_of_other_dtypes_and_float_frames() -> None:
    chunks = good_chunks(5, 4, 3)
    mixed = []
    for i, c in enumerate(chunks):
        if i % 3 == 1:  # int64 actions and float64 rewards/priorities: checked and planned alone
            c = _with(c, actions=c.actions.astype(np.int64), rewards=c.rewards.astype(np.float64),
                      priorities=c.priorities.astype(np.float64))
        if i % 7 == 2:
            c = _with(c, flags=c.flags.astype(np.int8))
        if i % 4 == 3:  # bad values in chunks of both kinds
            c = _with(c, priorities=_set(c.priorities, 0, -1.0) if i % 8 == 3 else _set(c.priorities, 0, np.nan))
        mixed.append(c)
    ref = make_buffer(150, 4, 3, True, 32, reference=True)
    many = make_buffer(150, 4, 3, True, 32)
    errors = 0
    for pos in range(0, len(mixed), 6):
        batch = mixed[pos : pos + 6]
        got = [as_outcome(r) for r in many.add_chunks(batch)]
        assert got == [outcome(lambda c=c: ref.add_chunk(c)) for c in batch]
        errors += sum(isinstance(r, str) for r in got)
        assert_same(ref, many)
    assert errors >= len(mixed) // 4
    # a whole batch of integer rewards and int8 flags goes the vectorized way (one dtype key)
    ints = [_with(c, rewards=np.round(c.rewards * 3).astype(np.int16), flags=c.flags.astype(np.int8))
            for c in chunks]
    ref = make_buffer(150, 4, 3, False, 32, reference=True)
    many = make_buffer(150, 4, 3, False, 32)
    for pos in range(0, len(ints), 7):
        batch = ints[pos : pos + 7]
        assert many.add_chunks(batch) == [ref.add_chunk(c) for c in batch]
        assert_same(ref, many)
    # flags the batch scan is stricter about (256 has no bit validate_chunk looks at): planned alone
    odd = [_with(c, flags=_set(c.flags.astype(np.int32), 0, 256 | int(c.flags[0])) if k % 3 == 0 else c.flags.astype(np.int32))
           for k, c in enumerate(chunks)]
    ref = make_buffer(150, 4, 3, True, 32, reference=True)
    many = make_buffer(150, 4, 3, True, 32)
    for pos in range(0, len(odd), 5):
        batch = odd[pos : pos + 5]
        assert [as_outcome(r) for r in many.add_chunks(batch)] == [outcome(lambda c=c: ref.add_chunk(c))
                                                                    for c in batch]
        assert_same(ref, many)
    # float frames: finiteness is checked per chunk
    frames = [np.arange(12, dtype=np.float32).reshape(4, 3) + k for k in range(6)]
    frames[3][2, 1] = np.nan
    fl = [TransitionChunk(0, 0, f, np.array([0, 1, 0, NO_ACTION], np.int32), np.ones(4, np.float32),
                          np.array([FLAG_FIRST, 0, 0, 0], np.uint8), np.ones(4, np.float32)) for f in frames]
    ref = make_buffer(64, 1, 1, True, 32, reference=True, shape=(3,), dtype=np.float32)
    many = make_buffer(64, 1, 1, True, 32, shape=(3,), dtype=np.float32)
    got = many.add_chunks(fl)
    assert [as_outcome(r) for r in got] == [outcome(lambda c=c: ref.add_chunk(c)) for c in fl]
    assert "frames[2] has a NaN" in str(got[3]) and got[:3] == [3, 3, 3]
    assert_same(ref, many)


def test_a_first_frame_after_a_chunk_that_ends_acting_is_no_crossing() -> None:
    """The neighbour check must not pair one chunk's newest frame with the next chunk's first one."""
    def chunk(first_flag: int, last_action: int, t0: int) -> TransitionChunk:
        frames = np.stack([np.full(SHAPE, t0 + t, np.uint8) for t in range(6)])
        return TransitionChunk(0, 0, frames, np.array([1, 2, 0, 1, 2, last_action], np.int32),
                               np.arange(6, dtype=np.float32), np.array([first_flag, 0, 0, 0, 0, 0], np.uint8),
                               np.ones(6, np.float32))
    batch = [chunk(FLAG_FIRST, 3, 0), chunk(FLAG_FIRST, 1, 10), chunk(FLAG_FIRST, NO_ACTION, 20)]
    ref = make_buffer(64, 2, 2, True, 32, reference=True)
    many = make_buffer(64, 2, 2, True, 32)
    assert many.add_chunks(batch) == [ref.add_chunk(c) for c in batch] == [4, 4, 4]
    assert_same(ref, many)


def test_plan_batch_matches_plan_segment_chunk_by_chunk() -> None:
    """The vectorized plan itself, against plan_segment (the n-step returns bit for bit)."""
    for seed in range(12):
        stack, n = 1 + seed % 4, 1 + seed % 3
        rng = np.random.default_rng(seed)
        chunks = (good_chunks(seed, stack, n, max_new=10) if seed < 8
                  else [common_chunk(rng, stack, n, first=k == 0) for k in range(9)])
        plan, errors = plan_batch(chunks, SHAPE, np.dtype(np.uint8), 4096, stack, n, 0.97)
        refs = [plan_segment(c, stack, n, 0.97) for c in chunks]
        assert errors == [None] * len(chunks)
        assert plan.index == [i for i, r in enumerate(refs) if r is not None]
        for k, i in enumerate(plan.index):
            r, t0, t1 = refs[i], plan.tape[k], plan.tape[k + 1]
            rows = slice(plan.rows[k], plan.rows[k + 1])
            boots = plan.starts[rows] + n if plan.boots is None else plan.boots[rows]
            assert t1 - t0 == r.hi - r.lo
            assert np.array_equal(plan.frames[k], chunks[i].frames[r.lo : r.hi])
            assert np.array_equal(plan.starts[rows] - t0, r.starts) and np.array_equal(boots - t0, r.boots)
            assert np.array_equal(plan.floors[t0:t1] - t0, r.floors)
            assert np.array_equal(plan.seg_ends[t0:t1], np.full(t1 - t0, t1))
            assert np.array_equal(plan.actions[rows], r.actions)
            assert np.array_equal(plan.returns[rows].astype(np.float32).view(np.uint32), r.returns.view(np.uint32))
            discounts = plan.discounts[rows] if plan.discounts.ndim else np.full(r.discounts.size, plan.discounts)
            assert np.array_equal(discounts, r.discounts)
            assert np.array_equal(plan.priorities[rows], r.priorities.astype(np.float64))


def test_a_failed_copy_mid_batch_publishes_its_run_dead(monkeypatch) -> None:
    chunks = [c for c in good_chunks(9, 4, 3) if c.num_frames > 6]
    buf = make_buffer(60, 4, 3, True, 32)  # small: the failing run overwrites live segments
    pos = 0
    while buf._writer.abs_cursor < 90:
        assert all(isinstance(r, int) for r in buf.add_chunks(chunks[pos : pos + 2]))
        pos += 2
    buf.sync()
    added_before = buf.transitions_added
    real, calls = buf.storage.write_frames, []

    def broken(ring_start, frames):
        calls.append(ring_start)
        if len(calls) == 2:
            real(ring_start, frames[: len(frames) // 2])
            raise OSError("device copy failed")
        real(ring_start, frames)

    monkeypatch.setattr(buf.storage, "write_frames", broken)
    with pytest.raises(OSError):
        buf.add_chunks(chunks[pos : pos + 3])
    monkeypatch.setattr(buf.storage, "write_frames", real)
    records = list(buf._writer.records)
    dead = [r for r in records if not r.leaves.any()]
    assert dead and records[-len(dead) :] == dead  # the failed run, published last, all of it dead
    r0, r1 = dead[0].ring_start, dead[-1].ring_start + dead[-1].length
    assert r1 == buf._writer.cursor and buf._writer.claimed_end == buf._writer.abs_cursor
    assert (buf.storage.action[r0:r1] == NO_ACTION).all() and (buf.storage.seg_end[r0:r1] == -1).all()
    assert not buf._writer.live_starts[r0:r1].any()
    assert buf.transitions_added == added_before + sum(int((r.leaves > 0).sum()) for r in records[: -len(dead)])
    buf.check_valid()  # drains: the reader dropped whatever the failed run overwrote
    assert not buf._reader.tree.leaves(slice(r0, r1)).any()
    assert all(isinstance(r, int) for r in buf.add_chunks(chunks[pos + 3 :]))
    buf.check_valid()
    assert len(buf) and buf.sample(8).obs.shape[0] == 8


def test_an_empty_batch_and_a_batch_without_transitions() -> None:
    buf = make_buffer(64, 4, 3, True, 32)
    assert buf.add_chunks([]) == []
    nothing = TransitionChunk(0, 0, np.zeros((2, *SHAPE), np.uint8), np.array([0, NO_ACTION], np.int32),
                              np.ones(2, np.float32), np.array([FLAG_FIRST, 0], np.uint8), np.ones(2, np.float32))
    assert buf.add_chunks([nothing, nothing]) == [0, 0]
    assert len(buf) == 0 and buf.frames_stored == 0 and not buf._writer.records
