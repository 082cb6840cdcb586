"""Update rule on hand-made batches: Double DQN targets, Huber, PER weights, target sync, accumulation."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from learner.dqn import (
    Munchausen,
    dqn_loss,
    hard_update,
    munchausen_targets,
    quantile_huber,
    quantile_targets,
    td_targets,
)
from shared.config import LearnerConfig
from tests.support.learner_fakes import FakeReplay, make_learner, small_config


class TableQ(nn.Module):
    """Q(s, .) = a learnable per-state row: obs is an int64 state id [B]."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.table[obs]


def test_double_dqn_target_uses_online_argmax_and_target_values() -> None:
    online = TableQ([[0.0, 0.0], [1.0, 5.0]])  # online prefers action 1 in state 1
    target = TableQ([[0.0, 0.0], [3.0, -2.0]])  # target would prefer action 0
    next_obs = torch.tensor([1, 1])
    returns = torch.tensor([1.0, 1.0])
    discounts = torch.tensor([0.5, 0.0])  # second transition terminal
    y = td_targets(online, target, next_obs, returns, discounts, double_q=True)
    assert y.tolist() == pytest.approx([1.0 + 0.5 * -2.0, 1.0])
    y_plain = td_targets(online, target, next_obs, returns, discounts, double_q=False)
    assert y_plain.tolist() == pytest.approx([1.0 + 0.5 * 3.0, 1.0])


def test_huber_loss_weights_and_priorities_by_hand() -> None:
    online = TableQ([[0.0, 2.0], [0.0, 0.0]])
    target = TableQ([[0.0, 0.0], [0.0, 0.0]])
    obs = torch.tensor([0, 0])
    actions = torch.tensor([1, 0])  # Q(s,a) = 2.0 and 0.0
    returns = torch.tensor([2.5, 3.0])  # targets (terminal): td = 0.5 (quadratic) and 3.0 (linear)
    discounts = torch.zeros(2)
    weights = torch.tensor([1.0, 0.5])
    out = dqn_loss(online, target, obs, actions, returns, discounts, torch.tensor([1, 1]), weights)
    huber = [0.5 * 0.5**2, 3.0 - 0.5]
    assert out.loss.item() == pytest.approx((1.0 * huber[0] + 0.5 * huber[1]) / 2)
    assert out.td_abs.tolist() == pytest.approx([0.5, 3.0])
    assert not out.td_abs.requires_grad
    out.loss.backward()
    # d/dQ huber: -(td) in quadratic zone, -sign(td) in linear zone; weighted, / batch
    assert online.table.grad[0].tolist() == pytest.approx([-0.5 * 1.0 / 2, -0.5 * 1.0 / 2])


def test_normalizer_makes_micro_batches_sum_to_full_batch() -> None:
    torch.manual_seed(0)
    online = TableQ(torch.randn(6, 3).tolist())
    target = TableQ(torch.randn(6, 3).tolist())
    obs, nxt = torch.randint(0, 6, (8,)), torch.randint(0, 6, (8,))
    act, ret, disc, w = torch.randint(0, 3, (8,)), torch.randn(8), torch.rand(8), torch.rand(8)
    full = dqn_loss(online, target, obs, act, ret, disc, nxt, w)
    parts = [dqn_loss(online, target, obs[s], act[s], ret[s], disc[s], nxt[s], w[s], normalizer=8.0)
             for s in (slice(0, 4), slice(4, 8))]
    assert (parts[0].loss + parts[1].loss).item() == pytest.approx(full.loss.item(), rel=1e-6)


def test_a_hard_update_copies_the_online_network() -> None:
    """The copy a periodic reset makes of a re-initialized network (learner/resets.py); the update's own target sync is
    learner/step.py's (tests/test_step.py)."""
    online, target = TableQ([[1.0, 2.0]]), TableQ([[0.0, 0.0]])
    hard_update(target, online)
    assert target.table.tolist() == [[1.0, 2.0]]


def test_learner_target_sync_every_u_updates() -> None:
    learner = make_learner(small_config(target_update_every=2))
    try:
        learner.train_step()  # update 1: target still the initial copy
        differs = any(not torch.equal(a, b) for a, b in zip(learner.online.parameters(), learner.target.parameters(), strict=True))
        assert differs
        learner.train_step()  # update 2: hard sync
        for a, b in zip(learner.online.parameters(), learner.target.parameters(), strict=True):
            assert torch.equal(a, b)
    finally:
        learner.close()


def test_gradient_accumulation_matches_one_big_batch() -> None:
    """8 x 4 accumulated == 32 x 1 after one Adam step (same init, same effective batch)."""
    results = []
    for batch_size, accum in ((32, 1), (8, 4)):
        learner = make_learner(small_config(batch_size=batch_size, grad_accum_steps=accum), replay=FakeReplay(seed=3),
                               seed=11)
        try:
            stats = learner.train_step()
            results.append((copy.deepcopy(learner.online.state_dict()), stats,
                            learner.replay.priorities.copy()))
        finally:
            learner.close()
    (sd_big, st_big, pr_big), (sd_acc, st_acc, pr_acc) = results
    assert st_big["loss"] == pytest.approx(st_acc["loss"], rel=1e-5)
    assert st_big["grad_norm"] == pytest.approx(st_acc["grad_norm"], rel=1e-5)
    # float32 summation order differs; Adam's first step moves each weight by ~lr, so compare at 1e-6 abs
    for key in sd_big:
        torch.testing.assert_close(sd_acc[key], sd_big[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pr_acc, pr_big, rtol=1e-5, atol=1e-6)


def test_loss_normalizer_rejects_bad_input() -> None:
    online = TableQ([[0.0]])
    with pytest.raises(ValueError, match="empty batch"):
        dqn_loss(online, online, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64),
                 torch.tensor([]), torch.tensor([]), torch.tensor([], dtype=torch.int64), torch.tensor([]))


def test_munchausen_target_by_hand_two_actions() -> None:
    """tau = 1 so the clip matters: pi(.|s) = softmax(Q_target(s, .)), bonus = alpha * clip(log pi(a|s), -1, 0)."""
    target = TableQ([[0.0, 1.0], [1.0, 2.0]])  # state 0 = s_t, state 1 = s'
    m = Munchausen(alpha=0.9, tau=1.0, clip=-1.0)
    obs, actions, next_obs = torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([1, 1])
    returns, discounts = torch.tensor([1.0, 0.5]), torch.tensor([0.5, 0.0])  # the second transition is terminal
    y = munchausen_targets(target, obs, actions, next_obs, returns, discounts, m)
    log_z = math.log(math.exp(0.0) + math.exp(1.0))  # log-partition of softmax([0, 1])
    log_pi = [0.0 - log_z, 1.0 - log_z]  # -1.313 (clipped to -1) and -0.313
    bonus = [0.9 * max(log_pi[0], -1.0), 0.9 * log_pi[1]]
    pi_next = [math.exp(1.0) / (math.exp(1.0) + math.exp(2.0)), math.exp(2.0) / (math.exp(1.0) + math.exp(2.0))]
    soft_v = sum(p * (q - math.log(p)) for p, q in zip(pi_next, [1.0, 2.0], strict=True))
    assert log_pi[0] < -1.0 < log_pi[1], "the case must exercise the clip on one side only"
    assert y.tolist() == pytest.approx([1.0 + bonus[0] + 0.5 * soft_v, 0.5 + bonus[1]], rel=1e-6)
    assert not y.requires_grad


def test_munchausen_target_is_stable_for_a_small_tau() -> None:
    """Q / tau = 3,333: a naive exp overflows float32; log_softmax does not. pi puts all mass on action 0."""
    target = TableQ([[100.0, 0.0]])
    m = Munchausen(alpha=0.9, tau=0.03, clip=-1.0)
    y = munchausen_targets(target, torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([0, 0]),
                           torch.tensor([0.0, 0.0]), torch.tensor([0.9, 0.9]), m)
    assert torch.isfinite(y).all()
    # action 0: log pi = 0, no bonus; action 1: tau * log pi = -100, clipped to -1; soft value = max Q = 100
    assert y.tolist() == pytest.approx([0.9 * 100.0, -0.9 + 0.9 * 100.0], rel=1e-6)


def test_munchausen_without_bonus_tends_to_the_max_target_as_tau_shrinks() -> None:
    torch.manual_seed(1)
    target = TableQ(torch.randn(5, 4).tolist())
    obs, nxt, act = torch.randint(0, 5, (16,)), torch.randint(0, 5, (16,)), torch.randint(0, 4, (16,))
    ret, disc = torch.randn(16), torch.rand(16)
    y_max = td_targets(target, target, nxt, ret, disc, double_q=False)
    y_soft = munchausen_targets(target, obs, act, nxt, ret, disc, Munchausen(alpha=0.0, tau=1e-4, clip=-1.0))
    torch.testing.assert_close(y_soft, y_max, rtol=0, atol=1e-3)
    y_warm = munchausen_targets(target, obs, act, nxt, ret, disc, Munchausen(alpha=0.0, tau=1.0, clip=-1.0))
    assert (y_warm - y_max >= -1e-6).all() and (y_warm - y_max).abs().max() > 0.01  # soft max >= max


def test_munchausen_loss_ignores_the_online_network_s_argmax() -> None:
    """The soft bootstrap replaces Double DQN's argmax: the online network only gives Q(s, a)."""
    target = TableQ([[0.0, 1.0], [1.0, 2.0], [2.0, 0.0]])
    m = Munchausen(alpha=0.9, tau=0.5, clip=-1.0)
    obs, actions, next_obs = torch.tensor([0, 2]), torch.tensor([1, 0]), torch.tensor([1, 1])
    returns, discounts, weights = torch.tensor([1.0, 0.0]), torch.tensor([0.9, 0.9]), torch.ones(2)
    tables = ([[0.0, 0.0], [5.0, -5.0], [3.0, 3.0]], [[0.0, 0.0], [-5.0, 5.0], [3.0, 3.0]])  # argmax at s' flips
    y = munchausen_targets(target, obs, actions, next_obs, returns, discounts, m)
    q_sa = torch.tensor([0.0, 3.0])  # Q_online(s, a), the same in both tables
    for table in tables:
        out = dqn_loss(TableQ(table), target, obs, actions, returns, discounts, next_obs, weights, munchausen=m)
        assert out.td_abs.tolist() == pytest.approx((y - q_sa).abs().tolist())
    plain = [dqn_loss(TableQ(t), target, obs, actions, returns, discounts, next_obs, weights).td_abs for t in tables]
    assert not torch.equal(plain[0], plain[1]), "Double DQN does depend on the online argmax"


def test_munchausen_is_off_at_alpha_zero() -> None:
    assert Munchausen.of(LearnerConfig()) is None
    assert Munchausen.of(LearnerConfig(munchausen_alpha=0.0, munchausen_tau=0.5)) is None
    assert Munchausen.of(LearnerConfig(munchausen_alpha=0.9, munchausen_tau=0.03, munchausen_clip=-1.0)) == \
        Munchausen(alpha=0.9, tau=0.03, clip=-1.0)
    assert Munchausen.of(LearnerConfig(munchausen_alpha=0.5, munchausen_tau=0.2, munchausen_clip=-0.3)) == \
        Munchausen(alpha=0.5, tau=0.2, clip=-0.3)  # the config's values, not the paper's


def test_target_epsilon_bootstraps_the_epsilon_greedy_policy_by_hand() -> None:
    """eps = 0.2 over two actions: the bootstrap is 0.8 x Q_target(s', a*) + 0.2 x mean Q_target(s', .); the
    Munchausen one 0.8 x the soft value + 0.2 x mean Q_target(s', .), which differs from eps = 0's; eps = 0 is the
    plain target."""
    online = TableQ([[0.0, 0.0], [1.0, 5.0]])
    target = TableQ([[0.0, 1.0], [3.0, -2.0]])
    obs, actions, next_obs = torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([1, 1])
    returns, discounts = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.0])
    y = td_targets(online, target, next_obs, returns, discounts, double_q=True, target_epsilon=0.2)
    assert y.tolist() == pytest.approx([1.0 + 0.5 * (0.8 * -2.0 + 0.2 * 0.5), 1.0])
    assert td_targets(online, target, next_obs, returns, discounts, True, 0.0).tolist() == \
        td_targets(online, target, next_obs, returns, discounts, True).tolist()
    m = Munchausen(alpha=0.9, tau=1.0, clip=-1.0)
    y = munchausen_targets(target, obs, actions, next_obs, returns, discounts, m, target_epsilon=0.2)
    log_z = math.log(math.exp(3.0) + math.exp(-2.0))
    log_pi = [3.0 - log_z, -2.0 - log_z]
    soft_v = sum(math.exp(lp) * (q - lp) for lp, q in zip(log_pi, [3.0, -2.0], strict=True))  # = log_z
    log_z0 = math.log(1.0 + math.exp(1.0))
    bonus = [0.9 * max(0.0 - log_z0, -1.0), 0.9 * (1.0 - log_z0)]
    mixed = 0.8 * soft_v + 0.2 * 0.5
    assert y.tolist() == pytest.approx([1.0 + bonus[0] + 0.5 * mixed, 1.0 + bonus[1]], rel=1e-6)
    y0 = munchausen_targets(target, obs, actions, next_obs, returns, discounts, m)
    assert y0.tolist() == pytest.approx([1.0 + bonus[0] + 0.5 * soft_v, 1.0 + bonus[1]], rel=1e-6)
    assert y[0] < y0[0] - 0.1  # the random action's lower value lowers the bootstrap
    with pytest.raises(ValueError, match="not quantiles"):
        dqn_loss(online, target, obs, actions, returns, discounts, next_obs, torch.ones(2), quantiles=True,
                 target_epsilon=0.1)


# ---------------------------------------------------------------------------- QR-DQN
def test_quantile_huber_loss_by_hand() -> None:
    """N = 2 (taus 0.25, 0.75), theta = [0, 1], T = [0.5, 2]: u_ij = T_j - theta_i = [[0.5, 2], [-0.5, 1]],
    huber = [[0.125, 1.5], [0.125, 0.5]], weights |tau_i - 1{u < 0}| = [[.25, .25], [.25, .75]];
    sum over i of the mean over j: (.25 * 1.625) / 2 + (.25 * .125 + .75 * .5) / 2 = 0.40625."""
    theta = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss = quantile_huber(theta, torch.tensor([[0.5, 2.0]]))
    assert loss.item() == pytest.approx(0.40625)
    loss.sum().backward()
    # d/dtheta_0: mean_j -0.25 * huber'(u_0j) = -0.25 * (0.5 + 1) / 2; d/dtheta_1: -(.25 * -0.5 + .75 * 1) / 2
    torch.testing.assert_close(theta.grad, torch.tensor([[-0.1875, -0.3125]]))


def test_one_quantile_is_half_the_double_dqn_loss() -> None:
    """With N = 1 (tau 0.5) the quantile target is the Double DQN target and the loss half its Huber loss."""
    online = TableQ([[0.0, 2.0], [1.0, 5.0]])
    target = TableQ([[1.0, 0.5], [3.0, -2.0]])
    obs, nxt = torch.tensor([0, 1, 0]), torch.tensor([1, 0, 1])
    actions, returns = torch.tensor([1, 0, 0]), torch.tensor([0.5, -1.0, 2.0])
    discounts, weights = torch.tensor([0.9, 0.0, 0.81]), torch.tensor([1.0, 0.5, 0.25])

    def quantile(net):
        return lambda x: net(x).unsqueeze(2)  # [B, A, 1]

    plain = dqn_loss(online, target, obs, actions, returns, discounts, nxt, weights, True)
    qr = dqn_loss(quantile(online), quantile(target), obs, actions, returns, discounts, nxt, weights, True,
                  quantiles=True)
    assert qr.loss.item() == pytest.approx(0.5 * plain.loss.item())
    torch.testing.assert_close(qr.td_abs, plain.td_abs)
    y = quantile_targets(quantile(online), quantile(target), nxt, returns, discounts, double_q=True)
    torch.testing.assert_close(y.squeeze(1), td_targets(online, target, nxt, returns, discounts, True))


def test_quantile_targets_bootstrap_the_action_of_the_best_mean() -> None:
    """The online net's quantiles have the larger mean on action 1 but the larger max on action 0: a* = 1."""
    online_z = torch.tensor([[[-5.0, 9.0], [2.0, 3.0]]])  # action 0: mean 2, action 1: mean 2.5
    target_z = torch.tensor([[[10.0, 20.0], [1.0, 4.0]]])
    y = quantile_targets(lambda x: online_z, lambda x: target_z, torch.zeros(1), torch.tensor([1.0]),
                         torch.tensor([0.5]), double_q=True)
    torch.testing.assert_close(y, torch.tensor([[1.5, 3.0]]))
    y_own = quantile_targets(lambda x: online_z, lambda x: target_z, torch.zeros(1), torch.tensor([1.0]),
                             torch.tensor([0.5]), double_q=False)
    torch.testing.assert_close(y_own, torch.tensor([[6.0, 11.0]]))  # the target's own best mean: action 0
