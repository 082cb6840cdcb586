"""A run in segments is one run: `--resume` restores the replay (transitions and priorities), the
weights, the optimizer and the counters exactly as the first segment left them."""

from __future__ import annotations

import filecmp
import threading
from dataclasses import replace

import pytest
import torch

from launcher.head import Head, StopAt
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig

pytestmark = pytest.mark.slow


def cartpole() -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=200),
        collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16),
        replay=ReplayConfig(capacity=5_000),  # smaller than the steps run: the ring has wrapped
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=300, save_replay=True),
        transport=TransportConfig(port=0),
    )


def test_a_resumed_head_holds_the_same_replay_weights_and_counters(tmp_path) -> None:
    run = tmp_path / "run"
    first = Head(cartpole(), run)
    try:
        summary = first.run(StopAt(env_steps=6_000), threading.Event())
    finally:
        first.close()  # the final checkpoint, replay included
    assert summary["updates"] > 0 and summary["env_steps"] >= 6_000
    saved_replay = run / "checkpoint" / "replay"
    assert saved_replay.is_dir()
    weights = {k: v.clone() for k, v in first.learner.online.state_dict().items()}
    size, added = len(first.replay), int(first.replay.transitions_added)
    steps = first.env_steps()  # chunks that arrived while stopping were written too: more than summary's
    assert steps >= summary["env_steps"]

    second = Head(cartpole(), tmp_path / "run2", resume=run)
    try:
        assert len(second.replay) == size and int(second.replay.transitions_added) == added
        second.replay.save(tmp_path / "restored")
        names = sorted(p.name for p in saved_replay.iterdir())
        assert names == sorted(p.name for p in (tmp_path / "restored").iterdir())
        match, mismatch, errors = filecmp.cmpfiles(saved_replay, tmp_path / "restored", names, shallow=False)
        assert mismatch == [] and errors == [], (mismatch, errors)  # frames, actions, rewards, flags, priorities, tree
        for k, v in second.learner.online.state_dict().items():
            assert torch.equal(v, weights[k]), k
        assert second.learner.updates == summary["updates"]
        assert second.env_steps() == steps
        # and it trains on from there
        resumed = second.run(StopAt(env_steps=steps + 1_000), threading.Event())
    finally:
        second.close(checkpoint=False)
    assert resumed["env_steps"] >= steps + 1_000 and resumed["updates"] > summary["updates"]
