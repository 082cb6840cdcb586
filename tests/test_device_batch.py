"""Batches built on the device from the frame ring (replay/device_ring.py, replay/device_batch.py).

The device batch equals the host reader's `sample()` given the same uniforms (stacks floored at episode
starts, n-step returns, discounts, weights); a drain mirrors the writer's records into the table; and
a row whose segment a concurrent writer claimed while it was drawn or gathered is never handed out as
fresh: every fresh row is checked against the simulator's ground truth (whole frames, so a torn frame
fails too)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from replay.buffer import ReplayBuffer
from replay.device_batch import draw_rows, gather_rows, sample_batch
from replay.device_ring import ACTION, BOOT, DISC, FLOOR, MASS, RET, SEG_ABS, DeviceRing
from tests.support.replay_streams import check_stacks, chunks_for, expected_table, headers, make_streams

SHAPE = (8, 8)  # 64 bytes: the 24-byte (stream, episode, t) header and a checked body
STACK, N_STEP, GAMMA = 4, 3, 0.97
WAIT_S = 60.0  # generous bound on an event wait (a loaded machine), never a pacing delay


def interleaved_chunks(seed: int, streams: int = 6) -> tuple[list, dict]:
    """A fixed interleaving of several simulated streams' chunks, and the expected targets by frame header."""
    rng = np.random.default_rng(seed)
    sims = make_streams(streams, SHAPE, rng, episodes=6, max_len=60)
    gens = [chunks_for(s, STACK, N_STEP, rng, max_new=40, min_new=8) for s in sims]
    chunks = []
    while gens:
        k = int(rng.integers(len(gens)))
        try:
            chunks.append(next(gens[k])[0])
        except StopIteration:
            gens.pop(k)
    return chunks, expected_table(sims, N_STEP, GAMMA)


def make_buffer(capacity: int, seed: int = 3) -> ReplayBuffer:
    return ReplayBuffer(capacity, SHAPE, np.uint8, STACK, N_STEP, GAMMA, max_chunk_frames=64, seed=seed)


def check_rows(obs: np.ndarray, nxt: np.ndarray, actions: np.ndarray, returns: np.ndarray,
               discounts: np.ndarray, table: dict) -> None:
    """Every row's stacks, bootstrap frame and targets against the ground truth (no rows: nothing to check)."""
    if len(obs) == 0:
        return
    ho, hn = headers(obs), headers(nxt)
    check_stacks(ho, ho[:, -1, 2], STACK)
    check_stacks(hn, hn[:, -1, 2], STACK)
    assert np.array_equal(ho[:, -1, :2], hn[:, -1, :2]), "next stack from another stream or episode"
    for r in range(len(obs)):
        a, tb, ret, disc = table[tuple(int(x) for x in ho[r, -1])]
        assert (a, tb) == (int(actions[r]), int(hn[r, -1, 2])), f"row {r}: action or bootstrap frame"
        assert np.isclose(ret, float(returns[r]), rtol=1e-5) and np.isclose(disc, float(discounts[r])), f"row {r}"


def device_sample(ring: DeviceRing, beta: float):
    return sample_batch(ring.table, ring.frames, ring.claim, ring.uniforms[0], torch.tensor(beta, dtype=torch.float64),
                        STACK)


@pytest.mark.parametrize("capacity", [5000, 600])  # all chunks fit; the writer laps the ring (cut and retired segments)
def test_device_batch_equals_the_host_readers_sample(capacity: int) -> None:
    chunks, _ = interleaved_chunks(seed=11)
    buf = make_buffer(capacity)
    buf.add_chunks(chunks)
    batch = 96
    ring = DeviceRing(buf, "cpu", batch=batch, uniform_rows=1)
    for beta in (0.4, 0.9):
        state = buf._reader.rng.bit_generator.state
        host = buf.sample(batch, beta=beta)
        buf._reader.rng.bit_generator.state = state  # the ring draws the uniforms sample() drew
        ring.refill_uniforms(0, force=True)
        assert buf._reader.rng.bit_generator.state != state
        dev = device_sample(ring, beta)
        assert np.array_equal(dev.slots.numpy(), host.indices % capacity)
        assert bool(dev.fresh.all())
        assert torch.equal(dev.obs, host.obs) and torch.equal(dev.next_obs, host.next_obs)
        assert torch.equal(dev.actions, host.actions)
        assert torch.equal(dev.returns, host.returns) and torch.equal(dev.discounts, host.discounts)
        torch.testing.assert_close(dev.weights, host.weights, rtol=1e-6, atol=0)


def test_drain_mirrors_the_records_and_push_pull_round_trip() -> None:
    chunks, _ = interleaved_chunks(seed=12)
    buf = make_buffer(600)
    buf.add_chunks(chunks[:20])
    ring = DeviceRing(buf, "cpu", batch=8)
    for k in range(20, len(chunks), 7):  # laps the ring: segments cut and tails retired between drains
        buf.add_chunks(chunks[k : k + 7])
        assert ring.drain() > 0
        reader, st = buf._reader, buf.storage
        assert np.array_equal(ring.table[MASS].numpy(), reader.tree.leaves())
        assert np.array_equal(ring.table[SEG_ABS].numpy(), reader.seg_abs)
        for row, arr in ((ACTION, st.action), (RET, st.ret), (DISC, st.disc), (BOOT, st.boot), (FLOOR, st.floor)):
            assert np.array_equal(ring.table[row].numpy(), arr.astype(np.float64)), row
    live = ring.table[MASS] > 0
    ring.table[MASS] = torch.where(live, torch.rand(600, dtype=torch.float64) + 0.5, 0.0)
    ring.push()
    assert np.array_equal(buf._reader.tree.leaves(), ring.table[MASS].numpy())
    buf.check_valid()
    saved = ring.table.clone()
    ring.table.zero_()
    ring.pull()
    assert torch.equal(ring.table, saved)


def test_a_ring_on_another_device_than_the_learner_is_refused() -> None:
    buf = make_buffer(100)
    with pytest.raises(ValueError, match="learner's device"):
        DeviceRing(buf, "meta", batch=4)


@pytest.mark.parametrize("lap", [False, True])
def test_rows_a_writer_thread_overwrites_between_draw_and_gather_are_not_fresh(lap: bool) -> None:
    """Rows are drawn; a writer thread (started by an event) overwrites part of the ring, or all of it;
    then the rows are gathered. Rows of overwritten segments are stale with weight 0; every fresh row
    is correct."""
    chunks, truth = interleaved_chunks(seed=13)
    cap = 600
    buf = make_buffer(cap)
    buf.add_chunks(chunks[:40])
    ring = DeviceRing(buf, "cpu", batch=64, uniform_rows=1)
    ring.refill_uniforms(0, force=True)
    drawn = draw_rows(ring.table, ring.claim, ring.uniforms[0])
    go, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            go.wait(WAIT_S)
            start, k = buf._writer.claimed_end, 40
            while buf._writer.claimed_end - start < (2 * cap if lap else cap // 3):
                buf.add_chunk(chunks[k % len(chunks)])
                k += 1
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    go.set()
    assert done.wait(WAIT_S) and not errors, errors
    thread.join(WAIT_S)
    batch = gather_rows(ring.table, ring.frames, ring.claim, drawn, torch.tensor(0.5, dtype=torch.float64), STACK)
    fresh = batch.fresh.numpy()
    assert np.all(batch.weights.numpy()[~fresh] == 0) and np.all(batch.weights.numpy()[fresh] > 0)
    if lap:
        assert not fresh.any()
    else:
        assert 0 < fresh.sum() < len(fresh)  # some drawn rows were overwritten, some not
        check_rows(batch.obs.numpy()[fresh], batch.next_obs.numpy()[fresh], batch.actions.numpy()[fresh],
                   batch.returns.numpy()[fresh], batch.discounts.numpy()[fresh], truth)


def test_fresh_rows_are_correct_under_a_concurrent_writer() -> None:
    """The writer thread inserts a few chunks each time the reader starts a batch (an event, so its copies
    overlap the draw and the gather); 300 batches, every fresh row checked. Rows of claimed segments are
    not drawn, or are marked stale after the gather."""
    chunks, truth = interleaved_chunks(seed=14)
    cap = 400
    buf = make_buffer(cap)
    buf.add_chunks(chunks[:10])
    ring = DeviceRing(buf, "cpu", batch=32, uniform_rows=1)
    tick, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        k = 10
        try:
            while not stop.is_set():
                if not tick.wait(WAIT_S):
                    continue
                tick.clear()
                for _ in range(4):
                    buf.add_chunk(chunks[k % len(chunks)])
                    k += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    checked = stale = 0
    try:
        for it in range(300):
            ring.drain()
            ring.refill_uniforms(it, force=True)
            tick.set()
            batch = device_sample(ring, 0.6)
            fresh = batch.fresh.numpy()
            check_rows(batch.obs.numpy()[fresh], batch.next_obs.numpy()[fresh], batch.actions.numpy()[fresh],
                       batch.returns.numpy()[fresh], batch.discounts.numpy()[fresh], truth)
            checked += int(fresh.sum())
            stale += int((~fresh).sum())
            assert not errors, errors
    finally:
        stop.set()
        tick.set()
        thread.join(WAIT_S)
    assert not errors, errors
    assert buf.transitions_added > 5 * cap  # the writer lapped the ring many times
    assert checked > 300 * 32 // 2
    ring.drain()
    buf.check_valid()
    print(f"fresh rows checked: {checked}, stale rows: {stale}")
