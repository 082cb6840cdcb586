"""Prioritized stratified sampling over device tensors: the sum-tree's distribution without a tree.

`replay/sum_tree.py` draws B slots on the host: the total mass is cut into B equal strata, one
uniform offset per stratum, and a tree descent finds the leaf whose cumulative interval holds each
mass. Here the same masses are located by `torch.searchsorted` in the prefix sums of the leaves
(`torch.cumsum`), so a draw is a handful of tensor ops on the learner's device, with no host sync,
no `.item()` and no numpy; given the same uniforms it picks the same slots as the tree.

- Masses are float64, like the tree's nodes: prefix sums over millions of slots keep their
  resolution, and a slot of mass 0 owns an empty interval, so it is never drawn.
- The descent never ends on a zero leaf; here a mass rounded up to the total (the only case
  `searchsorted` could land past the last positive slot) is clamped onto that slot.
- Importance weights are `(count * p) ** -beta / max`, as `replay/sampler.py` computes them.
- New priorities are `(min(|td|, MAX_PRIORITY_TD) + eps) ** alpha` in float64, the reader's formula.
"""

from __future__ import annotations

import torch

from replay.sampler import MAX_PRIORITY_TD


def stratified_masses(total: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """float64 [B]: one mass per equal stratum of `total`, at offset `uniforms` (in [0, 1)) inside it."""
    count = uniforms.shape[0]
    strata = torch.arange(count, dtype=torch.float64, device=uniforms.device)
    masses = (strata + uniforms.to(torch.float64)) * (total / count)
    return torch.minimum(masses, total)


def draw(mass: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots int64 [B], probabilities float64 [B]) of a stratified draw over `mass` (float64 [N]).

    Slot i is drawn for a stratum mass m when cum[i-1] <= m < cum[i] (the tree's rule: go right
    when m >= the left subtree's mass). A draw from an all-zero `mass` returns probability 0."""
    cum = torch.cumsum(mass, 0)
    total = cum[-1]
    masses = stratified_masses(total, uniforms)
    slots = torch.searchsorted(cum, masses, right=True)
    last_positive = (cum < total).sum()  # the first slot whose prefix sum reaches the total
    slots = torch.minimum(slots, last_positive)
    probs = mass.index_select(0, slots) / total.clamp_min(torch.finfo(torch.float64).tiny)
    return slots, probs


def importance_weights(probs: torch.Tensor, count: torch.Tensor, beta: torch.Tensor,
                       keep: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [B]: (count * p) ** -beta normalized by its max over the kept rows; 0 where not kept.

    `count` is the number of sampleable slots; rows with probability 0 are never kept."""
    valid = probs > 0.0
    keep = valid if keep is None else keep & valid
    w = (count.to(torch.float64) * torch.where(valid, probs, 1.0)) ** (-beta.to(torch.float64))
    w = torch.where(keep, w, 0.0)
    top = w.max().clamp_min(torch.finfo(torch.float64).tiny)
    return (w / top).to(torch.float32)


def priority_mass(td_abs: torch.Tensor, alpha: float, eps: float) -> torch.Tensor:
    """float64 sampling mass of each |TD| value: (min(|td|, MAX_PRIORITY_TD) + eps) ** alpha."""
    td = torch.clamp(td_abs.to(torch.float64).abs(), max=MAX_PRIORITY_TD)
    return (td + eps) ** alpha
