"""Hypothesis: random insert / sample / update sequences against a reference model.

The model is a dict of every complete transition the inserted chunks contained (key
(stream, episode, t) -> expected targets, from a plain loop in the simulator). Invariants
after every operation: check_valid passes; the live set is a subset of the model's inserted
set; with a ring big enough for everything it equals it; otherwise the newest segments that
must still fit are all live; every sampled row matches the model exactly.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.buffer import ReplayBuffer
from tests.support.replay_streams import interleaved_chunks, live_keys, make_streams, verify_row

SHAPE = (3, 8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    streams=st.integers(1, 4),
    stack=st.integers(1, 4),
    n=st.integers(1, 4),
    capacity=st.sampled_from([48, 64, 100, 5000]),
    max_new=st.integers(1, 16),
    prioritized=st.booleans(),
    ops=st.lists(st.sampled_from(["insert", "insert", "insert", "sample", "update"]), min_size=5, max_size=60),
)
def test_random_operation_sequences_match_model(seed, streams, stack, n, capacity, max_new, prioritized, ops) -> None:
    rng = np.random.default_rng(seed)
    gamma = 0.9
    sims = make_streams(streams, SHAPE, rng, episodes=4, max_len=8)
    by_id = {s.stream: s for s in sims}
    chunk_iter = interleaved_chunks(sims, stack, n, rng, max_new=max_new)
    max_frames = 32
    buf = ReplayBuffer(capacity, SHAPE, np.uint8, stack, n, gamma, prioritized=prioritized, alpha=0.7,
                       max_chunk_frames=max_frames, seed=seed % 1000)
    inserted: set = set()
    history: list[tuple[int, set]] = []
    last_batch = None
    for op in ops:
        if op == "insert":
            item = next(chunk_iter, None)
            if item is None:
                continue
            chunk, c0 = item
            if chunk.num_frames > max_frames:
                continue  # rejected by validation (tested elsewhere)
            before = live_keys(buf)
            added = buf.add_chunk(chunk)
            new = live_keys(buf) - before
            assert len(new) <= added
            inserted |= new
            history.append((chunk.num_frames, new))
        elif op == "sample" and len(buf):
            b = buf.sample(int(rng.integers(1, 20)), beta=float(rng.random()))
            for r in range(len(b)):
                key = verify_row(by_id, b.obs[r].numpy(), b.next_obs[r].numpy(), int(b.actions[r]),
                                 float(b.returns[r]), float(b.discounts[r]), stack, n, gamma)
                assert key in inserted
            assert np.all(np.isfinite(b.weights.numpy())) and float(b.weights.max()) == 1.0
            last_batch = b
        elif op == "update" and last_batch is not None:
            buf.update_priorities(last_batch.indices, rng.random(len(last_batch)) * 5)
        buf.check_valid()
        live = live_keys(buf)
        assert live <= inserted
        assert len(buf) == len(live)
        if capacity >= 5000:
            assert live == inserted
        budget, must = capacity - max_frames, set()
        for frames, keys in reversed(history):
            budget -= frames
            if budget < 0:
                break
            must |= keys
        assert must <= live
