"""The run's EnvSpec is read once: the head builds a non-Mario env at most once at start (none for Mario),
`python -m launcher` once in all (the CLI's checks hand theirs to the head), and every part the head
wires is sized by that one spec."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from envs.spec import EnvSpec
from envs.testing import COUNTING_ENV_ID, CountingEnv
from launcher.head import Head
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from shared.protocol import ObsSpec


@pytest.fixture
def constructions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per CountingEnv built from now on (gymnasium.make looks the class up at each make)."""
    built: list[int] = []
    original = CountingEnv.__init__

    def counted(self, *args, **kwargs) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(CountingEnv, "__init__", counted)
    return built


def counting_config() -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id=COUNTING_ENV_ID, frame_stack=3, reward_scale=0.5, max_abs_reward=40.0),
        collectors=CollectorConfig(count=0),
        replay=ReplayConfig(capacity=10_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=16, dueling=False),
        transport=TransportConfig(port=0),
    )


def test_the_head_builds_a_non_mario_env_once_at_start(tmp_path, constructions) -> None:
    head = Head(counting_config(), tmp_path / "run")
    try:
        assert len(constructions) == 1
        spec = head.env_spec
        assert spec == EnvSpec((84, 84), np.uint8, 4, 3, reward_scale=0.5, max_abs_reward=40.0)
        # every part is sized by that one spec
        assert head.learner.spec is spec
        assert head.learner.geometry == {"obs_shape": [84, 84], "obs_dtype": "|u1", "stack": 3, "num_actions": 4,
                                         "hidden": 16, "dueling": False, "encoder": "nature", "encoder_width": 1,
                                         "quantiles": 0, "noisy": False}
        assert (head.replay.obs_shape, head.replay.stack) == ((84, 84), 3)
        # the data plane holds summaries to the env's time limit too
        assert head.consolidation.spec == ObsSpec.of(spec, max_episode_steps=counting_config().env.max_episode_steps)
        assert head.consolidation.spec.max_episode_steps == counting_config().env.max_episode_steps
        assert head.consolidation.max_abs_reward == 80.0  # unscaled summaries: 40 / 0.5 per step
    finally:
        head.close(checkpoint=False)
    assert len(constructions) == 1


def test_the_head_takes_the_spec_the_cli_read(tmp_path, constructions) -> None:
    from launcher.cli import parse_args

    cfg, opts = parse_args(["--profile", "cpu", "--env", COUNTING_ENV_ID, "--collectors", "0", "--port", "0",
                            "--set", "learner.hidden=16", "--run-dir", str(tmp_path / "run")])
    assert len(constructions) == 1 and opts.env_spec == EnvSpec((84, 84), np.uint8, 4, cfg.env.frame_stack,
                                                                reward_scale=cfg.env.reward_scale)
    head = Head(cfg, opts.run_dir, env_spec=opts.env_spec)
    try:
        assert len(constructions) == 1 and head.env_spec is opts.env_spec
    finally:
        head.close(checkpoint=False)


def test_python_m_launcher_builds_the_env_once_in_all(tmp_path, monkeypatch, constructions) -> None:
    import launcher.__main__ as entry

    monkeypatch.setattr(entry, "_setup_logging", lambda run_dir: None)  # keep the test process's logging as is
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)
    code = entry.main(["--profile", "cpu", "--env", COUNTING_ENV_ID, "--collectors", "0", "--port", "0",
                       "--set", "learner.hidden=16", "--max-seconds", "0", "--run-dir", str(tmp_path / "run")])
    assert code == 0 and len(constructions) == 1
    assert (tmp_path / "run" / "checkpoint" / "meta.json").is_file()


def test_a_mario_head_builds_no_emulator(tmp_path, monkeypatch) -> None:
    import envs.mario.emulator as emulator

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the head built an emulator")

    monkeypatch.setattr(emulator.MarioEmulator, "__init__", boom)
    cfg = replace(counting_config(), env=EnvConfig(frame_size=48, frame_stack=2, action_set="right_only"))
    head = Head(cfg, tmp_path / "run")
    try:
        assert head.env_spec == EnvSpec((48, 48), np.uint8, 5, 2, frame_skip=4, max_abs_reward=20 + 999 + 50)
        assert head.learner.geometry["num_actions"] == 5
    finally:
        head.close(checkpoint=False)
