"""evaluate.average: the parameter-wise mean of several checkpoints' online networks, written as an
evaluation-only checkpoint that loads and plays like any other. Checkpoints come from real
`Learner.save_checkpoint` calls (different seeds, so their weights differ)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from envs.testing import COUNTING_ENV_ID
from evaluate.average import AverageError, average_networks
from evaluate.average import main as average_main
from evaluate.evaluate import main as evaluate_main
from learner.checkpoint import load_checkpoint
from shared.config import EnvConfig
from tests.support.learner_fakes import FakeReplay, make_learner, small_config


def _run(run_dir: Path, seed: int, env_steps: int, **learner_overrides) -> Path:
    """A run dir whose checkpoint plays the counting env (84x84 uint8 frames, 4 actions)."""
    env = EnvConfig(env_id=COUNTING_ENV_ID)
    cfg = replace(small_config(**learner_overrides), env=env)
    replay = FakeReplay(obs_shape=(env.frame_size, env.frame_size), stack=env.frame_stack, num_actions=4, pool=16)
    learner = make_learner(cfg, replay=replay, seed=seed)
    try:
        learner.run_updates(1)
        learner.save_checkpoint(run_dir, counters={"env_steps": env_steps, "episodes": 3})
    finally:
        learner.close()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("average")
    return [_run(base / f"run{i}", seed=i, env_steps=1000 * (i + 1)) for i in range(3)]


def test_the_mean_of_three_networks_is_written_and_plays(runs: list[Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "mean"
    assert average_main([*map(str, runs), "--out", str(out)]) == 0
    assert "the mean of 3 networks" in capsys.readouterr().out
    nets = [load_checkpoint(r).model["online"] for r in runs]
    mean = load_checkpoint(out)
    assert not mean.optimizer["state"] and not mean.has_replay  # evaluation-only, like an export
    assert mean.counters["env_steps"] == 3000  # the last source's counters
    for key, value in mean.model["online"].items():
        expected = sum(n[key].double() for n in nets) / 3
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-6)
        assert not torch.equal(value, nets[0][key]) or torch.equal(nets[0][key], nets[1][key])
    record = json.loads((out / "average.json").read_text())
    assert [s["counters"]["env_steps"] for s in record["sources"]] == [1000, 2000, 3000]
    assert record["weights"] == [1.0, 1.0, 1.0]
    assert evaluate_main([str(out), "--episodes", "1", "--no-video", "--out", str(tmp_path / "eval")]) == 0


def test_weights_and_a_network_averaged_with_itself(runs: list[Path]) -> None:
    a, b = load_checkpoint(runs[0]), load_checkpoint(runs[1])
    same = average_networks([a, a])
    for key, value in same.model["online"].items():
        torch.testing.assert_close(value, a.model["online"][key].float(), rtol=0, atol=1e-7)
    tilted = average_networks([a, b], weights=[3.0, 1.0])
    for key, value in tilted.model["online"].items():
        expected = 0.75 * a.model["online"][key].double() + 0.25 * b.model["online"][key].double()
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("weights", [[1.0], [1.0, -1.0], [0.0, 0.0], [1.0, float("inf")], [1.0, float("nan")]])
def test_bad_weights_are_refused(runs: list[Path], weights: list[float]) -> None:
    a, b = load_checkpoint(runs[0]), load_checkpoint(runs[1])
    with pytest.raises(AverageError, match="weight"):
        average_networks([a, b], weights=weights)


def test_one_checkpoint_or_a_missing_one_exits_2_with_one_line(runs: list[Path], tmp_path: Path, capsys) -> None:
    assert average_main([str(runs[0]), "--out", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "at least two" in err
    assert average_main([str(runs[0]), str(tmp_path / "no-such-run"), "--out", str(tmp_path / "two")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "no-such-run" in err
    assert not (tmp_path / "one").exists() and not (tmp_path / "two").exists()


def test_networks_of_different_shapes_are_refused(runs: list[Path], tmp_path: Path, capsys) -> None:
    wide = _run(tmp_path / "wide", seed=0, env_steps=10, hidden=64)
    assert average_main([str(runs[0]), str(wide), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "does not match this first checkpoint: hidden: checkpoint 64 vs first checkpoint 32" in err, err
    assert not (tmp_path / "out").exists()
