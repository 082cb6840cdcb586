"""shared/chunk.py: the contract between collectors and replay (no torch: runs under 3.13 too)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import chunk as C

pytestmark = pytest.mark.envonly


def _general(actions, rewards, flags, first_start, n, gamma):
    """Force the general path by hiding the fast one."""
    saved = C._nstep_no_episode_end
    C._nstep_no_episode_end = lambda *a: None
    try:
        return C.nstep_targets(actions, rewards, flags, first_start, n, gamma)
    finally:
        C._nstep_no_episode_end = saved


def test_hand_made_chunk():
    actions = np.array([0, 1, 2, 3, 4, -1, 0, 1, 2, -1], np.int32)
    rewards = np.arange(10, dtype=np.float32)
    flags = np.zeros(10, np.uint8)
    flags[0] = flags[6] = C.FLAG_FIRST
    flags[4] = C.FLAG_TERMINATED
    t = C.nstep_targets(actions, rewards, flags, 0, 3, 0.5)
    assert t.starts.tolist() == [0, 1, 2, 3, 4, 6]
    assert t.bootstrap.tolist() == [3, 4, 5, 5, 5, 9]
    assert t.returns.tolist() == [1.0, 2.75, 4.5, 5.0, 4.0, 11.5]
    assert t.discounts.tolist() == [0.125, 0.125, 0.0, 0.0, 0.0, 0.125]
    floors = C.stack_floors(flags)
    assert C.stack_indices(np.array([2, 7]), floors[[2, 7]], 4).tolist() == [[0, 0, 1, 2], [6, 6, 6, 7]]


def test_truncation_bootstraps_from_final_observation():
    actions = np.array([0, 0, -1], np.int32)
    flags = np.array([C.FLAG_FIRST, C.FLAG_TRUNCATED, 0], np.uint8)
    t = C.nstep_targets(actions, np.ones(3, np.float32), flags, 0, 3, 0.9)
    assert t.starts.tolist() == [0, 1] and t.bootstrap.tolist() == [2, 2]
    assert np.allclose(t.discounts, [0.81, 0.9]) and np.allclose(t.returns, [1.9, 1.0])


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(-1, 3), st.floats(-5, 5, width=32), st.sampled_from([0, 0, 0, 2, 4])),
                  min_size=1, max_size=40),
    first_start=st.integers(0, 10),
    n=st.integers(1, 5),
    gamma=st.floats(0.5, 1.0),
)
def test_fast_path_is_bit_identical_to_the_general_path(data, first_start, n, gamma):
    actions = np.array([a for a, _, _ in data], np.int32)
    rewards = np.array([r for _, r, _ in data], np.float32)
    flags = np.array([f for _, _, f in data], np.uint8)
    for acts in (actions, np.maximum(actions, 0)):  # the second is the common all-acted chunk
        fast, slow = C.nstep_targets(acts, rewards, flags, first_start, n, gamma), _general(acts, rewards, flags, first_start, n, gamma)
        for name in ("starts", "bootstrap", "returns", "discounts", "steps"):
            assert np.array_equal(getattr(fast, name), getattr(slow, name)), name


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_window_returns_are_the_float64_sums_in_the_general_order(n: int) -> None:
    """Bit for bit: the collector, the replay's fast path and its batched planner all store these sums."""
    rng = np.random.default_rng(n)
    rewards = (rng.normal(size=40) * 3).astype(np.float32)
    gamma = 0.99
    sums = C.window_returns(rewards, n, gamma)
    assert sums.dtype == np.float64 and sums.size == 40 - n + 1
    for t in range(sums.size):
        expected, discount = 0.0, 1.0
        for k in range(n):
            expected = expected + discount * float(rewards[t + k])
            discount = discount * gamma
        assert sums[t] == expected, t
    targets = C.nstep_targets(np.zeros(40, np.int32), rewards, np.zeros(40, np.uint8), 0, n, gamma)
    assert np.array_equal(targets.returns, sums[: 40 - n].astype(np.float32))
