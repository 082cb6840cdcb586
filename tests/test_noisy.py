"""NoisyNet exploration (learner.noisy_sigma): the factorized Gaussian layer, what travels and is checkpointed, and who
draws noise when (every update in the learner, every step in a collector, never in an evaluation)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from actors.collector import Collector
from evaluate.evaluate import load_greedy
from learner.checkpoint import load_checkpoint
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig
from shared.network import NoisyLinear, build_q_network
from tests.support.fake_link import FakeLink
from tests.support.head_runs import run_inprocess_head
from tests.support.learner_fakes import FakeReplay, make_learner, small_config


def _f(x: torch.Tensor) -> torch.Tensor:
    return x.sign() * x.abs().sqrt()


def test_the_layer_is_mu_plus_sigma_times_factorized_noise_and_its_mean_without_noise() -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(6, 3, sigma0=0.5)
    assert torch.allclose(layer.weight_sigma, torch.full((3, 6), 0.5 / 6 ** 0.5))
    assert layer.weight_mu.abs().max() <= 6 ** -0.5
    with torch.no_grad():  # a non-zero sigma everywhere, so every term shows
        layer.weight_sigma.uniform_(0.1, 0.2)
        layer.bias_sigma.uniform_(0.1, 0.2)
    x = torch.randn(4, 6)
    g = torch.Generator().manual_seed(7)
    layer.reset_noise(g)
    g = torch.Generator().manual_seed(7)
    eps_in, eps_out = _f(torch.randn(6, generator=g)), _f(torch.randn(3, generator=g))
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(eps_out, eps_in)
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias_mu + layer.bias_sigma * eps_out))
    before = layer(x)
    layer.reset_noise()
    assert not torch.allclose(layer(x), before), "new noise, new output"
    layer.noise = False
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight_mu, layer.bias_mu))
    assert set(layer.state_dict()) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}  # noise stays home
    with pytest.raises(ValueError, match="sigma0 > 0"):
        NoisyLinear(2, 2, sigma0=0.0)


def test_acting_without_a_graph_and_learning_with_one_compute_the_same_layer_and_its_gradients() -> None:
    """Without a graph the layer never forms the noisy weight (eps_out * sigma (eps_in * x)); with one it forms it in
    one pass and backs it with one product: the outputs and the gradients are the textbook formula's."""
    torch.manual_seed(3)
    layer = NoisyLinear(40, 7, sigma0=0.5)
    with torch.no_grad():
        layer.weight_sigma.uniform_(0.05, 0.3)
    x = torch.randn(5, 40, dtype=torch.float64)
    layer.double().reset_noise()
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(layer.eps_out, layer.eps_in)
    reference = F.linear(x, weight, layer.bias_mu + layer.bias_sigma * layer.eps_out)
    grads = torch.autograd.grad(reference.square().sum(), [layer.weight_mu, layer.weight_sigma, layer.bias_sigma])
    out = layer(x)
    torch.testing.assert_close(out, reference)
    torch.testing.assert_close(torch.autograd.grad(out.square().sum(), [layer.weight_mu, layer.weight_sigma,
                                                                        layer.bias_sigma]), grads)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference.detach())
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), reference.detach())
    x_grad = x.clone().requires_grad_(True)  # a frozen layer (a target net) still passes gradients to its input
    layer.requires_grad_(False)
    torch.testing.assert_close(torch.autograd.grad(layer(x_grad).sum(), x_grad)[0], weight.detach().sum(0).expand(5, 40))


def test_a_noisy_network_s_head_is_noisy_its_torso_plain_and_its_mean_travels_in_the_state_dict() -> None:
    torch.manual_seed(1)
    net = build_q_network((84, 84), 4, 5, 32, True, noisy_sigma=0.5)
    assert len(net.noisy_layers()) == 4 and not any(isinstance(m, NoisyLinear) for m in net.torso.modules())
    copy = build_q_network((84, 84), 4, 5, 32, True, noisy_sigma=0.1)  # sigma0 is only an init: the load replaces it
    copy.load_state_dict(net.state_dict())
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(net.set_noise(False)(obs), copy.set_noise(False)(obs))
        net.set_noise(True)
        noisy = [net(obs) for _ in range(2)]
        torch.testing.assert_close(noisy[0], noisy[1])  # the noise changes only when drawn
        net.reset_noise()
        assert not torch.allclose(net(obs), noisy[0])
    plain = build_q_network((84, 84), 4, 5, 32, True)
    assert plain.noisy_layers() == [] and plain.set_noise(False) is plain


def test_the_learner_draws_new_noise_every_update_and_learns_the_sigmas() -> None:
    learner = make_learner(small_config(noisy_sigma=0.5, target_update_every=1000), replay=FakeReplay(seed=1), seed=2)
    try:
        assert learner.geometry["noisy"] is True
        layer = learner.online.noisy_layers()[0]
        sigma0 = layer.weight_sigma.detach().clone()
        draws = []
        for _ in range(3):
            learner.run_updates(1)
            draws.append(layer.eps_in.clone())
        assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
        target_eps = learner.target.noisy_layers()[0].eps_in
        assert not torch.equal(target_eps, draws[-1]), "the target net draws its own noise"
        assert not torch.equal(layer.weight_sigma.detach(), sigma0), "the sigmas get gradients"
    finally:
        learner.close()


def test_a_collector_draws_new_noise_every_step() -> None:
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=8),
                  learner=LearnerConfig(hidden=16, noisy_sigma=0.5))
    col = Collector(cfg, collector_id=1, epsilon=0.0, link=FakeLink(), seed=3)
    try:
        layer = col.net.noisy_layers()[0]
        assert layer.noise, "collectors explore with noisy weights"
        seen = []
        for _ in range(3):
            col.step()
            seen.append(layer.eps_out.clone())
        assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    finally:
        col.close()


def test_a_noisy_checkpoint_evaluates_with_its_mean_weights(tmp_path) -> None:
    import gymnasium as gym

    import envs.testing  # noqa: F401  (registers ApeXCounting-v0)

    learner = make_learner(small_config(noisy_sigma=0.5), replay=FakeReplay(obs_shape=(84, 84), num_actions=3, seed=3),
                           num_actions=3, seed=4)
    try:
        learner.run_updates(2)
        learner.save_checkpoint(tmp_path / "run")
        online = learner.online
    finally:
        learner.close()
    data = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert data.geometry["noisy"] is True
    env = gym.make("ApeXCounting-v0", num_actions=3)
    greedy, stack, _ = load_greedy(data, env)
    obs = np.random.default_rng(0).integers(0, 255, (stack, 84, 84), dtype=np.uint8)
    picks = {greedy(obs) for _ in range(5)}
    online.set_noise(False)
    with torch.no_grad():
        expected = int(online(torch.from_numpy(obs[None])).argmax(dim=1))
    assert picks == {expected}, "the mean weights, the same action every time"


@pytest.mark.slow
def test_a_noisy_run_trains_and_its_collectors_act_with_the_learner_s_noisy_weights(tmp_path) -> None:
    """The collectors build the noisy network from the WELCOME and load the learner's broadcasts (mu and sigma; a
    refused one would leave them at version 0), and the checkpoint records a noisy geometry."""
    assert run_inprocess_head(tmp_path, noisy_sigma=0.5)["noisy"] is True
