"""A run in segments is one run: `--resume` restores the replay (transitions, priorities and the
sampler's random generator), the weights, the optimizer and the counters exactly as the first
segment left them."""

from __future__ import annotations

import filecmp
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from launcher.head import Head, StopAt
from learner.checkpoint import CheckpointError
from learner.trainer import Learner
from replay.buffer import ReplayBuffer
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
from shared.config import Config, LearnerConfig, ReplayConfig
from tests.support.head_runs import cartpole
from tests.support.learner_fakes import learner_of


@pytest.mark.slow
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

    # a refused resume (another network width) leaves the run's config.json, its record of how it was trained
    recorded = (run / "config.json").read_text()
    wider = replace(cartpole(), learner=replace(cartpole().learner, hidden=2 * cartpole().learner.hidden))
    with pytest.raises(CheckpointError, match="hidden"):
        Head(wider, run, resume=run)
    assert (run / "config.json").read_text() == recorded


# ---------------------------------------------------------------------- segments == one run, exactly
OBS, STACK, ACTIONS = (4,), 2, 2  # CartPole's geometry: 4 floats, 2 actions


def _chunks(first_stream: int, count: int) -> list[TransitionChunk]:
    """`count` whole episodes as chunks, the same every call (the data, not the replay, is seeded)."""
    data = np.random.default_rng(1000 + first_stream)
    out = []
    for k in range(count):
        steps = int(data.integers(4, 24))
        flags = np.zeros(steps + 1, dtype=np.uint8)
        flags[0] = FLAG_FIRST
        flags[steps - 1] = FLAG_TERMINATED if k % 3 else FLAG_TRUNCATED
        out.append(TransitionChunk(
            first_stream + k, 0, data.normal(size=(steps + 1, *OBS)).astype(np.float32),
            np.append(data.integers(0, ACTIONS, steps), NO_ACTION).astype(np.int32),
            data.normal(size=steps + 1).astype(np.float32), flags,
            (data.random(steps + 1) + 0.1).astype(np.float32)))
    return out


def _config() -> Config:
    return Config(
        learner=LearnerConfig(device="cpu", batch_size=16, hidden=32, precision="fp32", warmup_transitions=0,
                              samples_per_insert=0.0, prefetch=False, target_update_every=3,
                              weight_broadcast_every=4, torch_threads=1),
        replay=ReplayConfig(beta_steps=50))


def _segment(seed: int | None, config: Config | None = None) -> tuple[Learner, ReplayBuffer]:
    """A learner and its replay built as the head builds them; `seed` only picks the sampler's stream."""
    buf = ReplayBuffer(256, OBS, np.float32, STACK, 3, 0.97, seed=seed)
    return learner_of(config or _config(), EnvSpec(OBS, np.float32, ACTIONS, STACK), buf, "cpu"), buf


def test_a_resume_trains_with_the_lr_and_eps_it_is_given(tmp_path, caplog) -> None:
    """Adam's saved state carries the lr and eps it was trained with: restoring it silently kept them, so a
    resume told `--set learner.lr=...` trained on with the old rate. The config's values win; the moments and
    step stay the checkpoint's."""
    first = _chunks(0, 12)
    part, part_buf = _segment(seed=5)
    try:
        _train(part, part_buf, first, 5)
        part.save_checkpoint(tmp_path / "run", replay=part_buf)
        saved = part.optimizer.state_dict()
    finally:
        part.close()
    cfg = _config()
    slower = replace(cfg, learner=replace(cfg.learner, lr=cfg.learner.lr / 4, adam_eps=1e-6))
    resumed, resumed_buf = _segment(seed=None, config=slower)
    try:
        with caplog.at_level("INFO"):
            resumed.load_checkpoint(tmp_path / "run", replay=resumed_buf)
        groups = resumed.optimizer.param_groups
        assert [(g["lr"], g["eps"]) for g in groups] == [(cfg.learner.lr / 4, 1e-6)] * len(groups)
        _same_optimizer({**resumed.optimizer.state_dict(), "param_groups": saved["param_groups"]}, saved)
        assert "Adam lr" in caplog.text and "from the config" in caplog.text
    finally:
        resumed.close()


def _train(learner: Learner, buf: ReplayBuffer, chunks: list[TransitionChunk], updates: int) -> None:
    for chunk in chunks:
        assert buf.add_chunk(chunk) > 0
    learner.run_updates(updates)


def _same_optimizer(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for pid, entry in a["state"].items():
        assert entry.keys() == b["state"][pid].keys()
        for key, value in entry.items():  # step, exp_avg, exp_avg_sq
            assert torch.equal(value, b["state"][pid][key]), (pid, key)


def _same_networks(a: Learner, b: Learner) -> None:
    for net in ("online", "target"):
        sa, sb = getattr(a, net).state_dict(), getattr(b, net).state_dict()
        assert sa.keys() == sb.keys()
        for k, v in sa.items():
            assert torch.equal(v, sb[k]), (net, k)


def _same_replay(a: ReplayBuffer, b: ReplayBuffer, scratch: Path) -> None:
    """Byte-identical saves: frames, per-slot metadata, priorities (tree leaves), cursors, counters and
    the sampler's generator state."""
    a.save(scratch / "a")
    b.save(scratch / "b")
    names = sorted(p.name for p in (scratch / "a").iterdir())
    assert names == sorted(p.name for p in (scratch / "b").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(scratch / "a", scratch / "b", names, shallow=False)
    assert mismatch == [] and errors == [], (mismatch, errors)
    np.testing.assert_array_equal(a._reader.tree.nodes, b._reader.tree.nodes)
    assert a._reader.rng.bit_generator.state == b._reader.rng.bit_generator.state
    assert (len(a), a.transitions_added, a.frames_stored) == (len(b), b.transitions_added, b.frames_stored)


def test_save_and_resume_in_a_fresh_process_state_equals_one_uninterrupted_run(tmp_path) -> None:
    """N updates, checkpoint, M more in a learner and replay built with another seed (nothing reseeded by
    the test): weights, target, Adam's moments and step, replay contents, priorities, generator states and
    counters equal those of one N+M run. More chunks arrive after the checkpoint, so the ring wraps and the
    restored write cursor matters too."""
    first, later = _chunks(0, 12), _chunks(100, 12)
    n, m = 7, 9
    torch.manual_seed(0)  # the same initial weights for both runs: construction, not resumption
    whole, whole_buf = _segment(seed=5)
    torch.manual_seed(0)
    part, part_buf = _segment(seed=5)
    try:
        _train(whole, whole_buf, first, n)
        _train(whole, whole_buf, later, m)
        _train(part, part_buf, first, n)
        part.save_checkpoint(tmp_path / "run", replay=part_buf)
    finally:
        part.close()
    resumed, resumed_buf = _segment(seed=None)  # another initialisation and sampler stream
    try:
        assert resumed_buf._reader.rng.bit_generator.state != whole_buf._reader.rng.bit_generator.state
        counters = resumed.load_checkpoint(tmp_path / "run", replay=resumed_buf)
        assert counters["updates"] == n
        _train(resumed, resumed_buf, later, m)
        assert whole_buf.capacity < whole_buf._writer.abs_cursor  # the ring wrapped after the checkpoint
        assert (resumed.updates, resumed.samples) == (whole.updates, whole.samples) == (n + m, (n + m) * 16)
        # publications are events, not state: the resumed process publishes its restored weights once more
        assert resumed.broadcasts == whole.broadcasts + 1
        _same_networks(resumed, whole)
        _same_optimizer(resumed.optimizer.state_dict(), whole.optimizer.state_dict())
        assert int(resumed.optimizer.state_dict()["state"][0]["step"]) == n + m
        _same_replay(resumed_buf, whole_buf, tmp_path)
    finally:
        resumed.close()
        whole.close()
