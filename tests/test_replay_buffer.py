"""Content tests of ReplayBuffer with counting frames: stacks, n-step targets, wrap-around, streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from replay.buffer import ReplayBuffer, ReplayInvariantError
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
from shared.config import Config, ReplayConfig
from tests.support.replay_streams import (
    check_frame,
    complete_transitions,
    interleaved_chunks,
    live_keys,
    make_frame,
    make_streams,
    verify_row,
)

SHAPE = (4, 8)



def sample_and_verify(buf: ReplayBuffer, streams, batches: int, batch_size: int, gamma: float) -> set:
    by_id = {s.stream: s for s in streams}
    seen = set()
    for _ in range(batches):
        b = buf.sample(batch_size, beta=0.5)
        assert b.obs.shape == (batch_size, buf.stack, *SHAPE) and b.obs.dtype == torch.uint8
        assert b.obs.is_contiguous() and b.next_obs.is_contiguous()
        assert b.actions.dtype == torch.int64 and b.weights.dtype == torch.float32
        assert float(b.weights.max()) == pytest.approx(1.0)
        obs, nxt = b.obs.numpy(), b.next_obs.numpy()
        for r in range(batch_size):
            seen.add(verify_row(by_id, obs[r], nxt[r], int(b.actions[r]), float(b.returns[r]),
                                float(b.discounts[r]), buf.stack, buf.n_step, gamma))
    return seen


@pytest.mark.parametrize("stack,n", [(4, 3), (1, 1), (3, 5)])
def test_interleaved_streams_all_transitions_present(stack: int, n: int) -> None:
    rng = np.random.default_rng(stack * 10 + n)
    streams = make_streams(6, SHAPE, rng, episodes=5, max_len=15)
    buf = ReplayBuffer(20_000, SHAPE, np.uint8, stack, n, 0.9, seed=1)
    added = 0
    for chunk, _ in interleaved_chunks(streams, stack, n, rng):
        added += buf.add_chunk(chunk)
    buf.check_valid()
    want = complete_transitions(streams, n)
    assert added == len(want) == buf.transitions_added == len(buf)
    assert live_keys(buf) == want
    seen = sample_and_verify(buf, streams, 20, 64, 0.9)
    assert seen <= want
    assert buf.frames_stored / len(buf) < 2.0  # short episodes and tiny chunks: still far below 8


def test_wraparound_keeps_recent_segments_and_valid_stacks() -> None:
    rng = np.random.default_rng(7)
    stack, n, cap = 4, 3, 120
    streams = make_streams(6, SHAPE, rng, episodes=8, max_len=25)
    buf = ReplayBuffer(cap, SHAPE, np.uint8, stack, n, 0.95, max_chunk_frames=40, seed=2)
    history: list[tuple[int, set]] = []  # (frames in chunk, transitions it added)
    by_id = {s.stream: s for s in streams}
    for step, (chunk, _c0) in enumerate(interleaved_chunks(streams, stack, n, rng, max_new=20)):
        before = live_keys(buf)
        buf.add_chunk(chunk)
        after = live_keys(buf)
        new = after - before
        history.append((chunk.num_frames, new))
        # the newest segments whose (untrimmed) sizes plus one jump gap fit the ring are all live
        budget, must = cap - 40, set()
        for frames, keys in reversed(history):
            budget -= frames
            if budget < 0:
                break
            must |= keys
        assert must <= after
        assert buf.frames_stored <= cap
        if step % 5 == 0:
            buf.check_valid()
            if len(buf):
                sample_and_verify(buf, streams, 2, 16, 0.95)
    assert buf._writer.abs_cursor > 3 * cap  # wrapped several times
    buf.check_valid()
    _ = by_id


def _chunk(flags, actions, rewards, first_start=0, shape=SHAPE, stream=0, episode=0):
    num = len(flags)
    frames = np.stack([make_frame(shape, stream, episode, t) for t in range(num)])
    return TransitionChunk(stream, first_start, frames, np.array(actions, dtype=np.int32),
                           np.array(rewards, dtype=np.float32), np.array(flags, dtype=np.uint8),
                           np.ones(num, dtype=np.float32))


def _rows_by_t(buf: ReplayBuffer, batch: int = 256):
    b = buf.sample(batch)
    out = {}
    for r in range(batch):
        t = check_frame(b.obs[r, -1].numpy())[2]
        tn = check_frame(b.next_obs[r, -1].numpy())[2]
        out[t] = (tn, float(b.returns[r]), float(b.discounts[r]), int(b.actions[r]))
    return out


def test_terminal_does_not_bootstrap_truncation_does() -> None:
    g = 0.5
    # episode of 3 steps terminated: frames t=0..3, END flag on t=2
    term = _chunk([FLAG_FIRST, 0, FLAG_TERMINATED, 0], [1, 2, 3, NO_ACTION], [1.0, 2.0, 4.0, 0.0])
    buf = ReplayBuffer(64, SHAPE, np.uint8, 2, 2, g, seed=0)
    assert buf.add_chunk(term) == 3
    rows = _rows_by_t(buf)
    assert rows[0] == (2, 1.0 + g * 2.0, g**2, 1)
    assert rows[1] == (3, 2.0 + g * 4.0, 0.0, 2)
    assert rows[2] == (3, 4.0, 0.0, 3)
    trunc = _chunk([FLAG_FIRST, 0, FLAG_TRUNCATED, 0], [1, 2, 3, NO_ACTION], [1.0, 2.0, 4.0, 0.0])
    buf = ReplayBuffer(64, SHAPE, np.uint8, 2, 2, g, seed=0)
    buf.add_chunk(trunc)
    rows = _rows_by_t(buf)
    assert rows[1] == (3, 2.0 + g * 4.0, g**2, 2)
    assert rows[2] == (3, 4.0, g, 3)


def test_first_frame_padding_and_incomplete_windows() -> None:
    # 5 frames, newest has no action: with n=3 only transitions 0 and 1 are complete
    c = _chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0])
    buf = ReplayBuffer(64, SHAPE, np.uint8, 4, 3, 0.9, seed=0)
    assert buf.add_chunk(c) == 2
    b = buf.sample(32)
    for r in range(32):
        ts = [check_frame(f)[2] for f in b.obs[r].numpy()]
        assert ts in ([0, 0, 0, 0], [0, 0, 0, 1])
    assert buf.frames_stored == 5


def test_chunk_without_complete_transition_stores_nothing() -> None:
    c = _chunk([FLAG_FIRST, 0], [0, NO_ACTION], [1, 0])
    buf = ReplayBuffer(64, SHAPE, np.uint8, 4, 3, 0.9)
    assert buf.add_chunk(c) == 0
    assert len(buf) == 0 and buf.frames_stored == 0
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)


@pytest.mark.parametrize("mutate,match", [
    (lambda c: c.__class__(c.stream, c.first_start, c.frames, c.actions[:-1], c.rewards, c.flags, c.priorities),
     "actions has shape"),
    (lambda c: c.__class__(c.stream, c.first_start, c.frames.astype(np.int16), c.actions, c.rewards, c.flags,
                           c.priorities), "dtype"),
    (lambda c: c.__class__(c.stream, 9, c.frames, c.actions, c.rewards, c.flags, c.priorities), "first_start"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, c.rewards,
                           np.array([1, 0, 1, 0], np.uint8), c.priorities), "FIRST"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, c.rewards,
                           np.array([1, 6, 0, 0], np.uint8), c.priorities), "both TERMINATED"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, c.rewards,
                           np.array([1, 0, 0, 2], np.uint8), c.priorities), "NO_ACTION"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, np.array([1, np.nan, 0, 0], np.float32), c.flags,
                           c.priorities), "not finite"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, np.array([1, 3.4e38, 0, 0], np.float32), c.flags,
                           c.priorities), r"rewards\[1\]=3\.4e\+38 is invalid: allowed \|reward\| <= 1e\+30"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, np.array([1, 1, -2e30, 0], np.float32), c.flags,
                           c.priorities), r"rewards\[2\]=-2e\+30 is invalid"),
    (lambda c: c.__class__(c.stream, 0, c.frames, c.actions, c.rewards, np.zeros(4, np.uint8), c.priorities),
     "history frames"),
    (lambda c: c.__class__(c.stream, 0, c.frames[:, :2], c.actions, c.rewards, c.flags, c.priorities),
     "frames have shape"),
])
def test_inconsistent_chunks_raise_precise_value_errors(mutate, match) -> None:
    good = _chunk([FLAG_FIRST, 0, 0, 0], [0, 1, 2, NO_ACTION], [1, 1, 1, 0])
    buf = ReplayBuffer(64, SHAPE, np.uint8, 4, 1, 0.9)
    with pytest.raises(ValueError, match=match):
        buf.add_chunk(mutate(good))
    assert buf.transitions_added == 0 and buf.frames_stored == 0
    assert buf.add_chunk(good) == 3


def test_priorities_weights_and_stale_updates() -> None:
    c = _chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0])
    buf = ReplayBuffer(10, SHAPE, np.uint8, 2, 1, 0.9, alpha=0.5, priority_eps=0.01, max_chunk_frames=6, seed=3)
    buf.add_chunk(c)
    assert len(buf) == 4
    buf._reader.drain()  # the reader applies the writer's records to its tree
    leaves = buf._reader.tree.leaves()
    np.testing.assert_allclose(leaves[:4], (1.0 + 0.01) ** 0.5)
    b = buf.sample(8, beta=1.0)
    buf.update_priorities(b.indices, np.full(8, 3.0))
    np.testing.assert_allclose(buf._reader.tree.leaves(b.indices % 10), (3.0 + 0.01) ** 0.5)
    old = b.indices.copy()
    # two more chunks overwrite slots 0..4 (the ring has 10 slots, each segment takes 5)
    buf.add_chunk(_chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0], episode=1))
    buf.add_chunk(_chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0], episode=2))
    buf._reader.drain()
    before = buf._reader.tree.leaves().copy()
    buf.update_priorities(old, np.full(8, 100.0))  # stale: must not touch the new occupants
    np.testing.assert_array_equal(buf._reader.tree.leaves(), before)
    buf.check_valid()
    # weights: (N * P)^-beta / max
    b = buf.sample(16, beta=0.7)
    p = buf._reader.tree.leaves(b.indices % 10) / buf._reader.tree.total
    w = (len(buf) * p) ** -0.7
    np.testing.assert_allclose(b.weights.numpy(), w / w.max(), rtol=1e-6)


def test_uniform_mode_weights_are_one_and_updates_ignored() -> None:
    c = _chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0])
    buf = ReplayBuffer(32, SHAPE, np.uint8, 2, 1, 0.9, prioritized=False, seed=3)
    buf.add_chunk(c)
    b = buf.sample(64)
    assert torch.all(b.weights == 1.0)
    buf.update_priorities(b.indices, np.full(64, 50.0))
    assert np.all(buf._reader.tree.leaves()[:4] == 1.0)
    counts = np.bincount(b.indices % 32, minlength=4)[:4]
    assert counts.min() == counts.max() == 16  # stratified over equal masses: exactly even


def test_save_load_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(11)
    streams = make_streams(3, SHAPE, rng, episodes=6)
    buf = ReplayBuffer(150, SHAPE, np.uint8, 4, 3, 0.97, max_chunk_frames=40, seed=5)
    for chunk, _ in interleaved_chunks(streams, 4, 3, rng, max_new=16):
        buf.add_chunk(chunk)
    b = buf.sample(32)
    buf.update_priorities(b.indices, rng.random(32) * 4)
    buf.save(tmp_path / "rb")
    assert not any(p.suffix not in (".npy", ".json") for p in (tmp_path / "rb").iterdir())
    loaded = ReplayBuffer.load(tmp_path / "rb", seed=9)
    buf._reader.rng = np.random.default_rng(9)
    assert len(loaded) == len(buf) and loaded.transitions_added == buf.transitions_added
    assert loaded.frames_stored == buf.frames_stored
    np.testing.assert_array_equal(loaded._reader.tree.nodes, buf._reader.tree.nodes)
    x, y = buf.sample(64), loaded.sample(64)
    for name in ("obs", "next_obs", "actions", "returns", "discounts", "weights"):
        assert torch.equal(getattr(x, name), getattr(y, name)), name
    np.testing.assert_array_equal(x.indices, y.indices)
    # the loaded buffer keeps accepting chunks where the original left off
    more = make_streams(1, SHAPE, rng, episodes=3)
    for chunk, _ in interleaved_chunks(more, 4, 3, rng):
        loaded.add_chunk(chunk)
    loaded.check_valid()
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(151, SHAPE, np.uint8, 4, 3, 0.97).restore(tmp_path / "rb")


def test_check_valid_detects_corruption() -> None:
    rng = np.random.default_rng(4)
    streams = make_streams(2, SHAPE, rng)
    buf = ReplayBuffer(200, SHAPE, np.uint8, 4, 3, 0.9, seed=0)
    for chunk, _ in interleaved_chunks(streams, 4, 3, rng):
        buf.add_chunk(chunk)
    buf.check_valid()
    tree = buf._reader.tree
    saved = tree.nodes.copy()
    tree.nodes[3] += 1.0  # internal node no longer the sum of its children
    with pytest.raises(ReplayInvariantError, match="children sum"):
        buf.check_valid()
    tree.nodes[:] = saved
    no_transition = int(np.flatnonzero(buf.storage.action == NO_ACTION)[0])
    tree.set(np.array([no_transition]), np.array([1.0]))  # mass on a slot that starts no transition
    with pytest.raises(ReplayInvariantError):
        buf.check_valid()
    tree.nodes[:] = saved
    live = int(np.flatnonzero(tree.leaves() > 0)[0])
    buf.storage.boot[live] = live  # bootstrap must lie after the slot, inside its segment
    with pytest.raises(ReplayInvariantError, match="bootstrap"):
        buf.check_valid()
    assert not issubclass(ReplayInvariantError, AssertionError)


def test_build_and_accounting() -> None:
    cfg = Config(replay=ReplayConfig(capacity=5000, n_step=3, storage_device="auto"))
    buf = ReplayBuffer.build(cfg.replay, EnvSpec((84, 84), np.dtype(np.uint8), 5, 4), "cpu")
    assert buf.device.type == "cpu" and buf.capacity == 5000 and buf.n_step == 3
    assert buf.nbytes() >= 5000 * 84 * 84
    rng = np.random.default_rng(0)
    streams = make_streams(2, (84, 84), rng, episodes=3, max_len=600)
    for chunk, _ in interleaved_chunks(streams, 4, 3, rng, max_new=128, min_new=128):
        buf.add_chunk(chunk)
    assert buf.frames_stored / len(buf) <= 1.1


def test_failed_copy_publishes_a_dead_range_and_read_only_frames_work(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    streams = make_streams(2, SHAPE, rng, episodes=4)
    chunks = [c for c, _ in interleaved_chunks(streams, 4, 3, rng)]
    buf = ReplayBuffer(300, SHAPE, np.uint8, 4, 3, 0.9, max_chunk_frames=40, seed=0)
    for c in chunks[:3]:
        buf.add_chunk(c)
    real = buf.storage.write_frames

    def broken(ring_start, frames):
        real(ring_start, frames[: len(frames) // 2])
        raise OSError("device copy failed")

    monkeypatch.setattr(buf.storage, "write_frames", broken)
    with pytest.raises(OSError):
        buf.add_chunk(chunks[3])
    monkeypatch.setattr(buf.storage, "write_frames", real)
    buf.check_valid()
    for c in chunks[4:]:
        frames = np.frombuffer(c.frames.tobytes(), dtype=np.uint8).reshape(c.frames.shape)  # read-only view
        assert not frames.flags.writeable
        buf.add_chunk(TransitionChunk(c.stream, c.first_start, frames, c.actions, c.rewards, c.flags, c.priorities))
    buf.check_valid()
    sample_and_verify(buf, streams, 5, 32, 0.9)


def test_len_is_safe_from_any_thread_and_matches_the_tree() -> None:
    rng = np.random.default_rng(8)
    streams = make_streams(3, SHAPE, rng, episodes=5)
    buf = ReplayBuffer(90, SHAPE, np.uint8, 4, 2, 0.9, max_chunk_frames=30, seed=0)
    for chunk, _ in interleaved_chunks(streams, 4, 2, rng, max_new=10):
        buf.add_chunk(chunk)
        pending = len(buf._writer.records)
        n = len(buf)  # must not drain: the tree belongs to the reader
        assert len(buf._writer.records) == pending
        buf._reader.drain()
        assert n == buf._reader.count


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_frames_must_be_finite(bad: float) -> None:
    frames = np.arange(12, dtype=np.float32).reshape(4, 3)
    good = TransitionChunk(0, 0, frames, np.array([0, 1, 0, NO_ACTION], np.int32), np.ones(4, np.float32),
                           np.array([FLAG_FIRST, 0, 0, 0], np.uint8), np.ones(4, np.float32))
    buf = ReplayBuffer(64, (3,), np.float32, 1, 1, 0.9)
    poisoned = frames.copy()
    poisoned[2, 1] = bad
    with pytest.raises(ValueError, match=r"chunk frames\[2\] has a NaN or infinite value"):
        buf.add_chunk(TransitionChunk(0, 0, poisoned, good.actions, good.rewards, good.flags, good.priorities))
    assert buf.transitions_added == 0
    assert buf.add_chunk(good) == 3  # finite float frames of any size below the bound are fine
    big = TransitionChunk(0, 0, np.full((4, 3), 3e38, np.float32), good.actions, good.rewards, good.flags,
                          good.priorities)
    assert buf.add_chunk(big) == 3


def test_nonfinite_priority_updates_are_skipped_and_counted() -> None:
    """What raised in the head: an inf |TD| from an overflowed n-step return. It must never reach the tree."""
    c = _chunk([FLAG_FIRST, 0, 0, 0, 0], [0, 1, 2, 3, NO_ACTION], [1, 1, 1, 1, 0])
    buf = ReplayBuffer(16, SHAPE, np.uint8, 2, 1, 0.9, alpha=0.5, priority_eps=0.01, seed=3)
    buf.add_chunk(c)
    b = buf.sample(4, beta=1.0)
    order = np.argsort(b.indices)
    idx = b.indices[order]
    assert sorted(idx % 16) == [0, 1, 2, 3]
    before = buf._reader.tree.leaves(idx % 16).copy()
    buf.update_priorities(idx, np.array([np.nan, np.inf, 1e300, 3.0]))
    leaves = buf._reader.tree.leaves(idx % 16)
    np.testing.assert_array_equal(leaves[:2], before[:2])  # NaN / inf rows keep their priority
    np.testing.assert_allclose(leaves[2:], [(1e30 + 0.01) ** 0.5, (3.0 + 0.01) ** 0.5])  # huge |TD| clamped
    assert buf._reader.nonfinite_priorities_skipped == 2
    assert np.isfinite(buf._reader.tree.total)
    buf.check_valid()
    batch = buf.sample(8, beta=1.0)
    assert torch.all(torch.isfinite(batch.weights)) and float(batch.weights.max()) == 1.0
    buf.update_priorities(batch.indices, torch.full((8,), float("nan")))  # the learner's tensor form too
    assert buf._reader.nonfinite_priorities_skipped == 10


def test_a_large_cpu_ring_is_a_zeroed_writable_tensor_of_its_own() -> None:
    """Rings of 4 MB and more live in their own private mapping (huge pages advised): still plain torch frames."""
    from replay.storage import FrameStorage

    st = FrameStorage(1000, (84, 84), np.uint8, "cpu")  # 7 MB
    assert st.frames.shape == (1000, 84, 84) and st.frames.dtype == torch.uint8 and st.frames.is_contiguous()
    assert int(st.frames.sum()) == 0
    st.write_frames(10, np.full((3, 84, 84), 7, np.uint8))
    assert int(st.frames[10:13].sum()) == 3 * 84 * 84 * 7 and int(st.frames.sum()) == 3 * 84 * 84 * 7
    runs = st.gather_windows(torch.tensor([9, 10]), 4, torch.empty((8, 84, 84), dtype=torch.uint8))
    assert runs.shape == (2, 4, 84, 84) and runs[:, :, 0, 0].tolist() == [[0, 7, 7, 7], [7, 7, 7, 0]]
