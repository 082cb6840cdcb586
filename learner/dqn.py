"""The DQN update rule as pure functions, testable on hand-made batches.

Double DQN with n-step targets (Hessel et al. 2018, Horgan et al. 2018):

    a*  = argmax_a Q_online(s', a)                (double_q; else argmax of Q_target)
    y   = R^(n) + gamma^m * Q_target(s', a*)      (`discounts` is gamma^m, 0 after a termination)
    td  = y - Q_online(s, a)
    L   = sum_i w_i * huber(td_i) / B_eff         (PER importance weights w_i)

Why `/ B_eff` instead of a mean: with gradient accumulation every micro-batch divides by the
*effective* batch size, so the summed micro-batch gradients equal the gradient of one big
batch exactly (up to float summation order). The replay normalizes importance weights by
their max over the whole effective batch because the learner samples the effective batch in
one `sample()` call and splits it (see `learner.trainer`).

The target side runs under `no_grad`; the loss is computed in float32 even under autocast
(`.float()` on the Q outputs), so mixed precision only changes the network's matmuls/convs.

Munchausen DQN (Vieillard et al. 2020; `learner.munchausen_alpha` > 0) replaces the target by

    pi(.|s) = softmax(Q_target(s, .) / tau)
    y = R^(n) + alpha * clip(tau * log pi(a_t|s_t), l0, 0)
              + gamma^m * sum_a' pi(a'|s') * (Q_target(s', a') - tau * log pi(a'|s'))

With `target_epsilon` eps > 0 the bootstrap values the epsilon-greedy policy the evaluations play
rather than the greedy one (Expected SARSA toward that policy):

    y = R^(n) + gamma^m * ((1 - eps) * Q_target(s', a*) + eps * mean_a' Q_target(s', a'))

and with Munchausen the soft value of the softmax policy is mixed the same way:

    y = R^(n) + bonus + gamma^m * ((1 - eps) * sum_a' pi(a'|s') * (Q_target(s', a') - tau * log pi(a'|s'))
                                   + eps * mean_a' Q_target(s', a'))

Either way a state where one random action is fatal (mid-jump over a pit) is worth less, so the
learned route keeps margins the greedy target does not reward. (Reweighting the soft value's terms
by (1 - eps) * pi + eps / A would change nothing: Q - tau * log pi is the same tau * logsumexp(Q / tau)
for every action, so any weights summing to 1 give the same value.) `target_epsilon` may be a 0-dim
tensor (the learner's switch at `learner.target_epsilon_from`, inside a compiled step): then the
mix is always computed, and eps = 0 gives the greedy target.

With n-step returns the bonus is added for the first step only: the replay stores the first action
and R^(n), not the actions and states in between, so the later steps' log-policy terms are unknown.
The soft bootstrap has no argmax, so `double_q` does not apply to it. Log-probabilities come from `log_softmax` (max-subtracted), so a
small tau does not overflow.

QR-DQN (Dabney et al. 2017; `learner.quantiles` N > 0): the networks give N quantiles theta_1..N of
the return per action, at the midpoints tau_i = (2i + 1) / 2N. The bootstrap action is the argmax
of their mean (the online network's with `double_q`), and every target quantile is

    T_j = R^(n) + gamma^m * theta_target_j(s', a*)
    L   = sum_b w_b * sum_i mean_j |tau_i - 1{T_j < theta_i}| * huber(T_j - theta_i) / B_eff

The priority of a transition is |mean_j T_j - mean_i theta_i|: the TD error of the means, the
scalar path's quantity, so the replay's priority scale does not depend on the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shared.config import LearnerConfig

HUBER_DELTA = 1.0  # smooth-L1 threshold: quadratic below, linear above (the DQN "error clipping")


@dataclass(frozen=True)
class Munchausen:
    """The Munchausen target's constants (LearnerConfig.munchausen_*); `of` gives None when it is off."""

    alpha: float  # scale of the bonus
    tau: float  # entropy temperature of pi = softmax(Q / tau)
    clip: float  # l0: lower bound of tau * log pi(a|s) in the bonus

    @classmethod
    def of(cls, lc: LearnerConfig) -> Munchausen | None:
        if lc.munchausen_alpha <= 0:
            return None
        return cls(float(lc.munchausen_alpha), float(lc.munchausen_tau), float(lc.munchausen_clip))


@dataclass
class LossOutput:
    """One micro-batch's loss and by-products (all detached except `loss`)."""

    loss: torch.Tensor  # scalar, sum_i w_i * huber_i / normalizer (carries the graph)
    td_abs: torch.Tensor  # float32 [B] |y - Q(s,a)|, detached, on the learner device
    q_mean: torch.Tensor  # scalar, mean Q(s, a) of the batch, detached
    unweighted_loss: torch.Tensor  # scalar, mean huber without importance weights, detached


def scheduled_target_epsilon(target_epsilon: float, start: int, updates: int | torch.Tensor) -> float | torch.Tensor:
    """`target_epsilon` for the update after `updates` done, 0 (the greedy bootstrap) before update `start`.

    A Python float for a host counter, or where no switch is scheduled (`start` 0); for a device counter a 0-dim
    tensor, so a compiled step switches without a branch on a tensor value or a recompile."""
    if target_epsilon <= 0 or start <= 0:
        return float(target_epsilon)
    if isinstance(updates, torch.Tensor):
        return torch.where(updates >= start, target_epsilon, 0.0).float()
    return float(target_epsilon) if updates >= start else 0.0


def _mixes(target_epsilon: float | torch.Tensor) -> bool:
    """Whether the bootstrap mixes in the uniform policy: a positive float, or any tensor (its value may be 0 now and
    not later, and a compiled step must not branch on it)."""
    return isinstance(target_epsilon, torch.Tensor) or target_epsilon > 0


def td_targets(
    online: nn.Module,
    target: nn.Module,
    next_obs: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    double_q: bool = True,
    target_epsilon: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """y = returns + discounts * Q_target(s', a*) as float32 [B], without a graph; with `target_epsilon` the
    bootstrap is the epsilon-greedy policy's expectation (module docstring)."""
    with torch.no_grad():
        q_next_target = target(next_obs).float()
        if double_q:
            best = online(next_obs).argmax(dim=1, keepdim=True)
        else:
            best = q_next_target.argmax(dim=1, keepdim=True)
        bootstrap = q_next_target.gather(1, best).squeeze(1)
        if _mixes(target_epsilon):
            bootstrap = (1.0 - target_epsilon) * bootstrap + target_epsilon * q_next_target.mean(dim=1)
        return returns.float() + discounts.float() * bootstrap


def munchausen_targets(
    target: nn.Module,
    obs: torch.Tensor,
    actions: torch.Tensor,
    next_obs: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    m: Munchausen,
    target_epsilon: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """y = returns + bonus(s, a) + discounts * soft value of Q_target at s' (module docstring), float32 [B]."""
    with torch.no_grad():
        q_now = target(obs).float()
        tau_logpi_now = m.tau * F.log_softmax(q_now / m.tau, dim=1)
        bonus = m.alpha * tau_logpi_now.gather(1, actions.long().view(-1, 1)).squeeze(1).clamp(m.clip, 0.0)
        q_next = target(next_obs).float()
        logpi_next = F.log_softmax(q_next / m.tau, dim=1)
        soft_value = (logpi_next.exp() * (q_next - m.tau * logpi_next)).sum(dim=1)
        if _mixes(target_epsilon):
            soft_value = (1.0 - target_epsilon) * soft_value + target_epsilon * q_next.mean(dim=1)
        return returns.float() + bonus + discounts.float() * soft_value


def quantile_targets(
    online: nn.Module,
    target: nn.Module,
    next_obs: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    double_q: bool = True,
) -> torch.Tensor:
    """T = R^(n) + gamma^m * theta_target(s', a*) as float32 [B, N], without a graph; `online` and `target`
    give quantiles [B, A, N]."""
    with torch.no_grad():
        z_next = target(next_obs).float()
        chooser = online(next_obs).float() if double_q else z_next
        z = action_quantiles(z_next, chooser.mean(dim=2).argmax(dim=1))
        return returns.float().unsqueeze(1) + discounts.float().unsqueeze(1) * z


def action_quantiles(z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The quantiles [B, N] of one action per row from all actions' quantiles `z` [B, A, N]."""
    index = actions.long().view(-1, 1, 1).expand(-1, 1, z.shape[2])
    return z.gather(1, index).squeeze(1)


def quantile_huber(theta: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per sample sum_i mean_j |tau_i - 1{T_j < theta_i}| * huber(T_j - theta_i), float32 [B]: `theta` the
    chosen action's quantiles [B, N] (with a graph), `targets` [B, N'] (without)."""
    n = theta.shape[1]
    taus = (torch.arange(n, device=theta.device, dtype=torch.float32) * 2 + 1) / (2 * n)
    u = targets.unsqueeze(1) - theta.unsqueeze(2)  # [B, N (i: online), N' (j: target)]
    huber = F.smooth_l1_loss(theta.unsqueeze(2).expand_as(u), targets.unsqueeze(1).expand_as(u),
                             reduction="none", beta=HUBER_DELTA)
    weight = (taus.view(1, n, 1) - (u.detach() < 0).float()).abs()
    return (weight * huber).mean(dim=2).sum(dim=1)


def dqn_loss(
    online: nn.Module,
    target: nn.Module,
    obs: torch.Tensor,
    actions: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_obs: torch.Tensor,
    weights: torch.Tensor,
    double_q: bool = True,
    normalizer: float | None = None,
    munchausen: Munchausen | None = None,
    quantiles: bool = False,
    target_epsilon: float | torch.Tensor = 0.0,
) -> LossOutput:
    """Importance-weighted Huber loss of one (micro-)batch.

    `normalizer` is the effective batch size the weighted sum is divided by (defaults to this
    batch's size, i.e. a weighted mean). Pass the effective batch size when accumulating.
    `munchausen`: the Munchausen target instead of the (Double) DQN one (None = off).
    `quantiles`: QR-DQN: `online` and `target` give quantiles [B, A, N], the loss is the quantile
    Huber loss (module docstring); not with `munchausen`.
    `target_epsilon`: the bootstrap values the epsilon-greedy policy (module docstring); not with `quantiles`.
    """
    batch = int(actions.shape[0])
    if batch == 0:
        raise ValueError("dqn_loss: empty batch")
    if normalizer is None:
        normalizer = float(batch)
    if normalizer <= 0:
        raise ValueError(f"dqn_loss: normalizer={normalizer} must be positive")
    if quantiles:
        if munchausen is not None:
            raise ValueError("dqn_loss: Munchausen targets and quantiles exclude each other")
        if _mixes(target_epsilon):
            raise ValueError("dqn_loss: target_epsilon applies to scalar heads, not quantiles")
        return _quantile_loss(online, target, obs, actions, returns, discounts, next_obs, weights, double_q,
                              normalizer)
    if munchausen is None:
        y = td_targets(online, target, next_obs, returns, discounts, double_q, target_epsilon)
    else:
        y = munchausen_targets(target, obs, actions, next_obs, returns, discounts, munchausen, target_epsilon)
    q_all = online(obs).float()
    q_sa = q_all.gather(1, actions.long().view(-1, 1)).squeeze(1)
    per_sample = F.smooth_l1_loss(q_sa, y, reduction="none", beta=HUBER_DELTA)
    loss = (weights.float() * per_sample).sum() / normalizer
    td_abs = (y - q_sa).detach().abs()
    return LossOutput(
        loss=loss,
        td_abs=td_abs,
        q_mean=q_sa.detach().mean(),
        unweighted_loss=per_sample.detach().mean(),
    )


def _quantile_loss(online: nn.Module, target: nn.Module, obs: torch.Tensor, actions: torch.Tensor,
                   returns: torch.Tensor, discounts: torch.Tensor, next_obs: torch.Tensor, weights: torch.Tensor,
                   double_q: bool, normalizer: float) -> LossOutput:
    y = quantile_targets(online, target, next_obs, returns, discounts, double_q)
    theta = action_quantiles(online(obs).float(), actions)  # [B, N]
    per_sample = quantile_huber(theta, y)
    loss = (weights.float() * per_sample).sum() / normalizer
    q_sa = theta.detach().mean(dim=1)
    return LossOutput(
        loss=loss,
        td_abs=(y.mean(dim=1) - q_sa).abs(),
        q_mean=q_sa.mean(),
        unweighted_loss=per_sample.detach().mean(),
    )


@torch.no_grad()
def hard_update(target: nn.Module, online: nn.Module) -> None:
    """Copy online parameters and buffers into the target network."""
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.copy_(o)
    for t, o in zip(target.buffers(), online.buffers(), strict=True):
        t.copy_(o)


FUSED_ADAM_DEVICES = ("cpu", "cuda")  # where torch's fused Adam kernel runs


def make_optimizer(params: list[torch.Tensor], lr: float, eps: float, device: torch.device) -> torch.optim.Adam:
    """The Adam whose state tensors (moments, step counts) and hyperparameters the update steps (learner/step.py),
    so `state_dict()` and checkpoints are torch.optim.Adam's. The update itself runs torch's fused kernel on CUDA
    and CPU (one pass over each parameter per step, on CUDA one launch for all of them): on the CPU foreach makes
    about ten passes over memory, for the Nature network's 3.3M parameters 19.1 against 5.6 ms a step on one
    thread, and the whole fp32 update makes 1.16x the updates/s (BENCHMARKS.md, "Learner on CPU and GPU"); the
    flags recorded here say the same. Other devices: foreach."""
    if device.type in FUSED_ADAM_DEVICES:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)
