"""The learner's update, one function for every `learner.step_mode`: from a batch to new weights.

Whatever feeds it -- a batch the host sampled (step_mode eager: learner/update.py) or one drawn on the device
from the frame ring (device, captured: learner/device_step.py) -- an update is, in this order:

1. the inputs: shifted at random where `learner.augment_shift` asks (learner/augment.py), then cut into
   `accum` micro-batches (each loss divides by the effective batch, so the summed gradients are the
   one-big-batch gradient);
2. the loss of each micro-batch, `micro_loss`: the Double/Dueling n-step target, or the Munchausen or
   quantile one, or the epsilon-greedy bootstrap (learner/dqn.py), under the precision's autocast;
3. its gradient: by autograd into the parameters' `.grad` (`autograd_gradients`: the eager mode, where the
   networks may be torch.compile'd apart) or by `torch.func.grad` (`func_gradients`: the device modes,
   where the whole step is one traced function);
4. `apply_gradients`: fp16's loss scale undone; the global gradient norm and clipping (`clip_grad_norm_`'s
   formula); the non-finite skip -- when the loss or the norm is NaN/inf (or no drawn row is fresh) the
   parameters and Adam's moments and step keep their values, decided on the device without a host sync;
   Adam (AdamW with `learner.weight_decay`) in the optimizer's own state tensors (so `state_dict()` and checkpoints are torch.optim.Adam's),
   by torch's fused kernel where it runs (`fused_adam`: eager on CPU and CUDA, one pass per parameter) or
   by its formula in tensor ops (traceable: compiled and captured, and the op-by-op reference); the fp16
   scale backed off or grown as `torch.amp.GradScaler` does, in the scaler's own tensors; the target
   network's hard copy every `target_update_every` updates or Polyak averaging; the metrics added into
   device sums the host folds in when its meter refreshes; the update counter.

The feeder does the rest: the eager mode hands the |TD| back to the replay, the device step writes the
priorities into the ring itself. Everything the update reads or writes lives in `StepState` (tensors,
updated in place) and `StepConfig` (Python constants).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from learner.augment import augment_pair
from learner.dqn import LossOutput, Munchausen, dqn_loss, scheduled_target_epsilon
from learner.precision import PrecisionPolicy


@dataclass(frozen=True)
class StepConfig:
    """The constants of an update (for a compiled step, a change means a new compiled step)."""

    batch: int  # effective batch: micro x accum rows per update
    micro: int
    accum: int
    stack: int
    prioritized: bool  # the device feeder's: draw by priority (else uniformly) and write priorities back
    alpha: float
    priority_eps: float
    beta_start: float  # the device feeder's importance-sampling exponent schedule
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
    uniform_rows: int = 64  # the device feeder's updates per refill of sampling uniforms
    munchausen: Munchausen | None = None  # the Munchausen target's constants (None: the Double DQN target)
    quantiles: bool = False  # QR-DQN: the networks give return quantiles and the loss is the quantile Huber loss
    target_epsilon: float = 0.0  # the bootstrap values the epsilon-greedy policy (learner/dqn.py)
    target_epsilon_from: int = 0  # ... from this update on (the counter in StepState.updates); 0: every update
    augment_shift: int = 0  # random-shift augmentation of the inputs by up to this many pixels (learner/augment.py)
    fused_adam: bool = False  # Adam by torch's fused kernel (eager on CPU/CUDA), else by its formula (traceable)
    weight_decay: float = 0.0  # AdamW's decoupled decay: each weight shrinks by lr x this before the step (0: Adam)


@dataclass
class StepState:
    """The tensors an update reads and writes in place, all on the learner's device."""

    names: list[str]  # the online network's trainable parameter names, in `params` order
    params: list[torch.Tensor]
    target_params: list[torch.Tensor]  # the target network's, same order
    exp_avg: list[torch.Tensor]  # Adam's state tensors (the optimizer's own)
    exp_avg_sq: list[torch.Tensor]
    adam_steps: list[torch.Tensor]
    lr: torch.Tensor  # float64 []: the learning rate, for the traced formula
    lr_value: float  # the same, for torch's fused kernel (which takes a Python float, as torch.optim.Adam passes it)
    scale: torch.Tensor  # float32 []: the fp16 loss scale (1 and unused otherwise)
    growth_tracker: torch.Tensor  # int32 []
    updates: torch.Tensor  # int64 []: updates done, skipped ones included (the learner's counter)
    meter_sums: torch.Tensor  # float32 [4]: loss, |TD| sum, Q sum, grad-norm sum of applied updates
    skipped: torch.Tensor  # int64 []: updates skipped for a non-finite loss or gradient norm
    last: torch.Tensor  # float32 [4]: the last update's loss, Q sum, grad norm, applied (1/0)
    last_td: torch.Tensor  # float32 [B]: its |TD|


def autocast_context(cfg: StepConfig) -> contextlib.AbstractContextManager:
    if cfg.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=cfg.device_type, dtype=cfg.autocast_dtype)


def micro_batches(cfg: StepConfig, batch: Any) -> Iterator[tuple[torch.Tensor, ...]]:
    """The effective batch (a SampleBatch or a DeviceBatch) shifted where asked and cut into `accum` micro-batches:
    (obs, actions, returns, discounts, next_obs, weights) each."""
    all_obs, all_next_obs = augment_pair(batch.obs, batch.next_obs, cfg.augment_shift)
    for k in range(cfg.accum):
        rows = slice(k * cfg.micro, (k + 1) * cfg.micro)
        obs, next_obs = all_obs[rows], all_next_obs[rows]
        if cfg.channels_last:
            obs = obs.contiguous(memory_format=torch.channels_last)
            next_obs = next_obs.contiguous(memory_format=torch.channels_last)
        yield obs, batch.actions[rows], batch.returns[rows], batch.discounts[rows], next_obs, batch.weights[rows]


def micro_loss(cfg: StepConfig, online: Callable[..., torch.Tensor], target: Callable[..., torch.Tensor],
               inputs: tuple[torch.Tensor, ...], target_epsilon: float | torch.Tensor) -> LossOutput:
    """The loss of one micro-batch, normalized by the effective batch; `online`/`target` map frames to Q values
    (or, with quantiles, take `quantiles=True` and give the quantiles)."""
    obs, actions, returns, discounts, next_obs, weights = inputs
    if cfg.quantiles:  # QR-DQN: the loss reads the return quantiles, not their mean
        def fwd_online(x: torch.Tensor) -> torch.Tensor:
            return online(x, quantiles=True)

        def fwd_target(x: torch.Tensor) -> torch.Tensor:
            return target(x, quantiles=True)
    else:
        fwd_online, fwd_target = online, target
    with autocast_context(cfg):
        return dqn_loss(fwd_online, fwd_target, obs, actions, returns, discounts, next_obs, weights, cfg.double_q,
                        normalizer=float(cfg.batch), munchausen=cfg.munchausen, quantiles=cfg.quantiles,
                        target_epsilon=target_epsilon)


def _target_epsilon(cfg: StepConfig, updates: int | torch.Tensor) -> float | torch.Tensor:
    return scheduled_target_epsilon(cfg.target_epsilon, cfg.target_epsilon_from, updates)


def autograd_gradients(cfg: StepConfig, s: StepState, online: Callable[..., torch.Tensor],
                       target: Callable[..., torch.Tensor], batch: Any, updates: int
                       ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gradients in `s.params` order -- the parameters' own `.grad`, of the scaled loss under fp16 --, loss,
    |TD| [B], Q sum) of the batch by autograd; `online`/`target` may be compiled wrappers of the networks;
    `updates`: the learner's count before this update (the epsilon-greedy bootstrap's schedule)."""
    for p in s.params:
        p.grad = None
    target_epsilon = _target_epsilon(cfg, updates)
    losses, tds, q_total = [], [], None
    for inputs in micro_batches(cfg, batch):
        out = micro_loss(cfg, online, target, inputs, target_epsilon)
        (out.loss * s.scale if cfg.use_scaler else out.loss).backward()
        losses.append(out.loss.detach())
        tds.append(out.td_abs)
        q = out.q_mean * cfg.micro
        q_total = q if q_total is None else q_total + q
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in s.params]
    for p, g in zip(s.params, grads, strict=True):
        p.grad = g
    loss = losses[0] if cfg.accum == 1 else torch.stack(losses).sum()
    td = tds[0] if cfg.accum == 1 else torch.cat(tds)
    assert q_total is not None
    return grads, loss, td, q_total


def func_gradients(cfg: StepConfig, s: StepState, online: nn.Module, target: nn.Module, batch: Any
                   ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """`autograd_gradients` by `torch.func.grad` over the parameters in `s` (one traceable function, no `.grad`)."""
    params = dict(zip(s.names, s.params, strict=True))
    target_params = dict(zip(s.names, s.target_params, strict=True))
    target_epsilon = _target_epsilon(cfg, s.updates)

    def loss_of(p: dict[str, torch.Tensor], inputs: tuple[torch.Tensor, ...]):
        out = micro_loss(cfg, lambda x, **kw: functional_call(online, p, (x,), kw),
                         lambda x, **kw: functional_call(target, target_params, (x,), kw), inputs, target_epsilon)
        scaled = out.loss * s.scale if cfg.use_scaler else out.loss
        return scaled, (out.loss.detach(), out.td_abs, out.q_mean)

    grad_fn = torch.func.grad(loss_of, has_aux=True)
    grads: dict[str, torch.Tensor] | None = None
    losses, tds, qs = [], [], []
    for inputs in micro_batches(cfg, batch):
        g, (loss, td, q_mean) = grad_fn(params, inputs)
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
    """torch.optim.Adam's step (no amsgrad) in tensor ops, or AdamW's with `weight_decay`, where `applied`; nothing
    changes elsewhere."""
    b1, b2 = cfg.adam_beta1, cfg.adam_beta2
    keep = 1.0 - s.lr * cfg.weight_decay  # AdamW: the decoupled decay, before the step
    for p, g, m, v, step in zip(s.params, grads, s.exp_avg, s.exp_avg_sq, s.adam_steps, strict=True):
        new_step = step + applied.to(step.dtype)
        m_new = torch.lerp(m, g, 1.0 - b1)
        v_new = v * b2 + (1.0 - b2) * (g * g)
        count = new_step.to(torch.float64)
        step_size = s.lr / (1.0 - b1 ** count)
        denom = v_new.sqrt() / torch.sqrt(1.0 - b2 ** count) + cfg.adam_eps
        p_new = (p * keep if cfg.weight_decay else p) - step_size * (m_new / denom)
        p.copy_(torch.where(applied, p_new, p))
        m.copy_(torch.where(applied, m_new, m))
        v.copy_(torch.where(applied, v_new, v))
        step.copy_(new_step)


@torch.no_grad()
def fused_adam_update(cfg: StepConfig, s: StepState, grads: list[torch.Tensor], applied: torch.Tensor) -> None:
    """The same step by torch's fused Adam (or AdamW) kernel, as torch.optim.Adam(fused=True) calls it: one pass per
    parameter; `found_inf` makes the kernel leave parameters and moments alone, and the step counts are taken back."""
    found_inf = (~applied).to(torch.float32)
    kernel = torch._fused_adamw_ if cfg.weight_decay else torch._fused_adam_
    torch._foreach_add_(s.adam_steps, 1.0)
    kernel(s.params, grads, s.exp_avg, s.exp_avg_sq, [], s.adam_steps, lr=s.lr_value, beta1=cfg.adam_beta1,
                       beta2=cfg.adam_beta2, weight_decay=cfg.weight_decay, eps=cfg.adam_eps, amsgrad=False, maximize=False,
                       grad_scale=None, found_inf=found_inf)
    torch._foreach_sub_(s.adam_steps, [found_inf] * len(s.adam_steps))


def update_scale(cfg: StepConfig, s: StepState, overflow: torch.Tensor) -> None:
    """GradScaler.update: back off after an overflow; grow after `growth_interval` clean updates."""
    tracker = torch.where(overflow, 0, s.growth_tracker + 1)
    grow = tracker >= cfg.growth_interval
    grown = s.scale * cfg.growth_factor
    kept = torch.where(grow & torch.isfinite(grown), grown, s.scale)
    s.scale.copy_(torch.where(overflow, s.scale * cfg.backoff_factor, kept))
    s.growth_tracker.copy_(torch.where(grow, 0, tracker).to(s.growth_tracker.dtype))


@torch.no_grad()
def sync_target(cfg: StepConfig, s: StepState, updates_after: int | torch.Tensor) -> None:
    """Polyak every update, or a hard copy when `updates_after` is a multiple of the period: decided in Python
    for a host count (the eager mode), by a 0/1 mask in `torch.where` for a device one (no host sync)."""
    if cfg.polyak_tau > 0.0:
        torch._foreach_lerp_(s.target_params, s.params, cfg.polyak_tau)
        return
    if isinstance(updates_after, int):
        if updates_after % cfg.target_update_every == 0:
            torch._foreach_copy_(s.target_params, s.params)
        return
    due = (updates_after % cfg.target_update_every) == 0
    for t, o in zip(s.target_params, s.params, strict=True):
        t.copy_(torch.where(due, o, t))


@torch.no_grad()
def apply_gradients(cfg: StepConfig, s: StepState, grads: list[torch.Tensor], loss: torch.Tensor, td: torch.Tensor,
                    q_sum: torch.Tensor, fresh: torch.Tensor | None = None, host_updates: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4 of the module docstring; returns (grad norm, applied) as 0-dim device tensors.

    `fresh`: which drawn rows are live (None: all); `host_updates`: the learner's count before this update when
    the host knows it (the target's period is then decided in Python), else the device counter `s.updates`
    is used. With `fused_adam` the gradients (the parameters' `.grad`) are unscaled and clipped in place."""
    if cfg.use_scaler:
        inv_scale = s.scale.to(torch.float64).reciprocal().to(torch.float32)
        if cfg.fused_adam:
            torch._foreach_mul_(grads, inv_scale)
        else:
            grads = [g * inv_scale for g in grads]
    grad_norm = global_norm(grads)
    overflow = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    applied = ~overflow if fresh is None else ~overflow & fresh.any()
    clip = torch.clamp(cfg.max_grad_norm / (grad_norm + 1e-6), max=1.0)
    if cfg.fused_adam:
        torch._foreach_mul_(grads, clip)
        fused_adam_update(cfg, s, grads, applied)
    else:
        adam_update(cfg, s, [g * clip for g in grads], applied)
    if cfg.use_scaler:
        update_scale(cfg, s, overflow)
    sync_target(cfg, s, s.updates + 1 if host_updates is None else host_updates + 1)
    live_td = td if fresh is None else torch.where(fresh, td, 0.0)
    values = torch.stack([loss.float(), live_td.sum(), q_sum.float(), grad_norm.float()])
    s.meter_sums.add_(torch.where(applied, values, 0.0))
    s.skipped.add_((~applied).to(s.skipped.dtype))
    s.last.copy_(torch.stack([loss.float(), q_sum.float(), grad_norm.float(), applied.float()]))
    s.last_td.copy_(td)
    s.updates.add_(1)
    return grad_norm, applied


# ---------------------------------------------------------------------- binding the learner's parts
def adam_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[list, list, list, dict]:
    """(exp_avg, exp_avg_sq, step tensors, the param group) of a plain Adam over `params`, created if absent.

    The step counters are kept on each parameter's device (fused and capturable Adam keep them there)."""
    if not isinstance(optimizer, torch.optim.Adam) or len(optimizer.param_groups) != 1:
        raise ValueError("the learner's update needs its torch.optim.Adam with one parameter group")
    group = optimizer.param_groups[0]
    if group.get("amsgrad") or group.get("weight_decay") or group.get("maximize") or group.get("differentiable"):
        raise ValueError("the learner's update implements Adam without amsgrad, weight decay, maximize or differentiable")
    exp_avg, exp_avg_sq, steps = [], [], []
    for p in params:
        st = optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
        exp_avg.append(st["exp_avg"])
        exp_avg_sq.append(st["exp_avg_sq"])
        steps.append(st["step"])
    return exp_avg, exp_avg_sq, steps, group


def scaler_tensors(scaler: Any, policy: PrecisionPolicy, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, growth tracker): the GradScaler's own tensors under fp16 (so its state_dict follows the
    step), a constant 1 and 0 otherwise."""
    if not policy.use_scaler:
        return torch.ones((), dtype=torch.float32, device=device), torch.zeros((), dtype=torch.int32, device=device)
    scaler.scale(torch.ones((), device=device))  # creates the scale and tracker tensors on `device` if absent
    return scaler._scale.view(()), scaler._growth_tracker.view(())


def bind_step_state(online: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                    policy: PrecisionPolicy, *, meter_sums: torch.Tensor, skipped: torch.Tensor, updates: int,
                    batch: int) -> StepState:
    """The update's view of the learner's parts (see the module docstring); `updates`: the learner's count,
    `batch`: the effective batch."""
    named = [(n, p) for n, p in online.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    target_named = dict(target.named_parameters())
    persistent = set(online.state_dict()) - {n for n, _ in online.named_parameters()}
    if persistent:  # NoisyNet's noise is a non-persistent buffer the learner redraws in place before each update
        raise ValueError(f"the learner's update supports networks without persistent buffers, got {sorted(persistent)}")
    exp_avg, exp_avg_sq, steps, group = adam_state(optimizer, params)
    device = params[0].device
    scale, tracker = scaler_tensors(scaler, policy, device)
    return StepState(
        names=names, params=params, target_params=[target_named[n] for n in names], exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq, adam_steps=steps,
        lr=torch.tensor(float(group["lr"]), dtype=torch.float64, device=device), lr_value=float(group["lr"]),
        scale=scale, growth_tracker=tracker,
        updates=torch.tensor(int(updates), dtype=torch.int64, device=device), meter_sums=meter_sums, skipped=skipped,
        last=torch.zeros(4, dtype=torch.float32, device=device),
        last_td=torch.zeros(batch, dtype=torch.float32, device=device),
    )


def needs_rebind(state: StepState, optimizer: torch.optim.Optimizer, scaler: Any, policy: PrecisionPolicy,
                 updates: int, expected_updates: int) -> bool:
    """Whether the learner's parts changed under a bound state: its update counter moved (a loaded checkpoint), Adam's
    state tensors or (fp16) the scaler's scale were replaced by a load."""
    if updates != expected_updates or optimizer.state[state.params[0]].get("exp_avg") is not state.exp_avg[0]:
        return True
    return policy.use_scaler and scaler._scale is not None and scaler._scale.data_ptr() != state.scale.data_ptr()


def step_config(lc: Any, replay_config: Any, policy: PrecisionPolicy, scaler: Any, group: dict, *, stack: int,
                prioritized: bool, channels_last: bool, uniform_rows: int, fused_adam: bool = False) -> StepConfig:
    """The constants of the learner's update: `lc` a LearnerConfig, `replay_config` a ReplayConfig; `fused_adam`:
    torch's fused kernel (the eager mode where it runs) rather than the traceable formula."""
    betas = group["betas"]
    growth = {}
    if policy.use_scaler:
        growth = {"growth_factor": float(scaler.get_growth_factor()), "backoff_factor": float(scaler.get_backoff_factor()),
                  "growth_interval": int(scaler.get_growth_interval())}
    return StepConfig(
        batch=lc.batch_size * lc.grad_accum_steps, micro=lc.batch_size, accum=lc.grad_accum_steps, stack=stack,
        prioritized=prioritized, alpha=float(replay_config.alpha), priority_eps=float(replay_config.priority_eps),
        beta_start=float(replay_config.beta_start), beta_steps=int(replay_config.beta_steps), double_q=lc.double_q,
        max_grad_norm=float(lc.max_grad_norm), target_update_every=int(lc.target_update_every),
        polyak_tau=float(lc.polyak_tau), adam_beta1=float(betas[0]), adam_beta2=float(betas[1]),
        adam_eps=float(group["eps"]), device_type=policy.device_type, autocast_dtype=policy.autocast_dtype,
        use_scaler=policy.use_scaler, channels_last=channels_last, uniform_rows=uniform_rows,
        munchausen=Munchausen.of(lc), quantiles=lc.quantiles > 0, target_epsilon=float(lc.target_epsilon),
        target_epsilon_from=int(lc.target_epsilon_from), augment_shift=int(lc.augment_shift), fused_adam=fused_adam,
        weight_decay=float(lc.weight_decay),
        **growth,
    )
