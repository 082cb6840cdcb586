"""A training batch built on the device from the ring: draw, frame stacks, n-step targets, freshness.

Pure tensor functions over a `DeviceRing`'s table, frames and claim (replay/device_ring.py); no host
sync, so they run inside a compiled and captured learner step. They rebuild exactly what
`SegmentReader.sample` returns: each row's state stack is the S slots ending at its slot, floored
at its episode's (or segment's) first frame, the next-state stack the same around its bootstrap
slot (`shared.chunk.stack_indices`), and actions, n-step returns and bootstrap discounts are the
stored ones.

Freshness. The host reader re-reads `claimed_end` after its gather and redraws stale rows. Here
the gather and the second read are one opaque op (`gather_checked`): a compiler can neither move
the read before the gather nor re-read the ring for a consumer after it, because the frames the
loss sees are the op's output. On a GPU the op's claim read is a copy from pinned host memory
queued after the gather kernel, so it reads the value the writer had stored before any byte it
overwrote could have been gathered. A stale row is not redrawn (that would need the host): it gets
weight 0 and no priority write-back, and the batch trains on the fresh rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replay.device_ring import ACTION, BOOT, DISC, FLOOR, MASS, RET, SEG_ABS
from replay.device_sampler import draw, importance_weights


@torch.library.custom_op("mario_apex::gather_checked", mutates_args=())
def gather_checked(frames: torch.Tensor, index: torch.Tensor, claim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(frames[index], the claim read after that gather, as int64 [1] on the frames' device)."""
    out = torch.index_select(frames, 0, index)
    return out, claim.to(frames.device, non_blocking=True, copy=True)


@gather_checked.register_fake
def _gather_checked_fake(frames: torch.Tensor, index: torch.Tensor, claim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (frames.new_empty((index.shape[0], *frames.shape[1:])),
            torch.empty(1, dtype=torch.int64, device=frames.device))


@torch.library.custom_op("mario_apex::read_claim", mutates_args=())
def read_claim(claim: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The writer's claim now, as int64 [1] on `like`'s device (a non-blocking copy from pinned memory on a GPU)."""
    return claim.to(like.device, non_blocking=True, copy=True)


@read_claim.register_fake
def _read_claim_fake(claim: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(1, dtype=torch.int64, device=like.device)


@dataclass(frozen=True)
class DeviceBatch:
    """A sampled batch on the device (shapes for B rows, S frames per stack)."""

    obs: torch.Tensor  # [B, S, *obs_shape] storage dtype
    next_obs: torch.Tensor  # [B, S, *obs_shape]
    actions: torch.Tensor  # int64 [B]
    returns: torch.Tensor  # float32 [B]
    discounts: torch.Tensor  # float32 [B]
    weights: torch.Tensor  # float32 [B], 0 for stale rows
    slots: torch.Tensor  # int64 [B] ring slots
    probs: torch.Tensor  # float64 [B] sampling probabilities when drawn
    fresh: torch.Tensor  # bool [B]: drawn from a live segment that no write touched during the gather


def stack_slots(newest: torch.Tensor, floors: torch.Tensor, stack: int) -> torch.Tensor:
    """int64 [B, S]: the S slots ending at each `newest`, none below its floor (oldest first)."""
    offsets = torch.arange(-(stack - 1), 1, dtype=torch.int64, device=newest.device)
    return torch.maximum(newest[:, None] + offsets, floors[:, None])


@dataclass(frozen=True)
class DrawnRows:
    """Rows drawn from the table, before their frames are gathered."""

    slots: torch.Tensor  # int64 [B]
    probs: torch.Tensor  # float64 [B]
    rows: torch.Tensor  # float64 [7, B]: the table's columns at `slots`, as drawn
    count: torch.Tensor  # int64 []: sampleable slots when drawn


def draw_rows(table: torch.Tensor, claim: torch.Tensor, uniforms: torch.Tensor) -> DrawnRows:
    """One row per stratum (len(uniforms) rows) among the slots of segments no write has claimed yet."""
    capacity = table.shape[1]
    live = table[SEG_ABS] + capacity >= read_claim(claim, table)
    mass = torch.where(live, table[MASS], 0.0)
    slots, probs = draw(mass, uniforms)
    return DrawnRows(slots, probs, table.index_select(1, slots), (mass > 0.0).sum())


def gather_rows(table: torch.Tensor, frames: torch.Tensor, claim: torch.Tensor, drawn: DrawnRows,
                beta: torch.Tensor, stack: int, prioritized: bool = True) -> DeviceBatch:
    """The batch of `drawn`: stacks gathered with the claim re-read after the gather (`gather_checked`)."""
    capacity, b = table.shape[1], drawn.slots.shape[0]
    rows = drawn.rows
    boots = rows[BOOT].to(torch.int64)
    boot_floors = table[FLOOR].index_select(0, boots).to(torch.int64)
    index = torch.cat((stack_slots(drawn.slots, rows[FLOOR].to(torch.int64), stack).reshape(-1),
                       stack_slots(boots, boot_floors, stack).reshape(-1)))
    stacks, claim_after = gather_checked(frames, index, claim)
    fresh = (rows[SEG_ABS] + capacity >= claim_after) & (drawn.probs > 0.0)
    if prioritized:
        weights = importance_weights(drawn.probs, drawn.count, beta, keep=fresh)
    else:
        weights = fresh.to(torch.float32)
    stacks = stacks.view(2, b, stack, *frames.shape[1:])
    return DeviceBatch(obs=stacks[0], next_obs=stacks[1], actions=rows[ACTION].to(torch.int64).clamp_min(0),
                       returns=rows[RET].to(torch.float32), discounts=rows[DISC].to(torch.float32),
                       weights=weights, slots=drawn.slots, probs=drawn.probs, fresh=fresh)


def sample_batch(table: torch.Tensor, frames: torch.Tensor, claim: torch.Tensor, uniforms: torch.Tensor,
                 beta: torch.Tensor, stack: int, prioritized: bool = True) -> DeviceBatch:
    """Draw len(uniforms) rows (one per stratum) and build their batch; see the module docstring."""
    return gather_rows(table, frames, claim, draw_rows(table, claim, uniforms), beta, stack, prioritized)
