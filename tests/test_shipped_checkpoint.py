"""The checkpoints shipped in docs/checkpoints/ (mario-1-1-cpu, mario-1-2-cpu, mario-1-3-cpu, mario-1-4-cpu) still load
and play with the current code.

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

from envs.factory import make_env
from evaluate.evaluate import _build_policy, _load, play_episode

CHECKPOINTS = Path(__file__).resolve().parents[1] / "docs" / "checkpoints"
SHIPPED = CHECKPOINTS / "mario-1-1-cpu"  # the 1-1 one: the modified-copy control below
ALL_SHIPPED = sorted(p for p in CHECKPOINTS.iterdir() if (p / "checkpoint").is_dir())
STEPS = 48  # agent steps (x4 emulator frames each): a couple of seconds per play


def test_every_shipped_checkpoint_is_listed_here() -> None:
    levels = {CHECKPOINTS / f"mario-1-{stage}-cpu" for stage in (2, 3, 4)}
    assert SHIPPED in ALL_SHIPPED and levels <= set(ALL_SHIPPED)
    for shipped in ALL_SHIPPED:  # what the README's Levels table reads beside each one
        prov = json.loads((shipped / "provenance.json").read_text())
        assert {"training_minutes", "machine", "date", "commands"} <= set(prov), shipped.name


@pytest.mark.parametrize("shipped", ALL_SHIPPED, ids=lambda p: p.name)
def test_the_shipped_checkpoint_matches_its_recorded_sha256(shipped: Path) -> None:
    meta = json.loads((shipped / "checkpoint" / "meta.json").read_text())
    assert sorted(meta["files"]) == ["model.pt", "optimizer.pt", "rng.pt", "scaler.pt"]
    for name, info in meta["files"].items():
        data = (shipped / "checkpoint" / name).read_bytes()
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
    assert result.steps == len(actions) and f"SuperMarioBros-{result.world}-{result.stage}-v0" == cfg.env.env_id
    return actions, positions[0], positions[-1]


@pytest.mark.parametrize("shipped", ALL_SHIPPED, ids=lambda p: p.name)
def test_the_shipped_checkpoint_plays_the_same_valid_greedy_actions_twice(shipped: Path) -> None:
    data, cfg, run_dir = _load(shipped)  # CheckpointError (EvalError) if any file's size or sha256 differs
    assert run_dir == shipped and data.path == shipped / "checkpoint" and not data.has_replay
    level = shipped.name.removeprefix("mario-").removesuffix("-cpu")  # mario-1-2-cpu: trained on 1-2
    assert cfg.env.env_id == f"SuperMarioBros-{level}-v0" and data.geometry["num_actions"] == 5
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
