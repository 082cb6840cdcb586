"""Config validation: every profile validates; bad values name the field, value and what is allowed."""

import json

import pytest

from config_optimized import PROFILES, load_profile
from shared.config import Config, ConfigError, estimate_replay_bytes

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
        ("learner.batch_size=0", "learner.batch_size", "[1, 65536]"),
        ("collectors.count=-1", "collectors.count", "[0, 1024]"),
        ("transport.bind=0.0.0.0", "transport.bind", "curve_keys_dir"),
        ("transport.socket_buffer_bytes=-1", "transport.socket_buffer_bytes", "[0, 1073741824]"),
        ("learner.warmup_transitions=10000000", "learner.warmup_transitions", "replay.capacity"),
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
