"""`--seed` fixes the head's randomness: the network's initial weights and the replay sampler's draws
come from the seed, so two heads with one seed start alike and two seeds start apart."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from envs.testing import COUNTING_ENV_ID
from launcher.head import Head
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig


def seeded_config(seed: int) -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id=COUNTING_ENV_ID, frame_stack=3, seed=seed),
        collectors=CollectorConfig(count=0),
        replay=ReplayConfig(capacity=4_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=16, dueling=False),
        transport=TransportConfig(port=0),
    )


def start(seed: int, run_dir) -> tuple[dict[str, torch.Tensor], float]:
    """The new head's initial online weights and its sampler's first uniform draw."""
    torch.manual_seed(12345)  # whatever the process did before must not matter
    np.random.seed(12345)
    head = Head(seeded_config(seed), run_dir)
    try:
        weights = {k: v.detach().clone() for k, v in head.learner.online.state_dict().items()}
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = head.replay._reader.rng.bit_generator.state  # a copy: the head's stays unused
        return weights, float(rng.random())
    finally:
        head.close(checkpoint=False)


def test_one_seed_gives_one_start_and_two_seeds_two(tmp_path) -> None:
    w1, u1 = start(7, tmp_path / "a")
    w2, u2 = start(7, tmp_path / "b")
    w3, u3 = start(8, tmp_path / "c")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert u1 == u2
    assert any(not torch.equal(w1[k], w3[k]) for k in w1)
    assert u1 != u3
