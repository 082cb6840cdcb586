"""EnvSpec: what the rest of the system needs to know of the training env, read once.

The head computes one EnvSpec at start (`envs.factory.env_spec`: from one env instance, or
from the config alone for Mario, which needs no emulator) and hands it to every part that sizes
something by the env: the replay (frame shape, dtype, stack), the learner (its network and the
checkpoint's geometry record), the wire's `ObsSpec` (shared/protocol.py: what the receiver checks
chunks against) and the memory checks (shared/config_checks.py). Each collector reads its own from
the first env it builds.

This module imports neither torch nor gymnasium: the config checks use it on interpreters that
have neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from envs import bounds
from envs.mario.actions import num_actions as mario_num_actions
from envs.mario.backend import backend_label
from shared.config import EnvConfig


def is_image_obs(obs_shape: Sequence[int]) -> bool:
    """The network's torso rule: 2-D (H, W) frames take the Nature CNN, everything else the MLP."""
    return len(obs_shape) == 2


@dataclass(frozen=True)
class EnvSpec:
    """One observation's shape and dtype, the action count, the stack and the reward handling of a run's env.

    Equality compares the numbers only; `description` is the head's log line about the same env.
    """

    obs_shape: tuple[int, ...]  # one observation: (H, W) for frames, (D,) for vectors
    obs_dtype: np.dtype
    num_actions: int  # Discrete(n)
    stack: int  # observations per network input: env.frame_stack for frames, 1 for anything else
    frame_skip: int = 1  # emulator frames per agent step (Mario and Atari apply env.frame_skip; other envs none)
    reward_scale: float = EnvConfig.reward_scale  # collectors send reward x this; episode returns stay unscaled
    # what the head accepts (envs/bounds.py derives them in `of_config`): largest |scaled reward| and largest
    # |value| of a float observation
    max_abs_reward: float = bounds.UNKNOWN_BOUND
    max_abs_obs: float = bounds.UNKNOWN_BOUND
    # what the env became (preprocessing, image or vector path, actions), for the head's first log line
    description: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "obs_shape", tuple(int(d) for d in self.obs_shape))
        object.__setattr__(self, "obs_dtype", np.dtype(self.obs_dtype))
        object.__setattr__(self, "num_actions", int(self.num_actions))
        object.__setattr__(self, "stack", int(self.stack))
        object.__setattr__(self, "frame_skip", int(self.frame_skip))

    @property
    def image(self) -> bool:
        """True on the image path (Nature CNN), False on the vector path (MLP)."""
        return is_image_obs(self.obs_shape)

    @property
    def frame_bytes(self) -> int:
        """Bytes of one observation (the replay stores one per slot, a chunk carries one per frame)."""
        return self.obs_dtype.itemsize * int(np.prod(self.obs_shape, dtype=np.int64))

    def path(self) -> str:
        """The network path this spec takes, in words."""
        if self.image:
            return f"image path: Nature CNN on {self.stack} x {self.obs_shape[0]}x{self.obs_shape[1]} {self.obs_dtype}"
        return f"vector path: MLP on {self.stack} x {self.obs_shape} {self.obs_dtype}"

    @classmethod
    def of_mario(cls, env_config: EnvConfig) -> EnvSpec:
        """A Mario env's spec from its config alone (no emulator): frame_size^2 uint8 gray frames, the action set's
        size, frame_stack frames per input. ValueError for an unknown action set."""
        e = env_config
        source = f"Mario wrapper on {backend_label(e.backend)} ({e.action_set} actions, skip {e.frame_skip} + max-pool, {e.frame_size}x{e.frame_size} gray)"
        return cls.of_config(e, (e.frame_size, e.frame_size), np.uint8, mario_num_actions(e.action_set),
                             frame_skip=e.frame_skip, preprocessing=source)

    @classmethod
    def of_config(cls, env_config: EnvConfig, obs_shape: Sequence[int], obs_dtype: Any, num_actions: int, *,
                  frame_skip: int = 1, preprocessing: str = "", action_names: Sequence[str] = (),
                  declared_obs_bounds: Sequence[float] | None = None) -> EnvSpec:
        """The spec of an env `env_config` builds, whose observations and actions are as given: the stack, the
        reward handling and the value bounds come from the config and the env (`declared_obs_bounds`: its Box's
        low and high values, see envs/bounds.py); `preprocessing` and `action_names` only feed `description`."""
        shape = tuple(int(d) for d in obs_shape)
        stack = env_config.frame_stack if is_image_obs(shape) else 1
        spec = cls(shape, np.dtype(obs_dtype), int(num_actions), stack, frame_skip=frame_skip,
                   reward_scale=env_config.reward_scale, max_abs_reward=bounds.max_abs_reward(env_config),
                   max_abs_obs=bounds.max_abs_obs(env_config, declared_obs_bounds))
        names = f" ({' '.join(action_names)})" if action_names else ""
        return replace(spec, description=f"{preprocessing}; {spec.path()}, {spec.num_actions} actions{names}")
