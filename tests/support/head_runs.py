"""Whole runs of the real head for tests: a small CartPole config, and a run in one process on the counting env."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import envs.testing  # noqa: F401  (registers ApeXCounting-v0)
from launcher.head import Head, StopAt
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig


def cartpole() -> Config:
    """A small CartPole run that checkpoints its replay, its ring smaller than a few thousand steps (it wraps)."""
    return replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=200),
        collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16),
        replay=ReplayConfig(capacity=5_000),  # smaller than the steps run: the ring has wrapped
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=300, save_replay=True),
        transport=TransportConfig(port=0),
    )


def run_inprocess_head(tmp_path, **learner_options) -> dict:
    """A whole run in one process (collectors as threads behind the real HELLO/WELCOME/WEIGHTS messages) on the
    counting env's 84x84 frames with these learner options, to 2,000 env steps: it stopped there, trained, rejected
    nothing, and its collectors acted with a broadcast version (one that refused the learner's weights would still
    act with 0). Returns the checkpoint's geometry record."""
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(count=2, envs_per_collector=2, chunk_steps=16),
                  replay=ReplayConfig(capacity=4096),
                  learner=LearnerConfig(device="cpu", precision="fp32", hidden=16, batch_size=8,
                                        warmup_transitions=200, samples_per_insert=0.0, weight_broadcast_every=2,
                                        **learner_options),
                  transport=TransportConfig(port=0))
    head = Head(cfg.check_valid(), tmp_path / "run", inprocess=True)
    try:
        summary = head.run(StopAt(env_steps=2_000, seconds=600), threading.Event())
        stats = head.consolidation.stats()
    finally:
        head.close()
    assert summary["reason"] == "max_env_steps", summary
    assert summary["updates"] >= 2 and stats.rejected == 0
    versions = [c["weight_version"] for c in stats.collectors.values()]
    assert max(versions) >= 2, versions
    return json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())["geometry"]
