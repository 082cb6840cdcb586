"""The learner's whole update as one function over device tensors, with no host round trip.

`device_update` does, in tensor ops only (no `.item()`, no numpy, no Python branch on a tensor value):

1. draw the effective batch from the device ring (replay/device_batch.py): prioritized stratified
   slots, stacks, n-step targets, importance weights annealed by the update counter, freshness;
2. the inputs shifted at random where `learner.augment_shift` asks (learner/augment.py, the eager path's function);
   the Double/Dueling (or Munchausen, or quantile) loss of each micro-batch (`learner.dqn.dqn_loss`, the eager path's function)
   and its gradient by `torch.func.grad`, summed over the micro-batches (each divides by the
   effective batch, so the sum is the one-big-batch gradient, as in learner/update.py);
3. fp16: the loss is scaled and the gradients unscaled, the scale backed off or grown as
   `torch.amp.GradScaler` does, in the scaler's own tensors;
4. the global gradient norm and clipping (`clip_grad_norm_`'s formula), then Adam (torch.optim.Adam's
   formula, in the optimizer's own state tensors, so checkpoints and `state_dict()` are unchanged);
5. the new priorities written into the ring's mass row at the drawn slots;
6. the target network: a hard copy when the update counter reaches a multiple of the period (a 0/1
   mask in `torch.where`), or Polyak averaging every update;
7. metrics added into device tensors that the host folds in when its meter refreshes (at most every
   0.5 s: one transfer of the sums, one of the skip count), never per update.

The non-finite skip is decided here too: when the loss or the gradient norm is NaN/inf (or no drawn
row is fresh) the parameters, the Adam moments and step, and the priorities keep their values
(`torch.where` picks the old ones, so a NaN never reaches them), and the skip is counted. The update
counter, the target schedule and the fp16 scale move on as in the eager learner.

Everything the step reads or writes lives in `StepState` (the tensors, updated in place) and
`StepConfig` (Python constants); the same function runs eagerly, under
`torch.compile(fullgraph=True)` and inside one CUDA graph (learner/device_runner.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from learner.augment import augment_pair
from learner.dqn import Munchausen, dqn_loss, scheduled_target_epsilon
from replay.device_batch import DeviceBatch, sample_batch
from replay.device_ring import MASS
from replay.device_sampler import priority_mass


@dataclass(frozen=True)
class StepConfig:
    """The constants of a device step (a change means a new compiled step)."""

    batch: int  # effective batch: micro x accum rows drawn per update
    micro: int
    accum: int
    stack: int
    prioritized: bool
    alpha: float
    priority_eps: float
    beta_start: float
    beta_steps: int
    double_q: bool
    max_grad_norm: float
    target_update_every: int
    polyak_tau: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    device_type: str
    autocast_dtype: torch.dtype | None
    use_scaler: bool
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    channels_last: bool = False
    uniform_rows: int = 64
    munchausen: Munchausen | None = None  # the Munchausen target's constants (None: the Double DQN target)
    quantiles: bool = False  # QR-DQN: the networks give return quantiles and the loss is the quantile Huber loss
    target_epsilon: float = 0.0  # the bootstrap values the epsilon-greedy policy (learner/dqn.py)
    target_epsilon_from: int = 0  # ... from this update on (the counter in StepState.updates); 0: every update
    augment_shift: int = 0  # random-shift augmentation of the inputs by up to this many pixels (learner/augment.py)


@dataclass
class StepState:
    """The tensors one update reads and writes in place, all on the learner's device (except `claim`)."""

    names: list[str]  # the online network's trainable parameter names, in `params` order
    params: list[torch.Tensor]
    target_params: list[torch.Tensor]  # the target network's, same order
    exp_avg: list[torch.Tensor]  # Adam's state tensors (the optimizer's own)
    exp_avg_sq: list[torch.Tensor]
    adam_steps: list[torch.Tensor]
    lr: torch.Tensor  # float32 []
    scale: torch.Tensor  # float32 []: the fp16 loss scale (1 and unused otherwise)
    growth_tracker: torch.Tensor  # int32 []
    updates: torch.Tensor  # int64 []: updates done, skipped ones included (the learner's counter)
    meter_sums: torch.Tensor  # float32 [4]: loss, |TD| sum, Q sum, grad-norm sum of applied updates
    skipped: torch.Tensor  # int64 []: updates skipped for a non-finite loss or gradient norm
    stale_rows: torch.Tensor  # int64 []: drawn rows whose segment a write claimed during the gather
    last: torch.Tensor  # float32 [4]: the last update's loss, Q sum, grad norm, applied (1/0)
    last_td: torch.Tensor  # float32 [B]: its |TD|
    table: torch.Tensor  # the ring's float64 [7, capacity] table (replay/device_ring.py)
    frames: torch.Tensor  # the ring's frames
    claim: torch.Tensor  # the writer's claim (host memory)
    uniforms: torch.Tensor  # float64 [uniform_rows, B]


def autocast_context(cfg: StepConfig) -> contextlib.AbstractContextManager:
    if cfg.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=cfg.device_type, dtype=cfg.autocast_dtype)


def batch_gradients(cfg: StepConfig, s: StepState, online: nn.Module, target: nn.Module, batch: DeviceBatch
                    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gradients in `s.params` order -- of the scaled loss under fp16 --, loss, |TD| [B], Q sum) of the batch."""
    params = dict(zip(s.names, s.params, strict=True))
    target_params = dict(zip(s.names, s.target_params, strict=True))
    target_epsilon = scheduled_target_epsilon(cfg.target_epsilon, cfg.target_epsilon_from, s.updates)

    def micro_loss(p: dict[str, torch.Tensor], obs: torch.Tensor, actions: torch.Tensor, returns: torch.Tensor,
                   discounts: torch.Tensor, next_obs: torch.Tensor, weights: torch.Tensor):
        with autocast_context(cfg):
            kwargs = {"quantiles": True} if cfg.quantiles else {}
            out = dqn_loss(lambda x: functional_call(online, p, (x,), kwargs),
                           lambda x: functional_call(target, target_params, (x,), kwargs),
                           obs, actions, returns, discounts, next_obs, weights, cfg.double_q,
                           normalizer=float(cfg.batch), munchausen=cfg.munchausen, quantiles=cfg.quantiles,
                           target_epsilon=target_epsilon)
        scaled = out.loss * s.scale if cfg.use_scaler else out.loss
        return scaled, (out.loss.detach(), out.td_abs, out.q_mean)

    grad_fn = torch.func.grad(micro_loss, has_aux=True)
    grads: dict[str, torch.Tensor] | None = None
    losses, tds, qs = [], [], []
    all_obs, all_next_obs = augment_pair(batch.obs, batch.next_obs, cfg.augment_shift)
    for k in range(cfg.accum):
        rows = slice(k * cfg.micro, (k + 1) * cfg.micro)
        obs, next_obs = all_obs[rows], all_next_obs[rows]
        if cfg.channels_last:
            obs = obs.contiguous(memory_format=torch.channels_last)
            next_obs = next_obs.contiguous(memory_format=torch.channels_last)
        g, (loss, td, q_mean) = grad_fn(params, obs, batch.actions[rows], batch.returns[rows],
                                        batch.discounts[rows], next_obs, batch.weights[rows])
        grads = g if grads is None else {n: grads[n] + g[n] for n in s.names}
        losses.append(loss)
        tds.append(td)
        qs.append(q_mean * cfg.micro)
    assert grads is not None
    loss_total = losses[0] if cfg.accum == 1 else torch.stack(losses).sum()
    q_total = qs[0] if cfg.accum == 1 else torch.stack(qs).sum()
    td_all = tds[0] if cfg.accum == 1 else torch.cat(tds)
    return [grads[n] for n in s.names], loss_total, td_all, q_total


def global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients together (`clip_grad_norm_`'s total norm)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


@torch.no_grad()
def adam_update(cfg: StepConfig, s: StepState, grads: list[torch.Tensor], applied: torch.Tensor) -> None:
    """torch.optim.Adam's step (no weight decay, no amsgrad) where `applied`; nothing changes elsewhere."""
    b1, b2 = cfg.adam_beta1, cfg.adam_beta2
    for p, g, m, v, step in zip(s.params, grads, s.exp_avg, s.exp_avg_sq, s.adam_steps, strict=True):
        new_step = step + applied.to(step.dtype)
        m_new = torch.lerp(m, g, 1.0 - b1)
        v_new = v * b2 + (1.0 - b2) * (g * g)
        count = new_step.to(torch.float64)
        step_size = s.lr.to(torch.float64) / (1.0 - b1 ** count)
        denom = v_new.sqrt() / torch.sqrt(1.0 - b2 ** count) + cfg.adam_eps
        p_new = p - step_size * (m_new / denom)
        p.copy_(torch.where(applied, p_new, p))
        m.copy_(torch.where(applied, m_new, m))
        v.copy_(torch.where(applied, v_new, v))
        step.copy_(new_step)


def update_scale(cfg: StepConfig, s: StepState, overflow: torch.Tensor) -> None:
    """GradScaler.update: back off after an overflow; grow after `growth_interval` clean updates."""
    tracker = torch.where(overflow, 0, s.growth_tracker + 1)
    grow = tracker >= cfg.growth_interval
    grown = s.scale * cfg.growth_factor
    kept = torch.where(grow & torch.isfinite(grown), grown, s.scale)
    s.scale.copy_(torch.where(overflow, s.scale * cfg.backoff_factor, kept))
    s.growth_tracker.copy_(torch.where(grow, 0, tracker).to(s.growth_tracker.dtype))


@torch.no_grad()
def sync_target(cfg: StepConfig, s: StepState, updates_after: torch.Tensor) -> None:
    """Polyak every update, or a hard copy when `updates_after` is a multiple of the period."""
    if cfg.polyak_tau > 0.0:
        for t, o in zip(s.target_params, s.params, strict=True):
            t.copy_(torch.lerp(t, o, cfg.polyak_tau))
        return
    due = (updates_after % cfg.target_update_every) == 0
    for t, o in zip(s.target_params, s.params, strict=True):
        t.copy_(torch.where(due, o, t))


@torch.no_grad()  # torch.func.grad differentiates inside; nothing outside builds an autograd graph
def device_update(cfg: StepConfig, s: StepState, online: nn.Module, target: nn.Module) -> None:
    """One optimizer update, entirely on the device (see the module docstring)."""
    k = s.updates
    beta = cfg.beta_start + (1.0 - cfg.beta_start) * torch.clamp(k.to(torch.float64) / cfg.beta_steps, max=1.0)
    uniforms = s.uniforms.index_select(0, (k % cfg.uniform_rows).view(1)).view(-1)
    batch = sample_batch(s.table, s.frames, s.claim, uniforms, beta, cfg.stack, cfg.prioritized)
    grads, loss, td, q_sum = batch_gradients(cfg, s, online, target, batch)
    if cfg.use_scaler:
        inv_scale = s.scale.to(torch.float64).reciprocal().to(torch.float32)
        grads = [g * inv_scale for g in grads]
    grad_norm = global_norm(grads)
    overflow = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    applied = ~overflow & batch.fresh.any()
    clip = torch.clamp(cfg.max_grad_norm / (grad_norm + 1e-6), max=1.0)
    adam_update(cfg, s, [g * clip for g in grads], applied)
    if cfg.prioritized:
        keep = batch.fresh & applied
        old = s.table[MASS].index_select(0, batch.slots)
        new = torch.where(keep, priority_mass(td, cfg.alpha, cfg.priority_eps), old)
        s.table.index_put_((torch.zeros_like(batch.slots), batch.slots), new)
    if cfg.use_scaler:
        update_scale(cfg, s, overflow)
    sync_target(cfg, s, k + 1)
    fresh_td = torch.where(batch.fresh, td, 0.0)
    values = torch.stack([loss.float(), fresh_td.sum(), q_sum.float(), grad_norm.float()])
    s.meter_sums.add_(torch.where(applied, values, 0.0))
    s.skipped.add_((~applied).to(s.skipped.dtype))
    s.stale_rows.add_((~batch.fresh & (batch.probs > 0.0)).sum())
    s.last.copy_(torch.stack([loss.float(), q_sum.float(), grad_norm.float(), applied.float()]))
    s.last_td.copy_(td)
    s.updates.add_(1)
