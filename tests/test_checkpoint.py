"""Checkpoint round trip, atomic layout, and precise CheckpointErrors for corrupt/mismatched files."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from learner.checkpoint import CheckpointError, find_checkpoint
from tests.test_learner_fakes import FakeReplay, make_learner, small_config


def _params(learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.online.state_dict().items()}


def test_round_trip_bit_identical_and_counters_continue(tmp_path) -> None:
    replay = FakeReplay(seed=1)
    a = make_learner(small_config(), replay=replay, seed=0)
    try:
        a.run_updates(5)
        path = a.save_checkpoint(tmp_path, replay=replay, counters={"env_steps": 1234, "episodes": 7})
        assert path == tmp_path / "checkpoint"
        assert sorted(p.name for p in path.iterdir()) == [
            "config.json", "meta.json", "model.pt", "optimizer.pt", "replay", "rng.pt", "scaler.pt"]
        assert not any(p.name.startswith(".checkpoint.tmp") for p in tmp_path.iterdir())
        expected_rng = (torch.rand(3), np.random.rand(3), random.random())
        saved_priorities = replay.priorities.copy()
    finally:
        a.close()

    replay_b = FakeReplay(seed=1)
    b = make_learner(small_config(), replay=replay_b, seed=99)  # different init, untouched priorities
    try:
        counters = b.load_checkpoint(tmp_path, replay=replay_b)
        assert counters["env_steps"] == 1234 and counters["episodes"] == 7 and counters["updates"] == 5
        assert (b.updates, b.samples) == (5, 5 * 8)
        rng_after = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(rng_after[0], expected_rng[0])
        np.testing.assert_array_equal(rng_after[1], expected_rng[1])
        assert rng_after[2] == expected_rng[2]
        saved = torch.load(tmp_path / "checkpoint" / "model.pt", weights_only=True)
        for k, v in b.online.state_dict().items():
            assert torch.equal(v, saved["online"][k]), k  # bit-identical
        for k, v in b.target.state_dict().items():
            assert torch.equal(v, saved["target"][k]), k
        np.testing.assert_array_equal(replay_b.priorities, saved_priorities)
        assert b.optimizer.state_dict()["state"][0]["step"].item() == 5
        b.run_updates(1)
        assert b.updates == 6 and b.samples == 6 * 8  # counters continue
    finally:
        b.close()


def test_resume_continues_identically(tmp_path) -> None:
    """Save after k updates, then one more update from the original and from the restored learner."""
    r1 = FakeReplay(seed=4)
    a = make_learner(small_config(), replay=r1, seed=0)
    try:
        a.run_updates(3)
        a.save_checkpoint(tmp_path, replay=r1)
        r1.rng = np.random.default_rng(77)
        a.run_updates(2)
        after_a = _params(a)
    finally:
        a.close()
    r2 = FakeReplay(seed=4)
    b = make_learner(small_config(), replay=r2, seed=123)
    try:
        b.load_checkpoint(tmp_path, replay=r2)
        r2.rng = np.random.default_rng(77)
        b.run_updates(2)
        for k, v in _params(b).items():
            assert torch.equal(v, after_a[k]), k
        assert b.updates == 5
    finally:
        b.close()


def test_truncated_file_names_the_file(tmp_path) -> None:
    learner = make_learner()
    try:
        learner.run_updates(1)
        path = learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    model = path / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    fresh = make_learner()
    try:
        with pytest.raises(CheckpointError, match=r"model\.pt.*(truncated|bytes)"):
            fresh.load_checkpoint(tmp_path)
        # without the size record the unreadable file is still reported by name
        meta = json.loads((path / "meta.json").read_text())
        del meta["files"]["model.pt"]
        (path / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=r"model\.pt: unreadable"):
            fresh.load_checkpoint(tmp_path)
    finally:
        fresh.close()


def test_shape_mismatch_and_geometry_mismatch(tmp_path) -> None:
    learner = make_learner(small_config(hidden=32))
    try:
        learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    wider = make_learner(small_config(hidden=48))
    try:
        with pytest.raises(CheckpointError, match="hidden: checkpoint 32 vs learner 48"):
            wider.load_checkpoint(tmp_path)
        # the same file with the geometry record edited: the tensor check names the key and shapes
        meta_path = tmp_path / "checkpoint" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["geometry"]["hidden"] = 48
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=r"shape mismatch for head\.\w+\.0\.weight: checkpoint \(32, \d+\) vs learner \(48, \d+\)"):
            wider.load_checkpoint(tmp_path)
    finally:
        wider.close()
    other_actions = make_learner(replay=FakeReplay(num_actions=7))
    try:
        with pytest.raises(CheckpointError, match="num_actions: checkpoint 5 vs learner 7"):
            other_actions.load_checkpoint(tmp_path)
    finally:
        other_actions.close()


def test_missing_key_and_missing_checkpoint(tmp_path) -> None:
    learner = make_learner()
    try:
        with pytest.raises(CheckpointError, match="no checkpoint found"):
            learner.load_checkpoint(tmp_path)
        state = learner.state_dict()
        del state["online"]["head.value.0.bias"]
        with pytest.raises(CheckpointError, match=r"missing key\(s\) \['head\.value\.0\.bias'\]"):
            learner.load_state_dict(state)
    finally:
        learner.close()


def test_atomic_replace_keeps_latest_and_recovers_old(tmp_path) -> None:
    learner = make_learner()
    try:
        learner.run_updates(1)
        learner.save_checkpoint(tmp_path)
        learner.run_updates(1)
        learner.save_checkpoint(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
        assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["counters"]["updates"] == 2
        # a crash between the two renames leaves only checkpoint.old: still found
        (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
        assert find_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
        assert learner.load_checkpoint(tmp_path)["updates"] == 2
    finally:
        learner.close()


def test_maybe_checkpoint_period(tmp_path) -> None:
    learner = make_learner(small_config(checkpoint_every_s=3600.0))
    try:
        assert learner.maybe_checkpoint(tmp_path) is None
        assert learner.maybe_checkpoint(tmp_path, force=True) == tmp_path / "checkpoint"
    finally:
        learner.close()
