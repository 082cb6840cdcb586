"""The learner on the real ReplayBuffer filled from TransitionChunks (prefetch thread = reader)."""

from __future__ import annotations

import numpy as np
import torch

from replay.buffer import ReplayBuffer
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk
from tests.support.learner_fakes import SMALL_OBS, make_learner, small_config

STACK, ACTIONS = 4, 5


def random_chunks(rng: np.random.Generator, count: int, frames: int = 40) -> list[TransitionChunk]:
    """Independent one-episode chunks: FIRST at 0, TERMINATED on the last step."""
    out = []
    for s in range(count):
        acts = rng.integers(0, ACTIONS, size=frames).astype(np.int32)
        acts[-1] = NO_ACTION  # final observation: no action
        flags = np.zeros(frames, dtype=np.uint8)
        flags[0] = FLAG_FIRST
        flags[-2] = FLAG_TERMINATED
        out.append(TransitionChunk(
            stream=s % 4, first_start=0,
            frames=rng.integers(0, 256, size=(frames, *SMALL_OBS), dtype=np.uint8),
            actions=acts, rewards=rng.normal(size=frames).astype(np.float32), flags=flags,
            priorities=np.ones(frames, dtype=np.float32)))
    return out


def test_learner_trains_from_real_replay_with_prefetch(tmp_path) -> None:
    rng = np.random.default_rng(0)
    replay = ReplayBuffer(2000, SMALL_OBS, np.uint8, STACK, n_step=3, gamma=0.99, seed=1)
    for chunk in random_chunks(rng, 10):
        replay.add_chunk(chunk)
    added = replay.transitions_added
    assert added > 100
    cfg = small_config(prefetch=True, warmup_transitions=100, samples_per_insert=4.0, batch_size=16,
                       grad_accum_steps=2)
    learner = make_learner(cfg, replay=replay, seed=0, num_actions=ACTIONS)
    try:
        done = 0
        for _ in range(50):
            done += learner.maybe_train(max_updates=4, time_budget_s=5.0, idle_sleep_s=0)
        # samples <= 4 * inserts since warmup passed + 2 batches of slack
        assert 0 < learner.samples <= 4 * (replay.transitions_added - added) + 2 * 32 + 32
        assert learner.stats()["ratio_state"] == "throttled"
        for chunk in random_chunks(rng, 5):  # more inserts let it train again
            replay.add_chunk(chunk)
        assert learner.maybe_train(max_updates=2, time_budget_s=5.0, idle_sleep_s=0) == 2
        with learner._source.pause():  # reader quiescent: safe to inspect from this thread
            replay.check_valid()
            assert len(replay) > 0
        st = learner.stats()
        assert np.isfinite(st["loss"]) and st["replay_size"] == len(replay)
        path = learner.save_checkpoint(tmp_path, replay=replay)
        assert (path / "replay" / "state.json").is_file()
    finally:
        learner.close()
    restored = ReplayBuffer(2000, SMALL_OBS, np.uint8, STACK, n_step=3, gamma=0.99, seed=1)
    other = make_learner(cfg, replay=restored, seed=5, num_actions=ACTIONS)
    try:
        other.load_checkpoint(tmp_path, replay=restored)
        assert restored.transitions_added == replay.transitions_added
        assert other.updates == done + 2
        for k, v in other.online.state_dict().items():
            assert torch.equal(v, learner.online.state_dict()[k])
    finally:
        other.close()
