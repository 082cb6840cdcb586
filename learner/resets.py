"""Periodic resets against primacy bias (Nikishin et al. 2022; D'Oro et al. 2023; BBF, Schwarzer et al. 2023).

With `learner.reset_every_updates = k > 0`, right after optimizer updates k, 2k, 3k, ... (the update counter):

- head (the `head.*` parameters: the dueling head's layers) <- a fresh initialization when `reset_head`,
  else they shrink-perturb like the torso;
- torso (`torso.*`) <- shrink_perturb * torso + (1 - shrink_perturb) * fresh (Ash & Adams 2020; BBF uses 0.5,
  1 leaves the torso as it is);
- Adam's state of every parameter the reset changed is cleared: both moments and the step count go to 0, so
  those parameters continue as under a fresh optimizer. Old moments would push the fresh head along the old
  head's gradient directions; zeroed moments under an old step count would skip Adam's bias correction and
  make the next steps about 3x the usual lr-sized step (0.1 g / sqrt(0.001 g^2)). Untouched parameters keep
  their state.
- the target network becomes a copy of the reset online network (BBF/SPR's `reset_target`): a target that kept
  the old network would pull the fresh head straight back to the values the reset is meant to forget.

The fresh weights come from the learner's own network factory under a seed drawn from (torch's initial seed
when the learner was built, the update count), in a forked RNG: the draw changes no other random stream, and
a run resumed from a checkpoint draws the same fresh weights at the same update (the head seeds torch with
env.seed before it builds the learner). The schedule is the update counter, which checkpoints hold: a reset
needs nothing else saved.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from learner.dqn import hard_update
from shared.config import LearnerConfig

HEAD_PREFIX = "head."  # shared/network.py QNetwork: `torso` then `head` (the dueling head)


class PeriodicReset:
    """The reset schedule of `learner.reset_*` and the reset itself (module docstring)."""

    def __init__(self, lc: LearnerConfig, build: Callable[[], nn.Module], base_seed: int) -> None:
        """`build`: the learner's network factory (a fresh, freshly initialized network on the CPU);
        `base_seed`: what the fresh draws derive from, with the update count."""
        if lc.reset_every_updates < 0 or not 0.0 <= lc.shrink_perturb <= 1.0:
            raise ValueError(f"reset_every_updates={lc.reset_every_updates} must be >= 0 and "
                             f"shrink_perturb={lc.shrink_perturb} in [0, 1]")
        self.every = int(lc.reset_every_updates)
        self.reset_head = bool(lc.reset_head)
        self.shrink = float(lc.shrink_perturb)
        self.build = build
        self.base_seed = int(base_seed)

    def due(self, updates: int) -> bool:
        """True right after the updates that end a period (k, 2k, ...); never when off."""
        return self.every > 0 and updates > 0 and updates % self.every == 0

    def fresh(self, updates: int) -> nn.Module:
        """The fresh network of the reset after `updates` updates (the same for the same base seed)."""
        seed = int(np.random.SeedSequence([self.base_seed, int(updates)]).generate_state(1)[0])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.build()

    def apply(self, updates: int, online: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Reset `online` in place, clear the optimizer state of what changed, copy it into `target`."""
        changed = shrink_perturb_(online, self.fresh(updates), self.reset_head, self.shrink)
        clear_optimizer_state(optimizer, changed)
        hard_update(target, online)


@torch.no_grad()
def shrink_perturb_(online: nn.Module, fresh: nn.Module, reset_head: bool, shrink: float) -> list[nn.Parameter]:
    """Head <- fresh (when `reset_head`), the rest <- shrink * it + (1 - shrink) * fresh; returns what changed."""
    fresh_params = dict(fresh.named_parameters())
    named = list(online.named_parameters())
    if set(fresh_params) != {name for name, _ in named}:
        raise ValueError("reset: the fresh network's parameters are not the online network's")
    if not any(name.startswith(HEAD_PREFIX) for name, _ in named):
        raise ValueError(f"reset: the network has no {HEAD_PREFIX!r} parameters to reset")
    changed = []
    for name, p in named:
        new = fresh_params[name].to(device=p.device, dtype=p.dtype)
        if reset_head and name.startswith(HEAD_PREFIX):
            p.copy_(new)
        elif shrink < 1.0:
            p.mul_(shrink).add_(new, alpha=1.0 - shrink)
        else:
            continue
        changed.append(p)
    return changed


@torch.no_grad()
def clear_optimizer_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    """Zero every state entry (Adam: step, exp_avg, exp_avg_sq) of `params`, in place: the state keeps its
    tensors, devices and layout (checkpoints, fused kernels), only the values restart."""
    for p in params:
        state = optimizer.state.get(p)
        if not state:
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                value.zero_()
            elif isinstance(value, (int, float)):
                state[key] = type(value)(0)
