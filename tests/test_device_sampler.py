"""The device sampler (replay/device_sampler.py): its draws follow the priorities (chi-square), and given
the same uniforms it picks the sum-tree's slots with the reader's probabilities, weights and new priorities."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from replay.device_sampler import draw, importance_weights, priority_mass
from replay.sampler import MAX_PRIORITY_TD
from replay.sum_tree import SumTree

# The 0.999 quantile of the chi-square distribution with 19 degrees of freedom (20 positive-mass
# slots): a correct sampler exceeds it with probability 0.001 (alpha level 0.1%).
CHI2_DF19_ALPHA_0001 = 43.820


def known_priorities() -> np.ndarray:
    """24 slots: 20 with distinct masses (|TD| + eps) ** 0.6 over three orders of magnitude, 4 with mass 0."""
    td = np.geomspace(0.01, 20.0, 20)
    mass = (td + 1e-6) ** 0.6
    out = np.zeros(24)
    out[[0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19, 20, 22, 23]] = mass
    return out


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    live = probs > 0
    expected = counts.sum() * probs[live]
    return float(((counts[live] - expected) ** 2 / expected).sum())


def draw_counts(mass: np.ndarray, batch: int, draws: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    m = torch.from_numpy(mass)
    counts = torch.zeros(len(mass), dtype=torch.int64)
    for _ in range(draws // batch):
        slots, _ = draw(m, torch.rand(batch, generator=gen, dtype=torch.float64))
        counts += torch.bincount(slots, minlength=len(mass))
    return counts.numpy()


@pytest.mark.parametrize("batch", [1, 64])
def test_draw_frequencies_match_the_priorities(batch: int) -> None:
    """64,000 draws over a known priority vector. With batch 1 a draw is one inverse-CDF sample, so the
    counts are multinomial and the statistic is chi-square with 19 df; with 64 strata the counts vary
    less than multinomial ones, so the same bound is conservative. Zero-mass slots are never drawn."""
    mass = known_priorities()
    counts = draw_counts(mass, batch, 64_000, seed=7)
    assert counts.sum() == 64_000
    assert counts[mass == 0].sum() == 0
    stat = chi_square(counts, mass / mass.sum())
    assert stat < CHI2_DF19_ALPHA_0001, f"chi-square {stat:.1f} >= {CHI2_DF19_ALPHA_0001} (df 19, alpha 0.001)"


def test_the_chi_square_check_detects_a_wrong_distribution() -> None:
    """The test above has power: draws over alpha=0.6 priorities judged against alpha=0.5 ones fail it."""
    mass = known_priorities()
    wrong = np.where(mass > 0, mass ** (0.5 / 0.6), 0.0)
    counts = draw_counts(mass, 1, 64_000, seed=7)
    assert chi_square(counts, wrong / wrong.sum()) > 10 * CHI2_DF19_ALPHA_0001


def test_same_slots_and_probabilities_as_the_sum_tree() -> None:
    rng = np.random.default_rng(3)
    cap = 1000
    leaves = rng.random(cap) ** 3 * 5
    leaves[rng.random(cap) < 0.3] = 0.0
    leaves[-17:] = 0.0  # trailing empty slots: a mass rounded to the total must not reach them
    tree = SumTree(cap)
    tree.set_range(0, leaves)
    for batch in (1, 7, 512):
        u = rng.random(batch)
        u[-1] = np.nextafter(1.0, 0.0)
        want = tree.find(np.minimum((np.arange(batch) + u) * (tree.total / batch), tree.total))
        slots, probs = draw(torch.from_numpy(leaves), torch.from_numpy(u))
        assert np.array_equal(slots.numpy(), want)
        np.testing.assert_allclose(probs.numpy(), tree.leaves(want) / tree.total, rtol=1e-12)
        assert np.all(leaves[slots.numpy()] > 0)


def test_a_mass_rounded_up_to_the_total_lands_on_the_last_positive_slot() -> None:
    mass = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0, 0.0], dtype=torch.float64)
    slots, probs = draw(mass, torch.tensor([1.0], dtype=torch.float64))  # beyond [0, 1): the total itself
    assert slots.tolist() == [3] and probs.tolist() == pytest.approx([0.7])
    slots, _ = draw(mass, torch.tensor([0.0, 0.999999], dtype=torch.float64))
    assert slots.tolist() == [1, 3]


def test_an_empty_ring_draws_rows_of_probability_zero_and_weight_zero() -> None:
    slots, probs = draw(torch.zeros(8, dtype=torch.float64), torch.full((4,), 0.5, dtype=torch.float64))
    assert torch.all(probs == 0)
    w = importance_weights(probs, torch.tensor(0), torch.tensor(0.4))
    assert torch.all(w == 0) and torch.all(torch.isfinite(w))


def test_weights_follow_the_reader_formula() -> None:
    rng = np.random.default_rng(5)
    probs = rng.random(64) / 100
    count, beta = 1234, 0.55
    w = (count * probs) ** (-beta)
    want = (w / w.max()).astype(np.float32)
    got = importance_weights(torch.from_numpy(probs), torch.tensor(count), torch.tensor(beta, dtype=torch.float64))
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), want)
    keep = torch.from_numpy(rng.random(64) < 0.8)
    kept = importance_weights(torch.from_numpy(probs), torch.tensor(count), torch.tensor(beta), keep=keep)
    assert torch.all(kept[~keep] == 0)
    np.testing.assert_allclose(kept[keep].numpy(), w[keep.numpy()] / w[keep.numpy()].max(), rtol=1e-6)


def test_new_priorities_follow_the_reader_formula() -> None:
    td = torch.tensor([0.0, 1e-3, 0.5, 3.0, 2e30, math.inf], dtype=torch.float32)
    got = priority_mass(td, alpha=0.6, eps=1e-6)
    want = (np.minimum(np.abs(td.numpy().astype(np.float64)), MAX_PRIORITY_TD) + 1e-6) ** 0.6
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)  # torch's and numpy's pow may differ by an ulp
    assert got.dtype == torch.float64 and torch.all(torch.isfinite(got))
