"""A new run that starts from another run's network (`learner.init_from`, `--init-from`): fine-tuning.

The online weights of the checkpoint become the new learner's online and target networks; its optimizer,
counters and replay start fresh. A checkpoint that does not fit the network is refused, naming what
differs, before anything changes (in the CLI: exit 2, one line, before any collector starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from learner.checkpoint import CheckpointError, load_checkpoint
from shared.config import Config, ConfigError
from tests.support.learner_fakes import FakeReplay, learner_of, make_learner, small_config, state_copy

SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "checkpoints" / "mario-1-1-cpu"


def _trained_checkpoint(tmp_path: Path, **learner_overrides) -> tuple[Path, dict[str, torch.Tensor]]:
    """A learner's checkpoint after 5 updates (online and target differ: the target synced at update 4)."""
    replay = FakeReplay(seed=1)
    a = make_learner(small_config(**learner_overrides), replay=replay, seed=0)
    try:
        a.run_updates(5)
        a.save_checkpoint(tmp_path, counters={"env_steps": 4321})
        return tmp_path, state_copy(a.online)
    finally:
        a.close()


def test_a_learner_starts_from_another_run_s_network_with_a_fresh_optimizer_and_counters(tmp_path) -> None:
    run, online = _trained_checkpoint(tmp_path)
    saved = load_checkpoint(run)
    assert any(not torch.equal(saved.model["target"][k], v) for k, v in online.items())  # the target lagged
    b = make_learner(small_config(), seed=99)
    try:
        fresh = state_copy(b.online)
        assert any(not torch.equal(fresh[k], v) for k, v in online.items())  # another initialization
        counters = b.load_weights(run)
        assert counters["env_steps"] == 4321 and counters["updates"] == 5  # the source's, for the log
        for k, v in online.items():
            assert torch.equal(b.online.state_dict()[k], v), k  # the source's online network ...
            assert torch.equal(b.target.state_dict()[k], v), k  # ... is the target too, as in a fresh learner
        assert (b.updates, b.samples, b.broadcasts) == (0, 0, 0)
        assert b.optimizer.state_dict()["state"] == {}  # no Adam moments carried over
        b.run_updates(2)
        assert b.updates == 2 and b.optimizer.state_dict()["state"][0]["step"].item() == 2
    finally:
        b.close()


def test_an_evaluation_only_snapshot_is_a_starting_point_too(tmp_path) -> None:
    replay = FakeReplay(seed=2)
    a = make_learner(small_config(), replay=replay, seed=0)
    try:
        a.run_updates(3)
        a.save_eval_snapshot(tmp_path / "best", counters={"env_steps": 77})
        online = state_copy(a.online)
    finally:
        a.close()
    b = make_learner(small_config(), seed=5)
    try:
        assert b.load_weights(tmp_path / "best")["env_steps"] == 77
        assert all(torch.equal(b.target.state_dict()[k], v) for k, v in online.items())
    finally:
        b.close()


def test_a_network_of_another_shape_is_refused_and_nothing_changes(tmp_path) -> None:
    run, _ = _trained_checkpoint(tmp_path, hidden=32)
    wider = make_learner(small_config(hidden=48), seed=3)
    try:
        before = state_copy(wider.online)
        with pytest.raises(CheckpointError, match="hidden: checkpoint 32 vs learner 48") as err:
            wider.load_weights(run)
        assert "\n" not in str(err.value)
        assert all(torch.equal(wider.online.state_dict()[k], v) for k, v in before.items())
    finally:
        wider.close()
    other_actions = make_learner(replay=FakeReplay(num_actions=7))
    try:
        with pytest.raises(CheckpointError, match="num_actions: checkpoint 5 vs learner 7"):
            other_actions.load_weights(run)
    finally:
        other_actions.close()


def test_the_shipped_1_1_network_starts_a_learner_of_today_s_mario_defaults() -> None:
    """The use it is for: a run on another level starting from the shipped 1-1 checkpoint (trained before
    Munchausen targets were the preset's) with the Mario preset of today."""
    from config_optimized import load_config

    cfg = load_config("cpu", ["learner.device=cpu", "learner.prefetch=false"])
    replay = FakeReplay(obs_shape=(84, 84), stack=4, num_actions=5, pool=16)
    learner = learner_of(cfg, EnvSpec((84, 84), np.uint8, 5, 4), replay)
    try:
        counters = learner.load_weights(SHIPPED)
        shipped = load_checkpoint(SHIPPED).model["online"]
        assert counters["env_steps"] > 0
        assert all(torch.equal(learner.online.state_dict()[k], v.to(learner.online.state_dict()[k].dtype))
                   for k, v in shipped.items())
        learner.run_updates(1)  # and it trains from there
    finally:
        learner.close()


def test_the_flag_sets_the_config_field_and_a_missing_checkpoint_is_one_line(tmp_path) -> None:
    from launcher.cli import parse_args

    base = ["--profile", "cpu", "--env", "CartPole-v1", "--port", "0", "--run-dir", str(tmp_path / "r")]
    run, _ = _trained_checkpoint(tmp_path / "src")
    cfg, _ = parse_args([*base, "--init-from", str(run)])
    assert cfg.learner.init_from == str(run)
    assert json.loads(cfg.to_json())["learner"]["init_from"] == str(run)  # what config.json records
    with pytest.raises(ConfigError, match=r"learner\.init_from='[^']*nowhere' is invalid: .*no checkpoint found"):
        parse_args([*base, "--init-from", str(tmp_path / "nowhere")])
    with pytest.raises(ConfigError, match=r"learner\.init_from="):
        parse_args([*base, "--set", f"learner.init_from={tmp_path / 'nowhere'}"])
    assert Config().learner.init_from == ""  # fresh weights unless asked


def _cartpole_checkpoint(tmp_path: Path, flags: list[str]) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint of a learner built as the head builds it for `flags` (CartPole), after one update."""
    from envs.factory import env_spec
    from launcher.cli import parse_args

    cfg, _ = parse_args([*flags, "--run-dir", str(tmp_path / "src")])
    spec = env_spec(cfg.env)
    replay = FakeReplay(obs_shape=spec.obs_shape, stack=spec.stack, num_actions=spec.num_actions, pool=32)
    cfg = replace(cfg, learner=replace(cfg.learner, prefetch=False, warmup_transitions=0, samples_per_insert=0.0))
    learner = learner_of(cfg, spec, replay, "cpu")
    try:
        learner.run_updates(1)
        return learner.save_checkpoint(tmp_path / "src", counters={"env_steps": 999}), state_copy(learner.online)
    finally:
        learner.close()


def test_a_head_starts_from_the_network_and_a_misfit_exits_2_before_any_collector(tmp_path) -> None:
    """`python -m launcher --init-from`: a CartPole head with no collectors (no data, so no update) ends with
    a checkpoint holding the source's network and counters of its own; with another hidden width the head
    refuses it: exit 2, one error line naming the field, no config.json written."""
    from tests.support.cluster import ROOT, head_env

    flags = ["--profile", "cpu", "--env", "CartPole-v1", "--port", "0", "--collectors", "0"]
    src, online = _cartpole_checkpoint(tmp_path, flags)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launcher", *flags, "--max-seconds", "1", "--run-dir", str(run),
                           "--init-from", str(tmp_path / "src")], cwd=ROOT, env=head_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "network from" in proc.stderr and "999 env steps" in proc.stderr, proc.stderr[-3000:]
    data = load_checkpoint(run)
    assert data.counters["updates"] == 0 and data.counters.get("env_steps", 0) == 0
    for k, v in online.items():
        assert torch.equal(data.model["online"][k], v) and torch.equal(data.model["target"][k], v), k
    assert json.loads((run / "config.json").read_text())["learner"]["init_from"] == str(tmp_path / "src")

    misfit = tmp_path / "misfit"
    proc = subprocess.run([sys.executable, "-m", "launcher", *flags, "--max-seconds", "1", "--run-dir", str(misfit),
                           "--set", "learner.hidden=48", "--init-from", str(src)], cwd=ROOT, env=head_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("error: ")]
    assert len(errors) == 1 and "hidden: checkpoint" in errors[0] and "vs learner 48" in errors[0], proc.stderr
    assert not (misfit / "config.json").exists()
