"""SumTree: sums stay exact, sampling frequencies match masses (chi-square), zeros never drawn."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sum_tree import ReplayInvariantError, SumTree

# chi-square critical value, df = 39, upper tail p = 0.001 (tables)
CHI2_39_P001 = 72.055


def test_sampling_frequencies_match_priorities_chi_square() -> None:
    rng = np.random.default_rng(12345)
    tree = SumTree(50)
    masses = rng.random(50) ** 2 * 5
    masses[[3, 17, 18, 31, 40, 41, 42, 43, 44, 49]] = 0.0  # 40 positive leaves
    tree.set_range(0, masses)
    draws = 200_000
    counts = np.zeros(50, dtype=np.int64)
    for _ in range(draws // 1000):
        counts += np.bincount(tree.sample_stratified(1000, rng), minlength=50)
    assert counts[masses == 0].sum() == 0
    expected = draws * masses / masses.sum()
    pos = masses > 0
    chi2 = float((((counts[pos] - expected[pos]) ** 2) / expected[pos]).sum())
    assert chi2 < CHI2_39_P001, chi2
    # and the test can fail: frequencies from wrong (uniform) masses are rejected
    wrong = np.where(pos, draws / pos.sum(), 0.0)
    chi2_wrong = float((((counts[pos] - wrong[pos]) ** 2) / wrong[pos]).sum())
    assert chi2_wrong > 10 * CHI2_39_P001


def test_iid_sampling_matches_too() -> None:
    rng = np.random.default_rng(7)
    tree = SumTree(40)
    masses = rng.random(40) + 0.05
    tree.set(np.arange(40), masses)
    u = rng.random(100_000) * tree.total
    counts = np.bincount(tree.find(u), minlength=40)
    expected = 100_000 * masses / masses.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_39_P001, chi2


def test_descent_never_lands_on_zero_leaf_at_the_edges() -> None:
    tree = SumTree(1000)
    tree.set_range(0, np.full(10, 0.1))  # the right half of the tree is empty
    edge = np.array([0.0, tree.total, np.nextafter(tree.total, 0), tree.total * (1 + 1e-12)])
    found = tree.find(np.minimum(edge, tree.total))
    assert np.all(tree.leaves(found) > 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.lists(st.tuples(st.integers(0, 69), st.integers(0, 69),
                                              st.floats(0, 100, allow_nan=False)), max_size=25))
def test_updates_keep_sums_exact(capacity: int, ops) -> None:
    tree = SumTree(capacity)
    ref = np.zeros(capacity)
    for a, b, v in ops:
        lo, hi = sorted((a % capacity, b % capacity))
        if v > 50:
            tree.set_range(lo, np.full(hi + 1 - lo, v))
            ref[lo : hi + 1] = v
        else:
            tree.set(np.array([lo, hi]), np.array([v, v / 2]))
            ref[lo], ref[hi] = v, v / 2
        tree.check()
    np.testing.assert_array_equal(tree.leaves(), ref)
    assert tree.total == pytest.approx(ref.sum())


def test_check_detects_corruption() -> None:
    tree = SumTree(16)
    tree.set_range(0, np.arange(16, dtype=float))
    tree.check()
    tree.nodes[5] += 1e-9
    with pytest.raises(ReplayInvariantError, match="node (2|5) "):
        tree.check()
    tree.set_range(0, np.arange(16, dtype=float))
    tree.nodes[tree.size + 2] = -1.0
    with pytest.raises(ReplayInvariantError, match="leaf"):
        tree.check()
