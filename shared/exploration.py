"""Exploration schedule shared by collectors (who act on it) and the head (who reports it)."""

from __future__ import annotations


def annealed_epsilon(final: float, weight_version: int, decay_updates: int) -> float:
    """Linear anneal from 1 to `final` over `decay_updates` learner updates; `final` when decay_updates <= 0.

    The clock is the weight version (= learner updates when the weights were published), so a
    restarted or late-joining collector explores as much as the others do at that point of training.
    """
    if decay_updates <= 0:
        return float(final)
    remaining = max(0.0, 1.0 - max(0, weight_version) / decay_updates)
    return float(final) + (1.0 - float(final)) * remaining


def acting_epsilon(apex: float, weight_version: int, decay_updates: int, stage_from: int, stage: float) -> float:
    """The epsilon a stream whose Ape-X epsilon is `apex` acts with at `weight_version`: `stage` from learner update
    `stage_from` on (collectors.eps_stage_from > 0), else `annealed_epsilon`. The same clock as the anneal: a
    restarted or remote collector switches when the others do, within one weight broadcast of the learner."""
    if stage_from > 0 and weight_version >= stage_from:
        return float(stage)
    return annealed_epsilon(apex, weight_version, decay_updates)


def stream_epsilons(first: int, count: int, total: int, base: float, alpha: float) -> list[float]:
    """Ape-X per env stream: stream i explores with eps_i = base ** (1 + alpha * i / (total - 1)).

    A collector with K envs owns the streams first .. first + K - 1 (the head assigns `first`). Streams
    past `total` (collectors beyond the configured count, e.g. remote ones) continue the same geometric
    sequence below base ** (1 + alpha), so no two streams of a run ever share an epsilon. A run of one
    stream (total <= 1) starts at `base` and continues the sequence as if total were 2.
    """
    span = max(1, total - 1)
    return [float(base ** (1.0 + alpha * i / span)) for i in range(first, first + count)]


def collector_epsilon(index: int, total: int, base: float, alpha: float) -> float:
    """Ape-X per collector (one epsilon for all its envs): the `stream_epsilons` formula with one stream
    per collector, so collector `index` of `total` gets base ** (1 + alpha * index / (total - 1))."""
    return stream_epsilons(index, 1, total, base, alpha)[0]


def slot_epsilons(slot: int, slots: int, k: int, base: float, alpha: float, per: str = "collector") -> list[float]:
    """The Ape-X epsilon of each of the K envs of exploration slot `slot` when the run has `slots` slots (N).

    per "stream": stream i = slot x K + k gets stream_epsilons' value over N x K streams. per "collector": all K
    envs of slot s get collector_epsilon(s, N) -- except with N = 1, where the per-collector formula
    base ** (1 + alpha * s / (N - 1)) has no spread to give (it divides by zero): a lone collector spreads the
    epsilons over its own K envs instead, as per "stream" does. Slots past N continue the sequence either way.
    """
    if per == "stream" or slots <= 1:
        return stream_epsilons(slot * k, k, max(1, slots) * k, base, alpha)
    return [collector_epsilon(slot, slots, base, alpha)] * k
