"""Random-shift augmentation (learner/augment.py, `learner.augment_shift`): the shift is a crop of the
border-padded frames, the same for every frame of a stack and drawn anew for each observation and next
observation; off, the inputs are the replay's own tensors. That it trains alike in every learner.step_mode is
in tests/test_device_step.py (BETWEEN: "augment")."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from learner.augment import augment_pair, draw_shifts, random_shift
from shared.config import ConfigError, LearnerConfig, ReplayConfig
from shared.config_checks import check_augment


def padded_crop(frames: np.ndarray, dy: int, dx: int, pad: int) -> np.ndarray:
    """The definition: pad by repeating the border, crop the frame's size at offset (dy, dx)."""
    _, h, w = frames.shape
    padded = np.pad(frames, ((0, 0), (pad, pad), (pad, pad)), mode="edge")
    return padded[:, dy:dy + h, dx:dx + w]


def frames(b: int = 6, c: int = 4, h: int = 12, w: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (b, c, h, w), dtype=np.uint8))


def test_a_shift_is_a_crop_of_the_border_padded_frames_for_every_frame_of_a_stack() -> None:
    x, pad = frames(), 3
    shifts = torch.tensor([[0, 0], [6, 6], [3, 3], [0, 6], [5, 1], [2, 4]])
    out = random_shift(x, shifts, pad)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    for b, (dy, dx) in enumerate(shifts.tolist()):
        np.testing.assert_array_equal(out[b].numpy(), padded_crop(x[b].numpy(), dy, dx, pad))
    assert torch.equal(out[2], x[2])  # the centre offset moves nothing
    assert not torch.equal(out[0], x[0])


def test_draws_cover_every_offset_and_each_observation_gets_its_own() -> None:
    torch.manual_seed(3)
    shifts = draw_shifts(4000, 2, torch.device("cpu"))
    assert shifts.dtype == torch.int64 and shifts.shape == (4000, 2)
    assert set(shifts.flatten().tolist()) == {0, 1, 2, 3, 4}
    x = frames(b=64)
    obs, next_obs = augment_pair(x, x.clone(), 4)
    moved = [not torch.equal(obs[b], next_obs[b]) for b in range(64)]
    assert sum(moved) > 48  # one draw in 81 is the same offset for both


def test_off_the_inputs_are_the_replays_own_tensors() -> None:
    x, y = frames(), frames(seed=1)
    obs, next_obs = augment_pair(x, y, 0)
    assert obs is x and next_obs is y


def test_vectors_are_refused_by_the_shift_and_by_the_config_check() -> None:
    with pytest.raises(ValueError, match="image observations"):
        random_shift(torch.zeros(4, 4, 8, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.int64), 1)
    lc = replace(LearnerConfig(), augment_shift=4)
    check_augment(lc, EnvSpec((84, 84), np.uint8, 5, 4))
    with pytest.raises(ConfigError, match=r"learner.augment_shift=4 is invalid: .*shape \(4,\)"):
        check_augment(lc, EnvSpec((4,), np.float32, 2, 1))
    with pytest.raises(ConfigError, match=r"\[0, 9\] for 36x40 frames"):
        check_augment(replace(lc, augment_shift=10), EnvSpec((36, 40), np.uint8, 5, 4))
    with pytest.raises(ConfigError, match=r"\[0, 32\]"):
        check_augment(replace(lc, augment_shift=-1))


def test_a_learner_for_vectors_refuses_the_option_before_it_builds_anything() -> None:
    from learner.trainer import Learner

    lc = LearnerConfig(device="cpu", batch_size=8, hidden=16, precision="fp32", augment_shift=2)
    with pytest.raises(ConfigError, match="learner.augment_shift=2"):
        Learner(lc, ReplayConfig(), EnvSpec((8,), np.uint8, 3, 4), replay=None, device="cpu")  # type: ignore[arg-type]
