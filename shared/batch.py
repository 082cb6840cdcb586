"""What the replay hands the learner: one sampled batch, already on the storage device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SampleBatch:
    """A prioritized n-step batch. Stacks are rebuilt from single stored frames at sample time."""

    obs: torch.Tensor  # [B, S, *obs_shape], storage dtype (uint8 frames), the state's stack
    actions: torch.Tensor  # int64 [B]
    returns: torch.Tensor  # float32 [B], sum_k gamma^k r_{t+k} over the n-step window
    discounts: torch.Tensor  # float32 [B], gamma^m to bootstrap with, 0.0 after a termination
    next_obs: torch.Tensor  # [B, S, *obs_shape], the stack the target bootstraps from
    weights: torch.Tensor  # float32 [B], importance weights normalized by their max (1 when uniform)
    indices: np.ndarray  # int64 [B], slot ids to pass back to update_priorities

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def to(self, device: torch.device, non_blocking: bool = False) -> SampleBatch:
        """Move tensors (not indices) to `device`; a no-op when they are already there."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return SampleBatch(
            move(self.obs), move(self.actions), move(self.returns), move(self.discounts),
            move(self.next_obs), move(self.weights), self.indices,
        )
