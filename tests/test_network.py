"""The Q-network factory (shared/network.py): the nature and impala encoders, and everyone who builds one.

The encoder is a learner.encoder / learner.encoder_width option: the collector, the learner, the WEIGHTS
template and the evaluator build it from the same config and their state_dicts load into each other; the
default stays the nature CNN a shipped checkpoint holds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401  (registers ApeXCounting-v0)
from envs.spec import EnvSpec
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig
from shared.network import ImpalaCNN, NatureCNN, build_q_network, conv_space_to_depth, use_space_to_depth
from tests.support.head_runs import run_inprocess_head
from tests.support.learner_fakes import FakeReplay, learner_of, make_learner, small_config

MARIO = (84, 84), 4, 7  # obs_shape, stack, actions: Mario's 84x84 frames, 4 per state, the simple action set


def _conv(cin: int, cout: int, k: int) -> int:
    return cin * cout * k * k + cout


def _impala_torso_params(stack: int, width: int) -> int:
    """Counted layer by layer: per stage one 3x3 conv in -> C, then 2 residual blocks of 2 convs C -> C."""
    c1, c2, c3 = 16 * width, 32 * width, 32 * width
    return (_conv(stack, c1, 3) + 4 * _conv(c1, c1, 3) + _conv(c1, c2, 3) + 4 * _conv(c2, c2, 3)
            + _conv(c2, c3, 3) + 4 * _conv(c3, c3, 3))


@pytest.mark.parametrize("encoder,width,features", [("nature", 1, 64 * 7 * 7), ("impala", 1, 32 * 11 * 11),
                                                    ("impala", 2, 64 * 11 * 11)])
def test_mario_input_gives_one_q_value_per_action(encoder: str, width: int, features: int) -> None:
    obs_shape, stack, actions = MARIO
    net = build_q_network(obs_shape, stack, actions, encoder=encoder, encoder_width=width)
    assert net.torso.out_features == features
    frames = torch.randint(0, 256, (3, stack, *obs_shape), dtype=torch.uint8)
    with torch.no_grad():
        q = net(frames)
        assert q.shape == (3, actions) and q.dtype == torch.float32 and torch.isfinite(q).all()
        torch.testing.assert_close(net(frames.float() / 255.0), q)  # the network scales uint8 itself
        assert not torch.equal(net(frames[:1]), net(frames[1:2]))  # the input matters


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("dueling", [True, False])
def test_impala_parameter_count(width: int, dueling: bool) -> None:
    obs_shape, stack, actions = MARIO
    hidden = 64
    net = build_q_network(obs_shape, stack, actions, hidden, dueling, "impala", width)
    assert isinstance(net.torso, ImpalaCNN)
    torso = sum(p.numel() for p in net.torso.parameters())
    assert torso == _impala_torso_params(stack, width)
    features = 32 * width * 11 * 11
    head = features * hidden + hidden + hidden * actions + actions
    head += (features * hidden + hidden + hidden + 1) if dueling else 0
    assert sum(p.numel() for p in net.parameters()) == torso + head
    if width == 1:
        assert torso == 97_744


def test_the_default_is_the_nature_cnn_with_its_names_and_init() -> None:
    """Default arguments and an explicit nature/1 draw the same weights from the same seed: the factory's
    default path (and so a default run's checkpoint and WEIGHTS) is the nature CNN."""
    torch.manual_seed(3)
    default = build_q_network((84, 84), 4, 5)
    torch.manual_seed(3)
    explicit = build_q_network((84, 84), 4, 5, 512, True, "nature", 1)
    assert isinstance(default.torso, NatureCNN)
    assert list(default.state_dict()) == list(explicit.state_dict())
    assert all(torch.equal(t, explicit.state_dict()[k]) for k, t in default.state_dict().items())
    assert [k for k in default.state_dict() if k.startswith("torso.")] == [
        f"torso.convs.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]


def test_impala_residual_blocks_add_to_their_input() -> None:
    """A block whose second conv is zero passes its input through unchanged (x + 0)."""
    net = build_q_network((20, 20), 2, 3, 16, True, "impala", 1)
    block = net.torso.stages[0].blocks[0]
    with torch.no_grad():
        block.conv1.weight.zero_()
        block.conv1.bias.zero_()
        x = torch.randn(2, 16, 10, 10)
        assert torch.equal(block(x), x)


@pytest.mark.parametrize("kwargs,words", [
    ({"encoder": "resnet"}, "encoder='resnet'"),
    ({"encoder": "nature", "encoder_width": 2}, "encoder_width=2"),
    ({"encoder": "impala", "encoder_width": 0}, "encoder_width=0"),
])
def test_bad_encoder_arguments_are_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build_q_network((84, 84), 4, 5, **kwargs)


def test_vector_observations_take_only_the_mlp() -> None:
    assert build_q_network((4,), 1, 2, 16).torso.out_features == 16
    with pytest.raises(ValueError, match="vector observations"):
        build_q_network((4,), 1, 2, 16, encoder="impala")


def _impala_config(width: int = 2) -> Config:
    return replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                   collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16),
                   learner=LearnerConfig(device="cpu", hidden=16, encoder="impala", encoder_width=width,
                                         precision="fp32", warmup_transitions=0, samples_per_insert=0.0,
                                         prefetch=False, batch_size=4))


@pytest.mark.parametrize("quantiles", [0, 4], ids=["impala", "impala-qr"])
def test_a_collector_and_a_learner_of_one_config_build_interchangeable_networks(quantiles: int) -> None:
    """The collector (built from what the WELCOME carries of the config), the WEIGHTS template and the learner:
    the same names, shapes and dtypes, and each one's weights load into the other with the same outputs; with
    learner.quantiles the collector acts on the mean of the learner's quantiles."""
    from actors.collector import Collector
    from envs.factory import env_spec
    from ingest.registration import collector_config
    from shared.weights import network_template
    from tests.support.fake_link import FakeLink

    cfg = _impala_config()
    cfg = replace(cfg, learner=replace(cfg.learner, quantiles=quantiles))
    welcomed = Config.from_dict(collector_config(cfg.to_dict()))  # what a collector knows of the run
    assert (welcomed.learner.encoder, welcomed.learner.encoder_width, welcomed.learner.quantiles) == \
        ("impala", 2, quantiles)
    collector = Collector(welcomed, collector_id=1, epsilon=0.1, link=FakeLink())
    learner = learner_of(cfg, collector.spec, FakeReplay(obs_shape=collector.obs_shape, stack=collector.stack,
                                                         num_actions=collector.num_actions))
    try:
        assert isinstance(collector.net.torso, ImpalaCNN) and isinstance(learner.online.torso, ImpalaCNN)
        if quantiles:
            assert tuple(learner.online.state_dict()["head.advantage.2.weight"].shape) == \
                (collector.num_actions * quantiles, 16)
        theirs, ours = collector.net.state_dict(), learner.online.state_dict()
        template = network_template(env_spec(welcomed.env), welcomed.learner)
        assert {k: (tuple(t.shape), t.dtype) for k, t in theirs.items()} == \
            {k: (tuple(t.shape), t.dtype) for k, t in ours.items()} == \
            {k: (tuple(t.shape), t.dtype) for k, t in template.items()}
        assert any(not torch.equal(theirs[k], ours[k]) for k in ours)  # two inits: the load below does something
        learner.train_step()
        assert collector.load_weights(1, {k: v.detach().cpu() for k, v in learner.online.state_dict().items()})
        frames = np.stack([collector.stacks[0], collector.stacks[1]])
        with torch.no_grad():
            expected = learner.online(torch.from_numpy(frames)).numpy()
        np.testing.assert_allclose(collector._q(frames), expected, rtol=1e-5, atol=1e-6)
        learner.online.load_state_dict(collector.net.state_dict())  # and back (strict)
    finally:
        collector.close()
        learner.close()


def test_a_learner_with_the_impala_encoder_trains_and_its_checkpoint_resumes(tmp_path) -> None:
    replay = FakeReplay()
    cfg = small_config(encoder="impala", encoder_width=1)
    learner = make_learner(cfg, replay=replay)
    try:
        before = {k: v.clone() for k, v in learner.online.state_dict().items()}
        stats = [learner.train_step() for _ in range(5)]
        assert all(np.isfinite(s["loss"]) for s in stats) and learner.updates == 5
        assert any(not torch.equal(before[k], v) for k, v in learner.online.state_dict().items())
        assert learner.geometry["encoder"] == "impala" and learner.geometry["encoder_width"] == 1
        learner.save_checkpoint(tmp_path)
        weights = {k: v.clone() for k, v in learner.online.state_dict().items()}
    finally:
        learner.close()
    resumed = make_learner(cfg, replay=FakeReplay(), seed=9)
    try:
        assert resumed.load_checkpoint(tmp_path)["updates"] == 5
        assert all(torch.equal(weights[k], v) for k, v in resumed.online.state_dict().items())
        resumed.train_step()
    finally:
        resumed.close()


def test_the_device_step_trains_an_impala_learner_like_the_eager_one() -> None:
    from tests.support.learner_pairs import IMAGE, assert_same_learners, config, filled_replay, learner_on

    eager = learner_on(config(encoder="impala"), filled_replay(IMAGE))
    device = learner_on(config(encoder="impala", step_mode="device"), filled_replay(IMAGE))
    try:
        assert isinstance(device.online.torso, ImpalaCNN)
        for _ in range(3):
            se, sd = eager.train_step(), device.train_step()
            assert sd["skipped"] == se["skipped"] == 0.0
            assert sd["loss"] == pytest.approx(se["loss"], rel=1e-5)
        assert_same_learners(eager, device, 1e-4, 1e-6)
    finally:
        eager.close()
        device.close()


def test_spec_geometry_records_the_encoder() -> None:
    from learner.checkpoint import geometry_of

    spec = EnvSpec((84, 84), np.uint8, 7, 4)
    assert geometry_of(spec, 512, True) == {"obs_shape": [84, 84], "obs_dtype": "|u1", "stack": 4, "num_actions": 7,
                                            "hidden": 512, "dueling": True, "encoder": "nature", "encoder_width": 1,
                                            "quantiles": 0, "noisy": False}
    assert geometry_of(spec, 64, False, "impala", 2)["encoder_width"] == 2
    assert geometry_of(spec, 64, False, "nature", 1, 32)["quantiles"] == 32
    assert geometry_of(spec, 64, False, "nature", 1, 0, True)["noisy"] is True


@pytest.mark.parametrize("dueling", [True, False])
def test_a_quantile_head_gives_n_quantiles_per_action_and_their_mean_as_q(dueling: bool) -> None:
    """QR-DQN head: [B, A, N] quantiles, Q = their mean; dueling combines value and advantages per quantile."""
    torch.manual_seed(0)
    net = build_q_network((84, 84), 4, 5, 32, dueling, quantiles=8)
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        z, q = net(obs, quantiles=True), net(obs)
        assert z.shape == (3, 5, 8) and q.shape == (3, 5)
        torch.testing.assert_close(q, z.mean(dim=2))
        if dueling:
            features = net.torso(obs)
            value = net.head.value(features).view(3, 1, 8)
            adv = net.head.advantage(features).view(3, 5, 8)
            torch.testing.assert_close(z, value + adv - adv.mean(dim=1, keepdim=True))
    plain = build_q_network((84, 84), 4, 5, 32, dueling)
    with pytest.raises(ValueError, match="one value per action"):
        plain(obs, quantiles=True)


@pytest.mark.slow
def test_an_impala_run_trains_and_its_collectors_act_with_the_learner_s_weights(tmp_path) -> None:
    """The collectors build the impala network from the WELCOME, accept the learner's broadcasts (their chunks
    carry a newer weight version) and the checkpoint records the encoder."""
    geometry = run_inprocess_head(tmp_path, encoder="impala", encoder_width=1)
    assert (geometry["encoder"], geometry["encoder_width"]) == ("impala", 1)


@pytest.mark.parametrize("hw,kernel,stride", [((84, 84), 8, 4), ((36, 36), 8, 4), ((90, 87), 8, 4), ((21, 30), 4, 2),
                                              ((12, 12), 3, 1)])
def test_the_space_to_depth_convolution_is_the_same_function(hw: tuple[int, int], kernel: int, stride: int) -> None:
    """A kernel that is m strides wide as an m x m stride-1 convolution over s x s pixel blocks: the same outputs
    and the same gradients for the layer's own weight and bias (edges the convolution never reads included)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 32, kernel_size=kernel, stride=stride).double()
    x = torch.rand(3, 4, *hw, dtype=torch.float64, requires_grad=True)
    plain, s2d = conv(x), conv_space_to_depth(x, conv)
    assert s2d.shape == plain.shape
    torch.testing.assert_close(s2d, plain, rtol=1e-12, atol=1e-12)
    grads = [torch.autograd.grad(out.square().sum(), (conv.weight, conv.bias, x)) for out in (plain, s2d)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_space_to_depth_refuses_a_convolution_it_cannot_rearrange() -> None:
    x = torch.rand(1, 4, 20, 20)
    for conv in (torch.nn.Conv2d(4, 8, 5, stride=2), torch.nn.Conv2d(4, 8, 4, stride=2, padding=1)):
        with pytest.raises(ValueError, match="multiple of stride"):
            conv_space_to_depth(x, conv)


def test_space_to_depth_is_a_switch_of_the_nature_torso_only() -> None:
    """auto is on with CUDA and off on a CPU; the parameters and their names stay (checkpoints load either
    way); the impala and MLP torsos have no such layer. The network computes the same Q-values either way."""
    net = build_q_network(*MARIO)
    keys = list(net.state_dict())
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    q_plain = net(frames)
    assert use_space_to_depth(net, "auto", "cuda") and net.torso.space_to_depth
    torch.testing.assert_close(net(frames), q_plain, rtol=1e-5, atol=1e-5)
    assert list(net.state_dict()) == keys
    assert not use_space_to_depth(net, "auto", "cpu") and not net.torso.space_to_depth
    assert use_space_to_depth(net, "on", "cpu") and not use_space_to_depth(net, "off", "cuda")
    assert not use_space_to_depth(build_q_network(*MARIO, encoder="impala"), "on", "cuda")
    assert not use_space_to_depth(build_q_network((8,), 4, 3), "on", "cuda")

