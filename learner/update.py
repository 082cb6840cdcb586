"""One optimizer update: forward/backward over micro-batches, the non-finite skip, torch.compile.

The functions here take the learner's training parts (`UpdateParts`: networks, optimizer, scaler,
precision policy) and do exactly one thing each; `learner.trainer.Learner` owns those parts,
the counters, the replay source and the broadcasts around them.

Micro-batches: see learner/trainer.py; each micro-loss divides by the effective batch size, so the
accumulated gradient equals the one-big-batch gradient.

Non-finite updates. An update whose loss or gradient norm is NaN/inf is skipped: weights and
optimizer state stay as they were. Where the decision is made: on CPU on the host (free); on
CUDA on the device without a host sync -- fp16 folds a non-finite loss into the gradients so
the GradScaler's own inf check skips the step, bf16/fp32 hand the flag to the fused Adam kernel
(`found_inf`, the mechanism GradScaler uses); an optimizer without that support falls back to
one host sync per update.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from learner.augment import augment_pair
from learner.dqn import Munchausen, clip_gradients, dqn_loss, scheduled_target_epsilon
from learner.precision import PrecisionPolicy
from shared.batch import SampleBatch
from shared.config import LearnerConfig


class UpdateParts(Protocol):
    """What an update reads from its owner (the Learner); read at every call, so a caller may swap a part."""

    lc: LearnerConfig
    device: torch.device
    online: torch.nn.Module
    target: torch.nn.Module
    fwd_online: Any  # the online network, or its compiled wrapper
    fwd_target: Any
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler (a disabled one when the precision needs none)
    precision: PrecisionPolicy
    micro: int
    accum: int
    batch_per_update: int
    channels_last: bool
    compiled: bool
    geometry: dict[str, Any]
    _device_skip: bool
    updates: int  # updates done before this one (learner.target_epsilon_from is counted in these)


@dataclass(frozen=True)
class Compiled:
    """The outcome of `compile_networks`: what to call for each network, and how it went."""

    fwd_online: Any
    fwd_target: Any
    ok: bool
    error: str | None
    seconds: float


def compile_networks(parts: UpdateParts, mode: str) -> Compiled:
    """torch.compile both networks and run one warm-up update on zeros; eager + ONE warning on failure.

    Sets `parts.fwd_online`/`fwd_target` for the warm-up (back to the eager networks on failure)."""
    t0 = time.perf_counter()
    try:
        parts.fwd_online = torch.compile(parts.online, mode=mode)
        parts.fwd_target = torch.compile(parts.target, mode=mode)
        forward_backward(parts, dummy_batch(parts))  # compiles fwd (grad / no-grad) and bwd graphs
        parts.optimizer.zero_grad(set_to_none=True)
        if parts.device.type == "cuda":
            torch.cuda.synchronize(parts.device)
        return Compiled(parts.fwd_online, parts.fwd_target, True, None, time.perf_counter() - t0)
    except Exception as exc:  # inductor/compiler missing, unsupported op, ...
        parts.fwd_online, parts.fwd_target = parts.online, parts.target
        parts.optimizer.zero_grad(set_to_none=True)
        error = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"torch.compile(mode={mode!r}) failed, training eagerly: {error[:500]}",
                      RuntimeWarning, stacklevel=3)
        return Compiled(parts.online, parts.target, False, error, time.perf_counter() - t0)


def dummy_batch(parts: UpdateParts) -> SampleBatch:
    """An all-zero effective batch of the learner's geometry (compile warm-up)."""
    b, shape = parts.batch_per_update, (parts.geometry["stack"], *parts.geometry["obs_shape"])
    dtype = torch.from_numpy(np.zeros(1, dtype=np.dtype(parts.geometry["obs_dtype"]))).dtype
    obs = torch.zeros((b, *shape), dtype=dtype, device=parts.device)
    z = torch.zeros(b, device=parts.device)
    return SampleBatch(obs, torch.zeros(b, dtype=torch.int64, device=parts.device), z, z, obs, z + 1,
                       np.zeros(b, dtype=np.int64))


def forward_backward(parts: UpdateParts, batch: SampleBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accumulate gradients over the micro-batches; returns (loss, td_abs [B_eff], q_sum) detached."""
    lc, n = parts.lc, len(batch)
    if n != parts.batch_per_update:
        raise ValueError(f"replay returned {n} transitions, expected batch_size x grad_accum_steps = "
                         f"{parts.batch_per_update}")
    if parts.compiled and lc.compile_mode == "reduce-overhead" and parts.device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
    td_parts, loss_total, q_total = [], torch.zeros((), device=parts.device), torch.zeros((), device=parts.device)
    munchausen = Munchausen.of(lc)
    quantiles = lc.quantiles > 0
    target_epsilon = scheduled_target_epsilon(lc.target_epsilon, lc.target_epsilon_from, parts.updates)
    if quantiles:  # QR-DQN: the loss reads the return quantiles, not their mean
        def fwd_online(x: torch.Tensor) -> torch.Tensor:
            return parts.fwd_online(x, quantiles=True)

        def fwd_target(x: torch.Tensor) -> torch.Tensor:
            return parts.fwd_target(x, quantiles=True)
    else:
        fwd_online, fwd_target = parts.fwd_online, parts.fwd_target
    all_obs, all_next_obs = augment_pair(batch.obs, batch.next_obs, lc.augment_shift)
    for k in range(parts.accum):
        sl = slice(k * parts.micro, (k + 1) * parts.micro)
        obs, next_obs = all_obs[sl], all_next_obs[sl]
        if parts.channels_last:
            obs = obs.contiguous(memory_format=torch.channels_last)
            next_obs = next_obs.contiguous(memory_format=torch.channels_last)
        with parts.precision.autocast():
            out = dqn_loss(fwd_online, fwd_target, obs, batch.actions[sl], batch.returns[sl],
                           batch.discounts[sl], next_obs, batch.weights[sl], lc.double_q, normalizer=float(n),
                           munchausen=munchausen, quantiles=quantiles, target_epsilon=target_epsilon)
        parts.scaler.scale(out.loss).backward()
        td_parts.append(out.td_abs)
        loss_total = loss_total + out.loss.detach()
        q_total = q_total + out.q_mean * parts.micro
    td = td_parts[0] if len(td_parts) == 1 else torch.cat(td_parts)
    return loss_total, td, q_total


def apply_update(
    parts: UpdateParts, batch: SampleBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool | torch.Tensor]:
    """One optimizer step on `batch`; returns (loss, td_abs, q_sum, grad_norm, applied).

    A non-finite loss or gradient norm skips the step (see the module docstring). `applied` is a
    Python bool where that was decided on the host, else a 0-dim bool tensor on the device (no sync).
    """
    parts.optimizer.zero_grad(set_to_none=True)
    loss, td, q_sum = forward_backward(parts, batch)
    if parts.precision.use_scaler:
        # x + 0 * loss is x, or NaN when the loss is NaN/inf: the scaler's inf check sees gradients only,
        # and the Huber gradient stays finite even for an infinite target
        grad = next((p.grad for p in parts.params if p.grad is not None), None)
        if grad is not None:
            grad.add_(loss * 0.0)
    parts.scaler.unscale_(parts.optimizer)
    grad_norm = clip_gradients(parts.params, parts.lc.max_grad_norm).detach()
    finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
    applied: bool | torch.Tensor
    if parts.precision.use_scaler:
        parts.scaler.step(parts.optimizer)  # skipped by the scaler when a gradient is non-finite
        applied = finite
    elif parts._device_skip:
        opt: Any = parts.optimizer
        opt.grad_scale, opt.found_inf = None, (~finite).to(torch.float32)  # fused Adam skips when 1
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf
        applied = finite
    else:
        applied = bool(finite)  # host decision: free on CPU, one sync on CUDA without fused Adam
        if applied:
            parts.optimizer.step()
    parts.scaler.update()
    return loss, td, q_sum, grad_norm, applied
