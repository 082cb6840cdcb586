"""The device feeder: the learner's update (learner/step.py) over a batch drawn on the device, no host round trip.

`device_update` does, in tensor ops only (no `.item()`, no numpy, no Python branch on a tensor value):

1. draw the effective batch from the device ring (replay/device_batch.py): prioritized stratified
   slots, stacks, n-step targets, importance weights annealed by the update counter, freshness;
2. its gradients by `torch.func.grad` and the update itself (learner/step.py: `func_gradients`,
   `apply_gradients` with the traced Adam), a row no longer fresh counting for nothing and an update
   without one fresh row skipped;
3. the new priorities written into the ring's mass row at the drawn slots (an applied update's fresh rows).

Everything it reads or writes lives in `DeviceStepState` (the update's tensors and the ring's) and
`StepConfig`; the same function runs eagerly (step_mode device), under `torch.compile(fullgraph=True)` and
inside one CUDA graph (captured: learner/device_runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from learner.step import StepConfig, StepState, apply_gradients, func_gradients
from replay.device_batch import sample_batch
from replay.device_ring import MASS
from replay.device_sampler import priority_mass


@dataclass
class DeviceStepState(StepState):
    """The update's tensors and the ring's the draw reads (all on the learner's device except `claim`)."""

    stale_rows: torch.Tensor  # int64 []: drawn rows whose segment a write claimed during the gather
    table: torch.Tensor  # the ring's float64 [7, capacity] table (replay/device_ring.py)
    frames: torch.Tensor  # the ring's frames
    claim: torch.Tensor  # the writer's claim (host memory)
    uniforms: torch.Tensor  # float64 [uniform_rows, B]


@torch.no_grad()  # torch.func.grad differentiates inside; nothing outside builds an autograd graph
def device_update(cfg: StepConfig, s: DeviceStepState, online: nn.Module, target: nn.Module) -> None:
    """One optimizer update, entirely on the device (see the module docstring)."""
    k = s.updates
    beta = cfg.beta_start + (1.0 - cfg.beta_start) * torch.clamp(k.to(torch.float64) / cfg.beta_steps, max=1.0)
    uniforms = s.uniforms.index_select(0, (k % cfg.uniform_rows).view(1)).view(-1)
    batch = sample_batch(s.table, s.frames, s.claim, uniforms, beta, cfg.stack, cfg.prioritized)
    grads, loss, td, q_sum = func_gradients(cfg, s, online, target, batch)
    _, applied = apply_gradients(cfg, s, grads, loss, td, q_sum, fresh=batch.fresh)
    if cfg.prioritized:
        keep = batch.fresh & applied
        old = s.table[MASS].index_select(0, batch.slots)
        new = torch.where(keep, priority_mass(td, cfg.alpha, cfg.priority_eps), old)
        s.table.index_put_((torch.zeros_like(batch.slots), batch.slots), new)
    s.stale_rows.add_((~batch.fresh & (batch.probs > 0.0)).sum())
