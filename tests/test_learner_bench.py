"""Smoke test of the learner benchmark plumbing (the full run is `python -m bench.learner`)."""

from __future__ import annotations

import torch

from bench.learner import NUM_ACTIONS, OBS_SHAPE, STACK, RandomReplay, _measure
from shared.config import Config, LearnerConfig


def test_random_replay_batches_look_like_the_replay() -> None:
    b = RandomReplay("cpu", pool=64).sample(8)
    assert b.obs.shape == (8, STACK, *OBS_SHAPE) and b.obs.dtype == torch.uint8
    assert b.next_obs.shape == b.obs.shape and b.indices.shape == (8,)
    assert int(b.actions.max()) < NUM_ACTIONS and b.weights.dtype == torch.float32


def test_measure_reports_rates() -> None:
    cfg = Config(learner=LearnerConfig(device="cpu", batch_size=4, precision="fp32", warmup_transitions=0,
                                       samples_per_insert=0.0, hidden=32))
    r = _measure(cfg, torch.device("cpu"), RandomReplay("cpu", pool=64), budget_s=0.05, min_updates=2, warmup=1)
    assert r["updates"] >= 2 and r["updates_per_s"] > 0
    assert abs(r["samples_per_s"] - r["updates_per_s"] * 4) < 1e-6 * r["samples_per_s"]
    assert 0.0 <= r["data_wait_frac"] <= 1.0
