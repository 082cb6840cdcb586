"""The eager feeder: the learner's update (learner/step.py) over a batch the host sampled (learner.step_mode eager).

The replay is sampled on the host (learner/prefetch.py) and the batch moved to the learner's device; the
gradients are taken by autograd, so the networks may be torch.compile'd apart (`compile_networks`,
learner.compile_mode); the update applies them with torch's fused Adam kernel where it runs (CPU and CUDA),
else with Adam's formula in tensor ops. The trainer hands the |TD| back to the replay.

Non-finite updates are skipped inside the update (weights, Adam state and the step count stay as they
were) without a host sync; the trainer reads the outcome on the CPU, where that is free, and on CUDA counts
it with the meter's sync.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from learner.dqn import FUSED_ADAM_DEVICES
from learner.precision import PrecisionPolicy
from learner.step import (
    StepConfig,
    apply_gradients,
    autograd_gradients,
    bind_step_state,
    needs_rebind,
    step_config,
)
from shared.batch import SampleBatch
from shared.config import LearnerConfig, ReplayConfig


class EagerStep:
    """The update bound to the learner's parts, fed one host-sampled batch per call (the learner's thread only)."""

    def __init__(self, lc: LearnerConfig, replay_config: ReplayConfig, *, online: torch.nn.Module,
                 target: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, policy: PrecisionPolicy,
                 channels_last: bool, stack: int, meter_sums: torch.Tensor, skipped: torch.Tensor, updates: int,
                 device: torch.device, mark_cudagraph_steps: bool = False) -> None:
        """`mark_cudagraph_steps`: the networks are compiled with CUDA graphs (reduce-overhead on CUDA), whose
        step boundaries torch must be told."""
        self.cfg: StepConfig = step_config(lc, replay_config, policy, scaler, optimizer.param_groups[0], stack=stack,
                                           prioritized=True, channels_last=channels_last, uniform_rows=1,
                                           fused_adam=device.type in FUSED_ADAM_DEVICES)
        self._parts = (online, target, optimizer, scaler, policy, meter_sums, skipped)
        self.state = self._bind(updates)
        self._expected_updates = int(updates)
        self.mark_cudagraph_steps = mark_cudagraph_steps

    def _bind(self, updates: int):
        online, target, optimizer, scaler, policy, meter_sums, skipped = self._parts
        return bind_step_state(online, target, optimizer, scaler, policy, meter_sums=meter_sums, skipped=skipped,
                               updates=updates, batch=self.cfg.batch)

    def __call__(self, fwd_online: Callable[..., torch.Tensor], fwd_target: Callable[..., torch.Tensor],
                 batch: SampleBatch, updates: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Update number `updates` (the learner's count before it) on `batch`; returns (loss, |TD| [B], Q sum, grad
        norm, applied) as device tensors. `fwd_online`/`fwd_target`: the networks or their compiled wrappers."""
        if len(batch) != self.cfg.batch:
            raise ValueError(f"replay returned {len(batch)} transitions, expected batch_size x grad_accum_steps = "
                             f"{self.cfg.batch}")
        _, _, optimizer, scaler, policy, _, _ = self._parts
        if needs_rebind(self.state, optimizer, scaler, policy, updates, self._expected_updates):
            self.state = self._bind(updates)
        if self.mark_cudagraph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        grads, loss, td, q_sum = autograd_gradients(self.cfg, self.state, fwd_online, fwd_target, batch, updates)
        grad_norm, applied = apply_gradients(self.cfg, self.state, grads, loss, td, q_sum, host_updates=updates)
        self._expected_updates = updates + 1
        return loss, td, q_sum, grad_norm, applied

    def warm_up(self, fwd_online: Callable[..., torch.Tensor], fwd_target: Callable[..., torch.Tensor],
                geometry: dict[str, Any], device: torch.device) -> None:
        """Forward and backward through `fwd_*` on an all-zero batch (compiles their graphs), changing no weight."""
        autograd_gradients(self.cfg, self.state, fwd_online, fwd_target, dummy_batch(self.cfg.batch, geometry, device),
                           self._expected_updates)
        for p in self.state.params:
            p.grad = None


@dataclass(frozen=True)
class Compiled:
    """The outcome of `compile_networks`: what to call for each network, and how it went."""

    fwd_online: Any
    fwd_target: Any
    ok: bool
    error: str | None
    seconds: float


def compile_networks(online: torch.nn.Module, target: torch.nn.Module, mode: str, device: torch.device,
                     warm_up: Callable[[Any, Any], None]) -> Compiled:
    """torch.compile both networks and run `warm_up(fwd_online, fwd_target)` (one forward and backward on zeros);
    the eager networks and ONE warning on failure."""
    t0 = time.perf_counter()
    try:
        fwd_online = torch.compile(online, mode=mode)
        fwd_target = torch.compile(target, mode=mode)
        warm_up(fwd_online, fwd_target)  # compiles fwd (grad / no-grad) and bwd graphs
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return Compiled(fwd_online, fwd_target, True, None, time.perf_counter() - t0)
    except Exception as exc:  # inductor/compiler missing, unsupported op, ...
        for p in online.parameters():
            p.grad = None
        error = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"torch.compile(mode={mode!r}) failed, training eagerly: {error[:500]}",
                      RuntimeWarning, stacklevel=3)
        return Compiled(online, target, False, error, time.perf_counter() - t0)


def dummy_batch(rows: int, geometry: dict[str, Any], device: torch.device) -> SampleBatch:
    """An all-zero batch of `rows` transitions of the learner's geometry (compile warm-up)."""
    shape = (geometry["stack"], *geometry["obs_shape"])
    dtype = torch.from_numpy(np.zeros(1, dtype=np.dtype(geometry["obs_dtype"]))).dtype
    obs = torch.zeros((rows, *shape), dtype=dtype, device=device)
    z = torch.zeros(rows, device=device)
    return SampleBatch(obs, torch.zeros(rows, dtype=torch.int64, device=device), z, z, obs, z + 1,
                       np.zeros(rows, dtype=np.int64))
