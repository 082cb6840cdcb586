"""Random-shift image augmentation of the learner's training inputs (`learner.augment_shift`).

DrQ (Kostrikov, Yarats and Fergus 2020) and its DQN form DrQ(epsilon) (Agarwal et al. 2021) pad each frame
by `pad` pixels, repeating its border, and crop it back to its size at a random offset: every frame of a
stack moves by the same (dy, dx), drawn uniformly from [-pad, pad] per transition, and a transition's
next observation gets a draw of its own. The Q-targets and the TD errors (hence the new priorities) are
computed on the shifted frames; collectors and evaluations see the frames as they are.

`augment_pair` is the one place the update applies it (learner/step.py `micro_batches`, which every
learner.step_mode runs), so the eager and the device modes draw the same shifts from torch's generator (the
device step on the CPU reproduces the eager update). Tensor ops only -- an integer draw and two gathers, no
host sync -- so it runs inside `torch.compile(fullgraph=True)` and a captured CUDA graph too.
"""

from __future__ import annotations

import torch


def draw_shifts(rows: int, pad: int, device: torch.device) -> torch.Tensor:
    """int64 [rows, 2]: each row's (dy, dx) offset into its padded frame, uniform in [0, 2 * pad]."""
    return torch.randint(0, 2 * pad + 1, (rows, 2), device=device)


def random_shift(frames: torch.Tensor, shifts: torch.Tensor, pad: int) -> torch.Tensor:
    """`frames` [B, C, H, W] (any dtype) shifted by `shifts` [B, 2] as a crop of the border-padded frames:
    out[b, c, y, x] = frames[b, c, clamp(y + dy_b - pad), clamp(x + dx_b - pad)]."""
    if frames.dim() != 4:
        raise ValueError(f"random shift augmentation needs [batch, stack, height, width] frames, got shape "
                         f"{tuple(frames.shape)} (learner.augment_shift is for image observations)")
    b, c, h, w = frames.shape
    rows = (torch.arange(h, device=frames.device) + (shifts[:, :1] - pad)).clamp(0, h - 1)  # [B, H]
    cols = (torch.arange(w, device=frames.device) + (shifts[:, 1:] - pad)).clamp(0, w - 1)  # [B, W]
    out = frames.gather(2, rows[:, None, :, None].expand(b, c, h, w))
    return out.gather(3, cols[:, None, None, :].expand(b, c, h, w))


def augment_pair(obs: torch.Tensor, next_obs: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(obs, next_obs) of one batch, each shifted by its own draw; unchanged when `pad` is 0."""
    if pad <= 0:
        return obs, next_obs
    shifts = draw_shifts(2 * obs.shape[0], pad, obs.device)
    return random_shift(obs, shifts[: obs.shape[0]], pad), random_shift(next_obs, shifts[obs.shape[0]:], pad)
