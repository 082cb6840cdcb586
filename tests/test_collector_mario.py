"""One real collector process on the Mario emulator fills a real replay buffer (slow)."""

from __future__ import annotations

import importlib.util
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from shared.protocol import ObsSpec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", [
    "nes-py",
    # K envs of one collector time-share the process's one FCEUmm core (envs/mario/retro.py)
    pytest.param("retro", marks=pytest.mark.skipif(importlib.util.find_spec("stable_retro") is None,
                                                   reason="stable-retro not installed (make install EXTRAS=retro)")),
])
def test_mario_collector_fills_buffer_with_real_frames(backend: str) -> None:
    from envs import factory as env_factory
    from replay.buffer import ReplayBuffer
    from tests.support.cluster import launch_collectors
    from tests.support.local_head import LocalHead

    # ez-greedy on (collectors.explore_repeat_mu travels in the WELCOME): held exploratory actions on the real emulator
    cfg = replace(Config(), env=EnvConfig(backend=backend),
                  collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16, explore_repeat_mu=2.0),
                  replay=ReplayConfig(capacity=4096), learner=LearnerConfig(hidden=64),
                  transport=TransportConfig(head_timeout_s=10.0))
    spec = env_factory.env_spec(cfg.env)
    assert spec.obs_shape == (84, 84) and spec.obs_dtype == np.uint8
    buffer = ReplayBuffer(4096, spec.obs_shape, spec.obs_dtype, spec.stack, cfg.replay.n_step, cfg.replay.gamma)
    with LocalHead(cfg, buffer, ObsSpec.of(spec), port=0) as head:
        proc = launch_collectors(head.connect, 1)
        try:
            deadline = time.monotonic() + 180
            while buffer.transitions_added < 200:
                assert time.monotonic() < deadline, "collector did not fill the buffer"
                assert proc.poll() is None, "collector exited early"
                time.sleep(0.2)
            batch = buffer.sample(32)
        finally:
            head.publisher.stop_collectors()
            try:
                proc.wait(timeout=20)
            except Exception:  # noqa: BLE001
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
        stats = head.consolidation.stats()
    assert stats.rejected == 0 and stats.transitions >= 200
    obs = batch.obs.cpu()
    assert obs.dtype == torch.uint8 and tuple(obs.shape) == (32, spec.stack, 84, 84)
    per_frame_std = obs.float().std(dim=(2, 3))
    assert (per_frame_std > 1.0).all(), "a sampled frame is constant: not a real emulator frame"
    assert batch.next_obs.cpu().float().std() > 1.0
