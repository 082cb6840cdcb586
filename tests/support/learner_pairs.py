"""Pairs of small learners on one simulated replay, for the tests that compare learner.step_modes.

Two learners built by `learner_on` at one seed over `filled_replay`s of one shape start from the same
weights and replay contents; `assert_same_learners` says they trained alike (weights, target, Adam state,
priorities).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from envs.spec import EnvSpec
from replay.buffer import ReplayBuffer
from replay.device_ring import MASS
from shared.config import Config, LearnerConfig, ReplayConfig
from tests.support.replay_streams import chunks_for, make_streams

IMAGE = (36, 36)  # the smallest frame the Nature CNN takes: the Mario code path, small
VECTOR = (64,)  # uint8 vectors: the MLP path, quick to compile
STACK, N_STEP, GAMMA, ACTIONS = 4, 3, 0.97, 5


def sim_chunks(shape: tuple[int, ...], seed: int = 21, streams: int = 4) -> list:
    """The chunks of a few simulated collector streams (tests/support/replay_streams.py)."""
    rng = np.random.default_rng(seed)
    sims = make_streams(streams, shape, rng, episodes=4, max_len=60)
    return [c for s in sims for c, _ in chunks_for(s, STACK, N_STEP, rng, max_new=40, min_new=8)]


def filled_replay(shape: tuple[int, ...], capacity: int = 3000, seed: int = 5, prioritized: bool = True) -> ReplayBuffer:
    """The project's replay holding `sim_chunks(shape)`."""
    buf = ReplayBuffer(capacity, shape, np.uint8, STACK, N_STEP, GAMMA, max_chunk_frames=64, seed=seed,
                       prioritized=prioritized)
    buf.add_chunks(sim_chunks(shape))
    return buf


def config(**overrides) -> Config:
    """A small CPU learner's config (fp32, batch 8, no warm-up, no ratio), these LearnerConfig fields changed."""
    base = LearnerConfig(device="cpu", batch_size=8, hidden=32, precision="fp32", warmup_transitions=0,
                         samples_per_insert=0.0, prefetch=False, weight_broadcast_every=3, target_update_every=2,
                         max_grad_norm=1.0)
    return Config(learner=replace(base, **overrides), replay=ReplayConfig(beta_steps=10))


def learner_on(cfg: Config, replay: ReplayBuffer, seed: int = 0):
    """A Learner on `replay`, its weights drawn after torch.manual_seed(seed)."""
    from learner.trainer import Learner

    torch.manual_seed(seed)
    spec = EnvSpec(replay.obs_shape, np.uint8, ACTIONS, STACK)
    return Learner(cfg.learner, cfg.replay, spec, replay, "cpu", config_json=cfg.to_json())


def assert_same_learners(eager, device, rtol: float, atol: float) -> None:
    """Weights, target, Adam state and priorities of two learners within float tolerance."""
    for name, t in eager.online.state_dict().items():
        torch.testing.assert_close(device.online.state_dict()[name], t, rtol=rtol, atol=atol, msg=name)
    for name, t in eager.target.state_dict().items():
        torch.testing.assert_close(device.target.state_dict()[name], t, rtol=rtol, atol=atol, msg=name)
    se, sd = eager.optimizer.state_dict()["state"], device.optimizer.state_dict()["state"]
    assert se.keys() == sd.keys()
    for k in se:
        assert float(se[k]["step"]) == float(sd[k]["step"])
        torch.testing.assert_close(sd[k]["exp_avg"], se[k]["exp_avg"], rtol=rtol, atol=atol)
        torch.testing.assert_close(sd[k]["exp_avg_sq"], se[k]["exp_avg_sq"], rtol=rtol, atol=atol * atol)
    leaves_e = eager.replay.reader.tree.leaves()
    mass_d = device._source.ring.table[MASS].numpy()
    assert np.array_equal(leaves_e > 0, mass_d > 0)
    np.testing.assert_allclose(mass_d, leaves_e, rtol=max(rtol, 1e-6))
