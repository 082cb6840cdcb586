"""Config validation: every profile validates; bad values name the field, value and what is allowed;
env presets apply alike however the env is named (`--env X` or `--set env.env_id=X`)."""

import json

import pytest

from config_optimized import (
    ACROBOT_PRESET,
    CARTPOLE_PRESET,
    ENV_PRESETS,
    MARIO_PRESET,
    PROFILES,
    SMALL_ENV_PRESET,
    env_preset,
    load_config,
    load_profile,
)
from launcher.cli import parse_args
from shared.config import MARIO_DEFAULT_ENV, Config, ConfigError
from shared.config_checks import estimate_replay_bytes

pytestmark = pytest.mark.envonly  # no torch needed: also runs under Python 3.13


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_validates(name):
    cfg = load_profile(name)
    cfg.check_valid(available_bytes=512 * 2**30)  # a big machine: only field rules are checked here


def test_auto_profile_fits_this_machine():
    load_profile("auto").check_valid()


def test_overrides_are_typed():
    cfg = load_profile("cpu", ["replay.capacity=200000", "learner.lr=3e-4", "env.clip_rewards=true", "env.env_id=CartPole-v1"])
    assert cfg.replay.capacity == 200_000
    assert cfg.learner.lr == pytest.approx(3e-4)
    assert cfg.env.clip_rewards is True
    assert cfg.env.env_id == "CartPole-v1"
    assert load_profile("cpu", ["replay.capacity=1e5"]).replay.capacity == 100_000


@pytest.mark.parametrize(
    "override, words",
    [
        ("replay.capacity=abc", ["replay.capacity", "int"]),
        ("replay.nope=1", ["replay.nope", "allowed in replay", "capacity"]),
        ("nosection.x=1", ["nosection", "allowed", "learner"]),
        ("learner.lr", ["section.field=value"]),
        ("env.clip_rewards=maybe", ["env.clip_rewards", "bool"]),
    ],
)
def test_bad_override_names_the_problem(override, words):
    with pytest.raises(ConfigError) as err:
        load_profile("cpu", [override])
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "override, field, allowed",
    [
        ("env.action_set=diagonal", "env.action_set", "right_only, simple, complex"),
        ("env.frame_skip=0", "env.frame_skip", "[1, 16]"),
        ("replay.gamma=1.5", "replay.gamma", "[0.0, 1.0]"),
        ("replay.alpha=-0.1", "replay.alpha", "[0.0, 1.0]"),
        ("learner.precision=fp8", "learner.precision", "auto, fp32, bf16, fp16"),
        ("learner.compile_mode=fast", "learner.compile_mode", "off, default"),
        ("learner.space_to_depth=yes", "learner.space_to_depth", "auto, on, off"),
        ("learner.target_epsilon=1.5", "learner.target_epsilon", "[0.0, 1.0]"),
        ("learner.batch_size=0", "learner.batch_size", "[1, 65536]"),
        ("learner.encoder=resnet", "learner.encoder", "nature, impala"),
        ("learner.encoder_width=0", "learner.encoder_width", "[1, 64]"),
        ("collectors.count=-1", "collectors.count", "[0, 1024]"),
        ("transport.bind=0.0.0.0", "transport.bind", "curve_keys_dir"),
        ("transport.socket_buffer_bytes=-1", "transport.socket_buffer_bytes", "[0, 1073741824]"),
        ("learner.warmup_transitions=10000000", "learner.warmup_transitions", "replay.capacity"),
        ("collectors.heartbeat_s=6", "collectors.heartbeat_s", "half of transport.head_timeout_s"),
    ],
)
def test_bad_value_names_field_value_and_allowed(override, field, allowed):
    cfg = load_profile("cpu", [override])
    with pytest.raises(ConfigError) as err:
        cfg.check_valid(available_bytes=512 * 2**30)
    message = str(err.value)
    assert field in message and override.split("=", 1)[1] in message and allowed in message


def test_replay_that_does_not_fit_is_refused_with_the_estimate():
    cfg = load_profile("cpu", ["replay.capacity=3000000"])
    needed = estimate_replay_bytes(cfg)
    with pytest.raises(ConfigError) as err:
        cfg.check_valid(available_bytes=4 * 2**30)
    assert "replay.capacity=3000000" in str(err.value) and str(needed) in str(err.value)


def test_unknown_profile():
    with pytest.raises(ConfigError, match="allowed one of cpu, gpu-workstation, gpu-server, auto"):
        load_profile("laptop")


def test_json_round_trip_and_unknown_fields():
    cfg = load_profile("gpu-server")
    assert Config.from_dict(json.loads(cfg.to_json())) == cfg
    data = cfg.to_dict()
    data["learner"]["bogus"] = 1
    with pytest.raises(ConfigError, match="bogus"):
        Config.from_dict(data)


# ---------------------------------------------------------------- env presets (config_optimized.py)


def _field(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _typed(key: str, raw: str):
    """A preset's string value as the config field holds it."""
    return _field(Config().with_overrides([f"{key}={raw}"]), key)


def _cli(tmp_path, *flags: str) -> dict:
    """parse_args on the cpu profile; the run dir is fixed (it defaults to a timestamp), port 0 skips the probe."""
    cfg, _ = parse_args(["--profile", "cpu", "--port", "0", "--run-dir", str(tmp_path / "run"), *flags])
    return cfg.to_dict()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", MARIO_DEFAULT_ENV])
def test_env_flag_and_set_env_id_give_the_same_config(tmp_path, env_id):
    by_flag = _cli(tmp_path, "--env", env_id)
    by_set = _cli(tmp_path, "--set", f"env.env_id={env_id}")
    assert by_flag == by_set
    assert by_flag["env"]["env_id"] == env_id
    cfg = Config.from_dict(by_set)
    for key, raw in env_preset(env_id).items():  # the preset reached the config in both spellings
        assert _field(cfg, key) == _typed(key, raw), key
    if env_id == MARIO_DEFAULT_ENV:  # Mario: the profile with the Mario preset, as with no env flag at all
        assert by_set == _cli(tmp_path)
        mario = [f"{k}={v}" for k, v in MARIO_PRESET.items()]
        assert cfg == load_profile("cpu", [*mario, "transport.port=0", f"logging.run_dir={tmp_path / 'run'}"])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
@pytest.mark.parametrize("lr_first", [True, False])
def test_explicit_set_beats_the_preset_in_both_spellings(tmp_path, env_id, lr_first):
    lr = ["--set", "learner.lr=3e-4"]
    for env in (["--env", env_id], ["--set", f"env.env_id={env_id}"]):
        cfg = Config.from_dict(_cli(tmp_path, *(lr + env if lr_first else env + lr)))
        assert env_preset(env_id)["learner.lr"] == "1e-3"
        assert cfg.learner.lr == pytest.approx(3e-4)  # the user's value, not the preset's
        assert cfg.learner.batch_size == 64  # the rest of the preset still applies


def test_cartpole_preset_is_what_the_cartpole_learning_test_needs():
    """tests/test_learning_cartpole.py and BENCHMARKS.md (10/10 seeds solved) ran with exactly these values."""
    cfg = load_config("cpu", ["env.env_id=CartPole-v1"])
    assert (cfg.learner.lr, cfg.learner.batch_size, cfg.transport.max_chunks_in_flight) == (1e-3, 64, 2)
    assert (cfg.learner.hidden, cfg.learner.samples_per_insert, cfg.learner.max_insert_lead) == (256, 8.0, 1000)
    assert (cfg.learner.target_update_every, cfg.learner.weight_broadcast_every, cfg.learner.prefetch) == (50, 25, False)
    assert (cfg.learner.warmup_transitions, cfg.replay.capacity) == (1000, 100_000)
    assert (cfg.env.reward_scale, cfg.env.max_episode_steps, cfg.collectors.eps_base) == (0.1, 500, 0.1)
    assert (cfg.collectors.count, cfg.collectors.envs_per_collector, cfg.collectors.chunk_steps) == (2, 4, 32)
    assert cfg.learner.torch_threads == 0  # the learner's own rule, whatever auto's CPU split gives Mario
    assert len(CARTPOLE_PRESET) == 18  # a new CartPole default belongs in this test (and in BENCHMARKS.md)


def test_preset_selection_by_env_id():
    assert ENV_PRESETS["CartPole-v1"] is CARTPOLE_PRESET and ENV_PRESETS["Acrobot-v1"] is ACROBOT_PRESET
    assert env_preset("CartPole-v1") == CARTPOLE_PRESET and env_preset("Acrobot-v1") == ACROBOT_PRESET
    assert env_preset("Acrobot-v1")["collectors.eps_base"] != CARTPOLE_PRESET["collectors.eps_base"]
    assert env_preset("MountainCar-v0") == SMALL_ENV_PRESET != {}  # any other non-Mario id: the small-env preset
    assert env_preset("SuperMarioBros-2-3-v1") == env_preset(MARIO_DEFAULT_ENV) == MARIO_PRESET != {}
    level_1_3 = env_preset("SuperMarioBros-1-3-v0")  # a per-level preset: a longer horizon, wider exploration
    assert level_1_3 == {**MARIO_PRESET, "replay.gamma": "0.97", "collectors.eps_per": "stream",
                         "collectors.explore_repeat_mu": "2", "collectors.eps_stage_from": "0"}
    assert env_preset("SuperMarioBros-1-3-v1") == MARIO_PRESET  # by exact id only
    env_preset("CartPole-v1")["learner.lr"] = "1"  # a copy: callers cannot change the table
    assert CARTPOLE_PRESET["learner.lr"] == "1e-3"


def test_last_env_id_assignment_picks_the_preset():
    cfg = load_config("cpu", ["env.env_id=Acrobot-v1", "env.env_id=CartPole-v1"])
    assert cfg.env.env_id == "CartPole-v1" and cfg.collectors.eps_base == pytest.approx(0.1)
    cfg = load_config("cpu", ["env.env_id=CartPole-v1", " env.env_id = Acrobot-v1"])
    assert cfg.env.env_id == "Acrobot-v1" and cfg.collectors.eps_base == pytest.approx(0.4)
    mario = [f"{k}={v}" for k, v in MARIO_PRESET.items()]
    assert load_config("cpu", ["env.env_id=CartPole-v1", f"env.env_id={MARIO_DEFAULT_ENV}"]) == load_profile("cpu", mario)


@pytest.mark.parametrize("env_id", [*ENV_PRESETS, "MountainCar-v0", MARIO_DEFAULT_ENV])
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_preset_validates_on_every_profile(env_id, profile):
    cfg = load_config(profile, [f"env.env_id={env_id}"])  # a misspelt preset key raises here
    cfg.check_valid(available_bytes=512 * 2**30)
    for key, raw in env_preset(env_id).items():
        assert _field(cfg, key) == _typed(key, raw), key
