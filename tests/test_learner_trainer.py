"""The Learner API: warmup/ratio gating, prefetch thread roles, broadcasts, stats."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.test_learner_fakes import FakeReplay, make_learner, small_config


def test_maybe_train_waits_for_warmup_then_respects_ratio() -> None:
    replay = FakeReplay(transitions_added=0)
    learner = make_learner(small_config(warmup_transitions=50, samples_per_insert=1.0, batch_size=8), replay=replay)
    try:
        assert learner.maybe_train(idle_sleep_s=0) == 0
        assert learner.stats()["ratio_state"] == "warming_up"
        assert replay.samples_drawn == 0  # nothing sampled before warmup
        replay.transitions_added = 50  # origin; slack = 2 batches = 16 samples
        assert learner.maybe_train(max_updates=10, time_budget_s=10) == 2
        assert learner.stats()["ratio_state"] == "throttled"
        replay.transitions_added = 50 + 24  # 24 more samples allowed = 3 updates
        assert learner.maybe_train(max_updates=10, time_budget_s=10) == 3
        assert learner.samples == 40
    finally:
        learner.close()


def test_prefetch_thread_owns_sample_and_priority_updates() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(prefetch=True, grad_accum_steps=2), replay=replay)
    try:
        for _ in range(6):
            learner.train_step()
        learner._source.flush()
        assert replay.updates_applied == 6
        assert len(replay.sample_threads) == 1
        assert replay.sample_threads == replay.update_threads
        assert threading.get_ident() not in replay.sample_threads
        st = learner.stats()
        assert 0.0 <= st["data_wait_frac"] <= 1.0
        assert st["updates"] == 6 and st["samples"] == 6 * 16
        assert st["replay_size"] == len(replay)
    finally:
        learner.close()
    assert not learner._source._thread.is_alive()


def test_sync_source_uses_caller_thread() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(prefetch=False), replay=replay)
    try:
        learner.train_step()
        assert replay.sample_threads == replay.update_threads == {threading.get_ident()}
    finally:
        learner.close()


def test_priorities_change_after_update() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(), replay=replay)
    try:
        before = replay.priorities.copy()
        learner.train_step()
        assert (replay.priorities != before).sum() > 0
    finally:
        learner.close()


def test_weight_broadcast_versions() -> None:
    calls: list[tuple[int, dict]] = []
    learner = make_learner(small_config(weight_broadcast_every=3),
                           on_weights=lambda v, sd: calls.append((v, {k: t.clone() for k, t in sd.items()})))
    try:
        learner.maybe_train(max_updates=7, time_budget_s=60)
        assert [v for v, _ in calls] == [0, 3, 6]  # version = updates at publication
        assert set(calls[0][1]) == set(learner.online.state_dict())
        assert not torch.equal(calls[0][1]["head.advantage.2.weight"], calls[2][1]["head.advantage.2.weight"])
        assert learner.stats()["weight_version"] == 6
    finally:
        learner.close()


def test_prefetch_error_surfaces_in_training_loop() -> None:
    class Broken(FakeReplay):
        def sample(self, batch_size, beta=0.4):
            raise RuntimeError("replay exploded")

    learner = make_learner(small_config(prefetch=True), replay=Broken())
    try:
        with pytest.raises(RuntimeError, match="replay exploded"):
            learner.train_step()
    finally:
        learner.close()


def test_stats_keys_and_interval_reset() -> None:
    learner = make_learner()
    try:
        learner.run_updates(3)
        st = learner.stats()
        for key in ("loss", "td_error", "mean_q", "grad_norm", "updates", "samples", "updates_per_s",
                    "samples_per_s", "data_wait_frac", "ratio_state", "replay_ratio", "compile_s", "beta",
                    "weight_version", "precision"):
            assert key in st, key
        assert np.isfinite(st["loss"]) and st["updates_per_s"] > 0
        assert learner.stats() == st  # cached for meter.min_period_s: cheap to poll
        learner.meter.window_s = learner.meter.min_period_s = 0.0
        learner.stats()
        again = learner.stats()  # no update since the previous read
        assert again["updates_per_s"] == 0.0 and again["loss"] == st["loss"]  # last means kept
    finally:
        learner.close()


def test_replay_returning_wrong_size_is_an_error() -> None:
    class Short(FakeReplay):
        def sample(self, batch_size, beta=0.4):
            return super().sample(batch_size - 1, beta)

    learner = make_learner(replay=Short())
    try:
        with pytest.raises(ValueError, match="batch_size x grad_accum_steps"):
            learner.train_step()
    finally:
        learner.close()


def test_vector_observations_train() -> None:
    """Low-dimensional observations ([B, 1, D], MLP torso) go through the same update."""
    replay = FakeReplay(obs_shape=(6,), stack=1, num_actions=3)
    learner = make_learner(small_config(batch_size=16), replay=replay)
    try:
        learner.run_updates(3)
        assert np.isfinite(learner.stats()["loss"])
        assert not learner.channels_last
    finally:
        learner.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("storage", ["cpu", "cuda"])
def test_cuda_learner_pinned_and_device_storage(storage: str) -> None:
    """CUDA: CPU storage goes through pinned buffers + side-stream copies; GPU storage is used as is."""
    from learner.learner_bench import NUM_ACTIONS, OBS_SHAPE, STACK, RandomReplay
    from learner.trainer import Learner

    replay = RandomReplay(storage)
    cfg = small_config(device="cuda", precision="auto", prefetch=True, batch_size=64, grad_accum_steps=2)
    learner = Learner(cfg, OBS_SHAPE, np.uint8, STACK, NUM_ACTIONS, replay, torch.device("cuda"))
    try:
        learner.run_updates(5)
        st = learner.stats()
        assert st["precision"] == "fp16" and np.isfinite(st["loss"]) and st["updates"] == 5
        assert learner.channels_last
    finally:
        learner.close()
