"""The checkpoint shipped in docs/checkpoints/mario-1-1-cpu still loads and plays with the current code.

It is loaded the way `python -m evaluate` loads it (every file checked against meta.json's sizes and
sha256, the run config read from the checkpoint) and plays greedy steps on the real Mario emulator
through the evaluator's own episode loop: the actions are valid, the same on two plays, and Mario
moves right.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from evaluate.evaluate import _build_policy, _load, play_episode
from shared.env_factory import make_env

SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "checkpoints" / "mario-1-1-cpu"
STEPS = 48  # agent steps (x4 emulator frames each): a couple of seconds per play


def test_the_shipped_checkpoint_matches_its_recorded_sha256() -> None:
    meta = json.loads((SHIPPED / "checkpoint" / "meta.json").read_text())
    assert sorted(meta["files"]) == ["model.pt", "optimizer.pt", "rng.pt", "scaler.pt"]
    for name, info in meta["files"].items():
        data = (SHIPPED / "checkpoint" / name).read_bytes()
        assert data[:40] != b"version https://git-lfs.github.com/spec/"[:40], f"{name} is a Git LFS pointer"
        assert (len(data), hashlib.sha256(data).hexdigest()) == (info["bytes"], info["sha256"]), name


def _greedy_play(data, cfg) -> tuple[list[int], int, int]:
    """(actions, x_pos after the first step, x_pos after STEPS steps) of one greedy play from reset(seed=0)."""
    env = make_env(cfg.env)
    try:
        policy, stack = _build_policy(data, env, epsilon=0.0, rng=np.random.default_rng(0))
        actions: list[int] = []
        positions: list[int] = []
        step = env.step

        def recording_step(action):  # the evaluator's loop, with each action and position noted
            actions.append(int(action))
            out = step(action)
            positions.append(int(out[4].get("x_pos", 0)))
            return out

        env.step = recording_step
        result = play_episode(env, policy, stack, 0, seed=0, max_steps=STEPS)
    finally:
        env.close()
    assert result.steps == len(actions) and result.world == 1 and result.stage == 1
    return actions, positions[0], positions[-1]


def test_the_shipped_checkpoint_plays_the_same_valid_greedy_actions_twice() -> None:
    data, cfg, run_dir = _load(SHIPPED)  # CheckpointError (EvalError) if any file's size or sha256 differs
    assert run_dir == SHIPPED and data.path == SHIPPED / "checkpoint" and not data.has_replay
    assert cfg.env.env_id == "SuperMarioBros-1-1-v0" and data.geometry["num_actions"] == 5
    first, x_start, x_end = _greedy_play(data, cfg)
    second, *_ = _greedy_play(data, cfg)
    assert len(first) == STEPS, "the greedy play ended before its steps (died or finished)"
    num_actions = int(data.geometry["num_actions"])
    assert all(0 <= a < num_actions for a in first), first
    assert first == second  # greedy and a deterministic emulator: the same play
    assert x_end > x_start, (x_start, x_end, first)  # a trained policy runs right


@pytest.mark.parametrize("name", ["model.pt", "rng.pt"])
def test_a_modified_copy_of_the_shipped_checkpoint_is_refused(tmp_path, name: str) -> None:
    """The control for the sha256 check above: one flipped byte in a copy and loading names the file."""
    import shutil

    from evaluate.evaluate import EvalError

    shutil.copytree(SHIPPED / "checkpoint", tmp_path / "checkpoint")
    target = tmp_path / "checkpoint" / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(EvalError, match=rf"{name}: sha256 differs from meta\.json"):
        _load(tmp_path)
